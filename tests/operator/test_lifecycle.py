"""Apply a JobQueue, watch the operator migrate, build the Deployment, scale it, report, and clean up."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from skiplock import AsyncQueue
from skiplock.migrate import acurrent_version, latest_version
from support.pg import await_for

from .conftest import Cluster, jobqueue_spec


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.jobqueue(name) or {}).get("status") or {})


def backlog_of(cluster: Cluster, name: str) -> int | None:
    return (status_of(cluster, name).get("backlog") or {}).get("ready")


async def test_create_migrates_and_builds_an_owned_deployment(
    cluster: Cluster, operator: object, pg_dsn: str, fresh_schema: str
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("mail", jobqueue_spec("mail", fresh_schema, minReplicas=1))

    dep = await await_for(lambda: cluster.deployment("mail"), timeout=10, what="worker Deployment")
    jq = cluster.jobqueue("mail")
    assert jq is not None
    owner = dep["metadata"]["ownerReferences"][0]
    assert owner["uid"] == jq["metadata"]["uid"] and owner["kind"] == "JobQueue" and owner["controller"] is True
    assert dep["spec"]["replicas"] == 1
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["SKIPLOCK_QUEUE"]["value"] == "mail" and env["SKIPLOCK_SCHEMA"]["value"] == fresh_schema
    assert env["SKIPLOCK_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "dsn"}
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        assert await acurrent_version(conn, fresh_schema) == latest_version()
    await await_for(
        lambda: (cluster.condition("mail", "SchemaReady") or {}).get("status") == "True", what="SchemaReady"
    )
    await await_for(lambda: (cluster.condition("mail", "Ready") or {}).get("status") == "True", what="Ready")


async def test_backlog_scales_up_then_down_after_the_window_then_delete(
    cluster: Cluster, operator: object, pg_dsn: str, schema: str, aqueue: AsyncQueue
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("img", jobqueue_spec("img", schema, scaleDownStabilizationSeconds=1.5))
    await await_for(lambda: cluster.replicas("img") == 0, timeout=10, what="Deployment at zero")

    await aqueue.enqueue_many("img", [{"n": i} for i in range(35)])
    await await_for(lambda: cluster.replicas("img") == 4, timeout=10, what="ceil(35 / 10) = 4 replicas")
    status = await await_for(
        lambda: status_of(cluster, "img") if backlog_of(cluster, "img") == 35 else None,
        what="status.backlog.ready = 35",
    )
    assert status["desiredReplicas"] == 4 and status["lastScaleTime"]
    assert status["backlog"] == {"ready": 35, "delayed": 0, "processing": 0, "stalled": 0, "failed": 0}

    jobs = await aqueue.claim("img", limit=100, worker="test")
    await aqueue.complete(jobs, worker="test")
    drained = time.monotonic()
    await await_for(lambda: cluster.replicas("img") == 0, timeout=10, what="scale to zero after the window")
    assert time.monotonic() - drained >= 1.0, "scaled down before the stabilization window passed"

    await cluster.delete_jobqueue("img")
    await await_for(lambda: cluster.deployment("img") is None, timeout=10, what="Deployment deleted")
    await await_for(lambda: cluster.jobqueue("img") is None, timeout=10, what="JobQueue finalized")
