"""Queue primitives against a real PostgreSQL (sync and async share one module)."""

from __future__ import annotations

import inspect
import math
import multiprocessing as mp
import re
import select
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from skiplock import AsyncQueue, Job, PayloadError, Queue, Settings
from skiplock.errors import ConfigError, DatabaseUnavailableError, NonRetryableError
from skiplock.sql import Queries, queries_for
from skiplock.store.statements import Claim, Failure, complete_and_claim_params
from support.procs import claim_all
from support.store import AsyncWorkerCalls, WorkerCalls

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def status_of(queue: Queue, job_id: int) -> dict:
    row = queue.get(job_id)
    assert row is not None
    return row


# ---------------------------------------------------------------------------------------------- enqueue
def test_enqueue_returns_an_id_and_the_job_is_pending(queue: Queue):
    r = queue.enqueue("emails", {"to": "a@b.c"})
    row = status_of(queue, r.id)
    assert (row["status"], row["payload"], row["attempts"], row["max_attempts"]) == ("pending", {"to": "a@b.c"}, 0, 5)
    assert r.duplicate is False


@pytest.mark.parametrize("payload", [None, 1, "text", [1, 2], {"nested": {"ü": ["x", 1.5, True, None]}}])
def test_any_json_value_round_trips(queue: Queue, payload):
    job_id = queue.enqueue("q", payload).id
    assert status_of(queue, job_id)["payload"] == payload


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"x": object()}, "not JSON-serialisable"),
        ({"x": math.nan}, "not JSON-serialisable"),
        ({"x": math.inf}, "not JSON-serialisable"),
        ({"x": "a\x00b"}, "NUL"),
        ({"x": "y" * 300_000}, "over the"),
    ],
)
def test_bad_payloads_are_refused_and_nothing_is_written(queue: Queue, payload, fragment):
    with pytest.raises(PayloadError, match=fragment):
        queue.enqueue("q", payload)
    assert queue.stats() == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": -1},
        {"delay": math.nan},
        {"max_attempts": 0},
        {"priority": 40_000},
        {"idempotency_key": ""},
        {"run_at": datetime(2030, 1, 1)},
    ],
)
def test_bad_arguments_are_refused(queue: Queue, kwargs):
    with pytest.raises(ValueError):
        queue.enqueue("q", {}, **kwargs)


def test_bad_queue_names_are_refused(queue: Queue):
    for name in ("", "has space", "x" * 200):
        with pytest.raises(ValueError, match="queue name"):
            queue.enqueue(name, {})


def test_idempotency_key_returns_the_existing_job(queue: Queue):
    first = queue.enqueue("q", {"n": 1}, idempotency_key="order-42")
    second = queue.enqueue("q", {"n": 2}, idempotency_key="order-42")
    assert second.id == first.id and second.duplicate
    assert queue.enqueue("other", {"n": 3}, idempotency_key="order-42").duplicate is False
    with queue.pool.connection() as conn:
        count = conn.execute(f'SELECT count(*) FROM "{queue.settings.schema}".jobs').fetchone()[0]
    assert count == 2


def test_a_key_taken_by_a_transaction_that_commits_during_the_enqueue_returns_that_job(queue: Queue, pg_dsn: str):
    """The insert waits for the other transaction's key, then returns nothing (its snapshot predates that commit):
    the enqueue looks the job up and returns it as the duplicate."""
    import threading
    import time

    with psycopg.connect(pg_dsn) as other:
        held = queue.enqueue("q", {"n": 1}, idempotency_key="k", conn=other)  # not committed yet
        found: list = []
        racer = threading.Thread(target=lambda: found.append(queue.enqueue("q", {"n": 2}, idempotency_key="k")))
        racer.start()
        time.sleep(0.3)  # the racer's insert now waits on the key's index entry
        other.commit()
        racer.join(10)
    assert [(r.id, r.duplicate) for r in found] == [(held.id, True)]


def test_a_failed_job_frees_its_idempotency_key(queue: Queue):
    first = queue.enqueue("q", {}, idempotency_key="k", max_attempts=1)
    [job] = queue.claim("q", limit=1, worker="w")
    queue.fail([Failure(job, "Boom: x", 0, retry=True)], worker="w")
    again = queue.enqueue("q", {}, idempotency_key="k")
    assert again.id != first.id and not again.duplicate
    assert queue.retry_failed(ids=[first.id]) == []  # its key is live again: not re-driven twice


def test_enqueue_in_the_callers_transaction_rolls_back_with_it_and_notifies_only_at_commit(queue: Queue, pg_dsn):
    channel = queue.settings.channel
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        with psycopg.connect(pg_dsn) as conn:
            queue.enqueue("q", {"n": 1}, conn=conn)
            assert not _notified(listener, 0.2), "notification before commit"
            conn.rollback()
        assert queue.stats() == []
        assert not _notified(listener, 0.3), "notification from a rolled-back transaction"
        with psycopg.connect(pg_dsn) as conn:
            for i in range(5):
                queue.enqueue("q", {"n": i}, conn=conn)
            conn.commit()
        notes = _notified(listener, 2.0)
        assert [n.payload for n in notes] == ["q"], "one notification per transaction and queue"
    assert queue.stats()[0].ready == 5


