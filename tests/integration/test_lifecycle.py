"""Job lifecycle controls against a real PostgreSQL: cancel (pending at once, running cooperatively, the race with
completion), the error history and ``skiplock show``."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from skiplock import AsyncQueue, Queue, Settings, Snooze
from skiplock.app import App
from skiplock.errors import EnqueueError
from skiplock.store.statements import Failure
from skiplock.worker import Worker
from support.pg import await_for, wait_for
from support.store import WorkerCalls


def fast(settings: Settings, **kw: Any) -> Settings:
    return settings.replace(**{"poll_seconds": 0.2, "backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.1, **kw})


def cli(*args: str, dsn: str, schema: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env |= {"SKIPLOCK_DSN": dsn, "SKIPLOCK_SCHEMA": schema}
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=env, capture_output=True, text=True, timeout=60
    )


def row(dsn: str, schema: str, job_id: int) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(f'SELECT * FROM "{schema}".jobs WHERE id = %s', (job_id,))
        found = cur.fetchone()
    assert found is not None
    return found


def effects_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".effects (job_id bigint PRIMARY KEY)')


def effects(dsn: str, schema: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(f'SELECT job_id FROM "{schema}".effects').fetchall()}


# ---------------------------------------------------------------------------------------------- cancel: pending
def test_cancelling_pending_jobs_is_immediate_and_retry_skips_them_unless_asked(queue: Queue, pg_dsn, schema):
    a, b, c = (queue.enqueue("q", {"n": i}).id for i in range(3))
    assert sorted(queue.cancel(ids=[a, b])) == [a, b]
    assert row(pg_dsn, schema, a)["status"] == "cancelled" and row(pg_dsn, schema, c)["status"] == "pending"
    assert queue.list_failed("q") == [], "a cancelled job is not a failed one"
    assert [s.failed for s in queue.stats("q")] == [0]
    assert queue.retry_failed(queue="q") == [], "retry never re-drives a cancelled job by default"
    assert sorted(queue.retry_failed(ids=[a], include_cancelled=True)) == [a]
    assert (row(pg_dsn, schema, a)["status"], row(pg_dsn, schema, b)["status"]) == ("pending", "cancelled")


def test_cancel_by_queue_and_task_leaves_other_tasks_and_finished_jobs(queue: Queue, pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ids = [
            conn.execute(
                f'INSERT INTO "{schema}".jobs (queue, payload, task) VALUES (%s, %s, %s) RETURNING id',
                ("q", "{}", task),
            ).fetchone()[0]  # type: ignore[index]
            for task in ("t.a", "t.b", "t.a")
        ]
        conn.execute(f'UPDATE "{schema}".jobs SET status = %s WHERE id = %s', ("done", ids[2]))
    assert queue.cancel(queue="q", task="t.a") == [ids[0]]
    assert queue.statuses(ids) == {ids[0]: "cancelled", ids[1]: "pending", ids[2]: "done"}


async def test_the_async_api_cancels_and_retries_like_the_sync_one(aqueue: AsyncQueue):
    a = (await aqueue.enqueue("q", {})).id
    assert await aqueue.cancel(ids=[a]) == [a]
    assert await aqueue.cancel(ids=[a]) == [], "already cancelled: nothing changes"
    assert await aqueue.statuses([a]) == {a: "cancelled"}
    assert await aqueue.retry_failed(queue="q") == []
    assert await aqueue.retry_failed(queue="q", include_cancelled=True) == [a]


def test_cli_cancel_reports_finished_jobs_and_exits_1_when_nothing_matched(queue: Queue, pg_dsn, schema):
    live = queue.enqueue("q", {}).id
    finished = queue.enqueue("q", {}).id
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".jobs SET status = %s WHERE id = %s', ("done", finished))

    out = cli("cancel", str(live), str(finished), "999999", dsn=pg_dsn, schema=schema)
    assert out.returncode == 0 and "cancelled 1 job(s)" in out.stdout, out
    assert f"job {finished}: done, left unchanged" in out.stderr and "job 999999: no such job" in out.stderr
    assert row(pg_dsn, schema, finished)["status"] == "done"

    again = cli("cancel", str(finished), dsn=pg_dsn, schema=schema)
    assert again.returncode == 1 and "cancelled 0 job(s)" in again.stdout
    for args in (("cancel", "--queue", "q"), ("retry", "--queue", "q"), ("retry", str(live))):
        nothing = cli(*args, dsn=pg_dsn, schema=schema)
        assert nothing.returncode == 1, (args, nothing)  # nothing matched: 1, by ids and by queue alike
    redo = cli("retry", "--include-cancelled", str(live), dsn=pg_dsn, schema=schema)
    assert redo.returncode == 0 and "re-queued 1" in redo.stdout, redo
    assert row(pg_dsn, schema, live)["status"] == "pending"


# ---------------------------------------------------------------------------------------------- cancel: running
async def _cancel_running(settings: Settings, pg_dsn: str, schema: str, *, is_async: bool) -> dict[str, Any]:
    """Start a handler that writes through job.conn and then blocks; cancel it; return what was seen."""
    effects_table(pg_dsn, schema)
    app = App()
    started = threading.Event()
    seen: dict[str, Any] = {"outcomes": []}

    if is_async:

        @app.task(name="blocks", queue="q")
        async def blocks_async(job):
            await job.conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s)', (job.id,))
            started.set()
            try:
                await asyncio.sleep(120)
            except asyncio.CancelledError:
                seen["stopped"] = time.monotonic()
                raise

    else:

        @app.task(name="blocks", queue="q")
        def blocks_sync(job):
            job.conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s)', (job.id,))
            started.set()
            deadline = time.monotonic() + 60
            while not job.cancelled and time.monotonic() < deadline:
                time.sleep(0.005)
            seen["stopped"] = time.monotonic()
            seen["saw_cancelled"] = job.cancelled

    async with await AsyncQueue.open(settings=settings) as aq:
        job_id = await _insert_task(aq, "blocks")
        worker = Worker(app, settings=settings, observe=lambda job, outcome: seen["outcomes"].append((job.id, outcome)))
        async with worker:
            await await_for(started.is_set, timeout=20, what="handler started")
            cancel_at = time.monotonic()
            assert await aq.cancel(ids=[job_id]) == [job_id]
            await await_for(lambda: "stopped" in seen and seen["outcomes"], timeout=20, what="handler stopped")
            seen["latency"] = seen["stopped"] - cancel_at
        seen["metric"] = worker.registry.get_sample_value(
            "skiplock_jobs_finished_total", {"queue": "q", "outcome": "cancelled"}
        )
        seen["lost"] = worker.registry.get_sample_value(
            "skiplock_jobs_finished_total", {"queue": "q", "outcome": "lease_lost"}
        )
    seen["job_id"] = job_id
    return seen


async def _insert_task(aq: AsyncQueue, task: str) -> int:
    """A job of a task, written with plain SQL as any producer may (enqueue by task is the producer API's)."""
    async with aq.pool.connection() as conn:
        cur = await conn.execute(
            f'INSERT INTO "{aq.settings.schema}".jobs (queue, payload, task) VALUES (%s, %s, %s) RETURNING id',
            ("q", "{}", task),
        )
        found = await cur.fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_running_job_is_cancelled_cooperatively_and_its_writes_rolled_back(settings, pg_dsn, schema, is_async):
    seen = await _cancel_running(fast(settings), pg_dsn, schema, is_async=is_async)
    job_id = seen["job_id"]
    assert row(pg_dsn, schema, job_id)["status"] == "cancelled"
    assert effects(pg_dsn, schema) == set(), "the handler's job.conn writes were rolled back"
    assert seen["outcomes"] == [(job_id, "cancelled")]
    assert seen["metric"] == 1 and seen["lost"] == 0
    if not is_async:
        assert seen["saw_cancelled"] is True


async def test_without_listen_the_heartbeat_tells_the_handler(settings, pg_dsn, schema):
    s = fast(settings, listen=False, lease_seconds=2.0, heartbeat_seconds=None, recover_seconds=None)
    seen = await _cancel_running(s, pg_dsn, schema, is_async=False)
    assert seen["outcomes"] == [(seen["job_id"], "cancelled")] and seen["saw_cancelled"] is True
    assert row(pg_dsn, schema, seen["job_id"])["status"] == "cancelled"


async def test_cancel_racing_completion_ends_each_job_done_with_its_effect_or_cancelled_without(
    settings, pg_dsn, schema
):
    """Cancels fired while handlers commit: every job ends in exactly one state, its side effect exactly when done,
    and the worker counts each one as the database recorded it (never a false lease_lost)."""
    effects_table(pg_dsn, schema)
    app = App()
    rng = random.Random(7)

    @app.task(name="writes", queue="q")
    def writes(job):
        job.conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s)', (job.id,))
        time.sleep(rng.random() * 0.01)

    n = 120
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ids = [
            r[0]
            for r in conn.execute(
                f'INSERT INTO "{schema}".jobs (queue, payload, task) '
                "SELECT 'q', '{}', 'writes' FROM generate_series(1, %s) RETURNING id",
                (n,),
            ).fetchall()
        ]
    outcomes: dict[int, str] = {}
    worker = Worker(app, settings=fast(settings, concurrency=8), observe=lambda job, o: outcomes.__setitem__(job.id, o))
    said_cancelled: set[int] = set()
    async with worker, await AsyncQueue.open(settings=settings) as aq:
        order = ids[:]
        rng.shuffle(order)
        for job_id in order:
            said_cancelled |= set(await aq.cancel(ids=[job_id]))
            await asyncio.sleep(rng.random() * 0.004)
        await await_for(lambda: worker.in_flight == 0, timeout=30, what="no job running")
    final = Queue(settings=settings).statuses(ids)
    assert set(final.values()) <= {"done", "cancelled"}
    done = {i for i, s in final.items() if s == "done"}
    cancelled = {i for i, s in final.items() if s == "cancelled"}
    assert cancelled == said_cancelled
    assert effects(pg_dsn, schema) == done, "a side effect exactly for each done job"
    assert done and cancelled, "the race was exercised both ways"
    assert {i for i, o in outcomes.items() if o == "done"} == done
    assert {i for i, o in outcomes.items() if o not in ("done", "cancelled")} == set(), outcomes
    assert {i for i, o in outcomes.items() if o == "cancelled"} <= cancelled


