"""The jobs table costs the hot path only what it must (issue 41, migration 0020): no BEFORE UPDATE row trigger (with
one, PostgreSQL locks every row an UPDATE changes before it looks at the trigger's columns, so each completion took a
row lock and wrote a lock record), and what the two moved triggers guarantee still holds for every writer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from skiplock import Queue
from skiplock.store.statements import Failure
from support.store import WorkerCalls

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ROW, BEFORE, UPDATE = 1, 2, 16  # pg_trigger.tgtype bits


def _fingerprints(pg_dsn: str, schema: str) -> list[tuple]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT id, status, failure_fingerprint, {s}.error_fingerprint(task, last_error) "
                "FROM {s}.jobs ORDER BY id"
            ).format(s=sql.Identifier(schema))
        ).fetchall()


def test_no_before_update_row_trigger_on_jobs(pg_dsn: str, schema: str, queue: Queue) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        triggers = conn.execute(
            "SELECT tgname, tgtype FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname",
            (f'"{schema}".jobs',),
        ).fetchall()
    names = [name for name, _ in triggers]
    assert {"jobs_payload_bound", "jobs_payload_bound_update", "jobs_failure_fingerprint"} <= set(names), names
    before_update = [name for name, kind in triggers if kind & ROW and kind & BEFORE and kind & UPDATE]
    assert before_update == [], f"these lock every row an UPDATE of jobs changes: {before_update}"


def test_a_failed_rows_fingerprint_is_stored_whoever_fails_it(pg_dsn: str, schema: str, queue: Queue) -> None:
    by_worker, by_hand, by_lease, retried = queue.enqueue_many("q", [{}, {}, {}, {}], max_attempts=1)
    jobs = {j.id: j for j in queue.claim("q", limit=4, worker="w", now=T0)}
    queue.fail([Failure(jobs[by_worker], "RuntimeError: order 42 rejected", 0.0, True)], worker="w", now=T0)
    jobs_table = sql.Identifier(schema, "jobs")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET status = 'failed', last_error = 'ValueError: bad row 7' WHERE id = %s").format(
                jobs_table
            ),
            (by_hand,),
        )
        # failed by hand, then again with another error: the second error's fingerprint
        for error in ("KeyError: a", "OSError: b"):
            conn.execute(
                sql.SQL("UPDATE {} SET status = 'failed', last_error = %s WHERE id = %s").format(jobs_table),
                (error, retried),
            )
    WorkerCalls(queue).recover_expired(queue="q", now=T0 + timedelta(days=1))
    rows = {row[0]: row for row in _fingerprints(pg_dsn, schema)}
    for job_id in (by_worker, by_hand, by_lease, retried):
        _, status, stored, expected = rows[job_id]
        assert status == "failed" and stored == expected and len(stored) == 16, rows[job_id]
    assert len({rows[i][2] for i in (by_worker, by_hand, retried)}) == 3
