"""The bad-input matrix, through the CLI (subprocess) and the API: each case gets a clear error, a non-zero exit
or an exception, and nothing is written or lost (the jobs already there are untouched)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from skiplock import NonRetryableError, Queue, Settings
from skiplock.errors import (
    MAX_ERROR_CHARS,
    ConfigError,
    DatabaseUnavailableError,
    EnqueueError,
    HandlerImportError,
    PayloadError,
    SkiplockError,
)
from skiplock.handlers import Handler, load_handler
from skiplock.migrate import latest_version, migrate
from skiplock.sql import queries_for
from skiplock.store.validation import encode_payload
from skiplock.worker import Worker
from support.ci import missing
from support.pg import await_for

TESTS = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    base["PYTHONPATH"] = str(TESTS)
    base.update(env or {})
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=base, capture_output=True, text=True, timeout=60, cwd=cwd
    )


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """``skiplock.cli.main`` in this process (the same code path as the command, a hundred times faster);
    logging is put back afterwards, since the CLI reconfigures it."""
    from skiplock.cli import main

    def run(*args: str, env: dict[str, str]) -> Ran:
        for key in list(os.environ):
            if key.startswith("SKIPLOCK_") or key == "DATABASE_URL":
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.syspath_prepend(str(TESTS))
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def snapshot(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT id, queue, payload, status, attempts, max_attempts, visible_at FROM {} ORDER BY id").format(
                sql.Identifier(schema, "jobs")
            )
        ).fetchall()


@pytest.fixture
def seeded(queue: Queue, pg_dsn: str, schema: str) -> Iterator[list[tuple[Any, ...]]]:
    """Two jobs already in the table; every test checks they come out untouched."""
    queue.enqueue("q", {"keep": 1})
    queue.enqueue("other", {"keep": 2}, delay=3600)
    before = snapshot(pg_dsn, schema)
    yield before
    assert snapshot(pg_dsn, schema) == before, "a rejected input changed the table"


# ---------------------------------------------------------------------------------------------- CLI
NESTED = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["enqueue", "--queue", "q", "--payload", "{'single': 'quotes'}"], {}, "not valid JSON"),
        (["enqueue", "--queue", "q", "--payload", '{"a": 1}{'], {}, "not valid JSON"),
        (["enqueue", "--queue", "q", "--payload", ""], {}, "not valid JSON"),
        (["enqueue", "--queue", "q", "--payload", "Infinity"], {}, "Infinity"),
        (["enqueue", "--queue", "q", "--payload", '{"x": -Infinity}'], {}, "Infinity"),
        (["enqueue", "--queue", "q", "--payload", "[NaN]"], {}, "NaN"),
        (["enqueue", "--queue", "q", "--payload", "1e400"], {}, "not JSON-serialisable"),
        (["enqueue", "--queue", "q", "--payload", '"nul \\u0000 inside"'], {}, "NUL"),
        (["enqueue", "--queue", "q", "--payload", '"\\ud800"'], {}, "not valid Unicode"),
        (
            ["enqueue", "--queue", "q", "--payload", '"' + "x" * 300 + '"'],
            {"SKIPLOCK_MAX_PAYLOAD_BYTES": "256"},
            "limit",
        ),
        (["enqueue", "--queue", "q", "--payload", "{}"], {"SKIPLOCK_MAX_PAYLOAD_BYTES": "0"}, "max_payload_bytes"),
        (["enqueue", "--queue", "", "--payload", "{}"], {}, "queue name"),
        (["enqueue", "--queue", "x" * 129, "--payload", "{}"], {}, "queue name"),
        (["enqueue", "--queue", "q;drop", "--payload", "{}"], {}, "queue name"),
        (["enqueue", "--queue", "q", "--payload", "{}", "--delay", "-0.5"], {}, "not a duration"),
        (["enqueue", "--queue", "q", "--payload", "{}", "--delay", "nan"], {}, "not a duration"),
        (["enqueue", "--queue", "q", "--payload", "{}", "--max-attempts", "-1"], {}, "must be >= 1"),
        (["enqueue", "--queue", "q", "--payload", "{}", "--priority", "40000"], {}, "priority"),
        (["enqueue", "--queue", "q", "--payload", "{}", "--idempotency-key", ""], {}, "idempotency_key"),
        (["stats", "--schema", 'x"; DROP SCHEMA public; --'], {}, "schema"),
        (["stats"], {"SKIPLOCK_SCHEMA": "Robert"}, "schema"),
        (["stats"], {"SKIPLOCK_SCHEMA": "s" * 41}, "schema"),
        (["stats", "--lease", "-1"], {}, "not a duration"),
        (["worker", "--handler", "support.handlers:noop", "--lease", "0"], {}, "lease_seconds must be > 0"),
        (["worker", "--handler", "support.handlers:noop", "--concurrency", "0"], {}, "must be >= 1"),
        (["worker", "--handler", "support.handlers:noop", "--poll", "-1"], {}, "not a duration"),
        (["worker", "--handler", "support.handlers:noop"], {"SKIPLOCK_LEASE_SECONDS": "nan"}, "finite number"),
        (["worker", "--handler", "support.handlers:noop"], {"SKIPLOCK_CONCURRENCY": "ten"}, "SKIPLOCK_CONCURRENCY"),
        (["worker", "--handler", "support.handlers:noop"], {"SKIPLOCK_LISTEN": "maybe"}, "SKIPLOCK_LISTEN"),
        (["worker", "--handler", "support.handlers:noop", "--queue", "bad name"], {}, "queue"),
        (["worker"], {}, "--handler"),
        (["worker", "--handler", "no colon"], {}, "handler"),
        (["worker", "--handler", "support.nosuch:fn"], {}, "cannot import handler module"),
        (["worker", "--handler", "support.handlers:missing"], {}, "has no attribute"),
        (["worker", "--handler", "support.handlers:not_callable"], {}, "not a function"),
        (["purge", "--older-than=-1d"], {}, "not a duration"),
        (["cancel"], {}, "give job ids"),
    ],
)
def test_cli_bad_input_is_a_clear_error_exit_2_and_writes_nothing(
    pg_dsn, schema, seeded, run_main, args, env, fragment
):
    out = run_main(*args, env={"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema, **env})
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert fragment in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["enqueue", "--queue", "q", "--payload", "{not json"], "not valid JSON"),
        (["enqueue", "--queue", "q", "--payload", '{"x": NaN}'], "NaN"),
        (["enqueue", "--queue", "q", "--payload", '"' + "x" * 2000 + '"'], "limit"),
        (["stats", "--schema", 'x"; DROP SCHEMA public; --'], "schema"),
        (["worker", "--handler", "support.nosuch:fn"], "cannot import handler module"),
    ],
)
def test_cli_bad_input_through_the_real_command(pg_dsn, schema, seeded, args, fragment):
    out = cli(*args, env={"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema, "SKIPLOCK_MAX_PAYLOAD_BYTES": "1024"})
    assert out.returncode == 2 and fragment in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_cli_deeply_nested_payload_is_a_clear_error(pg_dsn, schema, seeded):
    out = cli("enqueue", "--queue", "q", "--payload", NESTED, env={"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-500:]


def test_cli_unknown_queue_names_change_nothing_and_say_so(pg_dsn, schema, seeded, run_main):
    env = {"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema}
    stats = run_main("stats", "--queue", "nosuch", env=env)
    assert stats.returncode == 0 and "'nosuch' has no pending, processing or failed jobs" in stats.stdout
    assert (stats.stdout + stats.stderr).count("no pending, processing or failed jobs") == 1  # said once
    assert "no failed jobs" in run_main("failed", "--queue", "nosuch", env=env).stdout
    for command, words in (("retry", "re-queued 0"), ("cancel", "cancelled 0"), ("purge", "purged 0")):
        args = [command, "--queue", "nosuch"] + (["--older-than", "0s"] if command == "purge" else [])
        out = run_main(*args, env=env)
        # nothing matched: retry and cancel exit 1 by queue as by ids; purge has nothing to match
        assert out.returncode == (0 if command == "purge" else 1) and words in out.stdout, out
    for command in ("retry", "cancel"):  # ids that match nothing: non-zero
        out = run_main(command, "424242", env=env)
        assert out.returncode == 1 and " 0 " in out.stdout, out


@pytest.mark.parametrize("command", ["stats", "failed", "retry", "cancel"])
def test_cli_invalid_queue_names_are_rejected_by_every_command(pg_dsn, schema, run_main, command):
    out = run_main(command, "--queue", "bad name;--", env={"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema})
    assert out.returncode == 2 and "queue name" in out.stderr, out


def test_cli_unimportable_handler_modules_stop_the_worker_before_it_claims(pg_dsn, schema, seeded, tmp_path):
    (tmp_path / "boom_at_import.py").write_text("raise RuntimeError('module body failed')\n")
    (tmp_path / "broken_syntax.py").write_text("def handler(job:\n")
    (tmp_path / "needs_missing.py").write_text("import skiplock_no_such_dependency\n\ndef handler(job):\n    pass\n")
    env = {"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema, "SKIPLOCK_QUEUE": "q"}
    for spec, fragment in (
        ("boom_at_import:handler", "RuntimeError: module body failed"),
        ("broken_syntax:handler", "SyntaxError"),
        ("needs_missing:handler", "skiplock_no_such_dependency"),
    ):
        out = cli("worker", "--handler", spec, env=env, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert fragment in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("dsn", "code", "fragment"),
    [
        ("postgresql://nobody@127.0.0.1:1/x", 3, "database unavailable"),
        ("this is not a dsn", 2, "DSN is malformed"),  # configuration, not an outage; the DSN never echoed
        ("postgresql://[::1", 2, "DSN is malformed"),
        ("host=/nonexistent/socket/dir dbname=x", 3, "database unavailable"),
        ("", 2, "no database given"),
    ],
)
def test_cli_wrong_dsns_fail_fast_with_exit_3(schema, dsn, code, fragment):
    for args in (
        ["stats"],
        ["enqueue", "--queue", "q", "--payload", "{}"],
        ["worker", "--handler", "support.handlers:noop"],
    ):
        out = cli(*args, env={"SKIPLOCK_DSN": dsn, "SKIPLOCK_SCHEMA": schema})
        assert out.returncode == code, (args, out.stderr)
        assert fragment in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert not dsn or dsn not in out.stderr, out.stderr  # a DSN is never echoed, whole or in part
        assert 'after "this"' not in out.stderr, out.stderr


def test_cli_missing_database_and_unmigrated_schema(pg_dsn, run_main):
    from psycopg.conninfo import make_conninfo

    out = run_main("stats", env={"SKIPLOCK_DSN": make_conninfo(pg_dsn, dbname="skiplock_no_such_db")})
    assert out.returncode == 3 and "does not exist" in out.stderr, out.stderr
    env = {"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": "never_migrated_here"}
    for args in (["enqueue", "--queue", "q", "--payload", "{}"], ["worker", "--handler", "support.handlers:noop"]):
        out = run_main(*args, env=env)
        assert out.returncode == 3 and "skiplock migrate" in out.stderr, out.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('never_migrated_here')").fetchone() == (None,)


# ---------------------------------------------------------------------------------------------- API
class Unserialisable:
    pass


@pytest.mark.parametrize(
    "payload",
    [
        float("nan"),
        {"x": float("inf")},
        [float("-inf")],
        {1, 2},
        b"bytes",
        Unserialisable(),
        {"when": datetime(2026, 1, 1)},
        {(1, 2): "tuple key"},
        "nul \x00 char",
        {"k\x00": 1},
        "lone \ud800 surrogate",
        "x" * (256 * 1024),
        10**5000,
    ],
    ids=lambda p: type(p).__name__,
)
def test_api_bad_payloads_raise_payload_error_and_write_nothing(queue: Queue, seeded, payload):
    with pytest.raises(PayloadError):
        queue.enqueue("q", payload)
    with pytest.raises(PayloadError):
        queue.enqueue_many("q", [{"fine": 1}, payload])  # all or nothing


def test_api_a_literal_backslash_u0000_is_not_a_nul(queue: Queue):
    job_id = queue.enqueue("q", {"path": "C:\\u0000\\dir"}).id
    assert queue.get(job_id)["payload"] == {"path": "C:\\u0000\\dir"}


def test_api_deeply_nested_payload_is_a_payload_error():
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(PayloadError):
        encode_payload(deep, 10**6)


def test_api_payload_at_the_limit_is_accepted_one_byte_more_is_not(queue: Queue, settings: Settings):
    limit = settings.max_payload_bytes
    fits = "é" * ((limit - 2) // 2)  # two bytes each in UTF-8, plus the quotes
    assert len(encode_payload(fits, limit).encode()) <= limit
    job_id = queue.enqueue("q", fits).id
    assert queue.get(job_id)["payload"] == fits
    with pytest.raises(PayloadError, match="max_payload_bytes"):
        queue.enqueue("q", fits + "éé")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": -1},
        {"delay": float("nan")},
        {"delay": float("inf")},
        {"delay": "10"},
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"max_attempts": 2.5},
        {"priority": 1 << 20},
        {"run_at": datetime(2030, 1, 1)},  # naive: ambiguous
        {"max_attempts": 1001},
        {"priority": True},
        {"delay": 1e300},
        {"idempotency_key": ""},
        {"idempotency_key": "k" * 9000},
        {"task": ""},
        {"task": "t" * 201},
        {"unknown_option": 1},
    ],
    ids=lambda k: f"{next(iter(k))}={str(next(iter(k.values())))[:12]!r}",
)
def test_api_bad_enqueue_arguments_raise_enqueue_error_and_write_nothing(queue: Queue, seeded, kwargs):
    """EnqueueError is the one documented type (a SkiplockError and a ValueError), with a short clear message."""
    with pytest.raises(EnqueueError) as info:
        queue.enqueue("q", {}, **kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, SkiplockError)
    assert next(iter(kwargs)) in str(info.value) and len(str(info.value)) < 300
    if "idempotency_key" not in kwargs:  # enqueue_many: see the next test
        with pytest.raises(EnqueueError):
            queue.enqueue_many("q", [{}, {}], **kwargs)


async def test_async_bad_enqueue_arguments_raise_enqueue_error(aqueue, seeded):
    for kwargs in (
        {"delay": -1},
        {"max_attempts": 0},
        {"run_at": datetime(2030, 1, 1)},
        {"idempotency_key": "k" * 9000},
    ):
        with pytest.raises(EnqueueError):
            await aqueue.enqueue("q", {}, **kwargs)
    with pytest.raises(EnqueueError, match="queue name"):
        await aqueue.enqueue_many("bad name", [{}])


def test_api_enqueue_many_rejects_empty_idempotency_keys(queue: Queue, pg_dsn, schema):
    try:
        with pytest.raises(EnqueueError):
            queue.enqueue_many("q", [{}, {}], idempotency_keys=["", "k"])
        with pytest.raises(EnqueueError, match=r"1\.\.255"):
            queue.enqueue_many("q", [{}, {}], idempotency_keys=["k" * 9000, "k"])
    finally:
        assert snapshot(pg_dsn, schema) == [] or queue.cancel(queue="q")


@pytest.mark.parametrize("name", ["", "bad name", "x" * 129, None, 7, "q\x00"])
def test_api_bad_queue_names(queue: Queue, seeded, name):
    with pytest.raises(EnqueueError, match="queue name"):
        queue.enqueue(name, {})


@pytest.mark.parametrize("name", ['x"; DROP SCHEMA public; --', "Upper", "1abc", "a" * 41, "sch-ema", ""])
def test_api_hostile_schema_names_are_rejected_by_settings(pg_dsn, name):
    with pytest.raises(ConfigError, match="schema"):
        Settings.load(env={}, dsn=pg_dsn, schema=name)


def test_hostile_schema_names_are_quoted_even_past_validation(pg_dsn):
    """Defence in depth: SQL rendering and migrations quote whatever name they get."""
    name = 'we"ird; DROP SCHEMA public; --'
    assert 'FROM "we""ird; DROP SCHEMA public; --".jobs' in queries_for(name).job_complete_and_claim
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        try:
            applied = migrate(conn, name).applied
            assert applied[0] == "0001_initial" and len(applied) == latest_version()
            assert conn.execute("SELECT to_regnamespace('public') IS NOT NULL").fetchone() == (True,)
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_api_wrong_dsns_raise_database_unavailable(pg_dsn):
    from psycopg.conninfo import make_conninfo

    for dsn in ("postgresql://nobody@127.0.0.1:1/x", make_conninfo(pg_dsn, dbname="skiplock_no_such")):
        with pytest.raises(DatabaseUnavailableError):
            Queue(dsn=dsn, connect_timeout=2)
    with pytest.raises(ConfigError, match="the DSN is malformed"):  # configuration, as in the CLI; never echoed
        Queue(dsn="not a dsn", connect_timeout=2)
    with pytest.raises(ConfigError, match="no database given"):
        Queue(settings=Settings.load(env={}))


@contextlib.contextmanager
def _private_server() -> Iterator[Any]:
    from support.chaos import PrivatePostgres, setup_schema

    try:
        server = PrivatePostgres().init()
    except Exception as exc:  # pragma: no cover - machines without PostgreSQL binaries
        missing(f"no private PostgreSQL: {exc}")
    try:
        setup_schema(server.dsn, "s")
        yield server
    finally:
        server.cleanup()


def test_api_a_database_that_dies_under_an_open_queue_raises_and_loses_nothing():
    with _private_server() as server:
        settings = Settings.load(env={}, dsn=server.dsn, schema="s")
        with Queue(settings=settings, max_size=1, connect_timeout=2) as q:
            kept = q.enqueue("q", {"n": 1}).id
            server.stop("immediate")
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError):  # the pooled connection died with the server
                q.enqueue("q", {"n": 2})
            assert time.monotonic() - started < 5
            server.start()
        with Queue(settings=settings, max_size=1) as again:
            assert again.get(kept)["payload"] == {"n": 1}
            assert [r.ready for r in again.stats()] == [1]


def test_api_calls_on_a_dead_database_fail_within_the_connect_timeout():
    with _private_server() as server:
        settings = Settings.load(env={}, dsn=server.dsn, schema="s")
        q = Queue(settings=settings, max_size=1, connect_timeout=2)
        calls = ThreadPoolExecutor(1)
        try:
            q.enqueue("q", {"n": 1})
            server.stop("immediate")
            for _ in range(2):  # the dead pooled connection first, then no new connection can be made
                future = calls.submit(q.enqueue, "q", {"n": 2})
                done, _ = wait([future], timeout=6)
                assert done, "enqueue still blocked 6 s after the database died (connect_timeout is 2 s)"
                assert isinstance(future.exception(), DatabaseUnavailableError | psycopg.OperationalError)
        finally:
            q.close()  # wakes a blocked call
            calls.shutdown(wait=True)


# ------------------------------------------------------------------------------------------ handlers that raise badly
class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


RAISES: dict[str, BaseException] = {
    "huge": RuntimeError("x" * 5_000_000),
    "bytes": ValueError(b"\xff\xfe\x00\x80 not utf-8"),
    "surrogate": RuntimeError("bad \udcff byte \x00 and NUL"),
    "broken_str": BrokenStr(),
    "non_retryable_huge": NonRetryableError("y" * 100_000),
    "empty": KeyError(),
}


async def test_handlers_raising_huge_or_undecodable_errors_fail_cleanly_and_the_worker_goes_on(settings, aqueue):
    fast = settings.replace(poll_seconds=0.2, backoff_base_seconds=0.05, backoff_cap_seconds=0.1)
    ok: list[int] = []

    async def handler(job):
        name = job.payload.get("raise")
        if name:
            raise RAISES[name]
        ok.append(job.id)

    ids = {name: (await aqueue.enqueue("default", {"raise": name}, max_attempts=1)).id for name in RAISES}
    worker = Worker(settings=fast, handler=Handler("t", handler, True))
    task = asyncio.create_task(worker.run())
    try:
        rows: dict[str, Any] = {}

        async def finished() -> bool:
            for name, job_id in ids.items():
                rows[name] = await aqueue.get(job_id)
            return all(r["status"] == "failed" for r in rows.values())

        deadline = time.monotonic() + 20
        while not await finished() and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.05)
        assert await finished(), {n: (r["status"], r["last_error"]) for n, r in rows.items()}
        later = (await aqueue.enqueue("default", {})).id
        await await_for(lambda: later in ok, timeout=15, what="a normal job after the bad ones")
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
    for name, row in rows.items():
        error = row["last_error"]
        assert error and len(error) <= MAX_ERROR_CHARS, (name, len(error or ""))
        assert "\x00" not in error
        error.encode("utf-8")  # storable and printable
    assert rows["huge"]["last_error"].startswith("RuntimeError: xxx") and "truncated" in rows["huge"]["last_error"]
    assert rows["broken_str"]["last_error"].startswith("BrokenStr")
    assert rows["empty"]["last_error"] == "KeyError"


def test_load_handler_rejects_malformed_specs():
    for spec in ("", ":", "mod:", ":fn", "support.handlers", "support.handlers:noop.nope"):
        with pytest.raises(HandlerImportError):
            load_handler(spec)


async def test_one_refused_result_does_not_stop_the_worker_recording_results(settings, aqueue, monkeypatch):
    import dataclasses

    from skiplock.store.statements import Statements

    real_fail = Statements.fail
    refused: list[int] = []

    def fail_once(self, failures, worker, now):
        call = real_fail(self, failures, worker, now)
        if refused:
            return call
        refused.append(failures[0].job.id)  # the statement the server refuses, as a 1e13 s backoff gets refused
        return dataclasses.replace(call, query="SELECT now() + make_interval(secs => 1e13)", params=None)

    monkeypatch.setattr(Statements, "fail", fail_once)

    async def handler(job):
        if job.payload.get("fail") and job.attempts == 1:
            raise RuntimeError("fails once")

    fast = settings.replace(poll_seconds=0.2, backoff_base_seconds=0.05, backoff_cap_seconds=0.1)
    failing = (await aqueue.enqueue("default", {"fail": True})).id
    worker = Worker(settings=fast, handler=Handler("t", handler, True))
    task = asyncio.create_task(worker.run())
    try:
        await await_for(lambda: refused, timeout=15, what="job_fail refused once")
        later = (await aqueue.enqueue("default", {})).id
        deadline = time.monotonic() + 5
        statuses: tuple[str, str] = ("", "")
        while time.monotonic() < deadline and not task.done():
            statuses = ((await aqueue.get(failing))["status"], (await aqueue.get(later))["status"])
            if statuses == ("done", "done"):
                break
            await asyncio.sleep(0.1)
        assert statuses == ("done", "done"), f"(failing, later) stayed {statuses}: results are no longer recorded"
    finally:
        worker.request_stop()
        worker.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)


def test_show_renders_a_payload_nested_too_deep_for_python_clearly_and_briefly(pg_dsn, schema):
    """Issue 37 (low): `skiplock show` died with a RecursionError on a payload nested 5,000 levels deep (stored by
    plain SQL; jsonb takes it). It shows the reason, the size and the start of the payload, and --json answers too."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, payload) VALUES ('q', (repeat('[', 5000) || repeat(']', 5000))::jsonb) "
                "RETURNING id"
            ).format(sql.Identifier(schema, "jobs"))
        ).fetchone()
    assert row is not None
    env = {"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema}
    out = cli("show", str(row[0]), env=env)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "payload cannot be decoded: RecursionError (10,000 characters); it begins: [[[" in out.stdout, out.stdout
    assert len(out.stdout) < 2_000, "bounded: not the whole payload"
    shown = cli("show", str(row[0]), "--json", env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["payload_error"].startswith("PayloadError:")
    with Queue(settings=Settings(dsn=pg_dsn, schema=schema)) as q:
        assert q.get(int(row[0]))["payload"] is None  # type: ignore[index]
        assert q.get(q.enqueue("q", {"a": [1, {"b": 2**70}]}).id)["payload"] == {"a": [1, {"b": 2**70}]}  # type: ignore[index]
