"""The alert rules and the exported metrics, checked by promtool (Debian's ``prometheus`` package).

- ``promtool check rules`` on charts/skiplock/files/alerts.yaml, and ``promtool test rules`` on the unit tests
  next to this file (each alert fires and stays quiet when it should);
- ``promtool check metrics`` on a real scrape of a worker's WorkerMetrics, and of the operator's metrics with
  the queue-wide gauges read from a real PostgreSQL (observability/operator_exposition.py);
- every metric an alert or a dashboard panel names is exported by a worker or by the operator;
- every alert has a runbook section in docs/alerts.md.

In CI (CI=true) a missing promtool fails; elsewhere it skips with the install command.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from observability.operator_exposition import QUEUE_WIDE, operator_registry
from observability.promsupport import require_binary
from skiplock import AsyncQueue, Queue, Settings
from skiplock.metrics import ENQUEUE_DUPLICATES, TableCollector, WorkerMetrics
from skiplock.store.health import TableReader
from skiplock.worker.queue_gauges import QueueGauges
from skiplock_operator.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts/skiplock/files/alerts.yaml"
DASHBOARD = ROOT / "charts/skiplock/files/dashboard.json"
DOCS = ROOT / "docs" / "metrics.md"  # the metrics reference
RUNBOOKS = ROOT / "docs" / "alerts.md"
UNIT_TESTS = sorted(Path(__file__).parent.glob("*.test.yaml"))
RUNBOOK_BASE = "https://github.com/skiplock/skiplock/blob/main/docs/alerts.md#"
METRIC = re.compile(r"\bskiplock_[a-z0-9_]+")


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    path = require_binary("promtool")
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (lower case, punctuation dropped, spaces to dashes)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


# ------------------------------------------------------------------------------------------ rule files
def test_rule_file_passes_promtool_check() -> None:
    out = promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout


def test_alert_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no *.test.yaml next to this module"
    out = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


PAUSED_FILTER = re.compile(
    r"\n *unless on \(namespace, queue\)\n *max by \(namespace, queue\) \(skiplock_queue_paused or [^\n]*\) > 0"
)
SNOOZED_FILTER = '{outcome!~"snoozed|handed_back"}'


@pytest.mark.parametrize(
    ("mutate", "breaks"),
    [
        (lambda text: PAUSED_FILTER.subn("", text), "a paused queue with a backlog"),
        (lambda text: (text.replace(SNOOZED_FILTER, ""), text.count(SNOOZED_FILTER)), "snoozed attempts do not dilute"),
    ],
    ids=["paused-filter-dropped", "snoozed-filter-dropped"],
)
def test_the_unit_tests_catch_a_rule_that_drops_its_lifecycle_filter(tmp_path: Path, mutate: Any, breaks: str) -> None:
    """Mutation check: without the paused filter (backlog, age, no-worker alerts) or the snoozed one (failure
    ratio), the unit tests that show them must fail; so those tests are what guard the filters."""
    mutant, replaced = mutate(ALERTS.read_text(encoding="utf-8"))
    assert replaced >= 2, "the filter is not in the rules any more"
    rules = tmp_path / "alerts.yaml"
    rules.write_text(mutant, encoding="utf-8")
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        doc["rule_files"] = [str(rules)]
        (tmp_path / path.name).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    out = promtool("test", "rules", *(str(tmp_path / p.name) for p in UNIT_TESTS))
    assert out.returncode != 0, "the unit tests pass without the filter: nothing guards it"
    failed_cases = re.findall(r"(?m)^\s+name: (.+?),\s*$", out.stdout + out.stderr)
    assert failed_cases and all(breaks in name for name in failed_cases), out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet (exp_alerts: [])"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_every_alert_has_severity_for_summary_description_and_a_runbook() -> None:
    headings = [
        line.lstrip("#").strip() for line in RUNBOOKS.read_text(encoding="utf-8").splitlines() if line.startswith("## ")
    ]
    anchors = {github_anchor(h) for h in headings}
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), "alert names must be unique (the chart drops alerts by name)"
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Skiplock[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert re.fullmatch(r"\d+[smh]", str(rule["for"])), name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        assert annotations["runbook_url"] == RUNBOOK_BASE + name.lower(), name
        assert name.lower() in anchors, f"docs/alerts.md has no section '## {name}'"
    assert {github_anchor(h) for h in headings if h.startswith("Skiplock")} == {n.lower() for n in names}


def test_every_runbook_says_what_it_means_what_to_check_and_how_to_fix() -> None:
    sections = RUNBOOKS.read_text(encoding="utf-8").split("\n## ")[1:]
    assert sections
    for section in sections:
        title, _, body = section.partition("\n")
        if not title.startswith("Skiplock"):
            continue
        for part in ("**Meaning**", "**First checks**", "**Fixes**"):
            assert part in body, f"{title}: no {part}"


# ------------------------------------------------------------------------------------------ a real scrape
@pytest.fixture
def scrape(settings: Settings) -> Iterator[tuple[str, str]]:
    """(worker exposition, operator exposition): a worker's own metrics after some work, and the operator's
    metrics with the queue-wide gauges of one JobQueue read from the database."""
    with Queue(settings=settings, max_size=2) as queue:
        queue.enqueue("emails", {"n": 1})
        queue.enqueue("emails", {"n": 2})
        queue.enqueue("emails", {"n": 3}, delay=3600)
        failed = queue.enqueue("emails", {"n": 4}, max_attempts=1)
        with psycopg.connect(settings.require_dsn(), autocommit=True) as conn:
            conn.execute(  # one failed job and one processing job whose lease expired long ago
                f'UPDATE "{settings.schema}".jobs SET status = %s, last_error = %s WHERE id = %s',
                ["failed", "RuntimeError: boom", failed.id],
            )
            conn.execute(
                f'INSERT INTO "{settings.schema}".jobs '
                "(queue, payload, status, attempts, locked_by, locked_at) "
                "VALUES ('emails', '{}', 'processing', 1, 'gone', now() - interval '1 hour')"
            )
        registry = CollectorRegistry()
        metrics = WorkerMetrics(registry)
        metrics.describe_worker("emails", 4, "0.1.0")
        metrics.jobs_claimed.labels("emails").inc(3)
        metrics.jobs_finished.labels("emails", "done").inc(2)
        metrics.jobs_finished.labels("emails", "failed").inc()
        metrics.jobs_failed.labels("emails", "exhausted").inc()
        metrics.jobs_recovered.labels("emails", "pending").inc()
        metrics.jobs_released.labels("emails").inc()
        metrics.job_duration.labels("emails").observe(0.2)
        metrics.job_wait.labels("emails").observe(1.5)
        metrics.wakeups.labels("notify").inc()
        metrics.db_errors.labels("claim").inc()
        metrics.database_up.set(1)
        metrics.listener_connected.set(1)
        metrics.last_notification.set(1_700_000_000)
        registry.register(TableCollector(TableReader(queue.settings), ttl=0))  # the jobs table's health
        registry.register(asyncio.run(refreshed_gauges(queue.settings, ["emails"])))  # the worker's queue gauges
        operator = operator_registry(queue.settings, namespace="shop", jobqueue="mailer", queues=["emails"])
        yield generate_latest(registry).decode(), generate_latest(operator).decode()


async def refreshed_gauges(settings: Settings, queues: list[str]) -> QueueGauges:
    """A worker's queue gauges after one refresh from the database."""
    async with await AsyncQueue.open(settings=settings, max_size=1) as source:
        gauges = QueueGauges(source, queues, interval=60)
        assert await gauges.refresh()
    return gauges


