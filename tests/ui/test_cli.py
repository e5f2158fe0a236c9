"""``skiplock ui`` and ``skiplock failed --group`` as a user runs them, the fingerprint stored only on failure,
the wheel's assets, and the worker and producer free of the UI's dependencies."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import psycopg
from psycopg import sql

from skiplock import Queue, Settings
from skiplock.store.statements import Failure
from support.http import status_of
from ui.conftest import TOKEN, add_failed

ROOT = Path(__file__).resolve().parents[2]


def env_for(dsn: str, schema: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    return env | {"SKIPLOCK_DSN": dsn, "SKIPLOCK_SCHEMA": schema} | extra


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_failed_group_prints_the_groups_the_ui_shows(pg_dsn: str, schema: str) -> None:
    add_failed(pg_dsn, schema, ["HTTPError: 503 for order 1", "HTTPError: 502 for order 22", "KeyError: 'x'"])
    env = env_for(pg_dsn, schema)
    table = cli("failed", "--group", env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["fingerprint", "jobs", "task", "first_seen", "last_seen", "error"]
    assert "2  send" in lines[2] and "HTTPError: <n> for order <n>" in lines[2]
    assert "KeyError: <str>" in lines[3]
    rows = json.loads(cli("failed", "--group", "--json", env=env).stdout)
    assert [(r["jobs"], r["normalised"]) for r in rows] == [
        (2, "HTTPError: <n> for order <n>"),
        (1, "KeyError: <str>"),
    ]


def test_failed_group_on_an_empty_queue(pg_dsn: str, schema: str) -> None:
    out = cli("failed", "--group", env=env_for(pg_dsn, schema))
    assert (out.returncode, out.stdout.strip()) == (0, "no failed jobs")


def test_skiplock_ui_serves_and_a_busy_port_is_a_clear_error(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"ops:{TOKEN}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = env_for(pg_dsn, schema)
    proc = subprocess.Popen(
        [sys.executable, "-m", "skiplock", "ui", "--port", str(port), "--token-file", str(token_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"on http://127.0.0.1:{port}/ (actions need the token)" in banner, banner
        deadline = time.monotonic() + 15
        while status_of(f"http://127.0.0.1:{port}/healthz") != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        assert status_of(f"http://127.0.0.1:{port}/queues") == 200
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/queues/mail/pause",
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["action"]["actor"] == "ops"
        busy = cli("ui", "--port", str(port), env=env)
        assert busy.returncode == 2
        assert (
            busy.stderr.strip() == f"skiplock: error: port {port} on 127.0.0.1 is already in use: stop what "
            "listens there or pass --port"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_skiplock_ui_refuses_an_unmigrated_schema_and_a_short_token(pg_dsn: str, tmp_path: Path) -> None:
    out = cli("ui", "--port", "0", env=env_for(pg_dsn, "never_migrated_ui"))
    assert out.returncode == 3 and "run 'skiplock migrate'" in out.stderr
    short = tmp_path / "token"
    short.write_text("short")
    out = cli("ui", "--token-file", str(short), env=env_for(pg_dsn, "never_migrated_ui"))
    assert out.returncode == 2 and "at least 16 characters" in out.stderr
    out = cli("ui", "--token-file", str(tmp_path / "missing"), env=env_for(pg_dsn, "never_migrated_ui"))
    assert out.returncode == 2 and "cannot read --token-file" in out.stderr


def test_the_fingerprint_is_stored_when_a_job_fails_and_never_on_success(
    queue: Queue, settings: Settings, pg_dsn: str, schema: str
) -> None:
    ids = list(queue.enqueue_many("default", [{}, {}], max_attempts=1))
    jobs = queue.claim("default", limit=2, worker="w")
    ok, bad = sorted(jobs, key=lambda j: j.id)
    queue.complete([ok], worker="w")
    queue.fail([Failure(bad, "RuntimeError: order 42 rejected", 0.0, True)], worker="w")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT id, status, failure_fingerprint, {s}.error_fingerprint(task, last_error) FROM {s}.jobs "
                "ORDER BY id"
            ).format(s=sql.Identifier(schema))
        ).fetchall()
    assert rows[0][:3] == (ids[0], "done", None)
    assert rows[1][1] == "failed" and rows[1][2] == rows[1][3] and len(rows[1][2]) == 16


def test_the_worker_and_the_producer_import_none_of_the_ui(tmp_path: Path) -> None:
    code = (
        "import sys, skiplock, skiplock.worker, skiplock.app, skiplock.queue, skiplock.cli\n"
        "ui = sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'jinja2', 'uvicorn', 'multipart')"
        " or m.startswith('skiplock.ui'))\n"
        "print(ui)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_the_wheel_ships_every_asset_of_the_ui(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    (wheel,) = tmp_path.glob("skiplock-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {f"skiplock/ui/templates/{p.name}" for p in (ROOT / "worker/skiplock/ui/templates").iterdir()}
    assert {
        "skiplock/ui/static/ui.js",
        "skiplock/ui/static/ui.css",
        "skiplock/sql/queries/ui.sql",
        "skiplock/sql/migrations/0009_ui.sql",
    } | templates <= names
    assert len(templates) >= 12
    for text in ("skiplock/ui/templates/base.html", "skiplock/ui/static/ui.js", "skiplock/ui/static/ui.css"):
        body = zipfile.ZipFile(wheel).read(text).decode()
        assert "http://" not in body and "https://" not in body, f"{text} must not load anything from a CDN"
