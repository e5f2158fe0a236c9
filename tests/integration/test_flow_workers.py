"""Flow control across real worker processes: each run of the flow app records its start and end (database
clock, in the job's transaction), and the tests check the intervals: no two runs of a serial key overlap and they
follow enqueue order, never more than N runs of a limited task overlap, a rate-limited task never starts more
than N per period, a limited task does not starve the others, and a claimer does not spin on rate-limited jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest

from skiplock import Queue, Settings
from skiplock.worker import Worker
from support import flow_app
from support.pg import await_for, wait_for
from support.workers import WorkerProcess

FAST = {"poll_seconds": 0.5, "lease_seconds": 30, "concurrency": 4, "shutdown_grace_seconds": 5}
Run = tuple[int, str, int, str | None, datetime, datetime]  # job_id, task, attempt, serial_key, started, ended


@pytest.fixture
def fleet(pg_dsn: str, schema: str) -> Iterator[list[WorkerProcess]]:
    flow_app.create_runs_table(pg_dsn, schema)
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


def start(fleet: list[WorkerProcess], pg_dsn: str, schema: str, n: int = 3, **kw: object) -> None:
    for _ in range(n):
        fleet.append(WorkerProcess(pg_dsn, schema, "flow", None, app="support.flow_app:app", **{**FAST, **kw}))


def runs(pg_dsn: str, schema: str) -> list[Run]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f'SELECT * FROM "{schema}".runs ORDER BY started').fetchall()  # type: ignore[return-value]


def done(pg_dsn: str, schema: str, n: int) -> bool:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM \"{schema}\".jobs WHERE status = 'done'").fetchone()
    return row is not None and row[0] >= n


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """Most intervals open at one instant (an end at the same instant as a start does not overlap it)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def test_workers_never_run_two_jobs_of_a_key_at_once_and_keep_enqueue_order(
    fleet: list[WorkerProcess], pg_dsn: str, schema: str, settings: Settings
) -> None:
    with Queue(settings=settings) as q:
        for i in range(8):  # interleaved keys: a worker's batch holds jobs of many keys
            for k in range(4):
                q.enqueue("flow", {"key": f"user:{k}", "i": i, "sleep": 0.03}, task="flow.serial",
                          serial_key=f"user:{k}")  # fmt: skip
        q.enqueue_many("flow", [{"sleep": 0.01}] * 8, task="flow.plain")
    start(fleet, pg_dsn, schema, n=3)
    wait_for(lambda: done(pg_dsn, schema, 40), timeout=60, what="every job done")
    rows = runs(pg_dsn, schema)
    for k in range(4):
        mine = [r for r in rows if r[3] == f"user:{k}"]
        assert len(mine) == 8
        assert max_overlap([(r[4], r[5]) for r in mine]) == 1, f"two runs of user:{k} overlapped"
        assert [r[0] for r in mine] == sorted(r[0] for r in mine), "runs of a key out of enqueue order"
    assert max_overlap([(r[4], r[5]) for r in rows if r[3]]) > 1  # different keys did run in parallel


def test_a_failing_job_holds_its_key_until_its_retry_succeeds(
    fleet: list[WorkerProcess], pg_dsn: str, schema: str, settings: Settings
) -> None:
    with Queue(settings=settings) as q:
        first = q.enqueue("flow", {"key": "k", "fail_attempts": 2}, task="flow.serial", serial_key="k").id
        q.enqueue_many("flow", [{"key": "k"}] * 3, task="flow.serial", serial_key="k")
    start(fleet, pg_dsn, schema, n=2)
    wait_for(lambda: done(pg_dsn, schema, 4), timeout=60, what="every job done")
    rows = runs(pg_dsn, schema)
    assert rows[0][0] == first and rows[0][2] == 3  # done at its third attempt, first of its key
    assert all(later[4] >= rows[0][5] for later in rows[1:]), "a later job ran while the first waited to retry"


def test_global_concurrency_is_never_exceeded_and_other_tasks_are_not_starved(
    fleet: list[WorkerProcess], pg_dsn: str, schema: str, settings: Settings
) -> None:
    with Queue(settings=settings) as q:
        q.enqueue_many("flow", [{"sleep": 0.15}] * 16, task="flow.limited", priority=5)  # first in claim order
        q.enqueue_many("flow", [{"sleep": 0.01}] * 24, task="flow.plain")
    start(fleet, pg_dsn, schema, n=3)
    wait_for(lambda: done(pg_dsn, schema, 40), timeout=60, what="every job done")
    rows = runs(pg_dsn, schema)
    limited = [(r[4], r[5]) for r in rows if r[1] == "flow.limited"]
    plain = [(r[4], r[5]) for r in rows if r[1] == "flow.plain"]
    assert len(limited) == 16 and len(plain) == 24
    assert max_overlap(limited) == 2  # global_concurrency=2 across three workers of concurrency 4
    # 16 runs of 0.15 s two at a time take over a second; the plain jobs behind them finish long before.
    assert max(e for _, e in plain) < max(e for _, e in limited) - timedelta(seconds=0.5)


def test_a_rate_limited_task_never_exceeds_its_rate_and_its_jobs_end_done(
    fleet: list[WorkerProcess], pg_dsn: str, schema: str, settings: Settings
) -> None:
    with Queue(settings=settings) as q:
        q.enqueue_many("flow", [{"sleep": 0.0}] * 9, task="flow.rated")  # rate_limit="3/2s"
    start(fleet, pg_dsn, schema, n=2)
    wait_for(lambda: done(pg_dsn, schema, 9), timeout=30, what="every job done")
    with psycopg.connect(pg_dsn) as conn:
        statuses = conn.execute(f'SELECT DISTINCT status FROM "{schema}".jobs').fetchall()
    assert statuses == [("done",)]
    starts = sorted(r[4] for r in runs(pg_dsn, schema))
    # Starts are recorded in the handler, a little after the claim that the limit counts: a window slightly
    # shorter than the period never holds more than 3.
    window = timedelta(seconds=1.7)
    assert max(sum(1 for t in starts if s <= t < s + window) for s in starts) <= 3
    assert starts[-1] - starts[0] >= timedelta(seconds=3.5)  # 9 starts at 3 per 2 s span at least 4 s


async def test_the_claimer_waits_for_the_next_allowed_start_instead_of_spinning(
    pg_dsn: str, schema: str, settings: Settings
) -> None:
    flow_app.create_runs_table(pg_dsn, schema)
    flow_app.SCHEMA = schema
    with Queue(settings=settings) as q:
        q.enqueue_many("flow", [{"sleep": 0.0}] * 9, task="flow.rated")
    # A long poll interval: without the wait hint the worker would sleep 30 s after the first window; with a
    # spinning claimer it would claim thousands of times.
    worker = Worker(
        flow_app.app, settings=settings.replace(poll_seconds=30.0, lease_seconds=120.0, concurrency=4, batch=4)
    )
    task = asyncio.create_task(worker.run())
    try:
        await worker.wait_ready(10)
        await await_for(lambda: done(pg_dsn, schema, 9), timeout=20, what="every rate-limited job done")
    finally:
        worker.request_stop()
        await task
    assert worker._claimer is not None
    assert worker._claimer.claims <= 30, f"{worker._claimer.claims} claims for 9 jobs at 3 per 2 s"
