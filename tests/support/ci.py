"""What a test does when something it needs is missing: fail under CI (``CI=true``), skip elsewhere."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str) -> NoReturn:
    """A missing tool or service is a failure in CI, a skip on a developer's machine."""
    if in_ci():
        pytest.fail(f"{reason}; CI=true requires it")
    pytest.skip(reason)
