"""The worker Deployment builder: restricted pod security, probes, env from Settings.to_env(), labels, owner."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from skiplock_operator import resources
from skiplock_operator.spec import parse_spec

OWNER = {
    "apiVersion": "skiplock.io/v1alpha1",
    "kind": "JobQueue",
    "metadata": {"name": "mail", "namespace": "jobs", "uid": "0f1e2d3c-aaaa-bbbb-cccc-111122223333"},
}
SPEC = {
    "queue": "mail:eu",
    "handler": "app.jobs:send",
    "image": "example.com/app:1.2",
    "dsnSecretRef": {"name": "db", "key": "url"},
    "concurrency": 4,
    "leaseSeconds": 90,
    "shutdownGraceSeconds": 45,
    "env": [{"name": "SMTP_HOST", "value": "smtp.example.com"}],
    "podLabels": {"team": "mail"},
    "resources": {"requests": {"cpu": "100m"}},
    "imagePullSecrets": [{"name": "regcred"}],
}


def build(spec: dict[str, Any] | None = None, replicas: int | None = 2) -> dict[str, Any]:
    return resources.build_deployment(OWNER, parse_spec(spec or SPEC), replicas=replicas, version="0.1.0")


def container(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_restricted_pod_security() -> None:
    dep = build()
    pod = dep["spec"]["template"]["spec"]
    sc = container(dep)["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and sc["privileged"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in container(dep)["volumeMounts"]


def test_env_comes_from_settings_to_env_plus_secret_and_downward_api() -> None:
    spec = parse_spec(SPEC)
    env = {e["name"]: e for e in container(build())["env"]}
    for name, value in spec.worker_settings().to_env().items():
        assert env[name] == {"name": name, "value": value}
    assert env["SKIPLOCK_LEASE_SECONDS"]["value"] == "90" and env["SKIPLOCK_METRICS_PORT"]["value"] == "9464"
    assert env["SKIPLOCK_DSN"]["valueFrom"] == {"secretKeyRef": {"name": "db", "key": "url"}}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert "SKIPLOCK_WORKER_ID" not in env, "the worker makes its own identity (pod name, pid, nonce)"
    assert env["SMTP_HOST"]["value"] == "smtp.example.com"
    assert [e["name"] for e in container(build())["env"]][-1] == "SMTP_HOST"


def test_probes_port_and_grace() -> None:
    dep = build()
    c = container(dep)
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["args"] == ["worker"] and c["image"] == "example.com/app:1.2"
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45 + resources.GRACE_MARGIN_SECONDS
    assert c["resources"] == {"requests": {"cpu": "100m"}}
    assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_labels_selector_and_owner() -> None:
    dep = build()
    assert dep["metadata"]["name"] == "mail-worker" and dep["metadata"]["namespace"] == "jobs"
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "skiplock-worker", "app.kubernetes.io/instance": "mail"}
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert pod_labels["skiplock.io/queue"] == "mail-eu"  # ':' is not allowed in label values
    assert pod_labels["team"] == "mail" and dep["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    owner = dep["metadata"]["ownerReferences"][0]
    assert owner["uid"] == OWNER["metadata"]["uid"] and owner["kind"] == "JobQueue" and owner["controller"] is True
    assert dep["spec"]["replicas"] == 2 and "replicas" not in build(replicas=None)["spec"]


def test_label_value_is_always_valid() -> None:
    assert resources.label_value("a" * 100) == "a" * 63
    assert resources.label_value("-x:y.") == "x-y"


def test_drift_patch_is_none_when_in_step_and_never_touches_replicas() -> None:
    desired = build(replicas=None)
    actual = copy.deepcopy(build(replicas=7))
    actual["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    assert resources.drift_patch(desired, actual) is None  # server defaults are not drift
    changed = build({**SPEC, "image": "example.com/app:1.3"}, replicas=None)
    patch = resources.drift_patch(changed, actual)
    assert patch is not None and "replicas" not in patch["spec"]
    assert patch["spec"]["template"]["spec"]["containers"][0]["image"] == "example.com/app:1.3"


def test_deployments_of_the_examples_pass_the_kubernetes_schema() -> None:
    import kubernetes_validate
    import yaml

    root = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(root.glob("jobqueue*.yaml")):
        doc = yaml.safe_load(path.read_text())
        doc["metadata"].update(namespace="jobs", uid=OWNER["metadata"]["uid"])
        dep = resources.build_deployment(doc, parse_spec(doc["spec"]), replicas=0, version="0.1.0")
        kubernetes_validate.validate(dep, "1.35.0", strict=True)


def test_jobqueue_names_sharing_their_first_63_characters_get_distinct_selectors() -> None:
    from skiplock_operator.resources import selector_labels

    long_a, long_b = "a" * 63 + "-one", "a" * 63 + "-two"
    first, second = selector_labels(long_a), selector_labels(long_b)
    assert first != second
    for labels in (first, second):
        value = labels["app.kubernetes.io/instance"]
        assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
    assert selector_labels("short")["app.kubernetes.io/instance"] == "short"  # names that fit are unchanged


def test_a_deployment_made_with_an_older_selector_keeps_it() -> None:
    """The selector is immutable: a JobQueue with a long name whose Deployment predates the hashed instance label
    keeps its old selector, and its pod template stays matched by it (else every patch would be refused)."""
    from skiplock_operator.resources import build_deployment, drift_patch, with_selector
    from skiplock_operator.spec import parse_spec

    name = "a" * 70
    owner = {"apiVersion": "skiplock.io/v1alpha1", "kind": "JobQueue", "metadata": {"name": name, "uid": "u1"}}
    spec = parse_spec({"queue": "q", "handler": "a.b:c", "image": "img:1", "dsnSecretRef": {"name": "db"}})
    desired = build_deployment(owner, spec, replicas=None, version="1")
    old = {"app.kubernetes.io/name": "skiplock-worker", "app.kubernetes.io/instance": "a" * 63}
    kept = with_selector(desired, old)
    assert kept["spec"]["selector"]["matchLabels"] == old
    template_labels = kept["spec"]["template"]["metadata"]["labels"]
    assert all(template_labels[k] == v for k, v in old.items())
    actual = {**kept, "spec": {**kept["spec"], "replicas": 1}}
    assert drift_patch(kept, actual) is None
