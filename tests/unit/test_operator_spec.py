"""Spec parsing: defaults, bounds and cross-field rules, each error naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from skiplock_operator.scaling import ScalingSpec
from skiplock_operator.spec import InvalidSpecError, JobQueueSpec, parse_spec

MINIMAL = {"queue": "q", "handler": "a.b:c", "image": "img:1", "dsnSecretRef": {"name": "db"}}


def test_minimal_spec_gets_the_defaults() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.scaling == ScalingSpec()
    assert (spec.schema, spec.dsn_secret_key, spec.concurrency, spec.lease_seconds) == ("skiplock", "dsn", 10, 60.0)
    assert spec.worker_settings().queue == "q"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"queue": None}, "spec.queue is required"),
        ({"handler": None}, "spec.handler or spec.app is required"),
        ({"queues": ["a", ""]}, "spec.queues must be a list of non-empty strings"),
        ({"queues": ["a", "a"]}, "name a queue twice"),
        ({"app": "not an app"}, "app"),
        ({"operatorDsnSecretRef": {"key": "k"}}, "spec.operatorDsnSecretRef.name is required"),
        ({"recoverSeconds": 0}, "spec.recoverSeconds must be within"),
        ({"dsnSecretRef": {}}, "spec.dsnSecretRef.name is required"),
        ({"concurrency": 0}, "spec.concurrency must be within 1..1000"),
        ({"concurrency": "ten"}, "spec.concurrency must be an integer"),
        ({"heartbeatSeconds": 40}, "at most half of spec.leaseSeconds"),
        ({"pollSeconds": 60}, "spec.pollSeconds must be below spec.leaseSeconds"),
        ({"backoff": {"baseSeconds": 10, "capSeconds": 5}}, "spec.backoff.capSeconds must be >= spec"),
        ({"scaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas (3) must not exceed"),
        ({"scaling": {"connectionBudget": 5}}, "cannot hold one worker"),
        ({"env": [{"name": "SKIPLOCK_QUEUE", "value": "x"}]}, "which the operator owns"),
        ({"podLabels": {"app.kubernetes.io/instance": "x"}}, "must not set app.kubernetes.io/instance"),
        ({"handler": "not a handler"}, "handler"),
        ({"schema": "Bad-Schema"}, "schema"),
        ({"imagePullPolicy": "Sometimes"}, "must be one of"),
        ({"scaling": {"pollingIntervalSeconds": 0}}, "pollingIntervalSeconds must be within"),
        ({"retention": {"doneSeconds": 30}}, "spec.retention.doneSeconds must be within 60..315360000"),
        ({"retention": {"failedSeconds": "30d"}}, "spec.retention.failedSeconds must be a number"),
        ({"retention": {"purgeIntervalSeconds": -1}}, "spec.retention.purgeIntervalSeconds must be within 0..604800"),
        ({"retention": "7d"}, "spec.retention must be an object"),
    ],
)
def test_invalid_specs_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpecError, match=None) as info:
        parse_spec({**MINIMAL, **change})
    assert message in str(info.value)


def test_not_an_object() -> None:
    with pytest.raises(InvalidSpecError, match="spec must be an object"):
        parse_spec(["x"])  # type: ignore[arg-type]


def test_dataclass_defaults_match_the_parser() -> None:
    parsed = parse_spec(MINIMAL)
    plain = JobQueueSpec(queue="q", handler="a.b:c", image="img:1", dsn_secret_name="db")
    assert parsed == plain


def test_app_queues_and_derived_intervals_reach_the_worker_env() -> None:
    spec = parse_spec({**MINIMAL, "handler": None, "queue": None, "app": "shop.tasks:app", "queues": ["a", "b"]})
    assert spec.served_queues == ("a", "b") and spec.queue == "a" and spec.handler is None
    env = spec.worker_env()
    assert env["SKIPLOCK_APP"] == "shop.tasks:app" and env["SKIPLOCK_QUEUES"] == "a,b"
    assert "SKIPLOCK_HANDLER" not in env
    assert float(env["SKIPLOCK_HEARTBEAT_SECONDS"]) == 15.0 and float(env["SKIPLOCK_RECOVER_SECONDS"]) == 30.0
    explicit = parse_spec({**MINIMAL, "leaseSeconds": 20, "heartbeatSeconds": 2, "recoverSeconds": 3})
    assert (explicit.worker_settings().heartbeat_seconds, explicit.worker_settings().recover_seconds) == (2.0, 3.0)


def test_operator_dsn_and_manual_mode() -> None:
    plain = parse_spec(MINIMAL)
    assert plain.operator_secret == ("db", "dsn") and not plain.manual
    split = parse_spec({**MINIMAL, "operatorDsnSecretRef": {"name": "owner", "key": "url"}, "replicas": 3})
    assert split.operator_secret == ("owner", "url") and split.manual and split.replicas == 3
    assert split.dsn_secret_name == "db", "workers keep dsnSecretRef"


def test_retention_reaches_the_worker_env_but_the_operator_does_the_purging() -> None:
    spec = parse_spec(
        {**MINIMAL, "retention": {"doneSeconds": 3600, "cancelledSeconds": 120, "purgeIntervalSeconds": 60}}
    )
    assert (spec.retain_done_seconds, spec.retain_failed_seconds, spec.retain_cancelled_seconds) == (
        3600.0,
        30 * 86400.0,
        120.0,
    )
    assert spec.purge_interval_seconds == 60.0
    env = spec.worker_env()
    assert float(env["SKIPLOCK_RETAIN_DONE_SECONDS"]) == 3600 and float(env["SKIPLOCK_RETAIN_CANCELLED_SECONDS"]) == 120
    assert float(env["SKIPLOCK_PURGE_INTERVAL_SECONDS"]) == 0, "workers of a JobQueue never purge"