def _notified(conn: psycopg.Connection, timeout: float) -> list:
    select.select([conn.fileno()], [], [], timeout)
    return list(conn.notifies(timeout=0.3, stop_after=10))


def test_delayed_jobs_do_not_notify(queue: Queue, pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.settings.channel}"')
        queue.enqueue("q", {}, delay=60)
        assert not _notified(listener, 0.3)


def test_enqueue_many_inserts_all_skips_duplicate_keys_and_notifies_once(queue: Queue, pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.settings.channel}"')
        ids = queue.enqueue_many("bulk", [{"i": i} for i in range(1000)])
        assert len(ids) == 1000 and ids == sorted(ids)
        assert [n.payload for n in _notified(listener, 2.0)] == ["bulk"]
    keyed = queue.enqueue_many("bulk", [{}, {}, {}], idempotency_keys=["a", "a", "b"])
    assert len(keyed) == 2
    with pytest.raises(PayloadError):
        queue.enqueue_many("bulk", [{"ok": 1}, {"bad": math.nan}])
    assert queue.stats("bulk")[0].ready == 1002


# ---------------------------------------------------------------------------------------------- claim
def test_claim_orders_by_priority_then_visibility_then_id(queue: Queue):
    low = queue.enqueue("q", "low", priority=-1).id
    a = queue.enqueue("q", "a").id
    b = queue.enqueue("q", "b").id
    high = queue.enqueue("q", "high", priority=10).id
    got = [j.id for j in queue.claim("q", limit=10, worker="w")]
    assert got == [high, a, b, low]


def test_delayed_jobs_are_invisible_until_due(queue: Queue):
    job_id = queue.enqueue("q", {}, run_at=T0).id
    assert queue.claim("q", limit=5, worker="w", now=T0 - timedelta(seconds=1)) == []
    [job] = queue.claim("q", limit=5, worker="w", now=T0)
    assert job.id == job_id and job.attempts == 1


def test_claim_sets_the_lease_and_counts_the_attempt(queue: Queue):
    job_id = queue.enqueue("q", {}).id
    [job] = queue.claim("q", limit=1, worker="worker-1")
    assert job.id == job_id
    row = status_of(queue, job_id)
    assert (row["status"], row["locked_by"], row["attempts"]) == ("processing", "worker-1", 1)
    assert row["locked_at"] is not None
    assert queue.claim("q", limit=1, worker="worker-2") == []


def test_many_processes_never_claim_the_same_job_and_lose_none(queue: Queue, pg_dsn, schema):
    ids = set(queue.enqueue_many("race", [{"i": i} for i in range(3000)]))
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=claim_all, args=(pg_dsn, schema, "race", f"w{i}", out)) for i in range(6)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    claimed = [i for r in results for i in r]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(claimed) == ids, "a job was lost"
    assert sum(1 for r in results if r) >= 2, "claims did not spread over workers"


def test_claim_does_not_block_on_rows_locked_by_another_transaction(queue: Queue, pg_dsn):
    queue.enqueue_many("q", [{}, {}])
    with psycopg.connect(pg_dsn) as holder:
        holder.execute(f'SELECT id FROM "{queue.settings.schema}".jobs ORDER BY id LIMIT 1 FOR UPDATE')
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("SET lock_timeout = '500ms'")
        jobs = queue.claim("q", limit=2, worker="w")
        assert len(jobs) == 1, "SKIP LOCKED skipped the locked row and did not wait"


# ---------------------------------------------------------------------------------------------- complete / fail
def test_complete_is_fenced_by_worker_and_attempt(queue: Queue):
    queue.enqueue("q", {})
    [job] = queue.claim("q", limit=1, worker="w1")
    assert queue.complete([job], worker="w2") == set()
    assert queue.complete([job], worker="w1") == {job.id}
    assert status_of(queue, job.id)["status"] == "done"
    assert queue.complete([job], worker="w1") == set(), "completing twice reports the lost lease"


def test_a_recovered_and_reclaimed_job_refuses_the_old_attempt(queue: Queue):
    queue.enqueue("q", {})
    [old] = queue.claim("q", limit=1, worker="w1", now=T0)
    assert [
        r.id for r in WorkerCalls(queue).recover_expired(queue="q", lease_seconds=30, now=T0 + timedelta(seconds=31))
    ] == [old.id]
    [new] = queue.claim("q", limit=1, worker="w1", now=T0 + timedelta(seconds=32))
    assert new.attempts == 2
    assert queue.complete([old], worker="w1") == set()
    assert queue.complete([new], worker="w1") == {new.id}


def test_fail_retries_with_backoff_then_fails_when_exhausted(queue: Queue, settings: Settings):
    job_id = queue.enqueue("q", {}, max_attempts=2).id
    [job] = queue.claim("q", limit=1, worker="w", now=T0)
    failure = Failure(job, "ValueError: first", 10.0, retry=True)
    assert queue.fail([failure], worker="w", now=T0) == {job_id: "pending"}
    row = status_of(queue, job_id)
    assert row["visible_at"] == T0 + timedelta(seconds=10)
    assert row["last_error"] == "ValueError: first" and row["locked_by"] is None
    assert queue.claim("q", limit=1, worker="w", now=T0 + timedelta(seconds=9)) == []
    [job] = queue.claim("q", limit=1, worker="w", now=T0 + timedelta(seconds=10))
    assert queue.fail([Failure(job, "ValueError: second", 10.0, retry=True)], worker="w") == {job_id: "failed"}
    assert status_of(queue, job_id)["attempts"] == 2


