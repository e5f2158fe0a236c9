"""Every pod the chart renders meets the `restricted` Pod Security Standard and runs on a read-only root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chartlib import SCENARIOS, Render

POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet"}


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for doc in docs:
        if doc["kind"] not in POD_KINDS:
            continue
        spec = doc["spec"]
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if doc["kind"] != "Pod":
            spec = spec["template"]["spec"]
        out.append((f"{doc['kind']}/{doc['metadata']['name']}", spec))
    return out


def effective(pod: dict[str, Any], container: dict[str, Any], key: str) -> Any:
    ctx = container.get("securityContext", {})
    return ctx[key] if key in ctx else pod.get("securityContext", {}).get(key)


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.name)
def test_pods_are_restricted(render: Render, values: Path) -> None:
    specs = pod_specs(render("-f", str(values)))
    assert specs, "no pod spec rendered"
    for name, pod in specs:
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"), name
        for volume in pod.get("volumes", []):
            assert "hostPath" not in volume, f"{name}: hostPath volume"
        for container in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{container['name']}"
            ctx = container.get("securityContext", {})
            assert effective(pod, container, "runAsNonRoot") is True, where
            user = effective(pod, container, "runAsUser")
            assert isinstance(user, int) and user > 0, f"{where}: runAsUser {user}"
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert not ctx.get("privileged"), where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not ctx.get("capabilities", {}).get("add"), where
            seccomp = effective(pod, container, "seccompProfile") or {}
            assert seccomp.get("type") in {"RuntimeDefault", "Localhost"}, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            for port in container.get("ports", []):
                assert "hostPort" not in port, where


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.name)
def test_tmp_is_a_writable_emptydir(render: Render, values: Path) -> None:
    for name, pod in pod_specs(render("-f", str(values))):
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{name}: no /tmp mount under a read-only root"
            assert "emptyDir" in volumes[mounts["/tmp"]], f"{name}: /tmp is not an emptyDir"


def test_resources_and_probes_everywhere(render: Render) -> None:
    for name, pod in pod_specs(render()):
        for container in pod["containers"]:
            assert container["resources"]["requests"], name
            assert container["livenessProbe"] and container["readinessProbe"], name
