"""The operator's import rule (issue 42): skiplock_operator imports only skiplock's public modules, skiplock.store,
settings, knobs, migrate and schedule. import-linter enforces the contract in pyproject.toml (`make lint`: what it
forbids, indirect imports included); this test is the allow-list: a module of skiplock added later is in neither
list, and an operator module that imports it directly fails here."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "The operator imports only skiplock's public modules, skiplock.store, settings, knobs, migrate, schedule"
PUBLIC_HELPERS = {"skiplock.listener", "skiplock.backoff", "skiplock.exporter"}
"""Documented public modules (docs/reference/python.md) the operator uses as any program may."""
ALLOWED = {"skiplock.store", "skiplock.settings", "skiplock.knobs", "skiplock.migrate", "skiplock.schedule"}


def contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"] == CONTRACT)


def imported_skiplock_modules() -> dict[str, set[str]]:
    """Each skiplock module the operator's code imports directly -> the operator's files that do."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "operator" / "skiplock_operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name == "skiplock" or name.startswith("skiplock."):
                    found.setdefault(".".join(name.split(".")[:2]), set()).add(path.name)
    return found


def test_the_operator_imports_only_allowed_skiplock_modules() -> None:
    imported = imported_skiplock_modules()
    assert "skiplock.store" in imported  # the scan sees the imports
    allowed = {"skiplock"} | ALLOWED | PUBLIC_HELPERS
    assert {m: files for m, files in imported.items() if m not in allowed} == {}


def test_the_contract_forbids_none_of_the_allowed_modules() -> None:
    forbidden = set(contract()["forbidden_modules"])
    assert not forbidden & (ALLOWED | PUBLIC_HELPERS)
    assert {"skiplock.worker", "skiplock.queue", "skiplock.metrics", "skiplock.sql"} <= forbidden


def test_the_contract_is_strict() -> None:
    c = contract()
    assert c["type"] == "forbidden" and c["source_modules"] == ["skiplock_operator"]
    assert "ignore_imports" not in c


def test_the_public_helpers_the_operator_uses_are_documented() -> None:
    reference = (ROOT / "docs" / "reference" / "python.md").read_text(encoding="utf-8")
    for module in PUBLIC_HELPERS:
        assert f"`{module}`" in reference, module