def test_non_retryable_errors_fail_at_once(queue: Queue, settings: Settings):
    job_id = queue.enqueue("q", {}).id
    [job] = queue.claim("q", limit=1, worker="w")
    failure = Failure.from_exception(job, NonRetryableError("card declined"), settings)
    assert failure.final and not failure.retry
    assert queue.fail([failure], worker="w") == {job_id: "failed"}
    assert status_of(queue, job_id)["last_error"] == "NonRetryableError: card declined"


def test_failure_text_is_bounded_and_storable(settings: Settings):
    from skiplock.errors import format_error
    from skiplock.job import Job

    job = Job(1, "q", {}, 1, 5)
    f = Failure.from_exception(job, RuntimeError("x" * 100_000), settings)
    assert len(f.error) <= 4000 and f.error.startswith("RuntimeError: ")
    weird = format_error(ValueError(b"\xff\xfe".decode("utf-8", "surrogateescape") + "\x00"))
    weird.encode("utf-8")
    assert "\x00" not in weird


def test_batch_completion_reports_only_the_lost_ones(queue: Queue):
    queue.enqueue_many("q", [{} for _ in range(5)])
    jobs = queue.claim("q", limit=5, worker="w")
    queue.cancel(ids=[jobs[0].id])
    done = queue.complete(jobs, worker="w")
    assert done == {j.id for j in jobs[1:]}


def test_release_hands_back_without_burning_an_attempt(queue: Queue):
    job_id = queue.enqueue("q", {}).id
    [job] = queue.claim("q", limit=1, worker="w")
    assert WorkerCalls(queue).release([job], worker="w") == {job_id}
    row = status_of(queue, job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)


# ---------------------------------------------------------------------------------------------- leases
def test_heartbeat_extends_the_lease_so_the_job_is_not_recovered(queue: Queue):
    queue.enqueue("q", {})
    [job] = queue.claim("q", limit=1, worker="w", now=T0)
    assert WorkerCalls(queue).heartbeat([job], worker="w", now=T0 + timedelta(seconds=25)) == {job.id}
    assert WorkerCalls(queue).recover_expired(queue="q", lease_seconds=30, now=T0 + timedelta(seconds=40)) == []
    recovered = WorkerCalls(queue).recover_expired(queue="q", lease_seconds=30, now=T0 + timedelta(seconds=56))
    assert [r.status for r in recovered] == ["pending"]
    assert WorkerCalls(queue).heartbeat([job], worker="w") == set()


def test_recovery_fails_exhausted_jobs_and_says_why(queue: Queue):
    job_id = queue.enqueue("q", {}, max_attempts=1).id
    queue.claim("q", limit=1, worker="crashed-worker", now=T0)
    [r] = WorkerCalls(queue).recover_expired(queue="q", lease_seconds=30, now=T0 + timedelta(minutes=5))
    assert (r.id, r.status) == (job_id, "failed")
    assert "lease expired" in status_of(queue, job_id)["last_error"]
    assert "crashed-worker" in status_of(queue, job_id)["last_error"]


def test_recovery_is_scoped_to_its_queue(queue: Queue):
    queue.enqueue("a", {})
    queue.enqueue("b", {})
    queue.claim("a", limit=1, worker="w", now=T0, lease_seconds=1)
    queue.claim("b", limit=1, worker="w", now=T0, lease_seconds=1)
    assert [r.queue for r in WorkerCalls(queue).recover_expired(queue="a", now=T0 + timedelta(seconds=5))] == ["a"]


# ---------------------------------------------------------------------------------------------- stats / admin
def test_stats_counts_every_state(queue: Queue):
    queue.enqueue_many("q", [{} for _ in range(4)], run_at=T0)
    queue.enqueue("q", {}, run_at=T0 + timedelta(hours=1))
    jobs = queue.claim("q", limit=3, worker="w", now=T0 + timedelta(seconds=10))
    queue.fail([Failure(jobs[0], "E: x", 0, retry=False)], worker="w")
    [s] = queue.stats(now=T0 + timedelta(seconds=100), lease_seconds=60)
    assert (s.ready, s.delayed, s.processing, s.stalled, s.failed) == (1, 1, 2, 2, 1)
    assert s.oldest_ready_age_seconds == pytest.approx(100)
    assert queue.stats("nope") == []


