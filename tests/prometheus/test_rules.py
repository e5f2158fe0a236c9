"""The alert rules and the exported metrics, checked by promtool (Debian's ``prometheus`` package).

- ``promtool check rules`` on charts/skiplock/files/alerts.yaml, and ``promtool test rules`` on the unit tests
  next to this file (each alert fires and stays quiet when it should);
- ``promtool check metrics`` on a real scrape of WorkerMetrics + QueueCollector over a real PostgreSQL;
- every metric an alert or a dashboard panel names is exported by a worker or by the operator.

In CI (CI=true) a missing promtool fails; elsewhere it skips with the install command.
"""

from __future__ import annotations

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

from observability.promsupport import require_binary
from skiplock import Queue, Settings
from skiplock.metrics import QueueCollector, StatsFetcher, WorkerMetrics
from skiplock_operator.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts/skiplock/files/alerts.yaml"
DASHBOARD = ROOT / "charts/skiplock/files/dashboard.json"
DOCS = ROOT / "README.md"
UNIT_TESTS = sorted(Path(__file__).parent.glob("*.test.yaml"))
RUNBOOK_BASE = "https://github.com/skiplock/skiplock#runbook-"
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
        line.lstrip("#").strip() for line in DOCS.read_text(encoding="utf-8").splitlines() if line.startswith("#")
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
        assert f"runbook-{name.lower()}" in anchors, f"docs have no heading 'Runbook: {name}'"


# ------------------------------------------------------------------------------------------ a real scrape
@pytest.fixture
def scrape(settings: Settings) -> Iterator[str]:
    """The exposition a worker serves: its own metrics after some work, and the queue-wide gauges."""
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
        registry.register(QueueCollector(StatsFetcher(queue.settings), ttl=0))
        yield generate_latest(registry).decode()


def test_scrape_passes_promtool_check_metrics(scrape: str) -> None:
    out = promtool("check", "metrics", stdin=scrape)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def test_scrape_has_queue_wide_values_from_the_database(scrape: str) -> None:
    lines = set(scrape.splitlines())
    for state, value in (("ready", 2), ("delayed", 1), ("processing", 1), ("stalled", 1), ("failed", 1)):
        assert f'skiplock_queue_jobs{{queue="emails",state="{state}"}} {value:.1f}' in lines, state
    assert "skiplock_queue_stats_up 1.0" in lines
    oldest = 'skiplock_queue_oldest_ready_age_seconds{queue="emails"}'
    age = next(line for line in lines if line.startswith(oldest))
    assert 0 <= float(age.split()[-1]) < 60


def test_operator_scrape_passes_promtool_check_metrics() -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry).desired_replicas.labels("shop", "mailer").set(2)
    out = promtool("check", "metrics", stdin=generate_latest(registry).decode())
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def exported_names(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")} | {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in exposition.splitlines() if line and line[0] != "#"
    }


def test_every_metric_named_by_alerts_and_dashboard_is_exported(scrape: str) -> None:
    registry = CollectorRegistry()
    operator = OperatorMetrics(registry)
    operator.desired_replicas.labels("shop", "mailer").set(2)
    operator.current_replicas.labels("shop", "mailer").set(2)
    operator.ready_backlog.labels("shop", "mailer").set(2)
    exported = exported_names(scrape) | exported_names(generate_latest(registry).decode())
    named = {name for rule in alert_rules() for name in METRIC.findall(rule["expr"])}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            named |= set(METRIC.findall(target["expr"]))
    named |= set(METRIC.findall(json.dumps(dashboard["templating"])))
    assert named, "no metric found in the rules or the dashboard"
    assert named - exported == set()


def test_docs_name_and_explain_every_exported_metric(scrape: str) -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    docs = DOCS.read_text(encoding="utf-8")
    rows = {line.split("`")[1] for line in docs.splitlines() if line.startswith("| `skiplock_")}
    exported = exported_names(scrape) | exported_names(generate_latest(registry).decode())
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
    assert families - rows == set(), "metrics without a row in the docs' metrics reference"
    assert rows - families == set(), "documented metrics that nothing exports"
