"""Admin allow-lists reach the operator as its SKIPLOCK_OPERATOR_* environment, the example admission policy's
CEL refuses bad JobQueues and admits good ones (evaluated with cel-python, as the API server would), worker
pods get default resources, and the NetworkPolicies confine the operator and the workers."""

from __future__ import annotations

import json
from typing import Any

import celpy
import pytest
import yaml

from chart.chartlib import CHART, ROOT, Render, Template, of_kind, only
from chart.crdcheck import problems

POLICY = ("-f", str(CHART / "ci" / "policy-values.yaml"))
CRD = yaml.safe_load((ROOT / "crds" / "jobqueues.skiplock.io.yaml").read_text())


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str | None]:
    container = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_defaults_set_no_list_and_forbid_scheduling_fields(render: Render) -> None:
    env = operator_env(render())
    for name in (
        "IMAGES",
        "SERVICE_ACCOUNTS",
        "ANNOTATION_KEYS",
        "DSN_HOSTS",
        "POD_LABEL_KEYS",
        "ENV_NAMES",
        "SECRETS",
    ):
        assert f"SKIPLOCK_OPERATOR_ALLOWED_{name}" not in env, name
    assert env["SKIPLOCK_OPERATOR_DENIED_ENV_NAMES"] == "PYTHON*,LD_*,BROWSER"  # denied by default
    none_denied = operator_env(render("--set", "policy.deniedEnvNames=null"))
    assert none_denied["SKIPLOCK_OPERATOR_DENIED_ENV_NAMES"] == ""  # set and empty: the operator denies none
    assert env["SKIPLOCK_OPERATOR_ALLOW_SCHEDULING"] == "false"
    resources = json.loads(env["SKIPLOCK_OPERATOR_DEFAULT_WORKER_RESOURCES"] or "")
    assert resources == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