def test_stats_reads_only_the_partial_indexes(queue: Queue, pg_dsn):
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'''INSERT INTO "{schema}".jobs (queue, payload, status)
                        SELECT 'q', '{{}}', 'done' FROM generate_series(1, 50000)''')
        conn.execute(f'ANALYZE "{schema}".jobs')
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN "
                + queries_for(queue.settings.schema)
                .queue_stats.replace("%(queue)s", "NULL")
                .replace("%(now)s", "NULL")
                .replace("%(lease_seconds)s", "60")
            )
        )
    assert "Seq Scan on jobs" not in plan, plan  # the queues table holds one row per paused queue
    assert "jobs_claim_idx" in plan and "jobs_lease_deadline_idx" in plan
    assert "jobs_failed_idx" in plan or "jobs_failed_id_idx" in plan  # either partial index of the failed jobs
    done_scan = [line for line in plan.splitlines() if "Backward using" in line]  # avg_attempts_done: newest only
    assert done_scan and ("jobs_done_idx" in done_scan[0] or "jobs_retention_idx" in done_scan[0]), plan


def test_retry_and_cancel_and_list_failed(queue: Queue):
    a, b, c = (queue.enqueue("q", {"n": i}, max_attempts=1).id for i in range(3))
    for job in queue.claim("q", limit=2, worker="w"):
        queue.fail([Failure(job, "RuntimeError: x", 0.0, True)], worker="w")
    assert [r["id"] for r in queue.list_failed("q")] == [b, a]
    assert sorted(queue.retry_failed(queue="q")) == [a, b]
    assert queue.cancel(ids=[c]) == [c] and queue.retry_failed(queue="q") == [], "cancelled is not failed"
    assert status_of(queue, a)["status"] == "pending" and status_of(queue, a)["attempts"] == 0
    assert status_of(queue, c)["status"] == "cancelled"
    with pytest.raises(ValueError):
        queue.cancel()


def test_purge_deletes_old_finished_jobs_in_batches(queue: Queue, pg_dsn):
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'''INSERT INTO "{schema}".jobs (queue, payload, status, updated_at)
                        SELECT 'q', '{{}}', CASE WHEN g % 2 = 0 THEN 'done' ELSE 'failed' END, now() - interval '8 days'
                        FROM generate_series(1, 12000) g''')
    recent = queue.enqueue("q", {}).id
    assert queue.purge(older_than_seconds=7 * 86400, statuses=["failed"]) == 6000
    assert queue.purge(older_than_seconds=7 * 86400) == 6000
    assert queue.get(recent) is not None
    with pytest.raises(ValueError):
        queue.purge(older_than_seconds=1, statuses=["pending"])


def test_purge_of_all_queues_reaches_every_queue_and_status_through_the_status_indexes(queue: Queue, pg_dsn):
    """Without a cross-queue retention index, a purge of every queue walks each queue's done, failed and cancelled
    indexes: a queue holding only failed or only cancelled jobs is purged too, recent jobs stay, and the plan reads
    the status indexes by queue instead of scanning and sorting all finished rows."""
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'''INSERT INTO "{schema}".jobs (queue, payload, status, updated_at)
                        SELECT q, '{{}}', s, now() - (CASE WHEN g % 3 = 0 THEN 1 ELSE 9 END) * interval '1 day'
                        FROM (VALUES ('a', 'done'), ('a', 'failed'), ('b', 'failed'), ('c', 'cancelled'), ('d', 'done'))
                             AS v(q, s), generate_series(1, 15000) AS g''')
        conn.execute(f'ANALYZE "{schema}".jobs')
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN "
                + queries_for(schema)
                .job_purge.replace("%(queue)s", "NULL")
                .replace("%(now)s", "NULL")
                .replace("%(limit)s", "500")
                .replace("%(done_seconds)s", "604800")
                .replace("%(failed_seconds)s", "604800")
                .replace("%(cancelled_seconds)s", "604800")
            )
        )
    picks = plan.split("\n  ->  ", 1)[0]  # the CTEs that pick the rows, above the DELETE's own join
    assert "CTE cancelled" in picks and "Seq Scan" not in picks and "Sort" not in picks, plan
    assert all(f"Index Scan using jobs_{status}_idx" in picks for status in ("done", "failed", "cancelled")), plan
    assert queue.purge(older_than_seconds=7 * 86400, statuses=["done", "failed", "cancelled"]) == 5 * 10000
    with psycopg.connect(pg_dsn) as conn:
        left = conn.execute(
            f'SELECT queue, status, count(*) FROM "{schema}".jobs GROUP BY 1, 2 ORDER BY 1, 2'
        ).fetchall()
    assert left == [
        (q, status, 5000)
        for q, status in (("a", "done"), ("a", "failed"), ("b", "failed"), ("c", "cancelled"), ("d", "done"))
    ]
    assert queue.purge(older_than_seconds=7 * 86400, queue="c", statuses=["cancelled"]) == 0


# ---------------------------------------------------------------------------------------------- connection
def test_a_wrong_dsn_fails_fast_with_the_password_masked():
    with pytest.raises(DatabaseUnavailableError) as info:
        Queue("postgresql://app:hunter2@127.0.0.1:1/app", connect_timeout=2)
    assert "hunter2" not in str(info.value)


