"""RBAC is least-privilege per install mode: no wildcard, exactly the verbs the operator uses, Secrets readable
only in the namespaces it watches (no cluster-wide Secret access unless cluster mode is chosen), and the
aggregated JobQueue roles for the built-in view/edit/admin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chartlib import CHART, NAMESPACE, SCENARIOS, Render, Template, of_kind, only

# (apiGroup, resource) -> verbs. Every entry is used by skiplock_operator (k8s.py) or by kopf itself
# (finalizers and progress annotations patched on jobqueues, Events, peering keep-alives); deployments are
# listed and watched for drift correction of the Deployments the operator owns.
COMMON = {
    ("skiplock.io", "jobqueues"): {"get", "list", "watch", "patch"},
    ("skiplock.io", "jobqueues/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "secrets"): {"get"},
    ("", "events"): {"create", "patch"},
    ("", "pods"): {"get", "list", "patch"},  # busy-pod-safe scale-in (rbac.drainPods, on by default)
}
PEERING = {"get", "list", "watch", "patch"}
NAMESPACED = {**COMMON, ("kopf.dev", "kopfpeerings"): PEERING}
CLUSTER = {**COMMON, ("kopf.dev", "clusterkopfpeerings"): PEERING}
VIEW = {("skiplock.io", r): {"get", "list", "watch"} for r in ("jobqueues", "jobqueues/status", "jobqueues/scale")}
EDIT = {
    ("skiplock.io", "jobqueues"): {"create", "update", "patch", "delete", "deletecollection"},
    ("skiplock.io", "jobqueues/scale"): {"update", "patch"},
}
MULTI = ("--set", "rbac.namespaces={team-a,team-b}")
CLUSTER_MODE = ("--set", "rbac.scope=cluster")
SA = {"kind": "ServiceAccount", "name": "sl-skiplock", "namespace": NAMESPACE}


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule keys {set(rule)}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(docs, "ClusterRole") + of_kind(docs, "Role")


def by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in of_kind(docs, kind)}


def operator_args(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.name)
def test_no_wildcards_anywhere(render: Render, values: Path) -> None:
    docs = render("-f", str(values))
    assert roles(docs), "no Role or ClusterRole rendered"
    for role in roles(docs):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                wild = [item for item in rule.get(key, []) if "*" in item]
                assert not wild, f"wildcard in {role['kind']} {rule}"


def test_the_default_is_namespaced_mode(render: Render) -> None:
    docs = render()
    role = only(docs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role) == NAMESPACED
    binding = only(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sl-skiplock"}
    assert binding["subjects"] == [SA]
    assert not of_kind(docs, "ClusterRoleBinding")
    args = operator_args(docs)
    assert [a for a in args if a.startswith("--namespace") or a == "--all-namespaces"] == [f"--namespace={NAMESPACE}"]


def test_multi_namespace_mode_has_one_role_per_tenant(render: Render) -> None:
    docs = render(*MULTI)
    found = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in of_kind(docs, "Role")}
    assert set(found) == {("team-a", "sl-skiplock"), ("team-b", "sl-skiplock")}  # not the release namespace
    for role in found.values():
        assert grants(role) == NAMESPACED
    bindings = {b["metadata"]["namespace"]: b for b in of_kind(docs, "RoleBinding")}
    assert set(bindings) == {"team-a", "team-b"}
    for binding in bindings.values():
        assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["name"] == "sl-skiplock"
        assert binding["subjects"] == [SA]  # the ServiceAccount stays in the release namespace
    args = operator_args(docs)
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args


def test_multi_namespace_mode_refuses_a_namespace_twice(template: Template) -> None:
    proc = template("--set", "rbac.namespaces={team-a,team-a}")
    assert proc.returncode != 0 and "/rbac/namespaces" in proc.stderr


def test_cluster_mode_grants_exactly_what_the_operator_uses(render: Render) -> None:
    docs = render(*CLUSTER_MODE)
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    role = by_name(docs, "ClusterRole")["sl-skiplock"]
    assert grants(role) == CLUSTER
    binding = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sl-skiplock"}
    assert binding["subjects"] == [SA]
    assert "--all-namespaces" in operator_args(docs)
    assert not [a for a in operator_args(docs) if a.startswith("--namespace")]


@pytest.mark.parametrize("mode", [(), MULTI], ids=["namespaced", "multi-namespace"])
def test_no_cluster_role_reads_secrets_or_deployments_outside_cluster_mode(
    render: Render, mode: tuple[str, ...]
) -> None:
    docs = render(*mode)
    assert not of_kind(docs, "ClusterRoleBinding"), "the operator is bound to nothing cluster-wide"
    for role in of_kind(docs, "ClusterRole"):
        granted = {resource for _, resource in grants(role)}
        assert granted <= {"jobqueues", "jobqueues/status", "jobqueues/scale"}, role["metadata"]["name"]


@pytest.mark.parametrize("mode", [(), MULTI, CLUSTER_MODE], ids=["namespaced", "multi-namespace", "cluster"])
def test_secrets_are_never_listed_or_watched(render: Render, mode: tuple[str, ...]) -> None:
    for role in roles(render(*mode)):
        assert grants(role).get(("", "secrets"), {"get"}) == {"get"}


@pytest.mark.parametrize("mode", [(), MULTI, CLUSTER_MODE], ids=["namespaced", "multi-namespace", "cluster"])
def test_watching_secrets_is_an_explicit_choice(render: Render, mode: tuple[str, ...]) -> None:
    """Secret list/watch (instant DSN rotation) only with rbac.watchSecrets, and the operator is told so."""
    for watch, verbs in ((False, {"get"}), (True, {"get", "list", "watch"})):
        docs = render(*mode, "--set", f"rbac.watchSecrets={str(watch).lower()}")
        operator_roles = [r for r in roles(docs) if "jobqueues-" not in r["metadata"]["name"]]
        assert operator_roles
        for role in operator_roles:
            assert grants(role)[("", "secrets")] == verbs
        env = {
            e["name"]: e.get("value")
            for e in only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["SKIPLOCK_OPERATOR_WATCH_SECRETS"] == str(watch).lower()
        assert env["SKIPLOCK_OPERATOR_WATCH_DEPLOYMENTS"] == "true"  # deployments list/watch are always granted


@pytest.mark.parametrize("mode", [(), MULTI, CLUSTER_MODE], ids=["namespaced", "multi-namespace", "cluster"])
def test_aggregated_jobqueue_roles(render: Render, mode: tuple[str, ...]) -> None:
    cluster_roles = by_name(render(*mode), "ClusterRole")
    view, edit = cluster_roles["sl-skiplock-jobqueues-view"], cluster_roles["sl-skiplock-jobqueues-edit"]
    assert grants(view) == VIEW and grants(edit) == EDIT
    for role in ("view", "edit", "admin"):  # whoever may edit or administer a namespace may also read
        assert view["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{role}"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]


def test_aggregated_roles_can_be_left_to_another_release(render: Render) -> None:
    names = set(by_name(render("--set", "rbac.aggregatedRoles=false"), "ClusterRole"))
    assert not {n for n in names if "jobqueues" in n}


def test_namespaces_with_cluster_scope_is_refused(template: Template) -> None:
    proc = template(*CLUSTER_MODE, *MULTI)
    assert proc.returncode != 0 and "rbac.namespaces" in proc.stderr


@pytest.mark.parametrize("bad", ["Team-A", "a_b", "x" * 64])
def test_namespace_names_are_checked_by_the_schema(template: Template, bad: str) -> None:
    proc = template("--set", f"rbac.namespaces={{{bad}}}")
    assert proc.returncode != 0 and "namespaces" in proc.stderr


@pytest.mark.parametrize("mode", [(), MULTI, CLUSTER_MODE], ids=["namespaced", "multi-namespace", "cluster"])
def test_rbac_create_false_renders_no_rbac(render: Render, mode: tuple[str, ...]) -> None:
    docs = render("--set", "rbac.create=false", *mode)
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert not of_kind(docs, kind)


def test_scenarios_cover_every_mode() -> None:
    names = {p.name for p in SCENARIOS}
    assert {"default-values.yaml", "multi-namespace-values.yaml", "cluster-values.yaml"} <= names
    assert (CHART / "ci" / "multi-namespace-values.yaml").read_text().count("- team-") == 2


@pytest.mark.parametrize("mode", [(), MULTI, CLUSTER_MODE], ids=["namespaced", "multi-namespace", "cluster"])
def test_pod_access_only_with_drain_pods(render: Render, mode: tuple[str, ...]) -> None:
    """Scale-in's pod access is get/list/patch with rbac.drainPods, none at all without, and the operator is told."""
    for drain, verbs in ((True, {"get", "list", "patch"}), (False, None)):
        docs = render(*mode, "--set", f"rbac.drainPods={str(drain).lower()}")
        operator_roles = [r for r in roles(docs) if "jobqueues-" not in r["metadata"]["name"]]
        assert operator_roles
        for role in operator_roles:
            assert grants(role).get(("", "pods")) == verbs
        env = {
            e["name"]: e.get("value")
            for e in only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["SKIPLOCK_OPERATOR_DRAIN_PODS"] == str(drain).lower()