# ---------------------------------------------------------------------------------------------- error history
def test_each_failed_attempt_appends_to_a_bounded_error_history(queue: Queue, pg_dsn, schema):
    job_id = queue.enqueue("q", {}, max_attempts=25).id
    for attempt in range(1, 24):
        [job] = queue.claim("q", limit=1, worker=f"w{attempt}")
        error = RuntimeError(f"boom {attempt} " + "x" * 5000)
        failure = Failure.from_exception(job, error, queue.settings)
        assert queue.fail([Failure(job, failure.error, 0.0, True)], worker=f"w{attempt}") == {job_id: "pending"}
    r = row(pg_dsn, schema, job_id)
    history = r["errors"]
    assert len(history) == 20, "the last 20 attempts are kept"
    assert [e["attempt"] for e in history] == list(range(4, 24))
    assert [e["worker"] for e in history] == [f"w{i}" for i in range(4, 24)]
    assert all(len(e["error"]) <= 1000 for e in history) and history[-1]["error"].startswith("RuntimeError: boom 23")
    assert r["last_error"].startswith("RuntimeError: boom 23") and len(r["last_error"]) > 1000, "last_error stays"
    assert all(e["at"] for e in history)


async def test_the_worker_records_each_failure_and_show_prints_the_history(settings, pg_dsn, schema):
    app = App()

    @app.task(name="flaky", queue="q")
    def flaky(job):
        raise ValueError(f"attempt {job.attempts} went wrong")

    async with await AsyncQueue.open(settings=settings) as aq:
        job_id = await _insert_task(aq, "flaky")
        async with aq.pool.connection() as conn:
            await conn.execute(f'UPDATE "{schema}".jobs SET max_attempts = 3 WHERE id = %s', (job_id,))
    worker = Worker(app, settings=fast(settings))
    async with worker:
        await await_for(lambda: row(pg_dsn, schema, job_id)["status"] == "failed", timeout=20, what="job failed")
    history = row(pg_dsn, schema, job_id)["errors"]
    assert [(e["attempt"], e["error"], e["worker"]) for e in history] == [
        (i, f"ValueError: attempt {i} went wrong", worker.identity) for i in (1, 2, 3)
    ]

    text = cli("show", str(job_id), dsn=pg_dsn, schema=schema)
    assert text.returncode == 0, text
    assert "status            failed" in text.stdout and "task              flaky" in text.stdout
    assert "lease_expires_at" in text.stdout and "errors (3, oldest first):" in text.stdout
    assert "attempt 2/" in text.stdout and "ValueError: attempt 2 went wrong" in text.stdout
    shown = json.loads(cli("show", str(job_id), "--json", dsn=pg_dsn, schema=schema).stdout)
    assert shown["id"] == job_id and shown["status"] == "failed" and shown["payload"] == {}
    assert [e["attempt"] for e in shown["errors"]] == [1, 2, 3] and shown["attempts"] == 3
    missing = cli("show", "999999", dsn=pg_dsn, schema=schema)
    assert missing.returncode == 1 and "no job 999999" in missing.stderr