# ---------------------------------------------------------------------------------------------- async twin
async def test_async_queue_runs_the_same_cycle(aqueue: AsyncQueue):
    r = await aqueue.enqueue("q", {"x": 1}, idempotency_key="k")
    assert (await aqueue.enqueue("q", {"x": 2}, idempotency_key="k")).id == r.id
    ids = await aqueue.enqueue_many("q", [{"i": i} for i in range(3)])
    jobs = await aqueue.claim("q", limit=10, worker="w")
    assert {j.id for j in jobs} == {r.id, *ids}
    assert await AsyncWorkerCalls(aqueue).heartbeat(jobs, worker="w") == {j.id for j in jobs}
    assert await aqueue.complete(jobs[:2], worker="w") == {jobs[0].id, jobs[1].id}
    statuses = await aqueue.fail([Failure(jobs[2], "E: x", 0, retry=True)], worker="w")
    assert statuses == {jobs[2].id: "pending"}
    assert await AsyncWorkerCalls(aqueue).release(jobs[3:], worker="w") == {jobs[3].id}
    [s] = await aqueue.stats("q")
    assert s.ready == 2 and s.processing == 0


async def test_async_enqueue_in_the_callers_transaction(aqueue: AsyncQueue, pg_dsn):
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await aqueue.enqueue("q", {}, conn=conn)
        await conn.rollback()
    assert await aqueue.stats() == []


async def test_complete_and_claim_completes_fenced_and_claims_in_one_statement(aqueue: AsyncQueue):
    ids = await aqueue.enqueue_many("q", [{"i": i} for i in range(4)])
    first, second = await aqueue.claim("q", limit=2, worker="w")
    stale = Job(second.id, second.queue, second.payload, second.attempts - 1, second.max_attempts)
    completed, claimed = await AsyncWorkerCalls(aqueue).complete_and_claim([first, stale], "q", limit=5, worker="w")
    assert completed == {first.id}, "only the attempt the worker holds is completed"
    assert sorted(j.id for j in claimed) == ids[2:]
    assert all(j.attempts == 1 and j.payload == {"i": ids.index(j.id)} for j in claimed)
    assert (await aqueue.get(first.id))["status"] == "done"
    assert (await aqueue.get(second.id))["status"] == "processing"
    # nothing done and nothing left: an empty round trip is harmless
    assert await AsyncWorkerCalls(aqueue).complete_and_claim([], "q", limit=5, worker="w") == (set(), [])
    # another worker cannot complete our jobs through it
    assert (await AsyncWorkerCalls(aqueue).complete_and_claim([second], "q", limit=1, worker="intruder"))[0] == set()


# ---------------------------------------------------------------------------------------------- one method set
def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (inspect.isfunction(member) or inspect.ismethod(member))
    }


PUBLIC_QUEUE_METHODS = {
    "open", "close", "detached",
    "enqueue", "enqueue_many",
    "claim", "complete", "fail",
    "get", "statuses", "stats", "list_failed", "list_stalled", "waiting", "limits",
    "retry_failed", "cancel", "pause", "resume", "paused", "purge",
    "schedules", "register_schedules", "remove_schedules", "prune_schedules",
    "task_defaults", "task_names", "done_recently",
    "migrate", "check_schema",
    "wait", "relatives", "workflow_jobs", "cancel_workflow",
}  # fmt: skip
"""Producer and admin verbs, plus the seed's claim/complete/fail for a loop of one's own; the worker's hot path
(complete_and_claim, heartbeat, release_orphans, ...) is ``skiplock.store.worker.WorkerStore``, not public."""


def test_queue_and_async_queue_expose_the_same_methods_with_the_same_parameters():
    sync, asynchronous = public_methods(Queue), public_methods(AsyncQueue)
    assert set(sync) == set(asynchronous), set(sync) ^ set(asynchronous)
    assert set(sync) == PUBLIC_QUEUE_METHODS, "the public façade is docs/reference/python.md's list"
    for name, signature in sync.items():
        if name == "open":  # both take dsn or settings= (or pool=); the sync one is also the constructor
            assert list(signature.parameters) == list(asynchronous[name].parameters)
            continue
        assert list(signature.parameters) == list(asynchronous[name].parameters), name
        assert inspect.iscoroutinefunction(getattr(AsyncQueue, name)) or name == "detached", name
    for prop in ("closed", "pool"):
        assert isinstance(getattr(Queue, prop), property) and isinstance(getattr(AsyncQueue, prop), property)


