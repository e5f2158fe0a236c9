"""The ``skiplock`` command through subprocess, and migrations run twice and concurrently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from skiplock import Queue, Settings
from skiplock.errors import HandlerImportError
from skiplock.handlers import load_target
from skiplock.migrate import current_version, latest_version, migrate
from skiplock.store.statements import Failure
from support.pg import drop_schema


def run(
    *args: str, dsn: str | None = None, schema: str | None = None, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    if dsn:
        env["SKIPLOCK_DSN"] = dsn
    if schema:
        env["SKIPLOCK_SCHEMA"] = schema
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def test_enqueue_stats_failed_retry_cancel_purge_round_trip(pg_dsn, schema):
    out = run("enqueue", "--queue", "emails", "--payload", '{"to": "a@b.c"}', dsn=pg_dsn, schema=schema)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.split()[0])
    dup = run("enqueue", "--queue", "emails", "--payload", "{}", "--idempotency-key", "k1", dsn=pg_dsn, schema=schema)
    again = run("enqueue", "--queue", "emails", "--payload", "{}", "--idempotency-key", "k1", dsn=pg_dsn, schema=schema)
    assert again.stdout.split()[0] == dup.stdout.split()[0] and "duplicate" in again.stdout
    run("enqueue", "--queue", "emails", "--payload", "{}", "--delay", "3600", dsn=pg_dsn, schema=schema)

    stats = run("stats", "--json", dsn=pg_dsn, schema=schema)
    assert stats.returncode == 0, stats.stderr
    [row] = json.loads(stats.stdout)
    assert (row["queue"], row["ready"], row["delayed"]) == ("emails", 2, 1)
    table = run("stats", dsn=pg_dsn, schema=schema)
    assert "emails" in table.stdout and "oldest_ready_s" in table.stdout

    cancel = run("cancel", str(job_id), dsn=pg_dsn, schema=schema)
    assert cancel.returncode == 0 and "cancelled 1 job" in cancel.stdout
    failed = run("failed", "--json", dsn=pg_dsn, schema=schema)
    assert json.loads(failed.stdout) == [], "a cancelled job is not listed as failed"
    assert run("retry", "--queue", "emails", dsn=pg_dsn, schema=schema).returncode == 1, "nor re-driven by retry"
    retry = run("retry", "--queue", "emails", "--include-cancelled", dsn=pg_dsn, schema=schema)
    assert retry.returncode == 0 and "re-queued 1" in retry.stdout
    assert run("retry", "999999", dsn=pg_dsn, schema=schema).returncode == 1, "nothing matched: non-zero"
    purge = run("purge", "--older-than", "7d", dsn=pg_dsn, schema=schema)
    assert purge.returncode == 0 and "purged 0" in purge.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("enqueue", "--queue", "q", "--payload", "{not json"), "not valid JSON"),
        (("enqueue", "--queue", "q", "--payload", '{"x": NaN}'), "NaN"),
        (("enqueue", "--queue", "q", "--payload", "{}", "--delay", "-5"), "is not a duration like 90, 90s, 15m"),
        (("enqueue", "--queue", "bad name", "--payload", "{}"), "queue name"),
        (("enqueue", "--queue", "q", "--payload", "{}", "--max-attempts", "0"), "must be >= 1"),
        (("purge", "--older-than", "soon"), "not a duration"),
        (("retry",), "give job ids"),
    ],
)
def test_bad_input_gets_a_clear_error_and_writes_nothing(pg_dsn, schema, args, fragment):
    out = run(*args, dsn=pg_dsn, schema=schema)
    assert out.returncode == 2, out
    assert fragment in out.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".jobs').fetchone()[0] == 0


def test_a_wrong_dsn_is_one_line_with_the_password_masked():
    out = run("stats", dsn="postgresql://app:hunter2@127.0.0.1:1/app")
    assert out.returncode == 3
    assert "hunter2" not in out.stderr + out.stdout
    assert out.stderr.count("\n") == 1 and "database unavailable" in out.stderr


def test_no_dsn_at_all_says_how_to_give_one():
    out = run("stats")
    assert out.returncode == 2 and "SKIPLOCK_DSN" in out.stderr


def test_an_unmigrated_schema_is_reported_not_crashed(pg_dsn):
    out = run("stats", dsn=pg_dsn, schema=f"nothing_{uuid.uuid4().hex[:8]}")
    assert out.returncode == 3 and "skiplock migrate" in out.stderr


def test_migrate_twice_changes_nothing(pg_dsn):
    name = f"m_{uuid.uuid4().hex[:10]}"
    try:
        first = run("migrate", dsn=pg_dsn, schema=name)
        second = run("migrate", dsn=pg_dsn, schema=name)
        assert first.returncode == 0 and "0001_initial" in first.stdout
        assert second.returncode == 0 and "nothing to do" in second.stdout
    finally:
        drop_schema(pg_dsn, name)


def test_four_concurrent_migrations_apply_each_version_once(pg_dsn):
    name = f"m_{uuid.uuid4().hex[:10]}"

    def one(_: int) -> tuple[str, ...]:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            return migrate(conn, name).applied

    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(4)))
        # Each version is its own transaction under the schema's lock: the four may share the work, in order, but
        # every version is applied by exactly one of them.
        applied = sorted(name for result in results for name in result)
        assert len(applied) == latest_version() and applied[0] == "0001_initial"
        assert all(list(r) == sorted(r) for r in results), "each applies the versions it finds missing in order"
        with psycopg.connect(pg_dsn) as conn:
            assert current_version(conn, name) == latest_version()
            rows = conn.execute(f'SELECT version FROM "{name}".schema_migrations').fetchall()
        assert rows == [(v,) for v in range(1, latest_version() + 1)]
    finally:
        drop_schema(pg_dsn, name)


def test_dropping_the_second_processing_index_gives_up_rather_than_queue_claims_behind_a_long_transaction(pg_dsn):
    """Migration 0007's DROP INDEX needs an exclusive lock on jobs: behind an application's open transaction that
    enqueued a job it fails after its lock timeout (changing nothing), and applies once that transaction is over."""
    name = f"m_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            migrate(conn, name)
            index = "jobs_recover_idx ON {}.jobs (queue, locked_at) WHERE status = 'processing'"
            conn.execute("CREATE INDEX " + index.format(f'"{name}"'))
            conn.execute(f'DELETE FROM "{name}".schema_migrations WHERE version >= 7')
        with psycopg.connect(pg_dsn) as app:  # an application transaction that enqueued a job and stays open
            Queue(settings=Settings(dsn=pg_dsn, schema=name)).enqueue("q", {}, conn=app)
            with psycopg.connect(pg_dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.LockNotAvailable):
                migrate(conn, name)
            app.commit()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert current_version(conn, name) == 6
            assert migrate(conn, name).applied[:2] == ("0007_one_processing_index", "0008_rate_slot_index")
            gone = conn.execute("SELECT to_regclass(%s)", [f'"{name}".jobs_recover_idx']).fetchone()
            assert gone == (None,)
    finally:
        drop_schema(pg_dsn, name)


def test_demo_runs_end_to_end_on_the_given_database(pg_dsn):
    out = run("demo", "--jobs", "300", "--workers", "2", "--concurrency", "8", dsn=pg_dsn, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "workers drained on SIGTERM with exit codes [0, 0]" in out.stdout
    with psycopg.connect(pg_dsn) as conn:
        done, receipts = conn.execute(
            "SELECT (SELECT count(*) FROM skiplock_demo.jobs WHERE status = 'done'),"
            " (SELECT count(*) FROM skiplock_demo.receipts)"
        ).fetchone()
        left = conn.execute(
            "SELECT count(*) FROM skiplock_demo.jobs WHERE status IN ('pending', 'processing')"
        ).fetchone()[0]
    assert done == receipts > 250 and left == 0


def test_grant_gives_a_worker_role_exactly_the_lease_updates(pg_dsn, schema):
    role = f"w_{uuid.uuid4().hex[:10]}"
    dry = run("grant", "--worker", role, "--dry-run", schema=schema)
    assert dry.returncode == 0 and f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}";' in dry.stdout
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
        try:
            out = run("grant", "--worker", role, dsn=pg_dsn, schema=schema)
            assert out.returncode == 0, out.stderr
            can = conn.execute(
                "SELECT has_table_privilege(%(r)s, %(t)s, 'SELECT'), has_table_privilege(%(r)s, %(t)s, 'INSERT'),"
                " has_table_privilege(%(r)s, %(t)s, 'DELETE'),"
                " has_column_privilege(%(r)s, %(t)s, 'locked_at', 'UPDATE'),"
                " has_column_privilege(%(r)s, %(t)s, 'payload', 'UPDATE')",
                {"r": role, "t": f'"{schema}".jobs'},
            ).fetchone()
            assert can == (True, False, False, True, False)
        finally:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


# ---------------------------------------------------------------------------------------------- common options
def test_common_options_work_before_the_command(pg_dsn):
    name = f"m_{uuid.uuid4().hex[:10]}"
    try:
        out = run("--dsn", pg_dsn, "--schema", name, "migrate")
        assert out.returncode == 0 and "0001_initial" in out.stdout, out.stderr
        out = run("--dsn", pg_dsn, "stats", "--schema", name)  # and mixed, before and after
        assert out.returncode == 0 and "no pending" in out.stdout, out.stderr
    finally:
        drop_schema(pg_dsn, name)


def test_dsn_file_reads_the_dsn_from_a_file(pg_dsn, schema, tmp_path):
    path = tmp_path / "dsn"
    path.write_text(pg_dsn + "\n")
    out = run("--dsn-file", str(path), "enqueue", "--queue", "q", "--payload", "{}", schema=schema)
    assert out.returncode == 0, out.stderr
    assert run("stats", "--dsn-file", str(path), schema=schema).stdout.count("q ") == 1


@pytest.mark.parametrize(
    ("content", "extra", "fragment"),
    [
        (None, (), "cannot read --dsn-file"),
        ("", (), "is empty"),
        ("postgresql://x/y", ("--dsn", "postgresql://x/y"), "not both"),
    ],
)
def test_dsn_file_errors_are_clear(tmp_path, content, extra, fragment):
    path = tmp_path / "dsn"
    if content is not None:
        path.write_text(content)
    out = run("stats", "--dsn-file", str(path), *extra)
    assert out.returncode == 2 and fragment in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_dsn_file_password_never_shows(tmp_path):
    path = tmp_path / "dsn"
    path.write_text("postgresql://app:hunter2@127.0.0.1:1/app")
    out = run("--dsn-file", str(path), "stats")
    assert out.returncode == 3 and "database unavailable" in out.stderr
    assert "hunter2" not in out.stdout + out.stderr


# ---------------------------------------------------------------------------------------------- enqueue --task
def test_enqueue_by_an_unregistered_task_name_needs_a_queue(pg_dsn, schema):
    refused = run("enqueue", "--task", "emails.send", "--payload", '{"to": "a@b.c"}', dsn=pg_dsn, schema=schema)
    assert refused.returncode == 2, refused
    assert "task 'emails.send' is not registered" in refused.stderr and "--queue" in refused.stderr
    other = run(
        "enqueue", "--task", "reports.build", "--queue", "reports", "--payload", "{}", dsn=pg_dsn, schema=schema
    )
    plain = run("enqueue", "--payload", "{}", dsn=pg_dsn, schema=schema)
    ids = [int(o.stdout.split()[0]) for o in (other, plain)]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT task, queue FROM "{schema}".jobs WHERE id = ANY(%s) ORDER BY id', (ids,))
        assert rows.fetchall() == [("reports.build", "reports"), (None, "default")]


@pytest.mark.parametrize(("task", "fragment"), [("", "task name"), ("x" * 201, "1..200 printable")])
def test_enqueue_with_a_bad_task_name_is_a_clear_error(pg_dsn, schema, task, fragment):
    out = run("enqueue", "--task", task, "--payload", "{}", dsn=pg_dsn, schema=schema)
    assert out.returncode == 2 and fragment in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_huge_idempotency_key_is_a_clear_error(pg_dsn, schema):
    out = run("enqueue", "--queue", "q", "--payload", "{}", "--idempotency-key", "k" * 9000, dsn=pg_dsn, schema=schema)
    assert out.returncode == 2 and "1..255 characters" in out.stderr, out.stderr[-500:]
    assert "ProgramLimitExceeded" not in out.stderr and len(out.stderr) < 500


# ---------------------------------------------------------------------------------------------- worker
def test_worker_with_only_a_lease_passes_settings_validation(pg_dsn, schema):
    out = run("worker", "--lease", "4", "--app", "nosuch:x", dsn=pg_dsn, schema=schema)
    assert out.returncode == 2
    assert "cannot import app module 'nosuch'" in out.stderr, out.stderr
    assert "heartbeat_seconds" not in out.stderr and "invalid settings" not in out.stderr


def test_worker_without_app_or_handler_says_what_to_give(pg_dsn, schema):
    out = run("worker", dsn=pg_dsn, schema=schema)
    assert out.returncode == 2 and "--app" in out.stderr and "--handler" in out.stderr


def test_load_target_loads_an_app_a_handler_or_both():
    app, handler = load_target(Settings(app="support.producer_app:app"))
    assert app is not None and "producer.send" in app and handler is None
    app, handler = load_target(Settings(app="support.producer_app:app", handler="support.handlers:noop"))
    assert app is not None and handler is not None and handler.spec == "support.handlers:noop"
    assert load_target(Settings(handler="support.handlers:anoop"))[0] is None


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("support.producer_app:not_an_app", "not a skiplock.App"),
        ("support.producer_app:empty", "registers no task"),
        ("support.producer_app:missing", "has no attribute"),
        ("support.nosuch:app", "cannot import app module"),
    ],
)
def test_load_target_errors_are_handler_import_errors(spec, fragment):
    with pytest.raises(HandlerImportError, match=fragment):
        load_target(Settings(app=spec))
    with pytest.raises(HandlerImportError, match="--app"):
        load_target(Settings())


# ---------------------------------------------------------------------------------------------- tables
def test_tables_left_align_text_and_right_align_numbers(pg_dsn, schema):
    for _ in range(2):
        run("enqueue", "--queue", "emails", "--payload", "{}", "--max-attempts", "1", dsn=pg_dsn, schema=schema)
    with Queue(pg_dsn, settings=Settings(dsn=pg_dsn, schema=schema)) as q:  # a cancelled job is not failed: fail them
        jobs = q.claim("emails", limit=2, worker="w")
        q.fail([Failure(j, "Boom: no", 0.0, False) for j in jobs], worker="w")
    header, rule, *rows = run("failed", dsn=pg_dsn, schema=schema).stdout.splitlines()
    assert rows and set(rule) <= {"-", " "}
    queue_col, error_col = header.index("queue"), header.index("last_error")
    for line in rows:
        assert line[queue_col:].startswith("emails") and line[error_col:].startswith("Boom")
        assert line[: header.index("id") + 2].strip().isdigit()  # ids end where the "id" heading ends
    header, _, row, done = run("stats", dsn=pg_dsn, schema=schema).stdout.splitlines()
    assert done.startswith("no job done in the last hour")
    assert row.startswith("emails ") and row[: header.index("failed") + len("failed")].endswith("2")


def test_migrate_leaves_a_connection_idle_autocommit_or_not(pg_dsn):
    """The operator migrates on a connection that is not autocommit and then runs short transactions on it: a
    migration that left a transaction open froze now() in every later one (its schedules stopped firing)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        for _ in range(2):  # a new schema, then an up-to-date one
            with psycopg.connect(pg_dsn) as conn:
                migrate(conn, schema)
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        drop_schema(pg_dsn, schema)
