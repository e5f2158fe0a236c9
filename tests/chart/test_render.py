"""helm lint, and every ci/*-values.yaml scenario rendered and validated against Kubernetes 1.35 schemas."""

from __future__ import annotations

import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from chart.chartlib import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    ROOT,
    SCENARIOS,
    Render,
    Template,
    of_kind,
    only,
    run_helm,
)
from chart.crdcheck import problems

# Kinds without a schema in kubernetes-validate: each is checked by its own test (JobQueue and the kopf
# peering against our CRDs in test_crds.py, the monitoring kinds in test_monitoring.py).
CUSTOM_KINDS = {"JobQueue", "ClusterKopfPeering", "KopfPeering", "PodMonitor", "ServiceMonitor", "PrometheusRule"}
# Objects that may live outside the release namespace: tenant namespaces of the multi-namespace mode, the
# dashboard in Grafana's namespace.
TENANT_KINDS = {"Role", "RoleBinding", "KopfPeering", "NetworkPolicy"}


def scenario_id(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


def test_scenarios_cover_the_modes() -> None:
    names = {scenario_id(p) for p in SCENARIOS}
    assert {
        "default",
        "namespaced-rbac",
        "multi-namespace",
        "cluster",
        "policy",
        "ha",
        "monitoring",
        "jobqueue",
    } <= names


def test_lint_strict(helm: str) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_lint_strict_each_scenario(helm: str, values: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_scenario_validates_against_kubernetes_schemas(render: Render, values: Path) -> None:
    docs = render("-f", str(values))
    assert docs, "nothing rendered"
    for doc in docs:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{values.name}: {name} is invalid at {list(exc.path)}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{values.name}: {name} has no Kubernetes {KUBE_VERSION} schema and no custom check")


@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_every_object_is_labelled_and_placed(render: Render, values: Path) -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "ClusterKopfPeering",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    watched = set(yaml.safe_load(values.read_text()).get("rbac", {}).get("namespaces", []))
    watched |= set(yaml.safe_load(values.read_text()).get("networkPolicy", {}).get("workerNamespaces", []))
    for doc in render("-f", str(values)):
        meta = doc["metadata"]
        labels = meta.get("labels", {})
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", meta["name"]
        assert labels.get("app.kubernetes.io/instance") == "sl", meta["name"]
        assert len(meta["name"]) <= 63 or doc["kind"] == "CustomResourceDefinition"
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in meta, f"{doc['kind']} {meta['name']} is cluster-scoped"
        elif doc["kind"] in TENANT_KINDS and watched:
            assert meta.get("namespace") in watched | {NAMESPACE}, f"{doc['kind']} {meta['name']}"
        elif doc["kind"] != "ConfigMap":  # the dashboard may go to Grafana's namespace
            assert meta.get("namespace") == NAMESPACE, f"{doc['kind']} {meta['name']}"


def test_default_objects(render: Render) -> None:
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    # Namespaced mode: a Role and RoleBinding; the only ClusterRoles are the aggregated JobQueue view/edit.
    expected = ["ClusterRole", "ClusterRole", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    assert sorted(k for k in kinds if k != "CustomResourceDefinition") == expected
    assert only(docs, "Deployment")["spec"]["replicas"] == 1
    assert only(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def test_operator_command_and_ports(render: Render) -> None:
    deployment = only(render(), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/skiplock/skiplock:0.1.0"  # tag defaults to appVersion
    assert container["command"] == ["skiplock", "operator"]
    assert container["args"] == [f"--namespace={NAMESPACE}", "--liveness-port=8080"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"liveness": 8080, "metrics": 9465}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SKIPLOCK_OPERATOR_METRICS_PORT"] == "9465"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    service = only(render(), "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    metrics = {"name": "metrics", "port": 9465, "targetPort": "metrics", "protocol": "TCP"}
    assert service["spec"]["ports"] == [metrics]


def test_namespaced_mode(render: Render) -> None:
    docs = render("--set", "rbac.scope=namespace")
    assert docs == render()  # the default
    assert not of_kind(docs, "ClusterRoleBinding")
    assert all("jobqueues" in r["metadata"]["name"] for r in of_kind(docs, "ClusterRole"))
    binding = only(docs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sl-skiplock"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sl-skiplock", "namespace": NAMESPACE}]
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={NAMESPACE}" in args and "--all-namespaces" not in args


@pytest.mark.parametrize(("scope", "kind"), [("cluster", "ClusterKopfPeering"), ("namespace", "KopfPeering")])
def test_ha_mode_uses_peering(render: Render, scope: str, kind: str) -> None:
    docs = render("--set", "operator.replicas=2", "--set", f"rbac.scope={scope}")
    deployment = only(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2 and "strategy" not in spec
    assert "--peering=sl-skiplock" in spec["template"]["spec"]["containers"][0]["args"]
    peering = only(docs, kind)
    assert peering["apiVersion"] == "kopf.dev/v1" and peering["metadata"]["name"] == "sl-skiplock"
    # Its CRD is in this release: only a hook is built after the CRDs exist.
    assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert (
        anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["labelSelector"]
        == (spec["selector"])
    )
    pdb = only(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == spec["selector"] and pdb["spec"]["maxUnavailable"] == 1


def test_single_replica_has_no_peering_objects(render: Render) -> None:
    docs = render()
    assert not of_kind(docs, "ClusterKopfPeering") and not of_kind(docs, "PodDisruptionBudget")


def test_image_digest_wins_over_tag(render: Render) -> None:
    digest = "sha256:" + "ab" * 32
    docs = render("--set", "image.tag=9.9.9", "--set", f"image.digest={digest}")
    image = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/skiplock/skiplock@{digest}"


def test_fullname_is_cut_at_63_characters(render: Render) -> None:
    docs = render("--set", "nameOverride=" + "x" * 62)
    name = only(docs, "Deployment")["metadata"]["name"]
    assert name == ("sl-" + "x" * 62)[:63]


def test_existing_service_account(render: Render, template: Template) -> None:
    docs = render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops")
    assert not of_kind(docs, "ServiceAccount")
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert only(docs, "RoleBinding")["subjects"][0]["name"] == "ops"
    proc = template("--set", "serviceAccount.create=false")
    assert proc.returncode != 0 and "serviceAccount.name is required" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "typo=1"), "typo"),
        (("--set", "operator.replica=2"), "replica"),
        (("--set", "rbac.scope=everywhere"), "scope"),
        (("--set", "operator.replicas=0"), "replicas"),
        (("--set", "image.pullPolicy=Sometimes"), "pullPolicy"),
        (("--set", "metrics.serviceMonitor.enabeld=true"), "enabeld"),
        (("--set", "operator.logFormat=xml"), "logFormat"),
    ],
    ids=[
        "top-level-typo",
        "nested-typo",
        "bad-enum",
        "below-minimum",
        "bad-pull-policy",
        "monitor-typo",
        "bad-log-format",
    ],
)
def test_values_schema_rejects(template: Template, args: tuple[str, ...], message: str) -> None:
    proc = template(*args)
    assert proc.returncode != 0, f"helm template {' '.join(args)} succeeded"
    assert message in proc.stderr, proc.stderr


def test_notes_show_how_to_create_and_watch_a_jobqueue(helm: str) -> None:
    # helm template does not render NOTES.txt; `helm install --dry-run=client` does, without a cluster.
    proc = run_helm(helm, "install", "sl", str(CHART), "--dry-run=client", "--namespace", NAMESPACE)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -f -" in notes and "kubectl get jobqueues --watch" in notes
    assert "ghcr.io/skiplock/skiplock:0.1.0" in notes
    # The JobQueue shown is one the CRD accepts.
    block = notes.split("<<'YAML'", 1)[1].split("\n  YAML", 1)[0]
    jobqueue = yaml.safe_load(textwrap.dedent(block.split("\n", 1)[1]))
    jobqueue["metadata"]["namespace"] = "default"
    crd = yaml.safe_load((ROOT / "crds" / "jobqueues.skiplock.io.yaml").read_text())
    assert problems(crd, jobqueue) == []