def test_queue_open_is_the_constructor_and_reads_no_environment(settings: Settings, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_SCHEMA", "not_this_one")
    monkeypatch.setenv("SKIPLOCK_MAX_ATTEMPTS", "9")
    with Queue.open(settings.dsn) as q:
        assert q.settings.schema == "skiplock" and q.settings.max_attempts == 5  # the arguments only
    with Queue.open(settings=settings) as q:
        job_id = q.enqueue("q", {}).id
        assert status_of(q, job_id)["status"] == "pending"
    assert q.closed


async def test_async_queue_has_the_admin_verbs(aqueue: AsyncQueue):
    job_id = (await aqueue.enqueue("q", {}, max_attempts=1)).id
    [job] = await aqueue.claim("q", limit=1, worker="w")
    await aqueue.fail([Failure(job, "E: boom", 0, retry=True)], worker="w")
    [failed] = await aqueue.list_failed("q")
    assert failed["id"] == job_id and failed["last_error"] == "E: boom"
    assert await aqueue.retry_failed(ids=[job_id]) == [job_id]
    assert await aqueue.cancel(queue="q", reason="test") == [job_id]
    later = datetime.now(UTC) + timedelta(seconds=1)
    assert await aqueue.purge(older_than_seconds=0, now=later) == 0, "a cancelled job is neither done nor failed"
    assert await aqueue.retry_failed(ids=[job_id], include_cancelled=True) == [job_id]
    assert await aqueue.cancel(ids=[job_id], task=None) == [job_id]
    assert await aqueue.purge(older_than_seconds=0, statuses=("cancelled",), now=later) == 1
    assert await aqueue.get(job_id) is None


def test_sync_queue_completes_and_claims_in_one_statement(queue: Queue):
    a, b = queue.enqueue_many("q", [{"i": 0}, {"i": 1}])
    [first] = queue.claim("q", limit=1, worker="w")
    completed, claimed = WorkerCalls(queue).complete_and_claim([first], "q", limit=5, worker="w")
    assert completed == {a} and [j.id for j in claimed] == [b]


def test_get_returns_the_task_and_the_lease_deadline(queue: Queue):
    job = status_of(queue, queue.enqueue("q", {}, task="t.one").id)
    assert job["task"] == "t.one" and "lease_expires_at" in job


async def test_a_detached_queue_runs_only_on_the_callers_connection(settings: Settings, pg_dsn):
    detached = Queue.detached(settings)
    with pytest.raises(ConfigError, match="not connected"):
        detached.enqueue("q", {})
    with psycopg.connect(pg_dsn) as conn:
        job_id = detached.enqueue("q", {}, conn=conn).id
    adetached = AsyncQueue.detached(settings)
    with pytest.raises(ConfigError, match="not connected"):
        await adetached.stats()
    with Queue(settings=settings) as q:
        assert status_of(q, job_id)["status"] == "pending"


def test_queue_names_reach_the_claim_as_a_text_array_literal_whatever_they_hold(pg_dsn):
    from skiplock.store.statements import text_array

    names = ("default", "a.b:c-d", 'we"ird', "back\\slash", "com,ma", "{x}", " sp ", "NULL")
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT %s::text[]", [text_array(names)]).fetchone()
    assert row is not None and tuple(row[0]) == names


def test_fenced_statements_find_their_rows_by_primary_key_after_an_analyze_that_saw_none_running(queue: Queue, pg_dsn):
    """Statistics gathered while no job ran make the processing partial index look empty; a fenced statement that
    let the planner answer its status test from that index walked every entry of it once per id (5x the
    statement). The status is compared with an init plan, so the rows are found by primary key."""
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'''INSERT INTO "{schema}".jobs (queue, payload, status)
                        SELECT 'q', '{{}}', 'done' FROM generate_series(1, 50000)''')
        conn.execute(f'ANALYZE "{schema}".jobs')  # no job running: processing looks empty
        ids = [
            r[0]
            for r in conn.execute(
                f'''INSERT INTO "{schema}".jobs (queue, payload, status, attempts, locked_by, locked_at,
                                                 lease_expires_at)
                    SELECT 'q', '{{}}', 'processing', 1, 'w', now(), now() + interval '1 minute'
                    FROM generate_series(1, 300) RETURNING id'''
            )
        ][:100]
        params = {"ids": ids, "attempts": [1] * len(ids), "worker": "w", "now": None}
        for name in ("job_complete", "job_release"):
            plan = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + getattr(queries_for(queue.settings.schema), name), params)
            )
            assert "jobs_pkey" in plan and "jobs_lease_deadline_idx" not in plan, (name, plan)
        claim = queries_for(queue.settings.schema).job_complete_and_claim_unlimited_one
        claim_params = {"queues": "{q}", "limit": 10, "per_queue": "{10}", "rotate": 0, "lease_seconds": 60.0}
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + claim, params | claim_params | {"leases": None}))
        done_part = plan.split("CTE done")[1].split("CTE ")[0]
        assert "jobs_pkey" in done_part and "jobs_lease_deadline_idx" not in done_part, plan


def test_fenced_statements_find_their_rows_by_primary_key_in_a_table_never_analyzed(queue: Queue, pg_dsn):
    """A table not yet analyzed (a fresh one, or one grown since) has no statistics: joined with the attempts as a
    set, each row looked like a rare match and 200 completions were compared with every row of a 20,000-job table
    (25 ms of a 33 ms claim). The completions, alone or carried by a claim, and the other statements that look up a
    batch of attempts find their rows by primary key, with no join to go wrong."""
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"""INSERT INTO "{schema}".jobs (queue, payload, status)
                        SELECT 'q', '{{}}', 'done' FROM generate_series(1, 20000)""")
        ids = [
            r[0]
            for r in conn.execute(
                f"""INSERT INTO "{schema}".jobs (queue, payload, status, attempts, locked_by, locked_at,
                                                 lease_expires_at)
                    SELECT 'q', '{{}}', 'processing', 1, 'w', now(), now() + interval '1 minute'
                    FROM generate_series(1, 200) RETURNING id"""
            )
        ]
        analyzed = conn.execute(
            "SELECT last_analyze IS NULL AND last_autoanalyze IS NULL FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = 'jobs'",
            (schema,),
        ).fetchone()
        assert analyzed == (True,), "the table must not have been analyzed for this test to mean anything"
        params = {"ids": ids, "attempts": [1] * len(ids), "worker": "w", "now": None}
        for name in ("job_complete", "job_confirm_done", "job_release", "job_cancelled_among"):
            plan = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + getattr(queries_for(queue.settings.schema), name), params)
            )
            assert "jobs_pkey" in plan and "Seq Scan" not in plan and "Join" not in plan, (name, plan)
        claim = queries_for(queue.settings.schema).job_complete_and_claim_unlimited_one
        claim_params = {"queues": "{q}", "limit": 100, "per_queue": "{100}", "rotate": 0, "lease_seconds": 60.0}
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + claim, params | claim_params | {"leases": None}))
        done_part = plan.split("CTE done")[1].split("CTE ")[0]
        assert "jobs_pkey" in done_part and "Seq Scan" not in done_part and "Join" not in done_part, plan
        # each row is matched with its own attempt: a stale attempt of a job is left alone
        wrong = {"ids": ids, "attempts": [1] * 100 + [2] * 100, "worker": "w", "now": None}
        completed = [r[0] for r in conn.execute(queries_for(queue.settings.schema).job_complete, wrong)]
        assert sorted(completed) == sorted(ids[:100])