def test_a_recovered_lease_is_part_of_the_history(queue: Queue, pg_dsn, schema):
    job_id = queue.enqueue("q", {}).id
    queue.claim("q", limit=1, worker="gone", lease_seconds=1)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE \"{schema}\".jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", (job_id,))
    wait_for(lambda: WorkerCalls(queue).recover_expired(queue="q"), timeout=10, what="recovered")
    [entry] = row(pg_dsn, schema, job_id)["errors"]
    assert entry["attempt"] == 1 and entry["worker"] == "gone" and entry["error"].startswith("LeaseExpired")


# ---------------------------------------------------------------------------------------------- timeouts
def attempts_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".attempts (job_id bigint, attempt int, PRIMARY KEY (job_id, attempt))')


def attempts_written(dsn: str, schema: str) -> set[tuple[int, int]]:
    with psycopg.connect(dsn) as conn:
        return {(r[0], r[1]) for r in conn.execute(f'SELECT job_id, attempt FROM "{schema}".attempts').fetchall()}


async def test_an_async_task_past_its_timeout_is_cancelled_rolled_back_and_retried(settings, pg_dsn, schema):
    attempts_table(pg_dsn, schema)
    app = App()
    cancelled_at: list[int] = []

    @app.task(name="slow", queue="q", timeout_seconds=0.3)
    async def slow(job):
        await job.conn.execute(f'INSERT INTO "{schema}".attempts VALUES (%s, %s)', (job.id, job.attempts))
        if job.attempts == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled_at.append(job.attempts)
                raise

    async with await AsyncQueue.open(settings=settings) as aq:
        job_id = await _insert_task(aq, "slow")
    worker = Worker(app, settings=fast(settings))
    async with worker:
        await await_for(lambda: row(pg_dsn, schema, job_id)["status"] == "done", timeout=20, what="done on retry")
    r = row(pg_dsn, schema, job_id)
    assert cancelled_at == [1] and r["attempts"] == 2
    assert [(e["attempt"], e["error"]) for e in r["errors"]] == [
        (1, "TimeoutError: the handler ran past its timeout of 0.3s")
    ]
    assert attempts_written(pg_dsn, schema) == {(job_id, 2)}, "the timed-out attempt's writes were rolled back"
    assert worker.registry.get_sample_value("skiplock_jobs_timed_out_total", {"queue": "q"}) == 1


