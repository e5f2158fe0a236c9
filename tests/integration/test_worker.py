"""The worker runtime with real processes and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql

from skiplock import Queue, Settings
from skiplock.errors import HandlerImportError
from skiplock.handlers import Handler, load_handler
from skiplock.metrics import WorkerMetrics
from skiplock.store.worker import PgWorkerStore
from skiplock.worker import APPLICATION_NAME, Worker
from skiplock.worker import claimer as claimer_module
from support.bouncer import run_pgbouncer
from support.pg import await_for, wait_for
from support.workers import WorkerProcess, make_effects_table

FAST = {
    "lease_seconds": 4,
    "heartbeat_seconds": 1,
    "poll_seconds": 0.5,
    "recover_seconds": 0.5,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.2,
}


@pytest.fixture
def workers(pg_dsn: str, schema: str) -> Iterator[list[WorkerProcess]]:
    make_effects_table(pg_dsn, schema)
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


def spawn(
    workers: list[WorkerProcess], pg_dsn: str, schema: str, handler: str, queue: str = "w", **kw
) -> WorkerProcess:
    w = WorkerProcess(pg_dsn, schema, queue, handler, **{**FAST, **kw})
    workers.append(w)
    return w


def counts(pg_dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT status, count(*) FROM "{schema}".jobs GROUP BY status').fetchall()
    return dict(rows)


def handlers_inside(pg_dsn: str, schema: str) -> int:
    """Handlers that wrote their effect and have not returned yet: their connections sit in the job's open
    transaction. (A job whose status is processing may still wait in the prefetch buffer for a thread.)"""
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND position(%s in query) > 0",
            (f'"{schema}".effects',),
        ).fetchone()[0]


def effects(pg_dsn: str, schema: str) -> list[tuple[int, int]]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f'SELECT job_id, count(*) FROM "{schema}".effects GROUP BY job_id').fetchall()


def all_done(pg_dsn: str, schema: str, n: int):
    return lambda: counts(pg_dsn, schema).get("done", 0) == n


@pytest.mark.parametrize("handler", ["support.handlers:write_effect", "support.handlers:awrite_effect"])
@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_sync_and_async_handlers_commit_each_effect_with_completion(
    workers, queue: Queue, pg_dsn, schema, handler, loop
):
    ids = queue.enqueue_many("w", [{} for _ in range(300)])
    w = spawn(workers, pg_dsn, schema, handler, concurrency=8, event_loop=loop)
    wait_for(all_done(pg_dsn, schema, 300), timeout=60, what="300 jobs done")
    # the default is uvloop's loop (a dependency on Linux); asyncio's on request
    assert f"loop={'uvloop' if loop == 'auto' else 'asyncio'}" in w.output()
    got = effects(pg_dsn, schema)
    assert {job_id for job_id, _ in got} == set(ids)
    assert all(n == 1 for _, n in got), "an effect was committed twice"


def test_no_op_handler_completes_in_batches(workers, queue: Queue, pg_dsn, schema):
    queue.enqueue_many("w", [{} for _ in range(2000)])
    spawn(workers, pg_dsn, schema, "support.handlers:noop", concurrency=16, batch=16)
    spawn(workers, pg_dsn, schema, "support.handlers:anoop", concurrency=16, batch=16)
    wait_for(all_done(pg_dsn, schema, 2000), timeout=60, what="2000 jobs done")


def test_failures_retry_with_backoff_then_fail(workers, queue: Queue, pg_dsn, schema):
    ok = queue.enqueue("w", {"fail_times": 2}, max_attempts=5).id
    dead = queue.enqueue("w", {"always_fail": True}, max_attempts=3).id
    final = queue.enqueue("w", {"non_retryable": True}, max_attempts=5).id
    spawn(workers, pg_dsn, schema, "support.handlers:mixed")
    wait_for(lambda: counts(pg_dsn, schema) == {"done": 1, "failed": 2}, timeout=30, what="terminal states")
    assert queue.get(ok)["attempts"] == 3
    assert queue.get(dead)["attempts"] == 3 and "always fails (attempt 3)" in queue.get(dead)["last_error"]
    assert queue.get(final)["attempts"] == 1 and queue.get(final)["last_error"] == "NonRetryableError: bad input"


def test_kill_9_mid_batch_jobs_come_back_and_finish_exactly_once_in_effect(workers, queue: Queue, pg_dsn, schema):
    ids = queue.enqueue_many("w", [{"sleep": 0.3} for _ in range(40)])
    victim = spawn(workers, pg_dsn, schema, "support.handlers:write_effect", concurrency=8)
    wait_for(lambda: counts(pg_dsn, schema).get("processing", 0) >= 4, timeout=20, what="jobs in flight")
    victim.signal(signal.SIGKILL)
    victim.wait()
    stuck = counts(pg_dsn, schema).get("processing", 0)
    assert stuck > 0, "the kill left nothing in flight; the test proves nothing"
    spawn(workers, pg_dsn, schema, "support.handlers:write_effect", concurrency=8)
    wait_for(all_done(pg_dsn, schema, 40), timeout=60, what="all jobs done after the crash")
    got = effects(pg_dsn, schema)
    assert sorted(j for j, _ in got) == sorted(ids) and all(n == 1 for _, n in got)
    with psycopg.connect(pg_dsn) as conn:
        retried = conn.execute(f'SELECT count(*) FROM "{schema}".jobs WHERE attempts = 2').fetchone()[0]
    assert retried >= stuck


def test_a_slow_job_with_heartbeats_is_not_stolen(workers, queue: Queue, pg_dsn, schema):
    job_id = queue.enqueue("w", {"sleep": 6}).id  # longer than the 2 s lease
    spawn(workers, pg_dsn, schema, "support.handlers:write_effect", lease_seconds=2, heartbeat_seconds=0.5)
    wait_for(lambda: queue.get(job_id)["status"] == "processing", timeout=20, what="claimed")
    spawn(workers, pg_dsn, schema, "support.handlers:write_effect", lease_seconds=2, heartbeat_seconds=0.5)
    wait_for(lambda: queue.get(job_id)["status"] == "done", timeout=30, what="slow job done")
    assert queue.get(job_id)["attempts"] == 1
    assert effects(pg_dsn, schema) == [(job_id, 1)]


def test_sigterm_drains_in_flight_jobs_and_exits_zero(workers, queue: Queue, pg_dsn, schema):
    queue.enqueue_many("w", [{"sleep": 1} for _ in range(4)])
    w = spawn(workers, pg_dsn, schema, "support.handlers:write_effect", concurrency=4, shutdown_grace_seconds=20)
    wait_for(lambda: handlers_inside(pg_dsn, schema) == 4, timeout=20, what="4 handlers running")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert counts(pg_dsn, schema) == {"done": 4}


def test_sigterm_past_the_grace_period_hands_jobs_back_without_burning_an_attempt(
    workers, queue: Queue, pg_dsn, schema
):
    ids = queue.enqueue_many("w", [{"sleep": 30} for _ in range(2)])
    w = spawn(workers, pg_dsn, schema, "support.handlers:awrite_effect", concurrency=2, shutdown_grace_seconds=0.5)
    wait_for(lambda: counts(pg_dsn, schema).get("processing", 0) == 2, timeout=20, what="2 in flight")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    for job_id in ids:
        row = queue.get(job_id)
        assert (row["status"], row["attempts"]) == ("pending", 0)
    assert effects(pg_dsn, schema) == []


def test_terminated_backend_connections_are_survived(workers, queue: Queue, pg_dsn, schema):
    queue.enqueue_many("w", [{} for _ in range(50)])
    w = spawn(workers, pg_dsn, schema, "support.handlers:write_effect", concurrency=4)
    wait_for(all_done(pg_dsn, schema, 50), timeout=30, what="first 50 done")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            (APPLICATION_NAME,),
        ).fetchone()[0]
    assert killed >= 2
    queue.enqueue_many("w", [{} for _ in range(50)])
    wait_for(all_done(pg_dsn, schema, 100), timeout=60, what="next 50 done after the connections were killed")
    assert w.alive, w.output()


def test_a_handler_that_cannot_be_imported_stops_the_worker_at_start(pg_dsn, schema):
    for spec, fragment in [
        ("support.nosuch:fn", "cannot import handler module"),
        ("support.handlers:missing", "has no attribute"),
        ("support.handlers:not_callable", "not a function"),
    ]:
        env = {"PYTHONPATH": "tests", "SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema, "PATH": "/usr/bin:/bin"}
        done = subprocess.run(  # noqa: PLW1510 - the exit code is the assertion
            [sys.executable, "-m", "skiplock", "worker", "--handler", spec],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert fragment in done.stderr


def test_load_handler_tells_sync_from_async():
    assert load_handler("support.handlers:noop").is_async is False
    assert load_handler("support.handlers:anoop").is_async is True
    with pytest.raises(HandlerImportError):
        load_handler("nocolon")


# ---------------------------------------------------------------------------------------------- in-process
async def _run_worker(settings: Settings, handler: Handler) -> tuple[Worker, asyncio.Task[int]]:
    worker = Worker(settings=settings, handler=handler)
    task = asyncio.create_task(worker.run())
    await await_for(
        lambda: worker.listener is None or worker.listener.connected or task.done(), timeout=15, what="listener up"
    )
    return worker, task


async def test_notify_wakes_an_idle_worker_long_before_its_poll(settings: Settings, aqueue):
    settings = settings.replace(poll_seconds=60, lease_seconds=120, heartbeat_seconds=10)
    seen: list[int] = []

    async def handler(job):
        seen.append(job.id)

    worker, task = await _run_worker(settings, Handler("t", handler, True))
    try:
        await asyncio.sleep(0.2)
        job_id = (await aqueue.enqueue("default", {})).id
        await await_for(lambda: seen == [job_id], timeout=10, what="job picked up through NOTIFY (poll is 60 s)")
        wakeups = worker.registry.get_sample_value("skiplock_worker_wakeups_total", {"source": "notify"})
        assert wakeups and wakeups >= 1
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_without_listen_the_poll_still_finds_work(settings: Settings, aqueue):
    settings = settings.replace(poll_seconds=0.3, listen=False)
    seen: list[int] = []

    async def handler(job):
        seen.append(job.id)

    worker, task = await _run_worker(settings, Handler("t", handler, True))
    try:
        await asyncio.sleep(0.5)
        job_id = (await aqueue.enqueue("default", {})).id
        await await_for(lambda: seen == [job_id], timeout=10, what="job picked up by polling")
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


async def test_a_stolen_lease_rolls_back_the_handlers_writes(settings: Settings, aqueue, pg_dsn, schema):
    make_effects_table(pg_dsn, schema)
    release = asyncio.Event()
    started = asyncio.Event()

    async def handler(job):
        await job.conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s)', (job.id, job.attempts))
        started.set()
        await release.wait()

    worker, task = await _run_worker(settings, Handler("t", handler, True))
    try:
        job_id = (await aqueue.enqueue("default", {})).id
        await asyncio.wait_for(started.wait(), 10)
        async with aqueue.pool.connection() as conn:  # another worker took the lease (recovered and re-claimed)
            await conn.execute(f'UPDATE "{schema}".jobs SET locked_by = %s WHERE id = %s', ("thief", job_id))
        release.set()
        await await_for(
            lambda: (
                worker.registry.get_sample_value(
                    "skiplock_jobs_finished_total", {"queue": "default", "outcome": "lease_lost"}
                )
                == 1
            ),
            timeout=10,
            what="lease_lost counted",
        )
        assert effects(pg_dsn, schema) == []
        row = await aqueue.get(job_id)
        assert row["status"] == "processing" and row["locked_by"] == "thief"
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


async def test_a_sync_handler_gets_a_connection_only_when_it_uses_job_conn(settings: Settings, aqueue, pg_dsn, schema):
    make_effects_table(pg_dsn, schema)
    ran: list[int] = []

    def handler(job):
        if job.payload["write"]:
            job.conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s)', (job.id, job.attempts))
        ran.append(job.id)

    settings = settings.replace(concurrency=4, batch=4)
    worker, task = await _run_worker(settings, Handler("t", handler, False))
    try:
        ids = await aqueue.enqueue_many("default", [{"write": i % 5 == 0} for i in range(40)])
        await await_for(lambda: counts(pg_dsn, schema).get("done") == 40, timeout=30, what="40 jobs done")
        assert sorted(ran) == sorted(ids)
        assert sorted(job_id for job_id, _ in effects(pg_dsn, schema)) == ids[::5]
        assert worker._executors._threads.pool is not None
        checkouts = worker._executors._threads.pool.get_stats().get("requests_num", 0)
        assert checkouts == 8, f"{checkouts} job.conn checkouts for 8 writing jobs (32 jobs never touched it)"
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_the_in_flight_gauge_counts_jobs_while_they_run(settings: Settings, aqueue):
    release = threading.Event()
    started: list[int] = []

    def handler(job):
        started.append(job.id)
        release.wait(20)

    worker, task = await _run_worker(settings.replace(concurrency=4, batch=4), Handler("t", handler, False))

    def gauge() -> float | None:
        return worker.registry.get_sample_value("skiplock_worker_jobs_in_flight", {"queue": "default"})

    try:
        await aqueue.enqueue_many("default", [{} for _ in range(3)])
        await await_for(lambda: len(started) == 3, timeout=10, what="3 jobs started")
        assert gauge() == 3, "the gauge counts jobs from their start, not from the first one to finish"
        release.set()
        await await_for(lambda: gauge() == 0, timeout=10, what="gauge back to 0")
    finally:
        release.set()
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_a_swallowed_job_conn_checkout_failure_fails_the_job_instead_of_completing_it(settings: Settings, aqueue):
    holder: list[Worker] = []

    def handler(job):
        pool = holder[0]._executors._threads.pool
        assert pool is not None
        pool.close()  # a real checkout failure: the pool is gone
        with contextlib.suppress(Exception):  # the handler hides it; its writes never happened
            job.conn.execute("SELECT 1")

    worker, task = await _run_worker(settings.replace(max_attempts=1), Handler("t", handler, False))
    holder.append(worker)
    try:
        job_id = (await aqueue.enqueue("default", {}, max_attempts=1)).id
        await await_for(
            lambda: (
                worker.registry.get_sample_value(
                    "skiplock_jobs_finished_total", {"queue": "default", "outcome": "failed"}
                )
                == 1
            ),
            timeout=10,
            what="the job counted failed",
        )
        row = await aqueue.get(job_id)
        assert row["status"] == "failed" and "job.conn could not be checked out" in row["last_error"]
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


class _Abort(BaseException):
    """Not an Exception: what a careless handler or library might raise."""


async def test_an_async_handler_raising_a_base_exception_frees_its_slot_and_fails_the_attempt(
    settings: Settings, aqueue
):
    async def handler(job):
        raise _Abort("stop")

    worker, task = await _run_worker(settings.replace(concurrency=1, batch=1), Handler("t", handler, True))
    try:
        first = (await aqueue.enqueue("default", {}, max_attempts=1)).id
        second = (await aqueue.enqueue("default", {}, max_attempts=1)).id

        async def both_failed() -> bool:
            return [(await aqueue.get(i))["status"] for i in (first, second)] == ["failed", "failed"]

        for _ in range(100):
            if await both_failed():
                break
            await asyncio.sleep(0.1)
        assert await both_failed(), "the one slot was lost after the first job"
        assert worker.in_flight == 0
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_claims_are_planned_again_once_the_jobs_table_has_grown(settings: Settings, aqueue, monkeypatch):
    """A claim prepared while the table was small keeps that plan (a scan of the whole table for the completions
    it carries) until an ANALYZE: once the table has grown REPLAN_GROWTH times over, the control connections drop
    their prepared statements in their own sessions (no connection is replaced), the claimer's kept one before
    its next claim, and every job still runs once."""
    monkeypatch.setattr(claimer_module, "REPLAN_CHECK_SECONDS", 0.05)
    monkeypatch.setattr(claimer_module, "REPLAN_FLOOR_BYTES", 0)
    ran: list[int] = []
    worker, task = await _run_worker(
        settings.replace(concurrency=4, batch=4), Handler("t", lambda job: ran.append(job.id), False)
    )
    try:
        first: list[int] = []
        for _ in range(8):  # small claims on a small table: the claim statement gets prepared
            first.extend(await aqueue.enqueue_many("default", [{} for _ in range(4)]))
            await await_for(lambda: set(first) <= set(ran), timeout=10, what="trickle done")
        claimer = worker._claimer
        assert claimer is not None and claimer.replans == 0
        control = worker._store
        more = await aqueue.enqueue_many("default", [{"pad": "x" * 200} for _ in range(3000)])
        await await_for(lambda: len(ran) == len(first) + len(more), timeout=60, what="backlog done")
        assert claimer.replans >= 1 and control.plans == claimer.replans
        assert sorted(ran) == sorted(first + more)
        assert control.pool.get_stats().get("connections_lost", 0) == 0
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_a_backlog_is_claimed_from_the_last_position_and_jobs_sorting_before_it_still_run_soon(
    settings: Settings, aqueue
):
    """While a backlog drains, claims start after the last job claimed (the dead index entries before it are not
    walked again); a job that sorts before that position (a higher priority, an old due time) waits at most for
    the next claim from the start, not for the end of the backlog."""
    ran: list[int] = []
    worker, task = await _run_worker(
        settings.replace(concurrency=4, batch=4), Handler("t", lambda job: ran.append(job.id), False)
    )
    try:
        backlog = await aqueue.enqueue_many("default", [{} for _ in range(3000)])
        await await_for(lambda: len(ran) >= 300, timeout=60, what="backlog under way")
        urgent = (await aqueue.enqueue("default", {}, priority=5)).id
        old = (await aqueue.enqueue("default", {}, run_at=datetime(2000, 1, 1, tzinfo=UTC))).id
        await await_for(lambda: len(ran) == len(backlog) + 2, timeout=60, what="backlog done")
        assert ran.index(urgent) < len(backlog) - 1000 and ran.index(old) < len(backlog) - 1000, (
            ran.index(urgent),
            ran.index(old),
        )
        claimer = worker._claimer
        assert claimer is not None and claimer.claims_after > 0
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_a_worker_picking_up_jobs_one_at_a_time_keeps_its_claim_connection_between_them(
    settings: Settings, aqueue, monkeypatch: pytest.MonkeyPatch
):
    """Between pick-ups less than IDLE_RETURN_SECONDS apart the claim connection stays checked out: a checkout and
    a return for each pick-up cost more of the worker's CPU than the claim's own work. Idle for longer, it goes
    back to the pool (the tests that wait for "claim connection returned when idle")."""
    monkeypatch.setattr(claimer_module, "IDLE_RETURN_SECONDS", 60.0)
    ran: list[int] = []
    worker, task = await _run_worker(settings, Handler("t", lambda job: ran.append(job.id), False))
    try:
        await aqueue.enqueue("default", {})
        await await_for(lambda: len(ran) == 1, timeout=30, what="the first job done")
        await await_for(lambda: worker._store.claim_connection_kept, timeout=30, what="the claim connection kept")
        store = worker._store
        give_back = store.give_back_claim_connection
        given_back: list[bool] = []

        async def counted() -> None:
            given_back.append(store.claim_connection_kept)
            await give_back()

        monkeypatch.setattr(store, "give_back_claim_connection", counted)
        kept = store._claim_conn
        for n in range(2, 5):
            await aqueue.enqueue("default", {})
            await await_for(lambda n=n: len(ran) == n, timeout=30, what=f"job {n} done")
        assert store.claim_connection_kept and store._claim_conn is kept
        assert True not in given_back, "the claim connection went back to the pool between pick-ups"
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_control_connections_prepare_the_claim_at_its_first_use(settings: Settings, aqueue):
    """A statement sent unprepared is parsed again each time, 1-3 ms for the claim: psycopg prepares a statement at
    its sixth use by default, so every drain's first claims paid it. A worker's control connections prepare each
    statement at its first use: after a worker claimed one job, its claim is prepared."""
    ran: list[int] = []
    worker, task = await _run_worker(settings, Handler("t", lambda job: ran.append(job.id), False))
    try:
        await aqueue.enqueue("default", {})
        await await_for(lambda: len(ran) == 1, timeout=30, what="the job done")
        claimer = worker._claimer
        assert claimer is not None
        await await_for(
            lambda: not worker._store.claim_connection_kept, timeout=30, what="claim connection returned when idle"
        )
        pool = worker._store.pool
        held = [await pool.getconn() for _ in range(pool.get_stats()["pool_size"])]
        try:
            prepared = []
            for conn in held:
                rows = await (await conn.execute("SELECT statement FROM pg_prepared_statements")).fetchall()
                prepared += [statement for (statement,) in rows]
        finally:
            for conn in held:
                await pool.putconn(conn)
        assert worker._claimer.claims <= 5, "more claims than psycopg's own threshold: the test proves nothing"
        assert any("FOR UPDATE SKIP LOCKED" in statement for statement in prepared), prepared
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_control_calls_go_on_unprepared_once_prepared_statements_go_missing(settings: Settings, caplog):
    """A pooler in transaction mode loses a connection's prepared statements between transactions: the call that
    finds one missing is tried again, the control pool's connections are replaced, and nothing is prepared after."""
    caplog.set_level(logging.WARNING, logger="skiplock")
    control = PgWorkerStore(settings, WorkerMetrics(CollectorRegistry()))
    await control.open()
    try:
        paused = control.statements.q.queue_paused
        held = [await control.pool.getconn() for _ in range(control.pool.max_size)]
        for conn in held:
            await conn.execute(paused, {"queues": ["default"]})  # prepared at its first use
            rows = await (await conn.execute("SELECT statement FROM pg_prepared_statements")).fetchall()
            assert (paused.replace("%(queues)s", "$1"),) in rows, rows
            # behind psycopg's back, as a pooler does: psycopg still thinks its statements are there
            assert conn.pgconn.exec_(b"DEALLOCATE ALL").status == psycopg.pq.ExecStatus.COMMAND_OK
        for conn in held:
            await control.pool.putconn(conn)
        assert await control.paused(["default"]) == []
        assert control.prepare is False and control.ok
        assert await control.paused(["default"]) == []
        async with control.pool.connection() as conn:
            rows = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements")).fetchall()
            assert rows == [(0,)]
        warned = [r for r in caplog.records if "prepared statements do not last" in r.getMessage()]
        assert len(warned) == 1
    finally:
        await control.close()