def test_a_claim_after_a_job_takes_only_the_later_jobs_of_its_priority(queue: Queue):
    """``after``: the claim starts at a claimed job's place in claim order (same priority, later due time or id);
    what sorts before it (a higher priority, an older due time) is left to a claim from the start."""
    low = queue.enqueue("q", "low", priority=-1).id
    a, b, c = queue.enqueue_many("q", [{"i": 0}, {"i": 1}, {"i": 2}])
    high = queue.enqueue("q", "high", priority=10).id
    claimed = queue.claim("q", limit=2, worker="w")
    assert [j.id for j in claimed] == [high, a]
    late = queue.enqueue("q", "late", run_at=T0 - timedelta(days=3650)).id  # due long before a: sorts first
    _, after = WorkerCalls(queue).complete_and_claim([], "q", limit=10, worker="w", after=claimed[-1])
    assert [j.id for j in after] == [b, c]
    _, rest = WorkerCalls(queue).complete_and_claim([], "q", limit=10, worker="w")
    assert [j.id for j in rest] == [late, low]
    with pytest.raises(ValueError, match="one queue"):
        WorkerCalls(queue).complete_and_claim([], ["q", "r"], limit=10, worker="w", after=claimed[-1])


def test_a_claim_of_several_queues_takes_at_most_each_queues_share(queue: Queue):
    """``shares``: the most jobs a claim takes (and locks) of each queue, by default equal (about ``limit`` in all);
    a queue with nothing due gives none, and the others do not take its share."""
    a = queue.enqueue_many("a", [{"i": i} for i in range(30)])
    b = queue.enqueue_many("b", [{"i": i} for i in range(30)])
    _, equal = WorkerCalls(queue).complete_and_claim([], ["a", "b", "c"], limit=12, worker="w")
    assert sorted(j.id for j in equal) == sorted(a[:4] + b[:4]), "4 of each (c has none): 8 of 12"
    _, shared = WorkerCalls(queue).complete_and_claim([], ["a", "b", "c"], limit=12, worker="w", shares=[10, 1, 1])
    assert [j.id for j in shared if j.queue == "a"] == a[4:14] and [j.id for j in shared if j.queue == "b"] == b[4:5]
    with pytest.raises(ValueError, match="shares must give each of the 3 queues at least 1 job"):
        WorkerCalls(queue).complete_and_claim([], ["a", "b", "c"], limit=12, worker="w", shares=[12, 0, 0])


def test_a_claim_of_several_queues_on_a_large_table_is_never_compiled(queue: Queue, pg_dsn):
    """The planner cannot see a claim's per-queue shares (a LIMIT taken from each queue's row) and guesses a tenth of
    the table: on a large table the estimate passed jit_above_cost, and compiling the claim cost 0.75-1 s a claim.
    The worker's control connections work without JIT."""
    schema = queue.settings.schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"""INSERT INTO "{schema}".jobs (queue, payload) SELECT 'a', '{{}}' FROM generate_series(1, 20000)"""
        )
        conn.execute(f'ANALYZE "{schema}".jobs')
        conn.execute("SET jit_above_cost = 0")  # as if the estimate were large enough, on any table
        params = complete_and_claim_params([], Claim(["a", "b"], "w", shares=[199, 1]), 200, None, lease_seconds=60.0)
        query = queries_for(queue.settings.schema).job_complete_and_claim_unlimited

        def plan() -> str:
            return "\n".join(r[0] for r in conn.execute("EXPLAIN " + query, params))

        row = conn.execute("SELECT pg_jit_available()").fetchone()
        if row is not None and row[0]:  # a server built without LLVM never compiles
            assert "JIT:" in plan(), "the server's default would compile it"
        conn.execute(queries_for(queue.settings.schema).session_control)
        assert "JIT:" not in plan()


