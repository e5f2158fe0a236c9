"""Failure paths: an invalid spec, an unreachable database, a missing Secret, paused and manual scaling."""

from __future__ import annotations

import asyncio
import json
import socket

from skiplock import AsyncQueue
from support.pg import await_for

from .conftest import Cluster, jobqueue_spec


def closed_port_dsn() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://skiplock:s3cret-pw@127.0.0.1:{port}/app?connect_timeout=1"


def writes_to(cluster: Cluster, name: str) -> int:
    return sum(
        1 for r in cluster.emu if r.method.value in ("PATCH", "POST", "PUT") and f"jobqueues/{name}" in str(r.url)
    )


def is_status(cluster: Cluster, name: str, type_: str, status: str, reason: str | None = None) -> bool:
    cond = cluster.condition(name, type_) or {}
    return cond.get("status") == status and (reason is None or cond.get("reason") == reason)


async def test_invalid_spec_sets_ready_false_without_retrying(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("bad", jobqueue_spec("bad", schema, minReplicas=4, maxReplicas=2))
    await await_for(lambda: is_status(cluster, "bad", "Ready", "False", "InvalidSpec"), what="Ready=False InvalidSpec")
    assert "minReplicas (4) must not exceed" in cluster.condition("bad", "Ready")["message"]  # type: ignore[index]
    assert cluster.deployment("bad") is None
    before = writes_to(cluster, "bad")
    await asyncio.sleep(1.0)  # a quiet period on purpose: count what the operator writes meanwhile
    assert writes_to(cluster, "bad") - before <= 1, "the operator keeps retrying a permanently invalid spec"

    await cluster.patch_jobqueue("bad", {"spec": {"scaling": {"minReplicas": 1}}})
    await await_for(lambda: is_status(cluster, "bad", "Ready", "True"), what="Ready=True after the fix")
    assert cluster.replicas("bad") == 1


async def test_database_unreachable_keeps_replicas_and_masks_the_password(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("pdf", jobqueue_spec("pdf", schema))
    await aqueue.enqueue_many("pdf", [{"n": i} for i in range(25)])
    await await_for(lambda: cluster.replicas("pdf") == 3, what="3 replicas")

    await cluster.apply_secret("db", closed_port_dsn())
    await await_for(
        lambda: is_status(cluster, "pdf", "DatabaseReachable", "False", "ConnectRefused"),
        what="DatabaseReachable=False",
    )
    message = cluster.condition("pdf", "DatabaseReachable")["message"]  # type: ignore[index]
    assert message == "the database server refused the connection"
    assert "s3cret-pw" not in json.dumps([cluster.jobqueue("pdf"), cluster.events()])
    assert is_status(cluster, "pdf", "ScalingActive", "False")
    assert is_status(cluster, "pdf", "Ready", "False", "ConnectRefused")
    await await_for(
        lambda: any(e.get("reason") == "ConnectRefused" and e.get("type") == "Warning" for e in cluster.events()),
        what="a Warning Event for the outage",
    )
    assert cluster.replicas("pdf") == 3, "replicas must be kept while the database is unreachable"

    await cluster.apply_secret("db", pg_dsn)
    await await_for(lambda: is_status(cluster, "pdf", "DatabaseReachable", "True"), what="reachable again")
    await await_for(lambda: is_status(cluster, "pdf", "Ready", "True"), what="Ready again")
    assert cluster.replicas("pdf") == 3


async def test_unreachable_at_creation_waits_for_the_schema(
    pg_dsn: str, fresh_schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", closed_port_dsn())
    await cluster.create_jobqueue("late", jobqueue_spec("late", fresh_schema))
    await await_for(lambda: is_status(cluster, "late", "SchemaReady", "False"), what="SchemaReady=False")
    assert is_status(cluster, "late", "Ready", "False", "ConnectRefused")
    assert cluster.deployment("late") is None, "no worker may run before its schema is migrated"

    await cluster.apply_secret("db", pg_dsn)
    await await_for(lambda: is_status(cluster, "late", "SchemaReady", "True"), timeout=15, what="SchemaReady=True")
    await await_for(lambda: cluster.deployment("late"), what="Deployment after the migration")


async def test_missing_secret_is_reported(schema: str, cluster: Cluster, operator: object) -> None:
    await cluster.create_jobqueue("orphan", jobqueue_spec("orphan", schema))
    await await_for(lambda: is_status(cluster, "orphan", "Ready", "False", "SecretNotFound"), what="SecretNotFound")


async def test_paused_and_manual_replicas_are_left_to_the_user(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("rep", {**jobqueue_spec("rep", schema), "paused": True})
    await await_for(lambda: is_status(cluster, "rep", "ScalingActive", "False", "Paused"), what="Paused")
    await aqueue.enqueue_many("rep", [{"n": i} for i in range(30)])
    await cluster.patch_deployment("rep-worker", {"spec": {"replicas": 2}})  # a human scales by hand
    await await_for(lambda: cluster.replicas("rep") == 2, what="manual scale applied")
    await cluster.patch_jobqueue("rep", {"spec": {"paused": False, "scaling": {"enabled": False}}})
    await await_for(
        lambda: is_status(cluster, "rep", "ScalingActive", "False", "AutoscalingDisabled"), what="AutoscalingDisabled"
    )
    assert cluster.replicas("rep") == 2, "autoscaling off leaves the replicas alone"
    await cluster.patch_jobqueue("rep", {"spec": {"scaling": {"enabled": True}}})
    await await_for(lambda: cluster.replicas("rep") == 3, what="autoscaling resumes: ceil(30 / 10)")