async def test_a_sync_job_past_its_own_timeout_is_abandoned_its_slot_stuck_until_the_thread_returns(
    settings, pg_dsn, schema
):
    attempts_table(pg_dsn, schema)
    app = App()
    release = threading.Event()

    @app.task(name="hangs", queue="q")
    def hangs(job):
        job.conn.execute(f'INSERT INTO "{schema}".attempts VALUES (%s, %s)', (job.id, job.attempts))
        if job.attempts == 1:
            release.wait(60)

    with Queue(settings=settings) as q:  # the per-job timeout, set at enqueue
        assert row(pg_dsn, schema, q.enqueue("other", {}, timeout_seconds=2.5).id)["timeout_seconds"] == 2.5
        for bad in (0, -1, float("nan"), float("inf"), True, "5"):
            with pytest.raises(EnqueueError, match="timeout_seconds"):
                q.enqueue("other", {}, timeout_seconds=bad)  # type: ignore[arg-type]
        with pytest.raises(EnqueueError, match="unknown enqueue option"):
            q.enqueue_many("other", [{}], timeout_seconds=1)  # type: ignore[call-arg]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        job_id = conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, task, timeout_seconds) VALUES (%s, %s, %s, %s) RETURNING id',
            ("q", "{}", "hangs", 0.3),
        ).fetchone()[0]  # type: ignore[index]
    worker = Worker(app, settings=fast(settings, concurrency=1))
    stuck = {"queue": "q"}
    async with worker:
        await await_for(
            lambda: worker.registry.get_sample_value("skiplock_worker_stuck_slots", stuck) == 1,
            timeout=20,
            what="slot reported stuck",
        )
        # the slot is marked stuck as the timeout fires; the failure it records is written just after
        r = await await_for(
            lambda: (x := row(pg_dsn, schema, job_id))["status"] == "pending" and x, timeout=10, what="timeout written"
        )
        assert r["errors"][0]["error"].startswith("TimeoutError: the handler ran past")
        ready, why = worker.health.ready()
        assert not ready and "stuck" in why, "every slot is stuck: not ready"
        assert worker.registry.get_sample_value("skiplock_jobs_timed_out_total", {"queue": "q"}) == 1
        release.set()  # the thread returns; its completion is refused and its writes rolled back
        await await_for(lambda: row(pg_dsn, schema, job_id)["status"] == "done", timeout=20, what="retry done")
        assert worker.registry.get_sample_value("skiplock_worker_stuck_slots", stuck) == 0
        assert worker.health.ready()[0]
    assert attempts_written(pg_dsn, schema) == {(job_id, 2)}
    lost = {"queue": "q", "outcome": "lease_lost"}
    assert worker.registry.get_sample_value("skiplock_jobs_finished_total", lost) == 0


