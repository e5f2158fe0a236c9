"""Serial keys, global concurrency and rate limits in the claim statements, against a real PostgreSQL (one
process: the claim and every path that ends a run, with time moved by ``now``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from skiplock import Job, Queue, Settings
from skiplock.errors import EnqueueError
from skiplock.limits import RateLimit, TaskLimits
from skiplock.sql import queries_for
from skiplock.store.statements import Claim, Failure, complete_and_claim_params
from support.store import WorkerCalls

T0 = datetime(2030, 1, 1, tzinfo=UTC)
QUEUES = (["q"], ["q", "other"])  # the one-queue statement and the round-robin one


def ids(jobs: list) -> list[int]:
    return sorted(j.id for j in jobs)


def claim(queue: Queue, names: list[str], worker: str = "w1", limit: int = 10, now: datetime = T0) -> list:
    return WorkerCalls(queue).complete_and_claim((), names, limit=limit, worker=worker, now=now)[1]


def claim_concurrently(settings: Settings, *, rounds: int, limit: int, threads: int = 8) -> list[Job]:
    """Claims (none completing) from ``threads`` connections released at once, ``rounds`` each: every job claimed."""
    barrier = threading.Barrier(threads)
    claimed: list[Job] = []

    def claimer(n: int) -> None:
        with Queue(settings=settings, max_size=1) as q:
            barrier.wait()
            for _ in range(rounds):
                claimed.extend(WorkerCalls(q).complete_and_claim((), ["q"], limit=limit, worker=f"w{n}", now=T0)[1])

    running = [threading.Thread(target=claimer, args=(n,)) for n in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return claimed


@pytest.mark.parametrize("names", QUEUES)
def test_a_key_runs_one_job_at_a_time_in_enqueue_order(queue: Queue, names: list[str]) -> None:
    a = [queue.enqueue("q", {"n": i}, serial_key="user:1", run_at=T0).id for i in range(3)]
    b = queue.enqueue("q", {}, serial_key="user:2", run_at=T0).id
    plain = queue.enqueue("q", {}, run_at=T0).id
    first = claim(queue, names)
    assert ids(first) == sorted([a[0], b, plain])  # one job per key, unkeyed ones as usual
    assert claim(queue, names, worker="w2") == []  # nobody else takes a later job of a running key
    current = next(j for j in first if j.id == a[0])
    for expected in a[1:]:
        done, nxt = WorkerCalls(queue).complete_and_claim([current], names, limit=10, worker="w1", now=T0)
        assert done == {current.id}
        assert ids(nxt) == [expected]  # the completion passes the key on within the same statement
        current = nxt[0]


def test_a_failing_job_holds_its_key_through_its_retries(queue: Queue) -> None:
    first, second = (queue.enqueue("q", {}, serial_key="k", run_at=T0).id for _ in range(2))
    [job] = claim(queue, ["q"])
    queue.fail([Failure(job, "Boom", 30.0, True)], worker="w1", now=T0)
    assert claim(queue, ["q"], now=T0 + timedelta(seconds=10)) == []  # waits for the retry, holding the key
    [retry] = claim(queue, ["q"], now=T0 + timedelta(seconds=31))
    assert retry.id == first
    queue.complete([retry], worker="w1")
    assert ids(claim(queue, ["q"], now=T0 + timedelta(seconds=32))) == [second]


def test_skip_on_retry_lets_later_jobs_of_the_key_run_meanwhile(queue: Queue) -> None:
    first = queue.enqueue("q", {}, serial_key="k", serial_skip_on_retry=True, run_at=T0).id
    second, third = (queue.enqueue("q", {}, serial_key="k", run_at=T0).id for _ in range(2))
    [job] = claim(queue, ["q"])
    assert job.id == first
    queue.fail([Failure(job, "Boom", 30.0, True)], worker="w1", now=T0)
    [nxt] = claim(queue, ["q"], now=T0 + timedelta(seconds=1))
    assert nxt.id == second  # the key moved on while the first waits for its retry
    assert claim(queue, ["q"], now=T0 + timedelta(seconds=31)) == []  # its retry is due, but one job runs
    queue.complete([nxt], worker="w1")
    assert ids(claim(queue, ["q"], now=T0 + timedelta(seconds=32))) == [first]  # back to the lowest id
    assert third not in ids(claim(queue, ["q"], now=T0 + timedelta(seconds=33)))


def test_enqueue_many_with_a_serial_key_and_bad_keys(queue: Queue) -> None:
    many = queue.enqueue_many("q", [{"n": i} for i in range(3)], serial_key="batch", run_at=T0)
    assert ids(claim(queue, ["q"])) == [many[0]]
    for bad in ("", "x" * 256, 42):
        with pytest.raises(EnqueueError, match="serial_key"):
            queue.enqueue("q", {}, serial_key=bad)  # type: ignore[arg-type]
    with pytest.raises(EnqueueError, match="serial_skip_on_retry"):
        queue.enqueue("q", {}, serial_skip_on_retry="yes")  # type: ignore[arg-type]


def test_concurrent_claims_never_run_two_jobs_of_a_key(queue: Queue, settings) -> None:
    for k in range(20):
        queue.enqueue_many("q", [{}] * 5, serial_key=f"k{k}", run_at=T0)
    jobs = claim_concurrently(settings, rounds=5, limit=3)
    rows = {r["id"]: r for r in (queue.get(j.id) for j in jobs) if r}
    keys = [queue_key(queue, j.id) for j in jobs]
    assert len(jobs) == 20 == len(set(keys)) and len(rows) == 20  # one per key: the head of each, once


def queue_key(queue: Queue, job_id: int) -> str:
    with queue.pool.connection() as conn:
        row = conn.execute(f'SELECT serial_key FROM "{queue.settings.schema}".jobs WHERE id = %s', (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


# ---------------------------------------------------------------------------------------------- concurrency
def limit(queue: Queue, concurrency: int | None = None, rate: RateLimit | None = None, task: str = "t") -> None:
    WorkerCalls(queue).register_limits([TaskLimits(task, concurrency, rate)], worker="test")


@pytest.mark.parametrize("names", QUEUES)
def test_a_claimer_without_limits_leaves_limited_tasks_to_those_that_know_them(queue: Queue, names: list[str]) -> None:
    """A worker none of whose tasks is limited claims with the cheaper statement: it runs every other job (serial
    keys still hold) and leaves the jobs of a limited task pending, whatever its slots say."""
    limit(queue, concurrency=5)
    limited = queue.enqueue_many("q", [{}] * 2, task="t", run_at=T0, priority=5)
    keyed = queue.enqueue_many("q", [{}] * 2, task="u", run_at=T0, serial_key="k")
    untasked = queue.enqueue("q", {}, run_at=T0)
    plain = WorkerCalls(queue).complete_and_claim((), names, limit=10, worker="w1", now=T0, limited=False)[1]
    assert ids(plain) == [keyed[0], untasked.id]  # one of the key at a time, none of the limited task
    again = WorkerCalls(queue).complete_and_claim(plain, names, limit=10, worker="w1", now=T0, limited=False)
    assert again[0] == {keyed[0], untasked.id} and ids(again[1]) == [keyed[1]]  # the key passed on
    assert ids(claim(queue, names, worker="w2")) == limited  # a claimer that knows the limits takes them


@pytest.mark.parametrize("names", QUEUES)
def test_global_concurrency_caps_running_jobs_and_the_rest_run(queue: Queue, names: list[str]) -> None:
    limit(queue, concurrency=2)
    limited = queue.enqueue_many("q", [{}] * 5, task="t", run_at=T0, priority=5)
    plain = queue.enqueue_many("q", [{}] * 3, task="u", run_at=T0)
    first = claim(queue, names, limit=5)
    assert ids(first) == limited[:2]  # two of the limited task (the others picked stay pending)
    assert ids(claim(queue, names, worker="w2", limit=5)) == plain  # the limit holds none of the other tasks back
    assert claim(queue, names, worker="w2") == []
    done = next(j for j in first if j.id == limited[0])
    completed, nxt = WorkerCalls(queue).complete_and_claim([done], names, limit=10, worker="w1", now=T0)
    assert completed == {done.id} and ids(nxt) == [limited[2]]  # the finished run's slot goes to the next job
    assert queue.limits()[0]["running"] == 2


ENDINGS = ("complete", "fail", "fail_final", "snooze", "release", "cancel", "recover", "delete")


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_way_a_run_ends_frees_its_slot(queue: Queue, ending: str) -> None:
    limit(queue, concurrency=1)
    queue.enqueue_many("q", [{}] * 2, task="t", run_at=T0)
    [job] = claim(queue, ["q"])
    assert claim(queue, ["q"]) == []
    if ending == "complete":
        queue.complete([job], worker="w1")
    elif ending in ("fail", "fail_final"):
        queue.fail([Failure(job, "Boom", 0.0, ending == "fail")], worker="w1", now=T0)
    elif ending == "snooze":
        WorkerCalls(queue).snooze([job], [0.0], worker="w1", now=T0)
    elif ending == "release":
        WorkerCalls(queue).release([job], worker="w1", now=T0)
    elif ending == "cancel":
        queue.cancel(ids=[job.id])
    elif ending == "recover":
        WorkerCalls(queue).recover_expired(queue="q", now=T0 + timedelta(days=1))
    else:
        with queue.pool.connection() as conn:
            conn.execute(f'DELETE FROM "{queue.settings.schema}".jobs WHERE id = %s', (job.id,))
    assert queue.limits()[0]["running"] == 0
    assert len(claim(queue, ["q"], now=T0 + timedelta(days=2))) == 1


def test_many_concurrent_claims_never_start_more_than_the_limit(queue: Queue, settings) -> None:
    limit(queue, concurrency=3)
    queue.enqueue_many("q", [{}] * 60, task="t", run_at=T0)
    queue.enqueue_many("q", [{}] * 10, task="u", run_at=T0)
    claimed = claim_concurrently(settings, rounds=6, limit=4)
    assert sum(1 for j in claimed if j.task == "t") == 3  # none completes, so never a fourth
    assert sum(1 for j in claimed if j.task == "u") == 10
    assert len({j.id for j in claimed}) == len(claimed)


# ---------------------------------------------------------------------------------------------- rate
@pytest.mark.parametrize("names", QUEUES)
def test_rate_limit_allows_n_starts_per_period_and_keeps_the_rest_pending(queue: Queue, names: list[str]) -> None:
    limit(queue, rate=RateLimit(2, 60.0))
    queue.enqueue_many("q", [{}] * 5, task="t", run_at=T0)
    first = claim(queue, names)
    assert len(first) == 2
    queue.complete(first, worker="w1")
    later = T0 + timedelta(seconds=30)
    assert claim(queue, names, now=later) == []  # completions do not give starts back: the period does
    assert WorkerCalls(queue).next_start(["t"], names, now=later) == pytest.approx(30.0)
    assert {r["status"] for r in map(queue.get, range(first[-1].id + 1, first[-1].id + 4)) if r} == {"pending"}
    assert len(claim(queue, names, now=T0 + timedelta(seconds=60))) == 2
    assert len(claim(queue, names, now=T0 + timedelta(seconds=120))) == 1
    assert (
        WorkerCalls(queue).next_start(["t"], names, now=T0 + timedelta(seconds=121)) is None
    )  # nothing waits on the rate


def test_next_start_hints_a_slot_freed_just_now_but_not_one_free_for_long(queue: Queue) -> None:
    """A slot that came free between a claim and the hint means "claim again now" (else the claimer would sleep a
    whole poll interval); one free for more than a second with a due job left is held back by something else."""
    limit(queue, concurrency=1, rate=RateLimit(1, 10.0))
    queue.enqueue_many("q", [{}] * 2, task="t", run_at=T0)
    [first] = claim(queue, ["q"])
    hint = WorkerCalls(queue).next_start(["t"], ["q"], now=T0 + timedelta(seconds=10.5))
    assert hint is not None and -1.0 < hint <= 0.0
    # The running job holds the only concurrency slot: the free rate slot cannot be used, so no hint to spin on.
    assert WorkerCalls(queue).next_start(["t"], ["q"], now=T0 + timedelta(seconds=12)) is None
    assert claim(queue, ["q"], now=T0 + timedelta(seconds=12)) == []
    queue.complete([first], worker="w1")
    assert len(claim(queue, ["q"], now=T0 + timedelta(seconds=12))) == 1


def test_rate_and_concurrency_together(queue: Queue) -> None:
    limit(queue, concurrency=1, rate=RateLimit(5, 60.0))
    queue.enqueue_many("q", [{}] * 3, task="t", run_at=T0)
    [job] = claim(queue, ["q"])
    queue.complete([job], worker="w1")
    assert len(claim(queue, ["q"], now=T0 + timedelta(seconds=1))) == 1
    assert queue.limits()[0]["recent_starts"] == 2


def test_a_concurrency_slot_is_found_by_its_primary_key_before_any_statistics(queue: Queue, pg_dsn, schema) -> None:
    """The claim takes a concurrency slot, and the trigger frees it, by (task, kind, n). Before task_slots has
    statistics (a new limit, autovacuum off or not yet run), no other index may look as good for that: one on
    (task, kind, free_at) did (every concurrency slot's free_at is -infinity), and each run started and ended read
    all its task's slots, 1,000 of them here."""
    limit(queue, concurrency=1000, rate=RateLimit(1000, 1.0))
    lookup = (
        f'UPDATE "{schema}".task_slots AS s SET job_id = NULL, attempts = NULL, worker = NULL '
        "WHERE s.task = $1 AND s.kind = 'concurrency' AND s.n = $2 AND s.job_id = $3 AND s.attempts = $4"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        table = f'"{schema}".task_slots'
        [(rows,)] = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table]).fetchall()
        assert rows <= 0, "task_slots was analysed: the test needs a table without statistics"
        conn.execute(f"PREPARE free_slot AS {lookup}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE free_slot('t', 7, 1, 1)"))
    assert "task_slots_pkey" in plan and "n = $2" in plan, plan


