"""RBAC is least-privilege: no wildcard, and exactly the verbs the operator uses, in both scopes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chartlib import NAMESPACE, SCENARIOS, Render, of_kind, only

# (apiGroup, resource) -> verbs. Every entry is used by skiplock_operator (k8s.py) or by kopf itself
# (finalizers and progress annotations patched on jobqueues, Events, peering keep-alives).
COMMON = {
    ("skiplock.io", "jobqueues"): {"get", "list", "watch", "patch"},
    ("skiplock.io", "jobqueues/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "secrets"): {"get"},
    ("", "events"): {"create"},
}
PEERING = {"get", "list", "watch", "patch"}


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


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.name)
def test_no_wildcards_anywhere(render: Render, values: Path) -> None:
    docs = render("-f", str(values))
    assert roles(docs), "no Role or ClusterRole rendered"
    for role in roles(docs):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                wild = [item for item in rule.get(key, []) if "*" in item]
                assert not wild, f"wildcard in {role['kind']} {rule}"


def test_cluster_scope_grants_exactly_what_the_operator_uses(render: Render) -> None:
    docs = render()
    assert not of_kind(docs, "Role")
    role = only(docs, "ClusterRole")
    assert grants(role) == {**COMMON, ("kopf.dev", "clusterkopfpeerings"): PEERING}
    binding = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sl-skiplock", "namespace": NAMESPACE}]


def test_namespace_scope_grants_exactly_what_the_operator_uses(render: Render) -> None:
    docs = render("--set", "rbac.scope=namespace")
    role = only(docs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role) == {**COMMON, ("kopf.dev", "kopfpeerings"): PEERING}


def test_secrets_are_never_listed_or_watched(render: Render) -> None:
    for scope in ("cluster", "namespace"):
        for role in roles(render("--set", f"rbac.scope={scope}")):
            assert grants(role)[("", "secrets")] == {"get"}


def test_rbac_create_false_renders_no_rbac(render: Render) -> None:
    docs = render("--set", "rbac.create=false")
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert not of_kind(docs, kind)