async def test_timeout_racing_the_handlers_commit_leaves_one_outcome_per_attempt(settings, pg_dsn, schema):
    """Sync handlers finishing around their timeout: each attempt either committed (done, no timeout recorded) or
    was timed out (its writes rolled back, TimeoutError in the history, done on the next attempt)."""
    attempts_table(pg_dsn, schema)
    app = App()
    rng = random.Random(3)

    @app.task(name="edge", queue="q", timeout_seconds=0.1)
    def edge(job):
        job.conn.execute(f'INSERT INTO "{schema}".attempts VALUES (%s, %s)', (job.id, job.attempts))
        if job.attempts == 1:
            time.sleep(0.07 + rng.random() * 0.06)

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ids = [
            r[0]
            for r in conn.execute(
                f'INSERT INTO "{schema}".jobs (queue, payload, task) '
                "SELECT 'q', '{}', 'edge' FROM generate_series(1, 40) RETURNING id"
            ).fetchall()
        ]
    async with Worker(app, settings=fast(settings, concurrency=8)):
        await await_for(
            lambda: set(Queue(settings=settings).statuses(ids).values()) == {"done"}, timeout=60, what="all done"
        )
    written = attempts_written(pg_dsn, schema)
    kinds = set()
    for job_id in ids:
        r = row(pg_dsn, schema, job_id)
        mine = {a for j, a in written if j == job_id}
        assert mine == {r["attempts"]}, (job_id, mine, r["attempts"])  # only the attempt that completed wrote
        timeouts = [e["attempt"] for e in r["errors"] if e["error"].startswith("TimeoutError")]
        assert timeouts == list(range(1, r["attempts"])), (job_id, r["errors"])
        kinds.add(r["attempts"] > 1)
    assert kinds == {True, False}, "the race went both ways"


def test_a_lease_is_never_renewed_past_the_jobs_timeout(queue: Queue, pg_dsn, schema):
    queue.enqueue("q", {}, timeout_seconds=3)
    with psycopg.connect(pg_dsn) as conn:
        t0 = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    from datetime import timedelta

    [job] = queue.claim("q", limit=1, worker="w", lease_seconds=2, now=t0)
    assert job.timeout_seconds == 3
    for after in (1.5, 2.5):
        held = WorkerCalls(queue).heartbeat(
            [job], worker="w", leases=[2], timeouts=[3], now=t0 + timedelta(seconds=after)
        )
        assert held == {job.id}
        assert row(pg_dsn, schema, job.id)["lease_expires_at"] == t0 + timedelta(seconds=3)
    assert WorkerCalls(queue).recover_expired(queue="q", now=t0 + timedelta(seconds=3.5))[0].id == job.id


# ---------------------------------------------------------------------------------------------- snooze
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_snooze_on_the_last_attempt_reschedules_without_using_it(settings, pg_dsn, schema, is_async):
    attempts_table(pg_dsn, schema)
    app = App()
    runs: list[tuple[int, float]] = []

    def body(job: Any) -> None:
        runs.append((job.attempts, time.monotonic()))
        if len(runs) <= 2:
            raise Snooze(0.3)

    if is_async:

        @app.task(name="later", queue="q")
        async def later_async(job):
            await job.conn.execute(f'INSERT INTO "{schema}".attempts VALUES (%s, %s)', (job.id, len(runs)))
            body(job)

    else:

        @app.task(name="later", queue="q")
        def later_sync(job):
            job.conn.execute(f'INSERT INTO "{schema}".attempts VALUES (%s, %s)', (job.id, len(runs)))
            body(job)

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        job_id = conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, task, max_attempts) VALUES (%s, %s, %s, 1) RETURNING id',
            ("q", "{}", "later"),
        ).fetchone()[0]  # type: ignore[index]
    worker = Worker(app, settings=fast(settings))
    async with worker:
        await await_for(lambda: row(pg_dsn, schema, job_id)["status"] == "done", timeout=20, what="done at last")
    r = row(pg_dsn, schema, job_id)
    assert [a for a, _ in runs] == [1, 1, 1], "every run was attempt 1 of 1: a snooze uses no attempt"
    assert all(b - a >= 0.3 for (_, a), (_, b) in itertools.pairwise(runs)), "each waited its snooze"
    assert r["attempts"] == 1 and r["errors"] == [] and r["last_error"] is None
    assert attempts_written(pg_dsn, schema) == {(job_id, 2)}, "the snoozed runs' writes were rolled back"
    snoozed = {"queue": "q", "outcome": "snoozed"}
    assert worker.registry.get_sample_value("skiplock_jobs_finished_total", snoozed) == 2
    assert worker.registry.get_sample_value("skiplock_jobs_finished_total", {"queue": "q", "outcome": "failed"}) == 0


