"""docs/helm.md is what tools/gen-helm-docs.py writes from values.yaml and values.schema.json, and names every key."""

from __future__ import annotations

import subprocess
import sys

import yaml

from chart.chartlib import CHART, ROOT

SCRIPT = ROOT / "tools" / "gen-helm-docs.py"
DOC = ROOT / "docs" / "helm.md"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


def test_committed_values_reference_is_current() -> None:
    proc = run("--check")
    assert proc.returncode == 0, proc.stderr


def test_every_top_level_key_and_the_new_options_have_a_row() -> None:
    text = DOC.read_text(encoding="utf-8")
    for key in yaml.safe_load((CHART / "values.yaml").read_text()):
        assert f"| `{key}` |" in text, key
    for key in (
        "rbac.namespaces",
        "policy.allowedImages",
        "policy.admission.enabled",
        "networkPolicy.enabled",
        "workerDefaults.resources.requests.cpu",
    ):
        assert f"| `{key}` |" in text, key
    assert '| `rbac.scope` | string (`namespace` \\| `cluster`) | `"namespace"` |' in text