def test_allow_lists_are_rendered_comma_separated(render: Render) -> None:
    env = operator_env(render(*POLICY))
    assert env["SKIPLOCK_OPERATOR_ALLOWED_IMAGES"] == "ghcr.io/acme/,registry.example.com/jobs/"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_SERVICE_ACCOUNTS"] == "jobs-worker"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_ANNOTATION_KEYS"] == "prometheus.io/scrape,example.com/"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_DSN_HOSTS"] == "db.internal.example.com,10.20.0.5"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_POD_LABEL_KEYS"] == "team,example.com/"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_ENV_NAMES"] == "APP_*,PYTHONUNBUFFERED"
    assert env["SKIPLOCK_OPERATOR_DENIED_ENV_NAMES"] == "PYTHON*,LD_*,BROWSER"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_SECRETS"] == "db,app-*"
    assert env["SKIPLOCK_OPERATOR_ALLOWED_IMAGE_PULL_SECRETS"] == "registry-credentials"
    assert json.loads(env["SKIPLOCK_OPERATOR_DEFAULT_WORKER_RESOURCES"] or "") == {
        "requests": {"cpu": "200m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }


def test_scheduling_is_one_switch(render: Render, template: Template) -> None:
    on = [f"policy.allow{field}=true" for field in ("Tolerations", "Affinity", "NodeSelector")]
    args = [a for item in on for a in ("--set", item)]
    assert operator_env(render(*args))["SKIPLOCK_OPERATOR_ALLOW_SCHEDULING"] == "true"
    proc = template("--set", on[0])
    assert proc.returncode != 0 and "set all three alike" in proc.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [("policy.allowedImages={a,,b}", "allowedImages"), ("policy.allowedDsnHosts={db a}", "allowedDsnHosts")],
    ids=["empty-item", "space"],
)
def test_bad_list_items_are_refused(template: Template, value: str, message: str) -> None:
    proc = template("--set", value)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------ admission policy
def policy_objects(render: Render, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = render(*POLICY, *extra)
    return only(docs, "ValidatingAdmissionPolicy"), only(docs, "ValidatingAdmissionPolicyBinding")


def admission_errors(policy: dict[str, Any], jobqueue: dict[str, Any]) -> list[str]:
    """Evaluate the policy's variables, then each validation, on `object` as the API server does."""
    env = celpy.Environment()
    activation: dict[str, Any] = {"object": celpy.json_to_cel(jobqueue)}
    variables: dict[str, Any] = {}
    for var in policy["spec"]["variables"]:
        program = env.program(env.compile(var["expression"]))
        variables[var["name"]] = program.evaluate({**activation, "variables": celpy.json_to_cel({})})
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    failed = []
    for rule in policy["spec"]["validations"]:
        result = env.program(env.compile(rule["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (rule["expression"], result)
        if not result:
            failed.append(rule["message"])
    return failed


def jobqueue(**spec: Any) -> dict[str, Any]:
    base = {
        "queue": "emails",
        "handler": "shop.jobs:send",
        "image": "ghcr.io/acme/shop:1.0",
        "dsnSecretRef": {"name": "db"},
    }
    return {
        "apiVersion": "skiplock.io/v1alpha1",
        "kind": "JobQueue",
        "metadata": {"name": "emails", "namespace": "team-a"},
        "spec": {**base, **spec},
    }


def test_admission_policy_is_off_by_default(render: Render) -> None:
    docs = render()
    assert not of_kind(docs, "ValidatingAdmissionPolicy") and not of_kind(docs, "ValidatingAdmissionPolicyBinding")


def test_admission_policy_matches_jobqueues_and_is_bound(render: Render) -> None:
    policy, binding = policy_objects(render)
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["skiplock.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["jobqueues"],
        }
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"skiplock.io/tenant": "true"}}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"image": "registry.example.com/jobs/report@sha256:" + "a" * 64},
        {"serviceAccountName": "jobs-worker"},
        {"podAnnotations": {"prometheus.io/scrape": "true"}},
        {"podAnnotations": {"example.com/team": "a", "example.com/cost": "b"}},
        {"podLabels": {"team": "a", "example.com/cost": "b"}},
        {"env": [{"name": "APP_MODE", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]},
        {"env": [{"name": "APP_KEY", "valueFrom": {"secretKeyRef": {"name": "app-s3", "key": "k"}}}]},
        {"env": [{"name": "APP_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]},
        {"imagePullSecrets": [{"name": "registry-credentials"}]},
    ],
    ids=[
        "plain",
        "second-prefix-by-digest",
        "allowed-service-account",
        "allowed-annotation",
        "annotation-prefix",
        "labels",
        "env-names",
        "env-secret",
        "env-field",
        "pull-secret",
    ],
)
def test_admission_policy_admits_good_jobqueues(render: Render, spec: dict[str, Any]) -> None:
    policy, _ = policy_objects(render)
    doc = jobqueue(**spec)
    assert problems(CRD, doc) == []  # a valid JobQueue in the first place
    assert admission_errors(policy, doc) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"image": "docker.io/evil/miner:latest"}, "spec.image"),
        ({"image": "ghcr.io/acme-evil/shop:1.0"}, "spec.image"),  # a prefix, not a substring
        ({"image": "ghcr.io/acm"}, "spec.image"),
        ({"image": "registry.example.com/jobs-evil/x:1"}, "spec.image"),  # whole path segments
        ({"env": [{"name": "PYTHONWARNINGS", "value": "x"}]}, "spec.env"),
        ({"env": [{"name": "BROWSER", "value": "sh -c id"}]}, "spec.env"),
        ({"env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]}, "spec.env"),
        ({"env": [{"name": "OTHER", "value": "1"}]}, "spec.env"),
        ({"env": [{"name": "APP_T", "valueFrom": {"secretKeyRef": {"name": "operator-token", "key": "t"}}}]}, "Secret"),
        ({"dsnSecretRef": {"name": "admin-db"}}, "Secret"),
        ({"podLabels": {"sidecar.istio.io/inject": "true"}}, "spec.podLabels"),
        ({"imagePullSecrets": [{"name": "other-registry"}]}, "spec.imagePullSecrets"),
        ({"serviceAccountName": "cluster-admin-sa"}, "spec.serviceAccountName"),
        ({"podAnnotations": {"sidecar.istio.io/inject": "false"}}, "spec.podAnnotations"),
        ({"podAnnotations": {"prometheus.io/scrape": "1", "prometheus.io/port": "1"}}, "spec.podAnnotations"),
        ({"podAnnotations": {"example.community/x": "1"}}, "spec.podAnnotations"),
        ({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, "spec.tolerations"),
        ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}, "spec.tolerations"),
        ({"affinity": {"nodeAffinity": {}}}, "spec.tolerations"),
    ],
    ids=[
        "foreign-registry",
        "lookalike-prefix",
        "short-image",
        "sibling-registry-path",
        "env-pythonwarnings",
        "env-browser",
        "env-ld-preload",
        "env-not-allowed",
        "env-other-secret",
        "dsn-other-secret",
        "label",
        "pull-secret",
        "service-account",
        "annotation",
        "exact-key-only",
        "lookalike-annotation-prefix",
        "tolerations",
        "node-selector",
        "affinity",
    ],
)
def test_admission_policy_refuses_bad_jobqueues(render: Render, spec: dict[str, Any], message: str) -> None:
    policy, _ = policy_objects(render)
    errors = admission_errors(policy, jobqueue(**spec))
    assert len(errors) == 1 and message in errors[0], errors


def test_admission_policy_allows_scheduling_when_the_switch_is_on(render: Render) -> None:
    on = [a for f in ("Tolerations", "Affinity", "NodeSelector") for a in ("--set", f"policy.allow{f}=true")]
    policy, _ = policy_objects(render, *on)
    assert admission_errors(policy, jobqueue(tolerations=[{"key": "gpu", "operator": "Exists"}])) == []


def test_admission_policy_without_service_account_list_admits_any(render: Render) -> None:
    policy, _ = policy_objects(render, "--set", "policy.allowedServiceAccounts=null")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["allowedServiceAccounts"] == "[]"  # a CEL list, never null
    assert admission_errors(policy, jobqueue(serviceAccountName="anything")) == []


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({"image": "ghcr.io/acme/shop:1"}, True),
        ({"image": "ghcr.io/acme-evil/shop:1"}, False),
        ({"env": [{"name": "PYTHONWARNINGS", "value": "x"}]}, False),
        ({"env": [{"name": "PYTHONUNBUFFERED", "value": "1"}]}, True),
        ({"podLabels": {"sidecar.istio.io/inject": "true"}}, False),
        ({"env": [{"name": "APP_T", "valueFrom": {"secretKeyRef": {"name": "operator-token", "key": "t"}}}]}, False),
        ({"dsnSecretRef": {"name": "admin-db"}}, False),
        ({"imagePullSecrets": [{"name": "other-registry"}]}, False),
    ],
)
def test_admission_policy_and_operator_agree(render: Render, spec: dict[str, Any], allowed: bool) -> None:
    """The CEL and the operator's own check (fed the env the chart renders) refuse the same JobQueues."""
    from skiplock_operator.config import policy_from_env
    from skiplock_operator.spec import parse_spec, policy_violations

    env = {k: v for k, v in operator_env(render(*POLICY)).items() if v is not None}
    policy, _ = policy_objects(render)
    doc = jobqueue(**spec)
    assert (admission_errors(policy, doc) == []) is allowed
    assert (policy_violations(parse_spec(doc["spec"]), policy_from_env(env)) == []) is allowed


