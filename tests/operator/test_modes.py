"""Operator modes and restarts: HA with kopf peering, all namespaces, and a restart keeping the window."""

from __future__ import annotations

import time
from typing import Any

import kmock

from support.pg import await_for

from .conftest import NAMESPACE, Cluster, jobqueue_spec, running_operator

PEERINGS = kmock.resource("kopf.dev", "v1", "kopfpeerings")


async def test_peered_operator_heartbeats_and_reconciles(pg_dsn: str, schema: str, cluster: Cluster) -> None:
    body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "skiplock"}}
    await cluster._send("POST", f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings", body, "application/json")
    async with running_operator(cluster, standalone=False, peering="skiplock"):
        await cluster.apply_secret("db", pg_dsn)
        await cluster.create_jobqueue("ha", jobqueue_spec("ha", schema, minReplicas=1))
        await await_for(lambda: cluster.replicas("ha") == 1, timeout=15, what="Deployment from the peered operator")
        peers: dict[str, Any] = (cluster.get(PEERINGS, "skiplock") or {}).get("status") or {}
        assert peers, "the operator wrote no heartbeat into the peering object"


async def test_all_namespaces_mode_reconciles(pg_dsn: str, schema: str, cluster: Cluster) -> None:
    async with running_operator(cluster, namespaces=[], all_namespaces=True):
        await cluster.apply_secret("db", pg_dsn)
        await cluster.create_jobqueue("wide", jobqueue_spec("wide", schema, minReplicas=1))
        await await_for(lambda: cluster.replicas("wide") == 1, timeout=15, what="Deployment, cluster-wide operator")


async def test_a_restarted_operator_waits_a_full_window_before_scaling_down(
    pg_dsn: str, schema: str, cluster: Cluster
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    async with running_operator(cluster):
        await cluster.create_jobqueue("rs", jobqueue_spec("rs", schema, scaleDownStabilizationSeconds=2))
        await await_for(lambda: cluster.replicas("rs") == 0, what="Deployment at zero")
    await cluster.patch_deployment("rs-worker", {"spec": {"replicas": 3}})  # while no operator runs
    async with running_operator(cluster):
        started = time.monotonic()
        await await_for(lambda: cluster.replicas("rs") == 0, timeout=10, what="scale-down after the window")
        assert time.monotonic() - started >= 1.5, "a restarted operator scaled down before a full window"


async def test_without_watches_the_operator_needs_no_list_or_watch_on_deployments_and_secrets(
    pg_dsn: str, schema: str, cluster: Cluster
) -> None:
    def lists_or_watches(kind: str) -> list[str]:
        return [
            str(r.url) for r in cluster.emu if r.method.value == "GET" and str(r.url).split("?")[0].endswith(f"/{kind}")
        ]

    async with running_operator(cluster, config={"watch_deployments": False, "watch_secrets": False}):
        await cluster.apply_secret("db", pg_dsn)
        await cluster.create_jobqueue("lean", jobqueue_spec("lean", schema, minReplicas=1))
        await await_for(lambda: cluster.replicas("lean") == 1, timeout=15, what="Deployment without watches")
    assert lists_or_watches("deployments") == [] and lists_or_watches("secrets") == []

    async with running_operator(cluster):
        await await_for(lambda: lists_or_watches("deployments") and lists_or_watches("secrets"), what="the watches")