async def test_a_replan_makes_each_control_connection_plan_its_statements_again_in_its_own_session(
    settings: Settings, pg_dsn: str
):
    """A statement prepared while the jobs table was empty keeps its plan (a sequential scan of the table for the
    ids it joins) however much the table grows. After ``replan`` each pooled control connection, at its next
    checkout, plans it again for the table as it is (the primary key), and is still the same server session. (The
    worker's own statements find their rows by primary key whatever the table's size; this probe is the join they
    once made, which a plan made for the empty table reads by a scan of the table.)"""
    control = PgWorkerStore(settings, WorkerMetrics(CollectorRegistry()))
    await control.open()
    try:
        probe = sql.SQL(
            "SELECT /* replan probe */ j.id FROM {}.jobs AS j JOIN unnest(%(ids)s::bigint[]) AS c(id) ON j.id = c.id"
        ).format(sql.Identifier(settings.schema))
        params = {"ids": [1]}

        async def scans(conn: psycopg.AsyncConnection[Any]) -> str:
            """How the probe prepared on ``conn`` reads the jobs table, as planned now."""
            found = "SELECT name, parameter_types::text[] FROM pg_prepared_statements "
            found += "WHERE statement LIKE '%%replan probe%%'"
            row = await (await conn.execute(found, prepare=False)).fetchone()
            assert row is not None, "the probe is not prepared on this connection"
            name, types = row
            args = sql.SQL(", ").join(
                sql.Literal(None)
                if t.startswith("timestamp")
                else sql.Literal("w")
                if t == "text"
                else sql.Literal("{1}")
                for t in types
            )
            explain = sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(name), args)
            plan = [r[0] for r in await (await conn.execute(explain, prepare=False)).fetchall()]
            return next(line.strip() for line in plan if "Scan" in line and " on jobs j" in line)

        async def every_connection() -> dict[int, str]:
            """The probe's scan on each of the pool's connections (all checked out at once), by session."""
            held = [await control.pool.getconn() for _ in range(control.pool.max_size)]
            try:
                return {conn.info.backend_pid: await scans(conn) for conn in held}
            finally:
                for conn in held:
                    await control.pool.putconn(conn)

        held = [await control.pool.getconn() for _ in range(control.pool.max_size)]
        for conn in held:  # one generic plan each, as the claimer's connection keeps them, made on the empty table
            await conn.execute("SET plan_cache_mode = force_generic_plan", prepare=False)
            await conn.execute(probe, params, prepare=True)
        for conn in held:
            await control.pool.putconn(conn)
        before = await every_connection()
        assert all("Seq Scan" in scan for scan in before.values()), before
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            grow = sql.SQL("INSERT INTO {}.jobs (queue, payload) SELECT 'q', '{{}}' FROM generate_series(1, 50000)")
            other.execute(grow.format(sql.Identifier(settings.schema)))
        stale = await every_connection()
        assert stale == before, "plans made for the empty table are kept however much it grows"
        control.replan()
        after = await every_connection()
        assert set(after) == set(before), "the connections were replaced, not kept"
        assert all("Scan using jobs_pkey" in scan for scan in after.values()), after
    finally:
        await control.close()


