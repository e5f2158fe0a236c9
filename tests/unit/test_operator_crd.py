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

from skiplock.settings import WORKER_EXTRA_CONNECTIONS
from skiplock_operator.scaling import ScalingSpec
from skiplock_operator.spec import InvalidSpecError, JobQueueSpec, parse_spec

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
    assert props["operatorDsnSecretRef"]["properties"]["key"]["default"] == spec.dsn_secret_key


def test_intervals_follow_the_lease_unless_set() -> None:
    """No default for heartbeatSeconds/recoverSeconds: the API server stores nothing, the worker derives them."""
    props = SPEC_SCHEMA["properties"]
    for key in ("heartbeatSeconds", "recoverSeconds", "replicas", "app", "queues", "operatorDsnSecretRef"):
        assert "default" not in props[key], key
    stored = with_defaults({**BASE, "leaseSeconds": 600}, SPEC_SCHEMA)
    assert "heartbeatSeconds" not in stored and "recoverSeconds" not in stored
    assert cel_errors({**BASE, "leaseSeconds": 600}) == []


def test_manual_mode_is_the_scale_subresource_and_is_documented() -> None:
    scale = VERSION["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.replicas" and scale["statusReplicasPath"] == ".status.replicas"
    text = SPEC_SCHEMA["properties"]["replicas"]["description"]
    assert "kubectl scale" in text and "ManualReplicas" in text and "ScalingActive=False" in text
    assert "remove" in text  # how to return to autoscaling


def test_every_spec_field_is_bounded() -> None:
    """Strings carry a pattern, an enum or a maximum length; numbers and lists carry their bounds."""
    unbounded = []
    for path, node in walk(SPEC_SCHEMA, ".spec"):
        kind = node.get("type")
        if kind == "string" and not ({"pattern", "enum", "maxLength"} & node.keys()) and path not in OPEN_STRINGS:
            unbounded.append(path)
        if kind in ("integer", "number") and not ({"minimum", "maximum"} <= node.keys()) and "[]" not in path:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node and path not in OPEN_LISTS:
            unbounded.append(path)
    assert unbounded == []


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
ONE_WORKER = BASE.get("concurrency", 10) + WORKER_EXTRA_CONNECTIONS  # one worker of BASE (default concurrency 10)
# Free text whose length the API server's request size bounds (env values are the handler's own config).
OPEN_STRINGS = {".spec.env[].value"}
OPEN_LISTS: set[str] = set()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "scaling.minReplicas must not exceed scaling.maxReplicas"),
        ({"heartbeatSeconds": 31}, "heartbeatSeconds must be at most half of leaseSeconds"),
        ({"pollSeconds": 60}, "pollSeconds must be below leaseSeconds"),
        ({"backoff": {"baseSeconds": 10, "capSeconds": 5}}, "backoff.capSeconds must be at least backoff.baseSeconds"),
        ({"scaling": {"connectionBudget": ONE_WORKER - 1}}, "must hold at least one worker"),
        ({"env": [{"name": "SKIPLOCK_DSN", "value": "x"}]}, "env must not set"),
        ({"env": [{"name": "POD_UID", "value": "x"}]}, "env must not set"),
        ({"queues": ["a", "b", "a"]}, "queues must not name a queue twice"),
        ({"leaseSeconds": 20, "heartbeatSeconds": 11}, "heartbeatSeconds must be at most half of leaseSeconds"),
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
        {"scaling": {"connectionBudget": ONE_WORKER}},
        {"env": [{"name": "APP_MODE", "value": "x"}]},
    ],
)
def test_cel_rules_accept_good_specs(change: dict[str, Any]) -> None:
    assert cel_errors({**BASE, **change}) == []


def without(*keys: str, **extra: Any) -> dict[str, Any]:
    return {**{k: v for k, v in BASE.items() if k not in keys}, **extra}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (without("handler"), "set app (module:attr of a skiplock App), handler (module:function), or both"),
        (without("handler", "app"), "set app"),
        (without("queue", "queues"), "set queue or queues"),
    ],
    ids=["no-handler-no-app", "neither", "no-queue"],
)
def test_a_jobqueue_names_what_runs_and_where(spec: dict[str, Any], message: str) -> None:
    errors = cel_errors(spec)
    assert any(message in e for e in errors), errors
    jsonschema.Draft7Validator(SPEC_SCHEMA).validate(spec)  # the schema alone accepts it: the CEL rule refuses


