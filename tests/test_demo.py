"""`skiplock demo` on its embedded PostgreSQL: no platformdirs warning leaks out, and with --keep the server stays
up and the follow-up commands it prints (with the DSN) work as typed, the stop command included."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from support.ci import missing
from support.pg import drop_schema, wait_for
from support.scripts import run_python, user_env


@pytest.fixture(autouse=True)
def _embedded_postgres_installed() -> None:
    try:
        import pgserver  # noqa: F401
    except ImportError:
        missing("pgserver not installed: pip install -e '.[demo]' (make install does it)")


def _demo_env(tmp_path: Path) -> dict[str, str]:
    env = user_env(drop=("DATABASE_URL", "XDG_RUNTIME_DIR"))
    env["TMPDIR"] = str(tmp_path)  # a private data folder for this run's embedded server
    return env


@contextlib.contextmanager
def _draining_demo(tmp_path: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A demo of 20,000 jobs on two workers, in its own process group as a terminal runs it, given once it prints its
    first progress line (the workers are draining); killed with its group if it still runs at the end."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "skiplock", "demo", "--jobs", "20000", "--workers", "2", "--concurrency", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if line.startswith("["):
                break
        else:
            pytest.fail(f"the demo ended before it drained: {demo.wait()} {demo.stderr and demo.stderr.read()}")
        yield demo
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)


def _ctrl_c(demo: subprocess.Popen[str]) -> str:
    """As a terminal's Ctrl-C does: SIGINT to the whole foreground process group (the demo, its workers, the server);
    the demo ends with 130 and no traceback; returns its last line on stderr."""
    os.killpg(demo.pid, signal.SIGINT)
    out, err = demo.communicate(timeout=120)
    assert demo.returncode == 130, out + err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_kept_demo_prints_commands_that_work_as_typed(tmp_path: Path) -> None:
    env = _demo_env(tmp_path)
    # as `make demo` runs it: the virtualenv's bin first on the demo's PATH, but not on the user's shell's (where
    # the printed commands are pasted), and not activated
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d != venv_bin)
    env.pop("VIRTUAL_ENV", None)
    demo = run_python(
        ["-m", "skiplock", "demo", "--jobs", "60", "--workers", "1", "--concurrency", "4", "--keep"],
        env=env | {"PATH": venv_bin + os.pathsep + env["PATH"]},
        cwd=tmp_path,
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
    demo = run_python(
        ["-m", "skiplock", "demo", "--jobs", "30", "--workers", "1", "--concurrency", "4"],
        env=_demo_env(tmp_path),
        cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "RuntimeDirWarning" not in demo.stdout + demo.stderr
    assert "run skiplock demo --keep" in demo.stdout
    pgdata = tmp_path / f"skiplock-demo-{os.getuid()}" / "pgdata"
    assert not (pgdata / "postmaster.pid").exists(), "the embedded server was stopped"


def test_ctrl_c_stops_the_workers_and_the_embedded_server_and_says_so(tmp_path: Path) -> None:
    pgdata = tmp_path / f"skiplock-demo-{os.getuid()}" / "pgdata"
    with _draining_demo(tmp_path, _demo_env(tmp_path)) as demo:
        spawned = psutil.Process(demo.pid).children(recursive=True)
        assert len([p for p in spawned if "worker" in p.cmdline()]) == 2, spawned
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        last = _ctrl_c(demo)
    assert last == "demo stopped (Ctrl-C): the workers and the embedded PostgreSQL were stopped"
    wait_for(
        lambda: not any(psutil.pid_exists(p.pid) for p in spawned) and not psutil.pid_exists(postmaster),
        timeout=30,
        what="the workers and the embedded server to be gone",
    )
    assert not (pgdata / "postmaster.pid").exists(), "the embedded server was stopped"


def test_ctrl_c_on_a_demo_on_the_given_database_stops_its_workers_and_says_where_its_jobs_stay(
    pg_dsn: str, tmp_path: Path
) -> None:
    with _draining_demo(tmp_path, _demo_env(tmp_path) | {"SKIPLOCK_DSN": pg_dsn}) as demo:
        spawned = psutil.Process(demo.pid).children(recursive=True)
        assert len(spawned) == 2, spawned
        last = _ctrl_c(demo)
    assert last == (
        "demo stopped (Ctrl-C): the workers were stopped; the demo's jobs stay in schema 'skiplock_demo' until the "
        "next run"
    )
    wait_for(lambda: not any(psutil.pid_exists(p.pid) for p in spawned), timeout=30, what="the workers to be gone")
    drop_schema(pg_dsn, "skiplock_demo")


def test_the_demo_without_its_extra_says_how_to_install_it(tmp_path: Path) -> None:
    # pgserver made unimportable in the child, as it is where skiplock was installed without [demo]
    code = "import sys; sys.modules['pgserver'] = None; from skiplock.cli import main; sys.exit(main(['demo']))"
    out = run_python(["-c", code], env=_demo_env(tmp_path), timeout=60)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr == (
        "skiplock: error: demo: no DSN given and the embedded PostgreSQL is not installed: "
        "pip install 'skiplock[demo]' (make demo does it), or pass --dsn\n"
    )
