"""End to end: a real ``skiplock worker`` process and the operator's metrics endpoint, a real Prometheus
scraping both every second, the real rules.

The queue-wide gauges come from both sources: the worker's own (refreshed every second here) and the operator's
exposition (observability/operator_exposition.py: the operator's metric names and labels, values read from the
same PostgreSQL at every scrape). Every query of every dashboard panel must return data after a short run, the
queue selector must list the queue, the max over both sources must equal each source's value, and Prometheus
must load and evaluate files/alerts.yaml without errors. Two more runs scrape only the operator (zero replicas:
the stall and no-worker alerts go pending) and nothing at all (the absent() alert goes pending). About 20 s,
mostly the fixed target-sync delay of Prometheus.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from prometheus_client import start_http_server

from observability.operator_exposition import operator_registry
from observability.promsupport import ALERTS, panel_queries, require_binary
from skiplock import Queue, Settings
from support.pg import wait_for

HERE = Path(__file__).resolve().parent
QUEUE = "observed"
NAMESPACE = "shop"  # what the PodMonitor and the operator put on the series of a JobQueue's namespace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body.decode()


def try_get(url: str) -> str | None:
    try:
        return http_get(url)
    except OSError:
        return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def worker(settings: Settings, tmp_path: Path) -> Iterator[int]:
    """``skiplock worker`` on the test schema, serving /metrics on a free port; yields the port."""
    port = free_port()
    env = {
        **os.environ,
        "SKIPLOCK_DSN": settings.require_dsn(),
        "SKIPLOCK_SCHEMA": settings.schema,
        "SKIPLOCK_METRICS_HOST": "127.0.0.1",
        "SKIPLOCK_BACKOFF_BASE_SECONDS": "0.1",
        "SKIPLOCK_BACKOFF_CAP_SECONDS": "0.2",
        "SKIPLOCK_QUEUE_METRICS_SECONDS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skiplock",
            "worker",
            "--queue",
            QUEUE,
            "--handler",
            "observability_handlers:handle",
            "--metrics-port",
            str(port),
            "--concurrency",
            "4",
            "--poll",
            "0.5",
            "--lease",
            "10",
            "--heartbeat",
            "2",
            "--recover",
            "1",
        ],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield port
    finally:
        stop(proc)
        log.close()
        if proc.returncode not in (0, -signal.SIGTERM):
            print((tmp_path / "worker.log").read_text(errors="replace"))


@pytest.fixture
def operator_metrics(settings: Settings) -> Iterator[int]:
    """The operator's /metrics with the queue-wide gauges of JobQueue shop/observed; yields the port."""
    registry = operator_registry(settings, namespace=NAMESPACE, jobqueue=QUEUE, queues=[QUEUE])
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


WORKER_JOB = "skiplock"
OPERATOR_JOB = "skiplock-operator"


def scrape_job(name: str, port: int, **extra: Any) -> dict[str, Any]:
    return {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], **extra}


@contextlib.contextmanager
def running_prometheus(tmp_path: Path, scrape_configs: list[dict[str, Any]]) -> Iterator[str]:
    """A Prometheus that scrapes the given jobs every second and evaluates the alert rules; yields its URL."""
    binary = require_binary("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": scrape_configs,
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: proc.poll() is not None or try_get(f"{url}/-/ready") is not None,
            timeout=15,
            interval=0.1,
            what="prometheus /-/ready",
        )
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text(errors="replace")
        yield url
    finally:
        stop(proc)
        log.close()


@pytest.fixture
def prometheus(worker: int, operator_metrics: int, tmp_path: Path) -> Iterator[str]:
    """Prometheus scraping the worker (with the namespace label a PodMonitor adds) and the operator."""
    worker_job = scrape_job(WORKER_JOB, worker)
    worker_job["static_configs"][0]["labels"] = {"namespace": NAMESPACE}
    # honor_labels: the JobQueue's namespace label of the operator's series wins over the target's.
    jobs = [worker_job, scrape_job(OPERATOR_JOB, operator_metrics, honor_labels=True)]
    with running_prometheus(tmp_path, jobs) as url:
        yield url


