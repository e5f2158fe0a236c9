"""Leases of prefetched jobs, against a real PostgreSQL: a job whose lease was lost while it waited in the buffer
never starts (another worker has it: its handler must not run twice)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest

from skiplock import Settings
from skiplock.worker import Worker
from support.pg import await_for


def fill(dsn: str, schema: str, n: int) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload) SELECT %s, jsonb_build_object(%s::text, g) '
            "FROM generate_series(0, %s - 1) AS g ORDER BY g RETURNING id",
            ("default", "n", n),
        ).fetchall()
    return [r[0] for r in rows]


def done(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM \"{schema}\".jobs WHERE status = 'done'").fetchone()
    return int(row[0]) if row else 0


async def test_a_prefetched_job_whose_lease_was_lost_never_starts(
    settings: Settings, pg_dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="skiplock")
    gate = threading.Event()
    started: list[int] = []
    fast_jobs = 2000  # no-ops first: the worker learns its pace and prefetches

    def handler(job: Any) -> None:
        started.append(job.id)
        if job.payload["n"] >= fast_jobs:
            gate.wait(30)

    # a long lease: a buffered job waits up to 3 s before the claim loop would hand it back on its own
    s = settings.replace(poll_seconds=0.2, concurrency=2, batch=50, prefetch=40, heartbeat_seconds=0.2)
    ids = fill(pg_dsn, schema, 3000)
    worker = Worker(settings=s, handler=handler)
    try:
        async with worker:
            assert worker._executors is not None
            await await_for(
                lambda: sum(i >= ids[fast_jobs] for i in started) == 2 and worker._executors.buffered(),
                timeout=30,
                what="jobs prefetched, slots blocked",
            )
            stolen = {j.id for j in worker._executors.buffered()}
            # another worker recovered them (as after a stall of this one) and holds them now
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(
                    f"UPDATE \"{schema}\".jobs SET locked_by = 'elsewhere:1' WHERE id = ANY(%s)", (list(stolen),)
                )

            def lost_seen() -> bool:
                return any(
                    getattr(r, "job_id", None) in stolen and getattr(r, "action", "").startswith("lease_lost")
                    for r in caplog.records
                )

            await await_for(lost_seen, timeout=10, what="a heartbeat finding the buffered leases lost")
            gate.set()  # the slots free: the next buffered jobs would start now
            await await_for(
                lambda: done(pg_dsn, schema) == len(ids) - len(stolen), timeout=30, what="every other job done"
            )
    finally:
        gate.set()
    ran = stolen & set(started)
    assert not ran, f"{len(ran)} of {len(stolen)} jobs started after their lease was lost"
    unstarted = [r for r in caplog.records if getattr(r, "action", None) == "lease_lost_unstarted"]
    assert {r.job_id for r in unstarted} == stolen, "each dropped job is logged once"
    assert len(unstarted) == len(stolen)
    lost = worker.registry.get_sample_value(
        "skiplock_jobs_finished_total", {"queue": "default", "outcome": "lease_lost"}
    )
    assert lost == len(stolen)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT DISTINCT locked_by FROM "{schema}".jobs WHERE id = ANY(%s)', (list(stolen),))
        assert [r[0] for r in rows.fetchall()] == ["elsewhere:1"], "the other worker's lease is untouched"