def test_snooze_is_fenced_and_checks_its_delay(queue: Queue, pg_dsn, schema):
    job_id = queue.enqueue("q", {}).id
    [job] = queue.claim("q", limit=1, worker="w")
    assert WorkerCalls(queue).snooze([job], [60], worker="other") == set(), "fenced: only the lease holder snoozes"
    assert WorkerCalls(queue).snooze([job], [60], worker="w") == {job_id}
    r = row(pg_dsn, schema, job_id)
    assert (r["status"], r["attempts"]) == ("pending", 0) and r["visible_at"] > r["updated_at"]
    for bad in (-1, float("nan"), True):
        with pytest.raises(ValueError, match="Snooze"):
            Snooze(bad)


# ---------------------------------------------------------------------------------------------- pause / resume
def _insert(dsn: str, schema: str, queue: str, task: str, n: int = 1) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, task) '
            "SELECT %s, '{}', %s FROM generate_series(1, %s) RETURNING id",
            (queue, task, n),
        ).fetchall()
    return [r[0] for r in rows]


async def test_pause_lets_running_jobs_finish_claims_nothing_new_and_resume_picks_up(settings, pg_dsn, schema):
    app = App()
    release = threading.Event()

    @app.task(name="a.slow", queue="a")
    def slow(job):
        if job.payload.get("hold", True):
            release.wait(30)

    @app.task(name="b.mark", queue="b")
    def mark(job):
        pass

    [running] = _insert(pg_dsn, schema, "a", "a.slow")
    worker = Worker(app, settings=fast(settings, concurrency=4))
    gauge = {"queue": "a"}
    async with worker, await AsyncQueue.open(settings=settings) as aq:
        await await_for(lambda: row(pg_dsn, schema, running)["status"] == "processing", timeout=20, what="running")
        await aq.pause("a")
        assert await aq.paused() == ["a"]
        later = _insert(pg_dsn, schema, "a", "a.slow", 3)
        release.set()
        await await_for(lambda: row(pg_dsn, schema, running)["status"] == "done", timeout=20, what="running finished")
        [marker] = _insert(pg_dsn, schema, "b", "b.mark")
        await await_for(lambda: row(pg_dsn, schema, marker)["status"] == "done", timeout=20, what="other queue served")
        assert {row(pg_dsn, schema, i)["status"] for i in later} == {"pending"}, "nothing claimed from a paused queue"
        await await_for(
            lambda: worker.registry.get_sample_value("skiplock_worker_queue_paused", gauge) == 1,
            timeout=10,
            what="paused gauge",
        )
        [stats] = await aq.stats("a")
        assert stats.paused and stats.ready == 3
        await aq.resume("a")
        await await_for(
            lambda: {row(pg_dsn, schema, i)["status"] for i in later} == {"done"}, timeout=20, what="resumed"
        )
        await await_for(
            lambda: worker.registry.get_sample_value("skiplock_worker_queue_paused", gauge) == 0,
            timeout=10,
            what="gauge back to 0",
        )
    assert Queue(settings=settings).paused() == []


async def test_pause_during_claims_stops_every_claim_that_starts_after_it(settings, pg_dsn, schema):
    app = App()

    @app.task(name="a.quick", queue="a")
    def quick(job):
        time.sleep(0.002)

    @app.task(name="b.mark", queue="b")
    def mark(job):
        pass

    ids = _insert(pg_dsn, schema, "a", "a.quick", 400)

    def claimed() -> set[int]:
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                f"SELECT id FROM \"{schema}\".jobs WHERE queue = 'a' AND status <> 'pending'"
            ).fetchall()
        return {r[0] for r in rows}

    async with (
        Worker(app, settings=fast(settings, concurrency=4, batch=4)),
        await AsyncQueue.open(settings=settings) as aq,
    ):
        await await_for(lambda: len(claimed()) >= 20, timeout=20, what="claims under way")
        await aq.pause("a")  # while the claim loop runs flat out

        async def served_b() -> set[int]:
            """A job of the other queue done: the worker claimed since; returns the paused queue's claimed jobs."""
            [marker] = _insert(pg_dsn, schema, "b", "b.mark")
            await await_for(lambda: row(pg_dsn, schema, marker)["status"] == "done", timeout=20, what="marker")
            return claimed()

        first = await served_b()
        seen = await served_b()
        assert seen == first, "no claim after the pause took a job of the paused queue"
        assert 20 <= len(first) < len(ids), "the pause landed mid-stream"


