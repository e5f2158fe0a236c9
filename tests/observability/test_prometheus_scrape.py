"""End to end: a real ``skiplock worker`` process, a real Prometheus scraping it every second, the real rules.

Every query of every dashboard panel must return data after a short run, the queue selector must list the
queue, and Prometheus must load and evaluate files/alerts.yaml without errors. About 10 s, mostly the
fixed target-sync delay of Prometheus before its first scrape (shared/TOOLING.md section 3).
"""

from __future__ import annotations

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

from observability.promsupport import ALERTS, panel_queries, require_binary
from skiplock import Queue, Settings
from support.pg import wait_for

HERE = Path(__file__).resolve().parent
QUEUE = "observed"


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
def prometheus(worker: int, tmp_path: Path) -> Iterator[str]:
    """A Prometheus that scrapes the worker every second and evaluates the alert rules; yields its base URL."""
    binary = require_binary("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "skiplock", "static_configs": [{"targets": [f"127.0.0.1:{worker}"]}]}],
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

    queries = panel_queries(queue=QUEUE, rate_interval="30s")
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

    values = query(prometheus, f'max by (queue) (skiplock_queue_jobs{{queue="{QUEUE}", state="failed"}})')
    assert float(values[0]["value"][1]) == 2
    done = query(prometheus, f'sum(skiplock_jobs_finished_total{{queue="{QUEUE}", outcome="done"}})')
    assert float(done[0]["value"][1]) >= 13  # twelve enqueued ok jobs and the recovered one

    labels = json.loads(
        http_get(
            f"{prometheus}/api/v1/label/queue/values?" + urllib.parse.urlencode({"match[]": "skiplock_queue_jobs"})
        )
    )
    assert QUEUE in labels["data"], "the dashboard's queue selector would not list the queue"


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