def alerts(base: str) -> list[dict[str, Any]]:
    body = json.loads(http_get(f"{base}/api/v1/alerts"))
    assert body["status"] == "success", body
    found: list[dict[str, Any]] = body["data"]["alerts"]
    return found


def query(base: str, promql: str) -> list[dict[str, Any]]:
    body = json.loads(http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_every_dashboard_query_returns_data_from_a_real_worker(
    settings: Settings, worker: int, prometheus: str
) -> None:
    metrics_url = f"http://127.0.0.1:{worker}/metrics"
    scrape = wait_for(lambda: try_get(metrics_url), timeout=20, interval=0.1, what="the worker's /metrics")
    assert scrape is not None and "skiplock_worker_concurrency" in scrape
    wait_for(
        lambda: "skiplock_listener_connected 1.0" in (try_get(metrics_url) or ""),
        timeout=10,
        interval=0.1,
        what="the worker's LISTEN connection",
    )
    with psycopg.connect(settings.require_dsn(), autocommit=True) as conn:
        conn.execute(  # a job whose worker died an hour ago: the worker recovers it at once (recovered_total)
            f'INSERT INTO "{settings.schema}".jobs (queue, payload, status, attempts, locked_by, locked_at) '
            "VALUES (%s, '{}', 'processing', 1, 'gone:1:x', now() - interval '1 hour')",
            [QUEUE],
        )
    with Queue(settings=settings, max_size=2) as queue:
        for i in range(12):
            queue.enqueue(QUEUE, {"kind": "ok", "sleep": 0.02 * (i % 4), "n": i})
        queue.enqueue(QUEUE, {"kind": "retry"}, max_attempts=2)  # retried once, then failed (exhausted)
        queue.enqueue(QUEUE, {"kind": "fail"})  # failed at once (non_retryable)
        queue.enqueue(QUEUE, {"kind": "ok"}, delay=3600)  # stays delayed
        wait_for(
            lambda: {s.queue: s for s in queue.stats(QUEUE)}[QUEUE].failed == 2,
            timeout=15,
            interval=0.1,
            what="both failing jobs to end in failed",
        )

    queries = panel_queries(queue=QUEUE, rate_interval="30s", namespace=NAMESPACE)  # one tenant selected
    assert len(queries) >= 20

    def empty_queries() -> list[str]:
        return [q.label for q in queries if not query(prometheus, q.expr)]

    missing: list[str] = []

    def all_answer() -> bool:
        missing[:] = empty_queries()
        return not missing

    try:
        wait_for(all_answer, timeout=20, interval=0.5, what="data for every panel query")
    except AssertionError:
        pytest.fail(f"panel queries without data: {missing}")

    where = f'jobqueue="{QUEUE}", namespace="{NAMESPACE}", queue="{QUEUE}"'
    values = query(prometheus, f'skiplock_queue_jobs{{{where}, state="failed"}}')
    assert [float(v["value"][1]) for v in values] == [2]  # one series: the operator's

    def both_sources_agree() -> list[float] | None:  # the worker's own gauge, refreshed every second
        worker_says = query(prometheus, f'skiplock_queue_jobs{{jobqueue="", queue="{QUEUE}", state="failed"}}')
        both = f'max by (namespace, queue) (skiplock_queue_jobs{{queue="{QUEUE}", state="failed"}})'
        deduped = query(prometheus, both)
        got = [float(v["value"][1]) for v in worker_says + deduped]
        return got if got == [2, 2] else None

    assert wait_for(both_sources_agree, timeout=15, interval=0.5, what="the worker's and the max over both: 2")
    delayed = query(prometheus, f'skiplock_queue_jobs{{{where}, state="delayed"}}')
    assert [float(v["value"][1]) for v in delayed] == [1]
    done = query(prometheus, f'sum(skiplock_jobs_finished_total{{queue="{QUEUE}", outcome="done"}})')
    assert float(done[0]["value"][1]) >= 13  # twelve enqueued ok jobs and the recovered one

    labels = json.loads(
        http_get(
            f"{prometheus}/api/v1/label/queue/values?" + urllib.parse.urlencode({"match[]": "skiplock_queue_jobs"})
        )
    )
    assert QUEUE in labels["data"], "the dashboard's queue selector would not list the queue"
    namespaces = json.loads(
        http_get(
            f"{prometheus}/api/v1/label/namespace/values?" + urllib.parse.urlencode({"match[]": "skiplock_queue_jobs"})
        )
    )
    assert namespaces["data"] == [NAMESPACE], "the namespace selector lists the JobQueue's namespace only"


def test_prometheus_loads_and_evaluates_the_alert_rules(prometheus: str) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        groups = json.loads(http_get(f"{prometheus}/api/v1/rules"))["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        never = "0001-01-01"  # lastEvaluation before the first evaluation
        return rules if rules and all(not r["lastEvaluation"].startswith(never) for r in rules) else None

    rules = wait_for(evaluated, timeout=10, interval=0.2, what="a first evaluation of every rule")
    assert rules is not None
    names = {r["name"] for r in rules}
    expected = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert names == expected
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


def test_zero_replicas_the_stall_and_no_worker_alerts_see_the_operators_numbers(
    settings: Settings, operator_metrics: int, tmp_path: Path
) -> None:
    """No worker runs at all (a JobQueue at zero replicas): only the operator is scraped, and still the stall
    and backlog-without-workers alerts become pending (they fire after their `for:`)."""
    with psycopg.connect(settings.require_dsn(), autocommit=True) as conn:
        conn.execute(  # a job whose worker died an hour ago, and a ready job nobody takes
            f'INSERT INTO "{settings.schema}".jobs (queue, payload, status, attempts, locked_by, locked_at) '
            "VALUES (%s, '{}', 'processing', 1, 'gone:1:x', now() - interval '1 hour')",
            [QUEUE],
        )
    with Queue(settings=settings, max_size=1) as queue:
        queue.enqueue(QUEUE, {"kind": "ok"})
    with running_prometheus(tmp_path, [scrape_job(OPERATOR_JOB, operator_metrics, honor_labels=True)]) as url:
        assert query(url, "skiplock_worker_concurrency") == []  # no worker series whatsoever

        def pending() -> dict[str, dict[str, str]] | None:
            # The absence alert goes pending when its group is evaluated before the first scrape (each group keeps
            # its own schedule), and inactive at its next evaluation: wait for that one too.
            found = {a["labels"]["alertname"]: a["labels"] for a in alerts(url) if a["state"] in ("pending", "firing")}
            wanted = {"SkiplockStalledJobs", "SkiplockBacklogWithoutWorkers"}
            return found if wanted <= set(found) and "SkiplockQueueMetricsAbsent" not in found else None

        found = wait_for(
            pending, timeout=20, interval=0.2, what="the stall and no-worker alerts pending, the operator seen"
        )
        assert found is not None
        for name in ("SkiplockStalledJobs", "SkiplockBacklogWithoutWorkers"):
            labels = found[name]
            assert (labels["namespace"], labels["queue"]) == (NAMESPACE, QUEUE), labels
        stalled = query(url, f'skiplock_queue_jobs{{queue="{QUEUE}", state="stalled"}}')
        assert [float(s["value"][1]) for s in stalled] == [1]


def test_without_any_source_the_absence_alert_goes_pending(tmp_path: Path) -> None:
    """No data at all (neither the operator nor a worker is scraped): the absent() alert, and only it, is pending."""
    with running_prometheus(tmp_path, []) as url:

        def pending() -> set[str] | None:
            names = {a["labels"]["alertname"] for a in alerts(url) if a["state"] in ("pending", "firing")}
            return names or None

        names = wait_for(pending, timeout=15, interval=0.2, what="an alert pending without data")
        assert names == {"SkiplockQueueMetricsAbsent"}
