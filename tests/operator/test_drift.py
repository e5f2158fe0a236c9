"""Drift correction: a hand-edited Deployment comes back, a rotated DSN Secret is used at once.

The poll interval is long (60 s) in these tests, so what fixes things is the watch, not the next poll.
"""

from __future__ import annotations

from typing import Any

from support.pg import await_for

from .conftest import Cluster, jobqueue_spec, running_operator
from .test_conditions import closed_port_dsn, is_status


def image(cluster: Cluster, name: str) -> Any:
    dep = cluster.deployment(name) or {}
    return dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("image")


async def test_a_hand_edited_deployment_is_reconciled_back(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("drift", jobqueue_spec("drift", schema, minReplicas=1, pollingIntervalSeconds=60))
    await await_for(lambda: is_status(cluster, "drift", "ScalingActive", "True"), what="first poll done")
    assert image(cluster, "drift") == "example.com/app-worker:1.0"

    tampered = {"spec": {"template": {"spec": {"containers": [{"name": "worker", "image": "evil.example/miner:1"}]}}}}
    await cluster.patch_deployment("drift-worker", tampered)
    await await_for(lambda: image(cluster, "drift") == "example.com/app-worker:1.0", what="template restored")
    env = {e["name"] for e in cluster.deployment("drift")["spec"]["template"]["spec"]["containers"][0]["env"]}  # type: ignore[index]
    assert "SKIPLOCK_DSN" in env, "the whole container came back, not just the image"


async def test_a_rotated_dsn_secret_is_seen_without_waiting_for_the_cache(
    pg_dsn: str, schema: str, cluster: Cluster
) -> None:
    async with running_operator(cluster, config={"secret_ttl_seconds": 600.0}):
        await cluster.apply_secret("db", pg_dsn)
        await cluster.create_jobqueue("rot", jobqueue_spec("rot", schema, minReplicas=1, pollingIntervalSeconds=60))
        await await_for(lambda: is_status(cluster, "rot", "ScalingActive", "True"), what="first poll done")
        await cluster.apply_secret("db", closed_port_dsn())
        await await_for(
            lambda: is_status(cluster, "rot", "DatabaseReachable", "False", "ConnectRefused"),
            what="the rotated DSN used (the cache holds 600 s, the poll waits 60 s)",
        )
        await cluster.apply_secret("db", pg_dsn)
        await await_for(lambda: is_status(cluster, "rot", "DatabaseReachable", "True"), timeout=15, what="rotated back")