def test_the_claim_moves_a_rate_slot_on_by_its_primary_key(queue: Queue, pg_dsn, schema) -> None:
    """A claim moves the rate slots it took on by (task, kind, n). Planned generic (as the worker's busy claims are)
    before task_slots has statistics, the rate index (task, free_at) looked as good for that: each of a claim's
    200 slots was found by walking its task's slots, 11 ms of a 20 ms claim at a rate of 10,000/s."""
    limit(queue, concurrency=1000, rate=RateLimit(1000, 1.0))
    params = complete_and_claim_params([], Claim(["q"], "w1"), 10, T0, lease_seconds=60.0)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        [(rows,)] = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [f'"{schema}".task_slots']
        ).fetchall()
        assert rows <= 0, "task_slots was analysed: the test needs a table without statistics"
        conn.execute("SET plan_cache_mode = force_generic_plan")
        lines = [
            r[0]
            for r in conn.execute("EXPLAIN " + queries_for(queue.settings.schema).job_complete_and_claim_one, params)
        ]
    start = next(i for i, line in enumerate(lines) if line.strip() == "CTE took_rslot")
    depth = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines)) if len(lines[i]) - len(lines[i].lstrip()) <= depth), None)
    took = "\n".join(lines[start:end])
    assert "Index Scan using task_slots_pkey" in took and "task_slots_rate_free_idx" not in took, took


