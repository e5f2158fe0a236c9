"""The chart's CRDs are byte-identical copies of crds/, rendered behind crds.enabled with the keep policy
behind crds.keep; the custom resources the chart renders are accepted by those CRDs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from chart.chartlib import CHART, KUBE_VERSION, NAMESPACE, ROOT, Render, of_kind, only
from chart.crdcheck import apply_defaults, problems

CANONICAL = ROOT / "crds"
COPIES = CHART / "crds-src"


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def canonical_crds() -> dict[str, dict[str, Any]]:
    paths = sorted(CANONICAL.glob("*.yaml"))
    return {crd["metadata"]["name"]: crd for path in paths for crd in load_all(path)}


def test_chart_copies_are_identical_to_crds_dir() -> None:
    sources = sorted(p.name for p in CANONICAL.glob("*.yaml"))
    assert "jobqueues.skiplock.io.yaml" in sources
    copies = sorted(p.name for p in COPIES.glob("*.yaml"))
    assert copies == sources, "run tools/sync-crds.sh"
    for name in sources:
        assert (COPIES / name).read_bytes() == (CANONICAL / name).read_bytes(), (
            f"charts/skiplock/crds-src/{name} drifted from crds/{name}: run tools/sync-crds.sh"
        )


def test_rendered_crds_equal_the_canonical_ones(render: Render) -> None:
    canonical = canonical_crds()
    rendered = {crd["metadata"]["name"]: crd for crd in of_kind(render(), "CustomResourceDefinition")}
    assert rendered.keys() == canonical.keys()
    for name, crd in canonical.items():
        got = rendered[name]
        assert got["spec"] == crd["spec"] and got.keys() == crd.keys()
        assert got["metadata"]["name"] == name
        assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        for key, value in crd["metadata"].get("labels", {}).items():
            assert got["metadata"]["labels"][key] == value
        assert got["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crds_keep_false_drops_the_policy(render: Render) -> None:
    for crd in of_kind(render("--set", "crds.keep=false"), "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_crds_enabled_false_renders_none(render: Render) -> None:
    assert not of_kind(render("--set", "crds.enabled=false"), "CustomResourceDefinition")


def test_jobqueue_crd_conventions() -> None:
    crd = canonical_crds()["jobqueues.skiplock.io"]
    assert crd["spec"]["group"] == "skiplock.io" and crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == "JobQueue" and "jq" in crd["spec"]["names"]["shortNames"]
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == ["v1alpha1"]


def test_jobqueue_from_values_is_accepted_by_the_crd(render: Render) -> None:
    docs = render("-f", str(CHART / "ci" / "jobqueue-values.yaml"))
    jobqueue = only(docs, "JobQueue")
    assert jobqueue["metadata"] == {**jobqueue["metadata"], "name": "emails", "namespace": NAMESPACE}
    assert "app.kubernetes.io/name" not in jobqueue["metadata"]["labels"]
    assert problems(canonical_crds()["jobqueues.skiplock.io"], jobqueue) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda spec: spec.pop("handler"), "handler"),
        (lambda spec: spec["scaling"].update(minReplicas=5, maxReplicas=2), "minReplicas"),
        (lambda spec: spec.update(heartbeatSeconds=100), "heartbeat"),
        (lambda spec: spec.update(concurrency="ten"), "concurrency"),
    ],
    ids=["missing-handler", "min-above-max", "heartbeat-over-half-lease", "wrong-type"],
)
def test_the_crd_check_rejects_bad_jobqueues(render: Render, change: Any, expected: str) -> None:
    """The offline check is not vacuous: it catches schema and CEL violations."""
    jobqueue = copy.deepcopy(only(render("-f", str(CHART / "ci" / "jobqueue-values.yaml")), "JobQueue"))
    change(jobqueue["spec"])
    found = problems(canonical_crds()["jobqueues.skiplock.io"], jobqueue)
    assert found and expected.lower() in " ".join(found).lower(), found


def test_jobqueue_enabled_without_spec_fails(template: Any) -> None:
    proc = template("--set", "jobQueue.enabled=true")
    assert proc.returncode != 0 and "jobQueue.spec is required" in proc.stderr


@pytest.mark.parametrize(("scope", "kind"), [("cluster", "ClusterKopfPeering"), ("namespace", "KopfPeering")])
def test_peering_object_is_accepted_by_the_peering_crd(render: Render, scope: str, kind: str) -> None:
    peering = only(render("--set", "operator.replicas=2", "--set", f"rbac.scope={scope}"), kind)
    crds = [crd for crd in canonical_crds().values() if crd["spec"]["names"]["kind"] == kind]
    assert len(crds) == 1, f"no CRD for {kind} in crds/"
    assert problems(crds[0], peering) == []
    assert ("namespace" in peering["metadata"]) == (crds[0]["spec"]["scope"] == "Namespaced")


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(path: Path) -> None:
    crds = {crd["spec"]["names"]["kind"]: crd for crd in canonical_crds().values()}
    for doc in load_all(path):
        doc.setdefault("metadata", {}).setdefault("namespace", "default")  # kubectl apply -n supplies it
        if doc["kind"] in crds:
            assert problems(crds[doc["kind"]], doc) == [], f"{path.name}: {doc['metadata']['name']}"
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"jobqueue.yaml", "secret.yaml"} <= names


@pytest.mark.parametrize(
    "spec",
    [
        {"app": "shop.tasks:app", "queues": ["emails", "reports"]},
        {"app": "shop.tasks:app", "handler": "shop.jobs:fallback", "queue": "emails"},
        {"handler": "shop.jobs:run", "queue": "emails", "replicas": 3, "operatorDsnSecretRef": {"name": "owner"}},
    ],
    ids=["app-and-queues", "app-with-catch-all-handler", "manual-replicas-and-operator-dsn"],
)
def test_task_model_jobqueues_from_values_are_accepted(render: Render, spec: dict[str, Any]) -> None:
    base = {"image": "ghcr.io/example/shop@sha256:" + "b" * 64, "dsnSecretRef": {"name": "db"}}
    args = ["--set", "jobQueue.enabled=true", "--set-json", f"jobQueue.spec={json.dumps({**base, **spec})}"]
    jobqueue = only(render(*args), "JobQueue")
    crd = canonical_crds()["jobqueues.skiplock.io"]
    assert problems(crd, jobqueue) == []
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    stored = apply_defaults(schema, copy.deepcopy({"spec": jobqueue["spec"]}))["spec"]
    assert stored["leaseSeconds"] == 60  # the API server fills in defaults ...
    assert "heartbeatSeconds" not in stored and "recoverSeconds" not in stored  # ... but these follow the lease


def test_a_jobqueue_without_app_or_handler_is_refused_by_the_crd(render: Render) -> None:
    spec = {"image": "i", "dsnSecretRef": {"name": "db"}, "queue": "emails"}
    jobqueue = only(
        render("--set", "jobQueue.enabled=true", "--set-json", f"jobQueue.spec={json.dumps(spec)}"), "JobQueue"
    )
    found = problems(canonical_crds()["jobqueues.skiplock.io"], jobqueue)
    assert any("set app" in p for p in found), found
