"""The package surface: a cheap import, run()'s usage errors, and the metric names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

import skiplock_operator
from skiplock_operator.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]


def test_import_does_not_load_kopf() -> None:
    code = "import sys, skiplock_operator; print('kopf' in sys.modules, 'kubernetes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": f"{ROOT / 'worker'}:{ROOT / 'operator'}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["False", "False"]


def test_run_without_namespaces_is_a_usage_error() -> None:
    assert skiplock_operator.run([], False, None, None, True) == 2


def test_metric_names() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.desired_replicas.labels("ns", "jq").set(3)
    metrics.scale_decisions.labels("up", "BacklogGrew").inc()
    text = generate_latest(registry).decode()
    for name in (
        'skiplock_operator_reconciles_total{result="success"}',
        'skiplock_operator_desired_replicas{jobqueue="jq",namespace="ns"} 3.0',
        'skiplock_operator_scale_decisions_total{direction="up",reason="BacklogGrew"} 1.0',
        "skiplock_operator_poll_duration_seconds_bucket",
    ):
        assert name in text
    metrics.forget("ns", "jq")
    assert 'jobqueue="jq"' not in generate_latest(registry).decode().split("skiplock_operator_desired_replicas")[-1]


def test_operator_config_from_env() -> None:
    from skiplock_operator.config import OperatorConfig

    config = OperatorConfig.from_env(
        {"SKIPLOCK_OPERATOR_SECRET_TTL_SECONDS": "0", "SKIPLOCK_OPERATOR_METRICS_PORT": "0"}, server="http://x"
    )
    assert (config.secret_ttl_seconds, config.metrics_port, config.server) == (0.0, None, "http://x")
    assert OperatorConfig.from_env({}).metrics_port == 9465


def test_a_bad_policy_setting_is_a_usage_error(monkeypatch: Any) -> None:
    monkeypatch.setenv("SKIPLOCK_OPERATOR_ALLOW_SCHEDULING", "perhaps")
    assert skiplock_operator.run(["default"], False, None, None, True) == 2


def test_queue_gauges_pass_promtool_and_go_with_their_jobqueue() -> None:
    import shutil

    from skiplock import QueueStats
    from support.ci import missing

    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.observe_queues(
        "ns", "jq", {"a": QueueStats("a", 4, 1, 2, 1, 3, 7.5), "b": QueueStats("b", 0, 0, 0, 0, 0, 0)}
    )
    text = generate_latest(registry).decode()
    assert 'skiplock_queue_jobs{jobqueue="jq",namespace="ns",queue="a",state="failed"} 3.0' in text
    assert 'skiplock_queue_oldest_ready_age_seconds{jobqueue="jq",namespace="ns",queue="a"} 7.5' in text
    assert 'skiplock_operator_database_up{jobqueue="jq",namespace="ns"} 1.0' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool is not installed")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    metrics.observe_queues("ns", "jq", {"a": QueueStats("a", 0, 0, 0, 0, 0, 0)})
    assert 'queue="b"' not in generate_latest(registry).decode()
    metrics.forget("ns", "jq")
    assert 'jobqueue="jq"' not in generate_latest(registry).decode()
