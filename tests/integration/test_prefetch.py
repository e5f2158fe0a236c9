"""The prefetch buffer, against a real PostgreSQL: a worker holds claimed jobs beyond its running ones, covers them
with heartbeats, hands them back without burning an attempt when it stops or when they waited too long, and never
starts one found cancelled."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from skiplock import Settings
from skiplock.worker import Worker
from support.pg import await_for


def fill(dsn: str, schema: str, n: int) -> list[int]:
    """``n`` jobs of the default queue with payloads ``{"n": 0}`` .. ``{"n": n - 1}``, claimed in that order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload) SELECT %s, jsonb_build_object(%s::text, g) '
            "FROM generate_series(0, %s - 1) AS g ORDER BY g RETURNING id",
            ("default", "n", n),
        ).fetchall()
    return [r[0] for r in rows]


def quick(settings: Settings, **kw: Any) -> Settings:
    return settings.replace(poll_seconds=0.2, **kw)


def counts(dsn: str, schema: str) -> dict[tuple[str, int], int]:
    """Jobs by (status, attempts)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT status, attempts, count(*) FROM "{schema}".jobs GROUP BY 1, 2').fetchall()
    return {(r[0], r[1]): r[2] for r in rows}


def blocking_handler(gate: threading.Event, fast_jobs: int, blocked: list[int]) -> Any:
    """No-op for the first ``fast_jobs`` payloads (the worker learns its pace), then blocks until ``gate``."""

    def handler(job: Any) -> None:
        if job.payload["n"] >= fast_jobs:
            blocked.append(job.id)
            gate.wait(30)

    return handler


def buffered(worker: Worker) -> int:
    assert worker._executors is not None
    return len(worker._executors.buffered())


async def test_a_fast_worker_prefetches_and_hands_the_buffer_back_at_stop_without_burning_an_attempt(
    settings: Settings, pg_dsn: str, schema: str
) -> None:
    gate = threading.Event()
    s = quick(settings, concurrency=2, batch=50, prefetch=40, shutdown_grace_seconds=10)
    fill(pg_dsn, schema, 3000)
    blocked: list[int] = []
    worker = Worker(settings=s, handler=blocking_handler(gate, 2000, blocked))
    try:
        async with worker:
            await await_for(
                lambda: len(blocked) == 2 and buffered(worker) > 0, timeout=30, what="jobs prefetched, slots blocked"
            )
            # both running jobs and the buffer hold leases (once no claim is in flight)
            await await_for(
                lambda: counts(pg_dsn, schema)[("processing", 1)] == 2 + buffered(worker),
                timeout=10,
                what="the buffer's leases in the table",
            )
            held = buffered(worker)
            assert 0 < held <= 40, "never more than prefetch"
            worker.request_stop()
            await await_for(
                lambda: counts(pg_dsn, schema).get(("processing", 1)) == 2, timeout=10, what="buffer handed back"
            )
            gate.set()  # the two running jobs finish within the grace period
    finally:
        gate.set()
    c = counts(pg_dsn, schema)
    assert c[("done", 1)] == 2002, c
    assert c[("pending", 0)] == 998, c  # every other job pending again, no attempt burnt
    assert worker.released >= held
    assert len(blocked) == 2, "a handed-back job never started"


async def test_buffered_jobs_that_wait_past_their_share_of_the_lease_are_handed_back(
    settings: Settings, pg_dsn: str, schema: str
) -> None:
    gate = threading.Event()
    # lease 4 s: a prefetched job waits at most 0.2 s (plus the claim loop's 1 s check) before it is handed back
    s = quick(settings, concurrency=2, batch=50, prefetch=40, lease_seconds=4.0, heartbeat_seconds=1.0)
    fill(pg_dsn, schema, 3000)
    blocked: list[int] = []
    worker = Worker(settings=s, handler=blocking_handler(gate, 2000, blocked))
    try:
        async with worker:
            await await_for(lambda: len(blocked) == 2, timeout=30, what="both slots blocked")
            # the stale ones are pending again, no attempt burnt; only the two running jobs are held
            await await_for(
                lambda: counts(pg_dsn, schema) == {("done", 1): 2000, ("processing", 1): 2, ("pending", 0): 998},
                timeout=10,
                what="stale prefetched jobs handed back",
            )
            assert buffered(worker) == 0
            assert len(blocked) == 2, "a handed-back job never started"
            gate.set()
    finally:
        gate.set()


async def test_a_prefetched_job_found_cancelled_never_starts(settings: Settings, pg_dsn: str, schema: str) -> None:
    gate = threading.Event()
    started: list[int] = []
    fast_jobs = 2000

    def handler(job: Any) -> None:
        started.append(job.id)
        if job.payload["n"] >= fast_jobs:
            gate.wait(30)

    s = quick(settings, concurrency=2, batch=50, prefetch=40)
    ids = fill(pg_dsn, schema, 3000)
    worker = Worker(settings=s, handler=handler)
    try:
        async with worker:
            await await_for(
                lambda: sum(i >= ids[fast_jobs] for i in started) == 2 and buffered(worker) > 0,
                timeout=30,
                what="jobs prefetched, slots blocked",
            )
            assert worker._executors is not None and worker._leases is not None
            victim = worker._executors.buffered()[-1]
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(f'UPDATE "{schema}".jobs SET status = %s WHERE id = %s', ("cancelled", victim.id))
            worker._leases.cancelled({victim.id})  # what the control channel's recheck reports
            assert victim.id not in {j.id for j in worker._executors.buffered()}
            gate.set()
    finally:
        gate.set()
    assert victim.id not in started
    assert (
        worker.registry.get_sample_value("skiplock_jobs_finished_total", {"queue": "default", "outcome": "cancelled"})
        == 1
    )
    assert ids