def test_a_worker_behind_pgbouncer_in_transaction_mode_drains_its_queue(
    pg_dsn: str, schema: str, settings: Settings, workers: list[WorkerProcess]
):
    """Behind a real PgBouncer in transaction mode (no LISTEN there: it polls), every job is done once, and the
    worker warns at most once about prepared statements, however its transactions were spread."""
    with Queue(settings=settings, max_size=2) as q:
        q.enqueue_many("w", [{"n": i} for i in range(2000)])
    with run_pgbouncer(pg_dsn, "transaction", pool_size=3) as bouncer:
        w = spawn(workers, bouncer, schema, "support.handlers:noop", listen=False, concurrency=4)
        wait_for(lambda: counts(pg_dsn, schema) == {"done": 2000}, timeout=60, what="2000 jobs done")
        w.signal()
        assert w.wait() == 0
    log = w.output()
    assert log.count("prepared statements do not last") <= 1, log
    assert "does not exist" not in log.split("prepared statements do not last")[-1], log


async def test_a_job_completed_in_its_handlers_transaction_is_not_planned_afresh_each_time(settings: Settings, aqueue):
    """The fenced completion in a handler's transaction runs once a job: PostgreSQL must plan it once per connection
    (a generic plan), not at every call (0.3 ms a job, and the statement took 2.4x longer). One handler connection,
    so each handler reads the plan counts of the completions before its own."""
    readings: list[tuple[int, int]] = []
    await aqueue.enqueue_many("elsewhere", [{} for _ in range(20000)])  # a table of some size, with statistics
    async with aqueue.pool.connection() as conn:
        await conn.execute(f'ANALYZE "{settings.schema}".jobs')

    def handler(job):
        row = job.conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'UPDATE%%status = ''done''%%'"
        ).fetchone()
        readings.append(tuple(row) if row else (0, 0))

    worker, task = await _run_worker(settings.replace(concurrency=1), Handler("t", handler, False))
    try:
        for _ in range(20):  # one at a time: each completes before the next is read
            ran = len(readings)
            await aqueue.enqueue("default", {})
            await await_for(lambda ran=ran: len(readings) > ran, timeout=30, what="the job run")
        await await_for(lambda: worker._completer is not None and worker.in_flight == 0, timeout=30, what="all done")
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
    generic, custom = readings[-1]
    assert generic >= 5 and custom <= 5, readings[-3:]


