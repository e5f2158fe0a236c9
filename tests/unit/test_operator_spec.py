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
        ({"dsnSecretRef": {}}, "spec.dsnSecretRef.name is required"),
        ({"concurrency": 0}, "spec.concurrency must be within 1..1000"),
        ({"concurrency": "ten"}, "spec.concurrency must be an integer"),
        ({"heartbeatSeconds": 40}, "at most half of spec.leaseSeconds"),
        ({"pollSeconds": 60}, "spec.pollSeconds (60) must be below"),
        ({"backoff": {"baseSeconds": 10, "capSeconds": 5}}, "capSeconds must be at least"),
        ({"scaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas (3) must not exceed"),
        ({"scaling": {"connectionBudget": 5}}, "cannot hold one worker"),
        ({"env": [{"name": "SKIPLOCK_QUEUE", "value": "x"}]}, "which the operator owns"),
        ({"podLabels": {"app.kubernetes.io/instance": "x"}}, "must not set app.kubernetes.io/instance"),
        ({"handler": "not a handler"}, "handler"),
        ({"schema": "Bad-Schema"}, "schema"),
        ({"imagePullPolicy": "Sometimes"}, "must be one of"),
        ({"scaling": {"pollingIntervalSeconds": 0}}, "pollingIntervalSeconds must be within"),
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
