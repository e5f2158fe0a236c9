"""Apply a JobQueue, watch the operator migrate, build the Deployment, scale it, report, and clean up."""

from __future__ import annotations

import re
import time
from typing import Any

import psycopg
import yaml

from skiplock import AsyncQueue
from skiplock.migrate import acurrent_version, latest_version
from support.pg import await_for

from .conftest import CRDS, Cluster, jobqueue_spec

CRD = next(p for p in CRDS if p.name == "jobqueues.skiplock.io.yaml")


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.jobqueue(name) or {}).get("status") or {})


def backlog_of(cluster: Cluster, name: str) -> int | None:
    return (status_of(cluster, name).get("backlog") or {}).get("ready")


async def test_create_migrates_and_builds_an_owned_deployment(
    pg_dsn: str, fresh_schema: str, cluster: Cluster, operator: object
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
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
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


def column_value(obj: dict[str, Any], path: str) -> Any:
    """Resolve the jsonPath forms our printer columns use: dotted fields and one [?(@.type=="X")] filter."""
    value: Any = obj
    for part in re.findall(r'[^.\[\]]+|\[\?\(@\.type=="\w+"\)\]', path):
        if part.startswith("[?"):
            wanted = re.search(r'"(\w+)"', part).group(1)  # type: ignore[union-attr]
            value = next((c for c in value or [] if c.get("type") == wanted), None)
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


async def test_status_fills_every_printer_column_and_spec_changes_roll_out(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("cols", jobqueue_spec("cols", schema, minReplicas=1))
    await aqueue.enqueue_many("cols", [{"n": i} for i in range(12)])
    await await_for(lambda: backlog_of(cluster, "cols") == 12, what="backlog in status")
    jq = cluster.jobqueue("cols")
    assert jq is not None
    for column in yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]:
        assert column_value(jq, column["jsonPath"]) is not None, column["name"]
    assert jq["status"]["observedGeneration"] == jq["metadata"]["generation"]
    assert jq["status"]["selector"] == "app.kubernetes.io/name=skiplock-worker,app.kubernetes.io/instance=cols"
    assert jq["status"]["oldestReadyAgeSeconds"] >= 0
    await await_for(lambda: "BacklogGrew" in {e.get("reason") for e in cluster.events()}, what="a BacklogGrew Event")

    replicas = cluster.replicas("cols")
    await cluster.patch_jobqueue("cols", {"spec": {"image": "example.com/app-worker:2.0"}})
    await await_for(
        lambda: (
            (cluster.deployment("cols") or {})["spec"]["template"]["spec"]["containers"][0]["image"]
            == "example.com/app-worker:2.0"
        ),
        what="new image rolled out",
    )
    assert cluster.replicas("cols") == replicas, "a template change must not touch the replicas"
    await await_for(
        lambda: (
            status_of(cluster, "cols").get("observedGeneration") == cluster.jobqueue("cols")["metadata"]["generation"]
        ),  # type: ignore[index]
        what="observedGeneration follows the spec",
    )


async def test_a_deployment_deleted_by_hand_comes_back(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("back", jobqueue_spec("back", schema, minReplicas=1))
    first = await await_for(lambda: cluster.deployment("back"), what="Deployment")
    await cluster.emu.delete(f"/apis/apps/v1/namespaces/default/deployments/{first['metadata']['name']}")
    again = await await_for(
        lambda: (d := cluster.deployment("back")) and d["metadata"]["uid"] != first["metadata"]["uid"] and d,
        what="Deployment recreated",
    )
    assert again["spec"]["replicas"] == 1


async def test_the_queue_column_shows_the_queues_of_a_jobqueue_that_sets_only_spec_queues(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    spec = jobqueue_spec("unused", schema)
    del spec["queue"]
    await cluster.create_jobqueue("shop", {**spec, "queues": ["orders", "emails"]})
    column = next(
        c
        for c in yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]
        if c["name"] == "Queue"
    )
    await await_for(
        lambda: column_value(cluster.jobqueue("shop") or {}, column["jsonPath"]) == "orders,emails",
        what="the Queue column",
    )
