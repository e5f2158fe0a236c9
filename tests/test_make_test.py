"""``make test`` itself, run as a developer runs it (lint is its own gate, ``make lint``: here ``MAKE=true`` leaves
that sub-make out): it says which PostgreSQL it uses, without its password; its temporary files go to one private
folder, removed at the end; without npm it says so and goes on, except under ``CI=true``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parents[1]


def make_test(tmp_path: Path, dsn: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``make test`` with a PATH that has no npm (a few tools the recipe needs, nothing else)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("bash", "sh", "mktemp", "chmod", "rm", "dirname", "true"):
        found = shutil.which(name)
        assert found, name
        (tools / name).symlink_to(found)
    make = shutil.which("make")
    assert make
    (tmp_path / "tmp").mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "MAKE")) and k != "CI"}
    base |= {"PATH": str(tools), "TMPDIR": str(tmp_path / "tmp"), "K8S_TOOLS_DIR": str(tmp_path / "no-k8s-tools")}
    return subprocess.run(
        [make, "--no-print-directory", "test", "MAKE=true", "PYTEST_ARGS=tests/unit/test_backoff.py"],
        cwd=ROOT, env=base | {"SKIPLOCK_TEST_DSN": dsn} | env, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip


def test_make_test_says_which_postgresql_and_leaves_no_temporary_files(pg_dsn: str, tmp_path: Path) -> None:
    out = make_test(tmp_path, pg_dsn)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "get-k8s-tools: npm is required" in out.stderr
    assert "make test: going on without helm and kubectl: the chart tests skip with the install hint" in out.stderr
    assert "make test: PostgreSQL at SKIPLOCK_TEST_DSN=" in out.stdout, out.stdout
    password = conninfo_to_dict(pg_dsn).get("password")
    assert not password or password not in out.stdout + out.stderr
    folder = re.search(r"^make test: temporary files in (\S+), removed at the end$", out.stdout, re.M)
    assert folder and Path(folder[1]).parent == tmp_path / "tmp", out.stdout
    assert re.search(r"^\d+ passed", out.stdout, re.M), out.stdout
    assert list((tmp_path / "tmp").iterdir()) == [], "nothing is left in the temporary folder"


def test_under_ci_a_missing_helm_is_a_failure(pg_dsn: str, tmp_path: Path) -> None:
    out = make_test(tmp_path, pg_dsn, CI="true")
    assert out.returncode != 0
    assert "make test: helm and kubectl are required under CI=true" in out.stderr, out.stderr
    assert "passed" not in out.stdout