def test_cli_pause_resume_and_stats(queue: Queue, pg_dsn, schema):
    queue.enqueue("q", {})
    queue.enqueue("q", {}, delay=3600)
    out = cli("pause", "q", dsn=pg_dsn, schema=schema)
    assert out.returncode == 0 and "paused" in out.stdout, out
    table = cli("stats", dsn=pg_dsn, schema=schema)
    assert "paused" in table.stdout.splitlines()[0] and "yes" in table.stdout.splitlines()[2], table.stdout
    [shown] = json.loads(cli("stats", "--json", dsn=pg_dsn, schema=schema).stdout)
    assert shown["paused"] is True and shown["next_due"] is not None and shown["avg_attempts_done"] is None
    assert cli("pause", "bad name;", dsn=pg_dsn, schema=schema).returncode == 2
    assert cli("resume", "q", dsn=pg_dsn, schema=schema).returncode == 0
    assert queue.paused() == [] and [s.paused for s in queue.stats("q")] == [False]


# ---------------------------------------------------------------------------------------------- retention
def _old_rows(dsn: str, schema: str, status: str, n: int, age: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, status, updated_at) '
            f"SELECT 'old', '{{}}', %s, now() - %s::interval FROM generate_series(1, %s)",
            (status, age, n),
        )


def _count(dsn: str, schema: str, status: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(f'SELECT count(*) FROM "{schema}".jobs WHERE status = %s', (status,)).fetchone()[0])  # type: ignore[index]


async def test_scheduled_retention_keeps_each_status_its_own_time_one_worker_at_a_time(settings, pg_dsn, schema):
    from prometheus_client import CollectorRegistry

    from skiplock.metrics import WorkerMetrics
    from skiplock.store.run import execute
    from skiplock.store.statements import Statements
    from skiplock.store.worker import PgWorkerStore
    from skiplock.worker.retention import Retention

    _old_rows(pg_dsn, schema, "done", 12, "8 days")
    _old_rows(pg_dsn, schema, "done", 5, "6 days")  # kept: done jobs live 7 days
    _old_rows(pg_dsn, schema, "failed", 7, "8 days")  # kept: failed jobs live 30 days
    _old_rows(pg_dsn, schema, "failed", 4, "31 days")
    _old_rows(pg_dsn, schema, "cancelled", 3, "8 days")
    _old_rows(pg_dsn, schema, "pending", 2, "90 days")  # never purged, whatever its age
    metrics = WorkerMetrics(CollectorRegistry())
    retention = Retention(settings, metrics, PgWorkerStore(settings, metrics), batch=5)  # several batches
    with psycopg.connect(pg_dsn) as holder:  # another worker is purging: its transaction holds the purge lock
        assert execute(holder, Statements(settings).purge_lock(wait=True))
        assert await retention.purge_once() is None and _count(pg_dsn, schema, "done") == 17
        holder.rollback()
    purged = await retention.purge_once()
    assert purged == {"done": 12, "failed": 4, "cancelled": 3}
    assert [_count(pg_dsn, schema, s) for s in ("done", "failed", "cancelled", "pending")] == [5, 7, 0, 2]
    samples = {s: metrics.registry.get_sample_value("skiplock_jobs_purged_total", {"status": s}) for s in purged}
    assert samples == {"done": 12, "failed": 4, "cancelled": 3}
    assert await retention.purge_once() == {}, "nothing left to purge"