@pytest.mark.parametrize(
    "spec",
    [
        without("handler", app="shop.tasks:app"),
        without("handler", app="shop.tasks:app", queues=["emails", "reports"]),
        {**BASE, "app": "shop.tasks:app"},  # both: the handler is the catch-all for jobs without a task
        without("queue", queues=["emails"]),
    ],
    ids=["app-only", "app-and-queues", "app-and-handler", "queues-only"],
)
def test_app_handler_queue_and_queues_combine(spec: dict[str, Any]) -> None:
    assert cel_errors(spec) == []
    jsonschema.Draft7Validator(SPEC_SCHEMA).validate(spec)


@pytest.mark.parametrize(
    "change",
    [
        {"app": "no-colon"},
        {"queues": []},
        {"queues": ["bad queue"]},
        {"queues": [f"q{i}" for i in range(65)]},
        {"operatorDsnSecretRef": {"key": "dsn"}},
        {"heartbeatSeconds": 0},
        {"recoverSeconds": 100000},
        {"serviceAccountName": "Not_A_Name"},
    ],
    ids=[
        "app-pattern",
        "queues-empty",
        "queues-pattern",
        "queues-too-many",
        "operator-dsn-no-name",
        "heartbeat-zero",
        "recover-too-long",
        "service-account-pattern",
    ],
)
def test_schema_rejects_bad_new_fields(change: dict[str, Any]) -> None:
    assert list(jsonschema.Draft7Validator(SPEC_SCHEMA).iter_errors({**BASE, **change})), change


def test_operator_dsn_secret_ref_defaults_its_key() -> None:
    stored = with_defaults({**BASE, "operatorDsnSecretRef": {"name": "owner-dsn"}}, SPEC_SCHEMA)
    assert stored["operatorDsnSecretRef"] == {"name": "owner-dsn", "key": "dsn"}


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


def test_the_operator_reads_each_worker_setting_with_the_crds_bounds_and_default() -> None:
    """spec.py reads every worker setting through the knob table (CRD_FIELDS), as the CRD is generated from it."""
    from skiplock.knobs import crd_bounds, crd_default
    from skiplock_operator.spec import SPEC_KNOBS

    parsed = parse_spec({"queue": "q", "handler": "m:f", "image": "i", "dsnSecretRef": {"name": "db"}})
    for k in SPEC_KNOBS:
        node = SPEC_SCHEMA
        for part in (k.crd or "").split("."):
            node = node["properties"][part]
        assert (node.get("minimum"), node.get("maximum")) == crd_bounds(k), k.crd
        assert node.get("default") == crd_default(k), k.crd
        expected = crd_default(k) if crd_default(k) is not None else k.default
        assert getattr(parsed, k.name) == expected, k.name
    _, high = crd_bounds(next(k for k in SPEC_KNOBS if k.name == "prefetch"))
    assert high is not None
    with pytest.raises(InvalidSpecError, match=r"spec\.prefetch must be within 0\.\.10000"):
        parse_spec({"queue": "q", "handler": "m:f", "image": "i", "dsnSecretRef": {"name": "db"}, "prefetch": high + 1})
    with pytest.raises(InvalidSpecError, match=r"spec\.logLevel must be one of DEBUG, INFO, WARNING, ERROR"):
        parse_spec(
            {"queue": "q", "handler": "m:f", "image": "i", "dsnSecretRef": {"name": "db"}, "logLevel": "CRITICAL"}
        )


def test_cross_field_errors_come_from_settings_in_the_spec_s_words() -> None:
    base = {"queue": "q", "handler": "m:f", "image": "i", "dsnSecretRef": {"name": "db"}}
    with pytest.raises(ValueError, match=r"spec\.heartbeatSeconds \(31\.0\) must be at most half of spec\.lease"):
        parse_spec({**base, "leaseSeconds": 60, "heartbeatSeconds": 31})