def test_a_claim_after_a_job_starts_its_index_scan_there(queue: Queue, pg_dsn):
    """The position is an index condition of the claim index, so the scan skips the dead entries that claimed jobs
    leave at the head of the index until a VACUUM (a filter would still walk them all)."""
    params = {
        "ids": "{}",
        "attempts": "{}",
        "worker": "w",
        "now": None,
        "queues": "{q}",
        "limit": 10,
        "per_queue": "{10}",
        "rotate": 0,
        "lease_seconds": 60.0,
        "leases": None,
        "after_priority": 0,
        "after_at": T0,
        "after_id": 1,
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name in ("job_complete_and_claim_one_after", "job_complete_and_claim_unlimited_one_after"):
            plan = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + getattr(queries_for(queue.settings.schema), name), params)
            )
            scan = plan.split("Index Scan using jobs_claim_idx")[1].split("->")[0]
            cond = scan.split("Index Cond:")[1].splitlines()[0]  # the condition line, not the Filter after it
            assert re.search(r"ROW\(\(?visible_at\)?(::timestamp with time zone)?, id\) >", cond), plan


def _prepare_claim(conn: psycopg.Connection, query: str, values: dict[str, str]) -> str:
    """PREPARE ``query`` as ``claim`` with its named parameters numbered; the arguments of its EXECUTE."""
    order: list[str] = []

    def number(m: re.Match[str]) -> str:
        order.extend([m[1]] if m[1] not in order else [])
        return f"${order.index(m[1]) + 1}"

    conn.execute(f"PREPARE claim AS {PLACEHOLDER.sub(number, query).replace('%%', '%')}")
    return ", ".join(values[n] for n in order)


def test_every_claim_statement_has_a_generic_plan_that_finds_its_rows_by_primary_key(queue: Queue, pg_dsn):
    """The claimer's connection keeps generic plans of its claims (a custom plan is 0.7 ms of planning a claim). A
    generic plan cannot know the LIMIT; it expected a tenth of the table to be claimed and hash-joined the claim
    with a scan of the whole table: the claimed rows are found by primary key instead."""
    schema = queue.settings.schema
    values = {
        "ids": "'{}'",
        "attempts": "'{}'",
        "worker": "'w'",
        "now": "NULL",
        "queues": "'{q}'",
        "limit": "10",
        "per_queue": "'{10}'",
        "rotate": "0",
        "lease_seconds": "60.0",
        "leases": "NULL",
        "after_priority": "0",
        "after_at": "'2030-01-01T00:00:00Z'",
        "after_id": "1",
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"""INSERT INTO "{schema}".jobs (queue, payload) SELECT 'q', '{{}}' FROM generate_series(1, 20000)"""
        )
        conn.execute(f'ANALYZE "{schema}".jobs')
        conn.execute("SET jit_above_cost = 0")  # as if every plan were costly enough to compile: the session says no
        conn.execute(queries_for(queue.settings.schema).session_control)  # every control connection's settings
        conn.execute(queries_for(queue.settings.schema).session_generic_plans)
        names = [n for n in Queries.__annotations__ if n.startswith("job_complete_and_claim")]
        assert len(names) == 6
        for name in names:
            args = _prepare_claim(conn, getattr(queries_for(queue.settings.schema), name), values)
            plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE claim({args})"))
            conn.execute("DEALLOCATE claim")
            bad = [line for line in plan.splitlines() if "Seq Scan on jobs" in line or "JIT:" in line]
            assert not bad, (name, bad, plan)
            claimed = plan.split("CTE claimed")[1].split("\n  CTE ")[0]  # up to the next top-level CTE
            assert "jobs_pkey" in claimed, (name, claimed)


def test_a_claim_without_flow_limits_finds_its_rows_in_one_index_scan_not_one_for_each_job(queue: Queue, pg_dsn):
    """Joined with the picked rows as well as matched against the array of their ids, the claimed rows were found by
    a nested loop that rescanned the primary key once for each job, sorting the array at each rescan (a fifth of the
    server's time a job in a drain): the claims of a worker without limits match the array alone."""
    schema = queue.settings.schema
    values = {"ids": "'{}'", "attempts": "'{}'", "worker": "'w'", "now": "NULL", "queues": "'{q}'", "limit": "50"}
    values |= {"per_queue": "'{50}'", "rotate": "0", "lease_seconds": "60.0", "leases": "NULL", "after_priority": "0"}
    values |= {"after_at": "'-infinity'", "after_id": "0"}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"""INSERT INTO "{schema}".jobs (queue, payload) SELECT 'q', '{{}}' FROM generate_series(1, 500)"""
        )
        conn.execute(queries_for(queue.settings.schema).session_generic_plans)
        names = [n for n in Queries.__annotations__ if n.startswith("job_complete_and_claim_unlimited")]
        assert len(names) == 3
        for name in names:
            args = _prepare_claim(conn, getattr(queries_for(queue.settings.schema), name), values)
            with conn.transaction(force_rollback=True):
                plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE claim({args})"))
            conn.execute("DEALLOCATE claim")
            claimed = plan.split("CTE claimed")[1].split("\n  CTE ")[0]
            assert " rows=50 loops=1)" in claimed.splitlines()[1], (name, plan)  # the UPDATE claimed 50
            scans = [line for line in claimed.splitlines() if "on jobs_pkey" in line or "on jobs j" in line]
            assert scans and all("loops=1)" in line for line in scans), (name, claimed)