async def test_the_claimers_connection_goes_back_to_the_pool_with_the_servers_plan_settings(settings: Settings, aqueue):
    """Once its claims fill their batch, the claimer's kept connection plans them once (force_generic_plan); before
    it goes back to the pool (the worker idles) the setting is reset, so the pool's other users plan as the server
    says. Every control connection works without JIT (session_control), whoever used it last."""
    ran: list[int] = []
    worker, task = await _run_worker(
        settings.replace(concurrency=4), Handler("t", lambda job: ran.append(job.id), False)
    )
    try:
        ids = await aqueue.enqueue_many("default", [{} for _ in range(3000)])
        await await_for(
            lambda: worker._claimer is not None and worker._store.streaming_claims,
            timeout=30,
            what="claims filling their batch: generic plans",
        )
        claimer = worker._claimer
        assert claimer is not None
        await await_for(lambda: len(ran) == len(ids), timeout=60, what="jobs done")
        await await_for(
            lambda: not worker._store.claim_connection_kept, timeout=30, what="claim connection returned when idle"
        )
        pool = worker._store.pool
        held = [await pool.getconn() for _ in range(pool.get_stats()["pool_size"])]
        try:
            for conn in held:
                row = await (
                    await conn.execute("SELECT current_setting('plan_cache_mode'), current_setting('jit')")
                ).fetchone()
                assert row == ("auto", "off"), row
        finally:
            for conn in held:
                await pool.putconn(conn)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
