"""Periodic tasks with the operator: three worker processes and two operator instances fire each tick of an
every-second schedule once, and a queue with no worker at all still gets its ticks (and scales up on them)."""

from __future__ import annotations

import asyncio
import collections
import time

import psycopg

from skiplock.cli import main
from support.pg import await_for
from support.workers import WorkerProcess

from .conftest import NAMESPACE, Cluster, jobqueue_spec, metric, running_operator

TICKS = {"namespace": NAMESPACE, "jobqueue": "ticks"}  # the JobQueue of these tests

APP = "support.periodic_app:app"


def tick_times(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT payload->>'scheduled_at' FROM \"{schema}\".jobs WHERE task = 'periodic.tick' ORDER BY id"
        ).fetchall()
    return [r[0] for r in rows]


async def test_three_workers_and_two_operators_enqueue_each_tick_once(
    pg_dsn: str, schema: str, queue: object, cluster: Cluster
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    workers = [WorkerProcess(pg_dsn, schema, "ticks", "support.handlers:noop", app=APP) for _ in range(3)]
    try:
        async with running_operator(cluster) as first, running_operator(cluster) as second:
            await cluster.create_jobqueue("ticks", jobqueue_spec("ticks", schema, minReplicas=1))
            await await_for(lambda: len(tick_times(pg_dsn, schema)) >= 6, timeout=40, what="six ticks")
            by_operators = sum(
                metric(m, "skiplock_operator_schedule_ticks_total", **TICKS, result="enqueued") or 0
                for m in (first, second)
            )
        for w in workers:
            w.signal()
        for w in workers:
            assert w.wait(30) == 0, w.output()
    finally:
        for w in workers:
            w.stop()
    ticks = tick_times(pg_dsn, schema)
    repeated = {t: n for t, n in collections.Counter(ticks).items() if n > 1}
    assert not repeated, f"ticks enqueued more than once: {repeated}"
    assert all("registered 1 schedule(s)" in w.output() for w in workers)
    print(f"{len(ticks)} ticks, {by_operators:.0f} of them enqueued by the operators")


async def test_a_queue_without_workers_gets_its_ticks_from_the_operator(
    pg_dsn: str, schema: str, queue: object, cluster: Cluster
) -> None:
    assert main(["schedules", "sync", "--app", APP, "--dsn", pg_dsn, "--schema", schema]) == 0  # at deploy
    await cluster.apply_secret("db", pg_dsn)
    async with running_operator(cluster) as metrics:
        await cluster.create_jobqueue("ticks", jobqueue_spec("ticks", schema, pollingIntervalSeconds=60))
        await await_for(lambda: len(tick_times(pg_dsn, schema)) >= 1, timeout=20, what="a tick from the operator")
        await await_for(lambda: cluster.replicas("ticks") == 1, timeout=10, what="a worker woken by the tick")
        assert (metric(metrics, "skiplock_operator_schedule_ticks_total", **TICKS, result="enqueued") or 0) >= 1


async def test_a_jobqueue_the_policy_refuses_fires_no_ticks(
    pg_dsn: str, schema: str, fresh_schema: str, queue: object, cluster: Cluster
) -> None:
    """Every daemon checks the admin's policy: the schedules of a refused JobQueue stay unfired, while an allowed
    JobQueue with the same schedule (in another schema) gets its ticks in the same time."""
    from skiplock_operator.config import Policy

    for s in (schema, fresh_schema):
        assert main(["migrate", "--dsn", pg_dsn, "--schema", s]) == 0
        assert main(["schedules", "sync", "--app", APP, "--dsn", pg_dsn, "--schema", s]) == 0
    await cluster.apply_secret("db", pg_dsn)
    policy = Policy(allowed_images=("registry.example.com/",))
    async with running_operator(cluster, config={"policy": policy}) as metrics:
        await cluster.create_jobqueue("refused", jobqueue_spec("ticks", schema))  # example.com/...: not allowed
        allowed = {**jobqueue_spec("ticks", fresh_schema), "image": "registry.example.com/worker:1"}
        await cluster.create_jobqueue("allowed", allowed)
        await await_for(lambda: len(tick_times(pg_dsn, fresh_schema)) >= 2, timeout=20, what="ticks of the allowed")
        refused = metric(
            metrics,
            "skiplock_operator_schedule_ticks_total",
            namespace=NAMESPACE,
            jobqueue="refused",
            result="enqueued",
        )
    condition = cluster.condition("refused", "Ready") or {}
    assert condition.get("reason") == "PolicyViolation"
    assert tick_times(pg_dsn, schema) == [], "the schedules daemon fired ticks for a JobQueue the policy refuses"
    assert not refused


# ------------------------------------------------------------------ issue 37 item 3 (operator part) and Low
def add_schedule(
    dsn: str, schema: str, name: str, *, late_days: float = 0.0, cron: str | None = None, **cols: object
) -> None:
    values = {
        "name": name,
        "app": "test",
        "queue": "sched",
        "task": "periodic.tick",
        "cron": cron,
        "every_seconds": None if cron else 1.0,
        "timezone": "Europe/Paris",
        "period_seconds": 60.0,
        **cols,
    }
    names = ", ".join(values)
    holders = ", ".join(f"%({k})s" for k in values)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".schedules ({names}, next_run_at) '
            f"VALUES ({holders}, now() - make_interval(secs => %(late)s))",
            {**values, "late": max(1.0, late_days * 86400)},
        )