def test_admission_policy_needs_an_image_list(template: Template) -> None:
    proc = template("--set", "policy.admission.enabled=true")
    assert proc.returncode != 0 and "policy.allowedImages" in proc.stderr


# ------------------------------------------------------------------------------------- network policies
MULTI = ("-f", str(CHART / "ci" / "multi-namespace-values.yaml"))


def test_network_policies_are_off_by_default(render: Render) -> None:
    assert not of_kind(render(), "NetworkPolicy")


def test_operator_network_policy(render: Render) -> None:
    docs = render(*MULTI)
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in of_kind(docs, "NetworkPolicy")}
    operator = policies[("skiplock-system", "sl-skiplock-operator")]["spec"]
    selector = only(docs, "Deployment")["spec"]["selector"]
    assert operator["podSelector"] == selector
    assert operator["policyTypes"] == ["Ingress", "Egress"]
    [ingress] = operator["ingress"]
    assert ingress["ports"] == [{"port": 9465, "protocol": "TCP"}, {"port": 8080, "protocol": "TCP"}]
    assert ingress["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    api, dns, postgres = operator["egress"]
    assert api == {
        "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
    }
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert postgres == {
        "ports": [{"port": 5432, "protocol": "TCP"}, {"port": 6432, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
    }


def test_worker_network_policies_allow_only_metrics_in(render: Render) -> None:
    docs = render(*MULTI)
    workers = {
        p["metadata"]["namespace"]: p["spec"]
        for p in of_kind(docs, "NetworkPolicy")
        if p["metadata"]["name"] == "sl-skiplock-workers"
    }
    assert set(workers) == {"team-a", "team-b"}  # the watched namespaces
    for spec in workers.values():
        assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "skiplock-worker"}}
        assert spec["policyTypes"] == ["Ingress"]  # egress is the handler's business
        assert [r["ports"] for r in spec["ingress"]] == [[{"port": "metrics", "protocol": "TCP"}]]


def test_cluster_mode_puts_worker_policies_where_listed(render: Render) -> None:
    docs = render("-f", str(CHART / "ci" / "cluster-values.yaml"))
    namespaces = sorted(p["metadata"]["namespace"] for p in of_kind(docs, "NetworkPolicy"))
    assert namespaces == ["jobs", "skiplock-system"]


def test_bad_cidr_is_refused(template: Template) -> None:
    proc = template(*MULTI, "--set", "networkPolicy.postgres.cidrs={10.0.0.0}")
    assert proc.returncode != 0 and "cidrs" in proc.stderr


def test_network_policies_need_who_may_reach_the_metrics_ports(template: Template) -> None:
    """Issue 37, item 5: with no metricsFrom the metrics and probe ports took connections from any pod (a slowloris
    from a neighbour made the kubelet's probes fail); the chart now refuses that install."""
    proc = template("--set", "networkPolicy.enabled=true")
    assert proc.returncode != 0 and "networkPolicy.metricsFrom" in proc.stderr
    assert template(*MULTI).returncode == 0


def test_security_docs_name_every_operator_setting_the_chart_renders(render: Render) -> None:
    text = (ROOT / "docs" / "security-kubernetes.md").read_text(encoding="utf-8")
    assert text.startswith("## Kubernetes: install modes and RBAC\n")
    on = [a for f in ("Tolerations", "Affinity", "NodeSelector") for a in ("--set", f"policy.allow{f}=true")]
    names = {name for name in operator_env(render(*POLICY, *on)) if name.startswith("SKIPLOCK_OPERATOR_")}
    names.discard("SKIPLOCK_OPERATOR_METRICS_PORT")
    assert len(names) == 14
    for name in names:
        assert f"`{name}`" in text, name