@pytest.mark.parametrize("which", [0, 1], ids=["worker", "operator"])
def test_scrape_passes_promtool_check_metrics(scrape: tuple[str, str], which: int) -> None:
    out = promtool("check", "metrics", stdin=scrape[which])
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def test_queue_wide_values_are_the_same_from_the_operator_and_from_a_worker(scrape: tuple[str, str]) -> None:
    """Both sources export the same names and values; the operator's series carry the JobQueue ({namespace,
    jobqueue}), a worker's only {queue} (its target labels add the pod's namespace): the rules take the max by
    (namespace, queue) over both, so nothing is counted twice."""
    worker, operator = scrape
    for text, where in ((operator, 'jobqueue="mailer",namespace="shop",queue="emails"'), (worker, 'queue="emails"')):
        lines = set(text.splitlines())
        for state, value in (("ready", 2), ("delayed", 1), ("processing", 1), ("stalled", 1), ("failed", 1)):
            assert f'skiplock_queue_jobs{{{where},state="{state}"}} {value:.1f}' in lines, (where, state)
        age = next(line for line in lines if line.startswith(f"skiplock_queue_oldest_ready_age_seconds{{{where}}}"))
        assert 0 <= float(age.split()[-1]) < 60
    assert 'skiplock_operator_database_up{jobqueue="mailer",namespace="shop"} 1.0' in set(operator.splitlines())


def test_operator_scrape_passes_promtool_check_metrics() -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry).desired_replicas.labels("shop", "mailer").set(2)
    out = promtool("check", "metrics", stdin=generate_latest(registry).decode())
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def exported_names(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")} | {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in exposition.splitlines() if line and line[0] != "#"
    }


def test_every_metric_named_by_alerts_and_dashboard_is_exported(scrape: tuple[str, str]) -> None:
    exported = exported_names(scrape[0]) | exported_names(scrape[1])
    named = {name for rule in alert_rules() for name in METRIC.findall(rule["expr"])}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            named |= set(METRIC.findall(target["expr"]))
    named |= set(METRIC.findall(json.dumps(dashboard["templating"])))
    assert named, "no metric found in the rules or the dashboard"
    assert named - exported == set()


def test_docs_name_and_explain_every_exported_metric(scrape: tuple[str, str]) -> None:
    """The metrics reference matches what the code exports (the worker's metrics and table health, the
    operator's metrics, the producer's metrics in the default registry); the operator's queue-wide series also
    have rows in docs/alerts.md."""
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    producer = CollectorRegistry()
    producer.register(ENQUEUE_DUPLICATES)  # what a producer process exports from the default registry
    docs = DOCS.read_text(encoding="utf-8")
    rows = {line.split("`")[1] for line in docs.splitlines() if line.startswith("| `skiplock_")}
    exported = exported_names(scrape[0]) | exported_names(generate_latest(registry).decode())
    exported |= exported_names(generate_latest(producer).decode())
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
    assert families - rows - set(QUEUE_WIDE) == set(), "metrics without a row in the docs' metrics reference"
    assert rows - families - set(QUEUE_WIDE) == set(), "documented metrics that nothing exports"
    runbook_rows = {
        line.split("`")[1] for line in RUNBOOKS.read_text(encoding="utf-8").splitlines() if line.startswith("| `")
    }
    assert set(QUEUE_WIDE) <= runbook_rows
