"""Chart tests with the real helm binary (tools/get-k8s-tools.sh puts it in .cache/k8s-tools/helm/).

No cluster is needed: `helm lint` and `helm template` run offline, and the rendered objects are validated
with kubernetes-validate (built-in kinds) and with the chart's own CRD schema (JobQueue). Without helm the
tests skip, except under CI=true, where a missing binary is a failure.
"""

from __future__ import annotations

import functools
import subprocess
from typing import Any

import pytest
import yaml

from chart.chartlib import CHART, KUBE_VERSION, NAMESPACE, RELEASE, Render, Template, find_helm, run_helm
from support.ci import missing


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        reason = "helm not found in .cache/k8s-tools/helm/ or on PATH (run: bash tools/get-k8s-tools.sh)"
        missing(reason)
    return path


@pytest.fixture(scope="session")
def template(helm: str) -> Template:
    """`helm template` of the chart with extra arguments (-f, --set ...); returns the finished process."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_helm(
            helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args
        )

    return run


@pytest.fixture(scope="session")
def render(template: Template) -> Render:
    """Rendered objects for the given helm arguments; cached per argument list, so treat them as read-only."""

    @functools.cache
    def rendered(*args: str) -> str:
        proc = template(*args)
        if proc.returncode != 0:
            raise AssertionError(f"helm template {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def run(*args: str) -> list[dict[str, Any]]:
        return [doc for doc in yaml.safe_load_all(rendered(*args)) if doc]

    return run


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "image: replays the Dockerfile's install steps in a fresh virtualenv")
