"""``spec.paused`` pauses the served queues in the database; the operator runs the scheduled retention.

kopf runs for real against the kmock emulator, with a real PostgreSQL and, where a worker matters, a real
in-process worker. Retention is tested under the least-privilege roles ``skiplock grant`` makes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from skiplock import Settings
from skiplock.app import App
from skiplock.grant import apply_grants
from skiplock.store.run import execute
from skiplock.store.statements import PurgePolicy, Statements
from skiplock.worker import Worker
from skiplock_operator.database import PERMISSION_DENIED, Databases
from support.pg import await_for
from support.roles import Roles, login_roles

from .conftest import NAMESPACE, Cluster, jobqueue_spec, metric
from .test_conditions import is_status


def paused_rows(dsn: str, schema: str) -> dict[str, bool]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT queue, paused FROM {}").format(sql.Identifier(schema, "queues")))
        return {r[0]: r[1] for r in rows.fetchall()}


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.jobqueue(name) or {}).get("status") or {})


def job_status(dsn: str, schema: str, job_id: int) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT status FROM {} WHERE id = %s").format(sql.Identifier(schema, "jobs")), (job_id,)
        )
        found = row.fetchone()
    assert found is not None
    return str(found[0])


def enqueue(dsn: str, schema: str, queue: str, task: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("INSERT INTO {} (queue, payload, task) VALUES (%s, '{{}}', %s) RETURNING id").format(
                sql.Identifier(schema, "jobs")
            ),
            (queue, task),
        ).fetchone()
    assert row is not None
    return int(row[0])


def paused_gauge(metrics: Any, jobqueue: str, queue: str) -> float | None:
    return metric(metrics, "skiplock_queue_paused", namespace=NAMESPACE, jobqueue=jobqueue, queue=queue)


def wakeups(worker: Worker) -> float:
    samples = [s for m in worker.registry.collect() if m.name == "skiplock_worker_wakeups" for s in m.samples]
    return sum(s.value for s in samples if s.name.endswith("_total"))


async def test_spec_paused_pauses_the_served_queues_a_worker_stops_claiming_and_false_resumes(
    pg_dsn: str, schema: str, cluster: Cluster, operator: Any
) -> None:
    app = App()

    @app.task(name="a.mark", queue="a")
    def mark_a(job: Any) -> None:
        return None

    @app.task(name="b.mark", queue="b")
    def mark_b(job: Any) -> None:
        return None

    await cluster.apply_secret("db", pg_dsn)
    spec = {**jobqueue_spec("a", schema, maxReplicas=0), "queues": ["a", "b"], "pollingIntervalSeconds": 0.2}
    await cluster.create_jobqueue("pq", spec)
    await await_for(lambda: is_status(cluster, "pq", "QueuesActive", "True", "Claiming"), what="QueuesActive")
    assert paused_rows(pg_dsn, schema) == {}, "nothing written while spec.paused is false"
    assert paused_gauge(operator, "pq", "a") == 0

    settings = Settings(dsn=pg_dsn, schema=schema, poll_seconds=0.2, queues=("a", "b"))
    worker = Worker(app, settings=settings)
    async with worker:
        first = enqueue(pg_dsn, schema, "a", "a.mark")
        await await_for(lambda: job_status(pg_dsn, schema, first) == "done", timeout=20, what="served before pause")

        flipped = time.monotonic()
        await cluster.patch_jobqueue("pq", {"spec": {"paused": True}})
        await await_for(lambda: paused_rows(pg_dsn, schema) == {"a": True, "b": True}, timeout=10, what="rows paused")
        row_seconds = time.monotonic() - flipped
        told = {"queue": "a"}
        await await_for(
            lambda: worker.registry.get_sample_value("skiplock_worker_queue_paused", told) == 1,
            timeout=10,
            what="the worker sees the pause",
        )
        worker_seconds = time.monotonic() - flipped
        print(f"\nspec.paused true -> queues rows paused: {row_seconds * 1000:.0f} ms; worker stops claiming: "
              f"{worker_seconds * 1000:.0f} ms")  # fmt: skip
        held = enqueue(pg_dsn, schema, "a", "a.mark")  # its NOTIFY wakes the worker, which claims nothing
        seen = wakeups(worker)
        await await_for(lambda: wakeups(worker) >= seen + 3, timeout=10, what="three claim-loop rounds")
        assert job_status(pg_dsn, schema, held) == "pending", "a paused queue is not claimed"
        await await_for(lambda: is_status(cluster, "pq", "QueuesActive", "False", "Paused"), what="condition")
        assert status_of(cluster, "pq")["pausedQueues"] == ["a", "b"] and status_of(cluster, "pq")["paused"] is True
        assert is_status(cluster, "pq", "ScalingActive", "False", "Paused")
        await await_for(lambda: paused_gauge(operator, "pq", "b") == 1, what="operator gauge")
        events = [e for e in cluster.events() if e.get("reason") == "Paused"]
        assert events and events[0]["type"] == "Normal" and "QueuesActive=False" in events[0]["message"]

        await cluster.patch_jobqueue("pq", {"spec": {"paused": False}})
        await await_for(lambda: job_status(pg_dsn, schema, held) == "done", timeout=20, what="resumed and claimed")
        assert paused_rows(pg_dsn, schema) == {"a": False, "b": False}
        await await_for(lambda: is_status(cluster, "pq", "QueuesActive", "True", "Claiming"), what="resumed status")
        assert status_of(cluster, "pq")["pausedQueues"] == [] and status_of(cluster, "pq")["paused"] is False
        assert any(e.get("reason") == "Claiming" and e["type"] == "Normal" for e in cluster.events())


async def test_a_queue_paused_by_command_is_left_paused_and_a_deleted_paused_jobqueue_resumes(
    pg_dsn: str, schema: str, cluster: Cluster, operator: Any
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("cmd", {**jobqueue_spec("cmd", schema, maxReplicas=0), "queues": ["cmd", "other"]})
    await await_for(lambda: is_status(cluster, "cmd", "QueuesActive", "True"), what="first poll")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # what `skiplock pause other` writes
        conn.execute(
            sql.SQL("INSERT INTO {} (queue, paused) VALUES ('other', true)").format(sql.Identifier(schema, "queues"))
        )
    await await_for(lambda: is_status(cluster, "cmd", "QueuesActive", "False", "PausedByCommand"), what="seen")
    assert status_of(cluster, "cmd")["pausedQueues"] == ["other"]
    assert paused_gauge(operator, "cmd", "other") == 1 and paused_gauge(operator, "cmd", "cmd") == 0
    polls = metric(operator, "skiplock_operator_poll_duration_seconds_count") or 0
    await await_for(lambda: (metric(operator, "skiplock_operator_poll_duration_seconds_count") or 0) > polls + 3)
    assert paused_rows(pg_dsn, schema) == {"other": True}, "spec.paused false never resumes a hand-made pause"

    await cluster.patch_jobqueue("cmd", {"spec": {"paused": True}})
    await await_for(lambda: paused_rows(pg_dsn, schema) == {"cmd": True, "other": True}, what="both paused")
    await await_for(lambda: status_of(cluster, "cmd").get("paused") is True, what="applied in status")
    await cluster.delete_jobqueue("cmd")
    await await_for(lambda: cluster.jobqueue("cmd") is None, what="JobQueue gone")
    assert paused_rows(pg_dsn, schema) == {"cmd": False, "other": False}, "the pause went with its JobQueue"
    assert paused_gauge(operator, "cmd", "other") is None, "the paused gauge goes with the JobQueue"


# ---------------------------------------------------------------------------------------------- retention
@pytest.fixture
def roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    """The worker and operator roles of ``skiplock grant`` on the schema (the operator role owns it)."""
    with login_roles(pg_dsn, schema) as made:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            apply_grants(conn, schema, worker=made.worker, operator=made.operator)
        yield made


def old_jobs(dsn: str, schema: str, status: str, n: int, days: float) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, payload, status, updated_at) "
                "SELECT 'rq', '{{}}', %s, now() - make_interval(secs => %s) FROM generate_series(1, %s) RETURNING id"
            ).format(sql.Identifier(schema, "jobs")),
            (status, days * 86400, n),
        ).fetchall()
    return {r[0] for r in rows}


def surviving(dsn: str, schema: str, ids: set[int]) -> set[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id FROM {} WHERE id = ANY(%s)").format(sql.Identifier(schema, "jobs")), (list(ids),)
        )
        return {r[0] for r in rows.fetchall()}


async def test_the_operator_purges_at_zero_replicas_with_the_owner_role_while_workers_may_not_delete(
    pg_dsn: str, schema: str, roles: Roles, cluster: Cluster, operator: Any
) -> None:
    with psycopg.connect(roles.dsn(pg_dsn, roles.worker)) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "jobs")))  # the worker role's limit
    doomed = old_jobs(pg_dsn, schema, "done", 1500, 2) | old_jobs(pg_dsn, schema, "failed", 3, 40)
    doomed |= old_jobs(pg_dsn, schema, "cancelled", 2, 8)
    kept = old_jobs(pg_dsn, schema, "done", 2, 0.5) | old_jobs(pg_dsn, schema, "failed", 2, 20)
    kept |= old_jobs(pg_dsn, schema, "pending", 2, 90)

    await cluster.apply_secret("worker-db", roles.dsn(pg_dsn, roles.worker))
    await cluster.apply_secret("owner-db", roles.dsn(pg_dsn, roles.operator))
    spec = {
        **jobqueue_spec("rq", schema, maxReplicas=0),
        "dsnSecretRef": {"name": "worker-db"},
        "operatorDsnSecretRef": {"name": "owner-db"},
        "retention": {"doneSeconds": 86400, "purgeIntervalSeconds": 1},
    }
    await cluster.create_jobqueue("ret", spec)
    await await_for(lambda: not surviving(pg_dsn, schema, doomed), timeout=20, what="old jobs purged")
    assert surviving(pg_dsn, schema, kept) == kept, "younger finished jobs and pending jobs stay"
    await await_for(lambda: cluster.replicas("ret") == 0, what="the Deployment at zero replicas")
    assert cluster.replicas("ret") == 0, "purged with no worker running"
    purged = {s: metric(operator, "skiplock_operator_jobs_purged_total", namespace=NAMESPACE, jobqueue="ret", status=s)
              for s in ("done", "failed", "cancelled")}  # fmt: skip
    assert purged == {"done": 1500, "failed": 3, "cancelled": 2}, "more than one batch of done jobs, all counted"
    env = {
        e["name"]: e.get("value") for e in cluster.deployment("ret")["spec"]["template"]["spec"]["containers"][0]["env"]
    }  # type: ignore[index]
    assert env["SKIPLOCK_PURGE_INTERVAL_SECONDS"] == "0", "the workers of a JobQueue never purge"
    assert (
        float(env["SKIPLOCK_RETAIN_DONE_SECONDS"]) == 86400 and float(env["SKIPLOCK_RETAIN_FAILED_SECONDS"]) == 2592000
    )

    await cluster.delete_jobqueue("ret")
    await await_for(lambda: cluster.jobqueue("ret") is None, what="JobQueue gone")
    assert (
        metric(operator, "skiplock_operator_jobs_purged_total", namespace=NAMESPACE, jobqueue="ret", status="done")
        is None
    )


async def test_an_operator_holding_only_the_worker_role_reports_the_purge_failing(
    pg_dsn: str, schema: str, roles: Roles, cluster: Cluster, operator: Any
) -> None:
    doomed = old_jobs(pg_dsn, schema, "done", 3, 30)
    await cluster.apply_secret("worker-db", roles.dsn(pg_dsn, roles.worker))
    spec = {**jobqueue_spec("rq", schema, maxReplicas=0), "dsnSecretRef": {"name": "worker-db"}}
    spec["retention"] = {"purgeIntervalSeconds": 1}
    await cluster.create_jobqueue("weak", spec)
    labels = {"namespace": NAMESPACE, "jobqueue": "weak"}
    await await_for(
        lambda: (metric(operator, "skiplock_operator_purge_errors_total", **labels) or 0) >= 1, what="error"
    )
    event = await await_for(lambda: [e for e in cluster.events() if e.get("reason") == "PurgeFailed"], what="Event")
    assert event[0]["type"] == "Warning" and "operatorDsnSecretRef" in event[0]["message"]
    assert PERMISSION_DENIED in event[0]["message"]
    assert roles.password not in event[0]["message"]
    assert surviving(pg_dsn, schema, doomed) == doomed
    await await_for(lambda: is_status(cluster, "weak", "Ready", "True"), what="the rest of the JobQueue still works")
    await cluster.patch_jobqueue("weak", {"spec": {"paused": True}})  # the worker role may not write `queues`
    await await_for(lambda: is_status(cluster, "weak", "QueuesActive", "False", PERMISSION_DENIED), what="refused")
    assert paused_rows(pg_dsn, schema) == {}


async def test_a_purge_batch_waits_its_turn_behind_the_retention_lock(pg_dsn: str, schema: str) -> None:
    doomed = old_jobs(pg_dsn, schema, "done", 5, 30)
    policy = PurgePolicy.retention(Settings(schema=schema))
    dbs = Databases(timeout=5.0)
    try:
        with psycopg.connect(pg_dsn) as holder:  # a worker's purge in progress: its transaction holds the lock
            assert execute(holder, Statements(Settings(schema=schema)).purge_lock(wait=True))
            assert await dbs.purge_batch("t", pg_dsn, schema, policy, 1000) is None
            assert surviving(pg_dsn, schema, doomed) == doomed
            holder.rollback()
        assert await dbs.purge_batch("t", pg_dsn, schema, policy, 1000) == {"done": 5}
        assert not surviving(pg_dsn, schema, doomed)
    finally:
        await dbs.close()
