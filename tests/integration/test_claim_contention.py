"""The claim from a position passes the rows other transactions hold without a lock test; whatever it passes, a claim
from the start takes (claim.sql, the ``after`` variants)."""

from __future__ import annotations

import psycopg

from skiplock import Queue
from support.store import WorkerCalls


def test_a_claim_after_a_position_passes_the_rows_another_claim_holds(queue: Queue, pg_dsn: str):
    jobs = queue.enqueue_many("q", [{"i": i} for i in range(12)])
    first = queue.claim("q", limit=1, worker="w")
    assert [j.id for j in first] == [jobs[0]]
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn) as other:  # another worker's claim, still running
        other.execute(f'SELECT id FROM "{schema}".jobs WHERE id = ANY(%s) FOR UPDATE', (jobs[1:5],)).fetchall()
        _, after = WorkerCalls(queue).complete_and_claim([], "q", limit=3, worker="w", after=first[-1])
        assert [j.id for j in after] == jobs[5:8]
        other.rollback()
    _, rest = WorkerCalls(queue).complete_and_claim([], "q", limit=10, worker="w")
    assert [j.id for j in rest] == jobs[1:5] + jobs[8:12]


def test_a_row_a_finished_transaction_left_locked_is_taken_by_a_claim_from_the_start(queue: Queue, pg_dsn: str):
    """While a transaction older than the lock stays open, the claim from a position cannot tell the lock from a
    running claim's and passes the row; the claim from the start (the claimer makes one at least every
    AFTER_MAX_SECONDS) tests the lock and takes it."""
    jobs = queue.enqueue_many("q", [{"i": i} for i in range(6)])
    first = queue.claim("q", limit=1, worker="w")
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn) as older, psycopg.connect(pg_dsn, autocommit=True) as locker:
        older.execute("SELECT pg_current_xact_id()")  # an older transaction, open throughout
        with locker.transaction():
            locker.execute(f'SELECT id FROM "{schema}".jobs WHERE id = %s FOR SHARE', (jobs[1],)).fetchall()
        _, after = WorkerCalls(queue).complete_and_claim([], "q", limit=2, worker="w", after=first[-1])
        assert [j.id for j in after] == jobs[2:4]
        _, rest = WorkerCalls(queue).complete_and_claim([], "q", limit=10, worker="w")
        assert [j.id for j in rest] == [jobs[1], *jobs[4:6]]
        older.rollback()
