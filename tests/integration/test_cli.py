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

from skiplock.migrate import current_version, latest_version, migrate
from skiplock.sql import migrations
from support.pg import drop_schema


def run(
    *args: str, dsn: str | None = None, schema: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    if dsn:
        env["SKIPLOCK_DSN"] = dsn
    if schema:
        env["SKIPLOCK_SCHEMA"] = schema
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=env, capture_output=True, text=True, timeout=timeout
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
    assert [r["id"] for r in json.loads(failed.stdout)] == [job_id]
    assert "Cancelled" in run("failed", dsn=pg_dsn, schema=schema).stdout
    retry = run("retry", "--queue", "emails", dsn=pg_dsn, schema=schema)
    assert retry.returncode == 0 and "re-queued 1" in retry.stdout
    assert run("retry", "999999", dsn=pg_dsn, schema=schema).returncode == 1, "nothing matched: non-zero"
    purge = run("purge", "--older-than", "7d", dsn=pg_dsn, schema=schema)
    assert purge.returncode == 0 and "purged 0" in purge.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("enqueue", "--queue", "q", "--payload", "{not json"), "not valid JSON"),
        (("enqueue", "--queue", "q", "--payload", '{"x": NaN}'), "NaN"),
        (("enqueue", "--queue", "q", "--payload", "{}", "--delay", "-5"), "must be a finite number >= 0"),
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
        assert first.returncode == 0 and "0002_tasks_and_lease_deadline" in first.stdout
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
        assert sorted(results) == [(), (), (), tuple(m.name for m in migrations())]
        with psycopg.connect(pg_dsn) as conn:
            assert current_version(conn, name) == latest_version()
            rows = conn.execute(f'SELECT version FROM "{name}".schema_migrations').fetchall()
        assert rows == [(m.version,) for m in migrations()]
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
