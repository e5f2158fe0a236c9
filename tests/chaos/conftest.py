"""A private PostgreSQL for the fault suite (it stops, restarts and crashes it), and the invariants' summary."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.chaos import PrivatePostgres, private_postgres
from support.ci import missing

SUMMARY: list[str] = []
"""Lines the fault tests want shown at the end of the run (each invariant with its figure)."""


@pytest.fixture(scope="session")
def chaos_pg() -> Iterator[PrivatePostgres]:
    try:
        cm = private_postgres()
        server = cm.__enter__()
    except Exception as exc:  # no binaries, no unprivileged user: say so (an error in CI, a skip elsewhere)
        missing(f"cannot start a private PostgreSQL for the fault suite: {exc}")
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SUMMARY:
        terminalreporter.section("skiplock fault suite: invariants")
        for line in SUMMARY:
            terminalreporter.write_line(line)