def test_the_rate_hint_probes_each_task_once(queue: Queue, pg_dsn, schema) -> None:
    """The claimer asks for the rate hint after every claim that came back short. It reads each task's earliest
    rate slot through the rate index and the claim index up to a due job, whatever the statistics: joined slot
    against slot and against the jobs, it read every slot once for each busy one (400,000 buffers, 200 ms, at a
    rate of 10,000/s)."""
    limit(queue, rate=RateLimit(1000, 1.0))
    params = {"tasks": ["t"], "queues": ["q", "r"], "now": T0}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + queries_for(queue.settings.schema).task_limits_next_start, params)
        )
    assert plan.count(" on task_slots ") == 1 and "task_slots_rate_free_idx" in plan, plan
    assert "Seq Scan" not in plan and "jobs_claim_idx" in plan, plan


# ---------------------------------------------------------------------------------------------- registration
def test_the_latest_registration_wins_and_slots_follow_it(queue: Queue) -> None:
    [row] = WorkerCalls(queue).register_limits([TaskLimits("t", 3)], worker="old")
    assert not row["was_present"]
    queue.enqueue_many("q", [{}] * 4, task="t", run_at=T0)
    running = claim(queue, ["q"])
    assert len(running) == 3
    [row] = WorkerCalls(queue).register_limits([TaskLimits("t", 1, RateLimit(10, 1.0))], worker="new")
    assert (row["was_present"], row["was_concurrency"], row["was_registered_by"]) == (True, 3, "old")
    [lim] = queue.limits()
    assert (lim["global_concurrency"], lim["rate_limit"], lim["registered_by"]) == (1, 10, "new")
    assert queue.limits()[0]["running"] == 1  # slots 2 and 3 went at once; their runs go on without one
    queue.complete(running, worker="w1")
    queue.enqueue_many("q", [{}] * 2, task="t", run_at=T0)
    assert len(claim(queue, ["q"])) == 1
    WorkerCalls(queue).register_limits([TaskLimits("t")], worker="newer")  # no limits any more: unregistered
    assert queue.limits() == []
    with queue.pool.connection() as conn:
        left = conn.execute(f'SELECT count(*) FROM "{queue.settings.schema}".task_slots').fetchone()
    assert left is not None and left[0] == 0


