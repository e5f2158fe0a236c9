"""The operator's import rule (issue 42): skiplock_operator imports only skiplock's public modules, skiplock.store,
settings, knobs, migrate and schedule. import-linter enforces the contract in pyproject.toml (`make lint`); this test
keeps the contract an allow-list: every module of skiplock is either allowed here or forbidden there."""

from __future__ import annotations

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


def skiplock_modules() -> set[str]:
    package = ROOT / "worker" / "skiplock"
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    return {f"skiplock.{name}" for name in names}


def test_every_skiplock_module_is_allowed_or_forbidden_to_the_operator() -> None:
    forbidden = set(contract()["forbidden_modules"])
    allowed = ALLOWED | PUBLIC_HELPERS
    assert not forbidden & allowed
    assert skiplock_modules() - forbidden - allowed == set(), "a new module: allow it here or forbid it there"
    assert (allowed | forbidden) - skiplock_modules() == set(), "a module that no longer exists"


def test_the_contract_is_strict() -> None:
    c = contract()
    assert c["type"] == "forbidden" and c["source_modules"] == ["skiplock_operator"]
    assert "ignore_imports" not in c


def test_the_public_helpers_the_operator_uses_are_documented() -> None:
    reference = (ROOT / "docs" / "reference" / "python.md").read_text(encoding="utf-8")
    for module in PUBLIC_HELPERS:
        assert f"`{module}`" in reference, module
