"""`skiplock demo` on its embedded PostgreSQL: no platformdirs warning leaks out, and with --keep the server stays
up and the follow-up commands it prints (with the DSN) work as typed, the stop command included."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from support.ci import missing
from support.pg import wait_for


@pytest.fixture(autouse=True)
def _embedded_postgres_installed() -> None:
    try:
        import pgserver  # noqa: F401
    except ImportError:
        missing("pgserver not installed: pip install -e '.[demo]' (make install does it)")


def test_kept_demo_prints_commands_that_work_as_typed(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SKIPLOCK_") and k not in ("DATABASE_URL", "XDG_RUNTIME_DIR")
    }
    env["TMPDIR"] = str(tmp_path)  # a private data folder for this run's embedded server
    # as `make demo` runs it: the virtualenv's bin first on the demo's PATH, but not on the user's shell's (where
    # the printed commands are pasted), and not activated
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d != venv_bin)
    env.pop("VIRTUAL_ENV", None)
    demo = subprocess.run(
        [sys.executable, "-m", "skiplock", "demo", "--jobs", "60", "--workers", "1", "--concurrency", "4", "--keep"],
        cwd=tmp_path,
        env=env | {"PATH": venv_bin + os.pathsep + env["PATH"]},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = demo.stdout + demo.stderr
    pid_match = re.search(r"^stop it with: (kill (\d+))", demo.stdout, re.M)
    try:
        assert demo.returncode == 0, output
        assert "RuntimeDirWarning" not in output and "XDG_RUNTIME_DIR" not in output
        assert re.search(r"^the embedded PostgreSQL keeps running: SKIPLOCK_DSN=\S+", demo.stdout, re.M), output
        assert "\r" not in demo.stdout, "no progress-bar frames into a file or pipe"
        hints = re.findall(r"^  (\S.* --schema skiplock_demo)$", demo.stdout, re.M)
        assert len(hints) == 2 and any(" failed " in h for h in hints) and any(" stats " in h for h in hints)
        assert not hints[0].startswith("skiplock "), "not on the user's PATH: the command is named by its path"
        for hint in hints:
            ran = subprocess.run(
                ["bash", "-c", hint], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
            )
            assert ran.returncode == 0, f"{hint}\n{ran.stdout}{ran.stderr}"
            assert "queue" in ran.stdout, ran.stdout
        failed = subprocess.run(
            ["bash", "-c", next(h for h in hints if " failed " in h) + " --json"],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        )
        [show] = re.findall(r"^  (\S.* --schema skiplock_demo) ID ", demo.stdout, re.M)
        shown = subprocess.run(
            ["bash", "-c", f"{show} {json.loads(failed.stdout)[0]['id']}"],
            check=False,
            env=env,
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0 and 'demo.py", line ' in shown.stdout, shown.stdout + shown.stderr
        assert pid_match, output
        subprocess.run(["bash", "-c", pid_match[1]], check=True)
        wait_for(lambda: not psutil.pid_exists(int(pid_match[2])), timeout=30, what="the kept server to stop")
    finally:
        if pid_match and psutil.pid_exists(int(pid_match[2])):
            psutil.Process(int(pid_match[2])).kill()


def test_demo_without_keep_stops_its_server_and_says_how_to_keep_it(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SKIPLOCK_") and k not in ("DATABASE_URL", "XDG_RUNTIME_DIR")
    }
    env["TMPDIR"] = str(tmp_path)
    demo = subprocess.run(
        [sys.executable, "-m", "skiplock", "demo", "--jobs", "30", "--workers", "1", "--concurrency", "4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "RuntimeDirWarning" not in demo.stdout + demo.stderr
    assert "run skiplock demo --keep" in demo.stdout
    pgdata = tmp_path / f"skiplock-demo-{os.getuid()}" / "pgdata"
    assert not (pgdata / "postmaster.pid").exists(), "the embedded server was stopped"