def test_waiting_counts_jobs_held_back_by_reason(queue: Queue) -> None:
    limit(queue, concurrency=1, task="c")
    limit(queue, rate=RateLimit(1, 3600.0), task="r")
    queue.enqueue_many("q", [{}] * 3, serial_key="k")
    queue.enqueue_many("q", [{}] * 2, task="c")
    queue.enqueue_many("q", [{}] * 2, task="r")
    assert len(queue.claim("q", limit=10, worker="w1")) == 3
    [row] = queue.waiting("q")
    assert (row["serial_key"], row["concurrency"], row["rate"]) == (2, 1, 1)


def test_the_unique_running_index_refuses_a_second_running_job_of_a_key(queue: Queue) -> None:
    a, b = (queue.enqueue("q", {}, serial_key="k").id for _ in range(2))
    claim(queue, ["q"], now=datetime.now(UTC))
    with queue.pool.connection() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            f"UPDATE \"{queue.settings.schema}\".jobs SET status = 'processing', locked_by = 'x', locked_at = now() "
            "WHERE id = %s",
            (b,),
        )
    assert queue.get(a)["status"] == "processing"  # type: ignore[index]


# ---------------------------------------------------------------------------------------------- API and CLI
def test_a_task_default_and_the_cli_set_the_serial_options(queue: Queue, pg_dsn: str, schema: str) -> None:
    from skiplock import App

    app = App(schema=schema)

    @app.task(name="t", queue="q", serial_skip_on_retry=True, global_concurrency=2, rate_limit="5/s")
    def t(job: object) -> None: ...

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        first = t.enqueue({}, conn=conn, serial_key="user:42").id
    out = run_cli("enqueue", "--queue", "q", "--task", "t", "--payload", "{}", "--serial-key", "user:42",
                  dsn=pg_dsn, schema=schema)  # fmt: skip
    second = int(out.stdout.strip())
    with queue.pool.connection() as conn:
        rows = conn.execute(f'SELECT id, serial_key, serial_skip_on_retry FROM "{schema}".jobs ORDER BY id').fetchall()
    assert rows == [(first, "user:42", True), (second, "user:42", False)]
    WorkerCalls(queue).register_limits([t.limits], worker="w")
    claim(queue, ["q"], now=datetime.now(UTC))
    listing = run_cli("limits", dsn=pg_dsn, schema=schema).stdout
    assert "5/1s" in listing and "waiting_serial_key" in listing
    data = json.loads(run_cli("limits", "--json", dsn=pg_dsn, schema=schema).stdout)
    assert data["limits"][0]["global_concurrency"] == 2 and data["waiting"][0]["serial_key"] == 1
    bad = run_cli("enqueue", "--payload", "{}", "--serial-key", "x" * 300, dsn=pg_dsn, schema=schema)
    assert bad.returncode != 0 and "serial_key" in bad.stderr


def run_cli(*args: str, dsn: str, schema: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env |= {"SKIPLOCK_DSN": dsn, "SKIPLOCK_SCHEMA": schema}
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=env, capture_output=True, text=True, timeout=60
    )