async def test_purge_during_a_drain_loses_nothing_and_stops_the_worker(settings, pg_dsn, schema):
    """A worker stopped while its scheduled purge deletes batches drains normally: only old finished rows are
    deleted, each batch committed or not at all, and the next round finishes the job."""
    _old_rows(pg_dsn, schema, "done", 60_000, "10 days")
    app = App()
    started = threading.Event()

    @app.task(name="work", queue="q")
    def work(job):
        started.set()
        time.sleep(0.3)

    [live] = _insert(pg_dsn, schema, "q", "work")
    worker = Worker(app, settings=fast(settings, purge_interval_seconds=3600))
    task = asyncio.create_task(worker.run())
    await worker.wait_ready(timeout=20)
    await await_for(started.is_set, timeout=20, what="job running")
    await await_for(lambda: _count(pg_dsn, schema, "done") < 60_000, timeout=30, what="purge under way")
    worker.request_stop()  # while batches are being deleted
    assert await asyncio.wait_for(task, 60) == 0
    assert row(pg_dsn, schema, live)["status"] == "done", "the running job finished in the drain"
    purged = worker.registry.get_sample_value("skiplock_jobs_purged_total", {"status": "done"})
    left = _count(pg_dsn, schema, "done")
    assert purged is not None and purged > 0 and left == 60_000 + 1 - purged, "every deleted row was counted"
    assert left > 1, "the stop landed in the middle of the purge"
    assert purged % 5000 == 0, "whole batches only"
    from prometheus_client import CollectorRegistry

    from skiplock.metrics import WorkerMetrics
    from skiplock.store.worker import PgWorkerStore
    from skiplock.worker.retention import Retention

    metrics = WorkerMetrics(CollectorRegistry())
    await Retention(settings, metrics, PgWorkerStore(settings, metrics)).purge_once()
    assert _count(pg_dsn, schema, "done") == 1, "the next round purged the rest, never the fresh job"


# ---------------------------------------------------------------------------------------------- inspection
def test_stalled_lists_jobs_past_their_stored_deadline_whatever_the_observers_lease(queue: Queue, pg_dsn, schema):
    queue.enqueue_many("q", [{}, {}])
    queue.enqueue("other", {})
    short, healthy = queue.claim("q", limit=2, worker="w1", lease_seconds=600)
    [other] = queue.claim("other", limit=1, worker="w2", lease_seconds=600)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # w1 stopped heartbeating one of them
        conn.execute(
            f"UPDATE \"{schema}\".jobs SET lease_expires_at = now() - interval '5 s' WHERE id = ANY(%s)",
            ([short.id, other.id],),
        )
    assert [r["id"] for r in queue.list_stalled(lease_seconds=1)] == [short.id, other.id]  # same deadline: by id
    assert [r["id"] for r in queue.list_stalled("q", lease_seconds=1)] == [short.id], "a healthy 600 s lease is fine"
    out = cli("stalled", "--queue", "q", dsn=pg_dsn, schema=schema)
    assert out.returncode == 1 and str(short.id) in out.stdout and "w1" in out.stdout, out
    assert str(healthy.id) not in out.stdout.split()
    [shown] = json.loads(cli("stalled", "--queue", "q", "--json", dsn=pg_dsn, schema=schema).stdout)
    assert shown["id"] == short.id and shown["locked_by"] == "w1" and shown["lease_expires_at"]
    none = cli("stalled", "--queue", "nosuch", dsn=pg_dsn, schema=schema)
    assert none.returncode == 0 and "no stalled jobs" in none.stdout


async def test_async_list_stalled_matches(aqueue: AsyncQueue):
    await aqueue.enqueue("q", {})
    [job] = await aqueue.claim("q", limit=1, worker="w", lease_seconds=600)
    assert await aqueue.list_stalled("q") == []
    from datetime import timedelta

    later = job.created_at + timedelta(seconds=3600)  # type: ignore[operator]
    assert [r["id"] for r in await aqueue.list_stalled("q", now=later)] == [job.id]


def test_stats_next_due_and_avg_attempts_done(queue: Queue, pg_dsn, schema):
    queue.enqueue("q", {})
    later = queue.enqueue("q", {}, delay=600).id
    queue.enqueue("q", {}, delay=1200)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, status, attempts) VALUES '
            "('q', '{}', 'done', 1), ('q', '{}', 'done', 2), ('q', '{}', 'done', 3)"
        )
    [s] = queue.stats("q")
    assert s.next_due == row(pg_dsn, schema, later)["visible_at"] and s.avg_attempts_done == 2.0
    assert (s.ready, s.delayed, s.paused) == (1, 2, False)


def test_run_jobs_reports_snoozed_jobs(settings, pg_dsn, schema):
    from skiplock.testing import run_jobs

    app = App()

    @app.task(name="wait", queue="q")
    def wait(job):
        raise Snooze(3600)

    [job_id] = _insert(pg_dsn, schema, "q", "wait")
    report = run_jobs(app, settings=settings, timeout=30)
    assert report.snoozed == [job_id] and report.done == report.failed == []
    assert row(pg_dsn, schema, job_id)["status"] == "pending"
