"""A script or command of the repository run in a child process as a user runs it: with this interpreter, and
without the tests' own settings (``SKIPLOCK_*`` and any other names given) in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def user_env(drop: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment without the ``SKIPLOCK_`` settings and the names in ``drop``."""
    dropped = set(drop)
    return {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k not in dropped}


def run_python(
    args: list[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (``user_env()`` unless ``env`` is given), its output captured; a non-zero exit does not raise."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=dict(user_env() if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