def add_refused_schedule(dsn: str, schema: str, name: str) -> None:
    """A schedule row the schedules table accepts (its bounds, migration 0019, refuse what they can) but whose tick
    the jobs table refuses: here a CHECK a DBA added on the jobs table, refusing its task."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'ALTER TABLE "{schema}".jobs ADD CONSTRAINT jobs_refused_task_check '
            "CHECK (task IS DISTINCT FROM 'refused.tick') NOT VALID"
        )
    add_schedule(dsn, schema, name, task="refused.tick")


async def test_a_schedule_row_the_jobs_table_refuses_fails_alone_and_is_parked(pg_dsn: str, schema: str) -> None:
    """One bad row (the jobs table refuses its tick) used to roll back the whole round, so no schedule of the
    JobQueue fired again. Each tick has its own savepoint now; the bad row is reported to park."""
    from skiplock_operator.database import Databases

    add_refused_schedule(pg_dsn, schema, "bad")
    add_schedule(pg_dsn, schema, "good")
    dbs = Databases(timeout=5.0)
    try:
        done = await dbs.fire_schedules(("default", "jq"), pg_dsn, schema, ["sched"], "skiplock_wake")
        assert done.failed == ["bad"] and [f.name for f in done.fired] == ["good"]
        assert done.fired[0].job_id is not None
        again = await dbs.fire_schedules(("default", "jq"), pg_dsn, schema, ["sched"], "skiplock_wake", parked={"bad"})
        assert again.failed == [] and "bad" not in [f.name for f in again.fired]
    finally:
        await dbs.close()


async def test_a_hundred_parked_rows_do_not_starve_a_due_schedule(pg_dsn: str, schema: str) -> None:
    """The operator parks rows in memory; they were filtered out after the query's LIMIT of 100, so 100 parked rows
    that were due first hid every other due schedule of the JobQueue, round after round. The query leaves them out
    now, and the next due time it reports is not a parked row's."""
    from skiplock_operator.database import Databases

    parked = {f"stuck{i:03}" for i in range(100)}
    for name in sorted(parked):
        add_schedule(pg_dsn, schema, name, late_days=1.0)  # due before "good"
    add_schedule(pg_dsn, schema, "good", every_seconds=60.0)
    dbs = Databases(timeout=5.0)
    try:
        done = await dbs.fire_schedules(("default", "jq"), pg_dsn, schema, ["sched"], "skiplock_wake", parked=parked)
        assert [f.name for f in done.fired] == ["good"] and done.fired[0].job_id is not None
        assert done.failed == []
        assert done.next_due is not None and done.next_due > 0, "the next due time was a parked (overdue) row's"
    finally:
        await dbs.close()


async def test_late_cron_rows_are_computed_off_the_event_loop_a_bounded_amount_per_round(
    pg_dsn: str, schema: str
) -> None:
    """A tenant's late cron rows (10,000 cron steps each) used to be computed inline, stalling every other
    JobQueue's polls; now each round computes on the namespace's schedule thread, within a time budget, and a late
    row's missed ticks cost at most 100 cron steps (issue 37, item 3): every row fires and the loop never stalls."""
    from skiplock_operator.database import Databases

    for i in range(12):
        add_schedule(pg_dsn, schema, f"late{i}", cron="* * * * *", late_days=8)
    dbs = Databases(timeout=5.0)
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:  # what every other JobQueue's daemon needs: a loop that turns
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    try:
        first = await dbs.fire_schedules(("default", "jq"), pg_dsn, schema, ["sched"], "skiplock_wake")
        assert first.fired, "a round fires what its budget allows"
        fired = {f.name for f in first.fired}
        for _ in range(20):
            if len(fired) == 12:
                break
            fired |= {
                f.name for f in (await dbs.fire_schedules(("default", "jq"), pg_dsn, schema, ["sched"], "ch")).fired
            }
        assert len(fired) == 12
    finally:
        stop.set()
        await task
        await dbs.close()
    assert max(gaps) < 0.25, f"the event loop stalled {max(gaps):.2f}s during a schedules round"


async def test_the_operator_parks_a_bad_row_and_keeps_firing_the_others(
    pg_dsn: str, schema: str, cluster: Cluster
) -> None:
    add_refused_schedule(pg_dsn, schema, "bad")
    add_schedule(pg_dsn, schema, "good")
    await cluster.apply_secret("db", pg_dsn)
    labels = {"namespace": NAMESPACE, "jobqueue": "parking"}
    async with running_operator(cluster) as metrics:
        await cluster.create_jobqueue("parking", jobqueue_spec("sched", schema, pollingIntervalSeconds=60))
        await await_for(lambda: good_ticks(pg_dsn, schema) >= 3, timeout=20, what="three ticks of the good row")
        failed = metric(metrics, "skiplock_operator_schedule_ticks_total", **labels, result="failed")
    assert failed == 1, "the bad row was tried again within its parking time (or never reported)"


def good_ticks(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM \"{schema}\".jobs WHERE queue = 'sched'").fetchone()
    return int(row[0]) if row else 0
