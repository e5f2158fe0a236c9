"""Shared helpers of the chart tests: where the chart and helm are, and how to run helm."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "skiplock"
SCENARIOS = sorted(CHART.glob("ci/*-values.yaml"))
KUBE_VERSION = "1.35.0"
RELEASE = "sl"
NAMESPACE = "skiplock-system"
HELM_HOME = Path("/tmp/skiplock-helm")

Render = Callable[..., list[dict[str, Any]]]
"""Rendered objects for helm arguments (-f, --set ...)."""
Template = Callable[..., subprocess.CompletedProcess[str]]
"""`helm template` for helm arguments, returning the finished process."""


def find_helm() -> str | None:
    """helm from tools/get-k8s-tools.sh's cache, else from PATH."""
    cached = ROOT / ".cache" / "k8s-tools" / "helm" / "helm"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("helm")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm offline with private cache/config folders, so no user setting leaks in."""
    homes = {f"HELM_{kind.upper()}_HOME": str(HELM_HOME / kind) for kind in ("cache", "config", "data")}
    env = {**os.environ, **homes}
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
