"""The JobQueue CRD: structural, described, its defaults equal the operator's, examples validate, CEL rules hold."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from skiplock_operator.scaling import ScalingSpec
from skiplock_operator.spec import JobQueueSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "jobqueues.skiplock.io.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = SCHEMA["properties"]["spec"]
EXAMPLES = sorted((ROOT / "examples").glob("jobqueue*.yaml"))


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def with_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """What the API server stores: schema defaults applied, numbers as doubles (as CEL sees them)."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for name, child in schema["properties"].items():
            if name not in out and "default" in child:
                out[name] = copy.deepcopy(child["default"])
            if name in out:
                out[name] = with_defaults(out[name], child)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [with_defaults(v, schema["items"]) for v in value]
    return value


def cel_errors(spec: dict[str, Any]) -> list[str]:
    """Evaluate every x-kubernetes-validations rule under spec, as the API server would."""
    env = celpy.Environment()
    stored = with_defaults(spec, SPEC_SCHEMA)
    failed: list[str] = []

    def check(value: Any, schema: dict[str, Any]) -> None:
        for rule in schema.get("x-kubernetes-validations", []):
            program = env.program(env.compile(rule["rule"]))
            if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
                failed.append(rule["message"])
        for name, child in (schema.get("properties") or {}).items():
            if isinstance(value, dict) and isinstance(value.get(name), dict):
                check(value[name], child)

    check(stored, SPEC_SCHEMA)
    return failed


def example(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def test_names_scope_and_subresources() -> None:
    assert CRD["metadata"]["name"] == "jobqueues.skiplock.io"
    assert (CRD["spec"]["group"], CRD["spec"]["scope"], CRD["spec"]["names"]["kind"]) == (
        "skiplock.io",
        "Namespaced",
        "JobQueue",
    )
    assert CRD["spec"]["names"]["shortNames"] == ["jq"] and VERSION["name"] == "v1alpha1"
    assert VERSION["subresources"]["status"] == {}
    assert VERSION["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert {"Queue", "Backlog", "Oldest", "Failed", "Replicas", "Desired", "Ready", "Age"} <= set(columns)
    assert columns["Reason"]["priority"] == 1


def test_schema_is_structural_and_described() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    for path, node in walk(SCHEMA):
        if path in ("", ".metadata") or path.endswith("{}"):
            continue
        assert node.get("description"), f"{path} has no description"
        assert (
            "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
    conditions = SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_crd_defaults_equal_the_operators_defaults() -> None:
    props = SPEC_SCHEMA["properties"]
    scaling = props["scaling"]["properties"]
    expected = ScalingSpec()
    for field, key in [
        ("enabled", "enabled"),
        ("min_replicas", "minReplicas"),
        ("max_replicas", "maxReplicas"),
        ("target_backlog_per_replica", "targetBacklogPerReplica"),
        ("activation_backlog", "activationBacklog"),
        ("max_oldest_ready_age_seconds", "maxOldestReadyAgeSeconds"),
        ("scale_down_stabilization_seconds", "scaleDownStabilizationSeconds"),
        ("polling_interval_seconds", "pollingIntervalSeconds"),
        ("connection_budget", "connectionBudget"),
    ]:
        assert scaling[key]["default"] == getattr(expected, field), key
    spec = JobQueueSpec(queue="q", handler="a:b", image="i", dsn_secret_name="s")
    top = {
        "imagePullPolicy": spec.image_pull_policy,
        "schema": spec.schema,
        "concurrency": spec.concurrency,
        "batch": spec.batch,
        "leaseSeconds": spec.lease_seconds,
        "pollSeconds": spec.poll_seconds,
        "maxAttempts": spec.max_attempts,
        "shutdownGraceSeconds": spec.shutdown_grace_seconds,
        "listen": spec.listen,
        "logFormat": spec.log_format,
        "logLevel": spec.log_level,
        "paused": spec.paused,
    }
    for key, value in top.items():
        assert props[key]["default"] == value, key
    for key in ("heartbeatSeconds", "recoverSeconds"):  # no default: the worker derives them from the lease
        assert spec.heartbeat_seconds is None and spec.recover_seconds is None
        assert "default" not in props[key], key
    backoff = props["backoff"]["properties"]
    assert (backoff["baseSeconds"]["default"], backoff["capSeconds"]["default"], backoff["jitter"]["default"]) == (
        spec.backoff_base_seconds,
        spec.backoff_cap_seconds,
        spec.backoff_jitter,
    )
    assert props["dsnSecretRef"]["properties"]["key"]["default"] == spec.dsn_secret_key


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_schema_and_rules(path: Path) -> None:
    doc = example(path)
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    assert cel_errors(doc["spec"]) == []
    parse_spec(with_defaults(doc["spec"], SPEC_SCHEMA))  # and the operator accepts it


def test_secret_example_is_a_secret_with_a_dsn() -> None:
    doc = example(ROOT / "examples" / "secret.yaml")
    assert doc["kind"] == "Secret" and "dsn" in doc["stringData"]
    assert doc["metadata"]["labels"]["skiplock.io/dsn"] == "true", "the operator reads only opted-in Secrets"
    assert example(ROOT / "examples" / "jobqueue.yaml")["spec"]["dsnSecretRef"]["name"] == doc["metadata"]["name"]


BASE = example(ROOT / "examples" / "jobqueue.yaml")["spec"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "scaling.minReplicas must not exceed scaling.maxReplicas"),
        ({"heartbeatSeconds": 31}, "heartbeatSeconds must be at most half of leaseSeconds"),
        ({"pollSeconds": 60}, "pollSeconds must be below leaseSeconds"),
        ({"backoff": {"baseSeconds": 10, "capSeconds": 5}}, "backoff.capSeconds must be at least backoff.baseSeconds"),
        ({"scaling": {"connectionBudget": 15}}, "must hold at least one worker"),
        ({"env": [{"name": "SKIPLOCK_DSN", "value": "x"}]}, "env must not set"),
        ({"env": [{"name": "POD_UID", "value": "x"}]}, "env must not set"),
    ],
)
def test_cel_rules_reject_bad_specs(change: dict[str, Any], message: str) -> None:
    errors = cel_errors({**BASE, **change})
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(
    "change",
    [
        {"scaling": {"minReplicas": 2, "maxReplicas": 2}},
        {"heartbeatSeconds": 30},
        {"leaseSeconds": 10, "heartbeatSeconds": 5, "pollSeconds": 9.5},
        {"scaling": {"connectionBudget": 16}},
        {"env": [{"name": "APP_MODE", "value": "x"}]},
    ],
)
def test_cel_rules_accept_good_specs(change: dict[str, Any]) -> None:
    assert cel_errors({**BASE, **change}) == []


def test_schema_rejects_bad_types_and_bounds() -> None:
    validator = jsonschema.Draft7Validator(SCHEMA)
    good = example(ROOT / "examples" / "jobqueue.yaml")
    for change in [{"concurrency": 0}, {"queue": "bad queue"}, {"scaling": {"maxReplicas": -1}}, {"logFormat": "xml"}]:
        bad = {**good, "spec": {**good["spec"], **change}}
        assert list(validator.iter_errors(bad)), change


def test_the_budget_rule_counts_the_connections_a_worker_holds() -> None:
    from skiplock_operator.scaling import WORKER_CONNECTION_OVERHEAD

    text = yaml.safe_dump(CRD)
    assert f"self.concurrency + {WORKER_CONNECTION_OVERHEAD}" in text
    assert f"budget / (concurrency + {WORKER_CONNECTION_OVERHEAD})" in text
