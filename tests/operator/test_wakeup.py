"""Scale from zero on NOTIFY: the first enqueue wakes the operator long before its next poll."""

from __future__ import annotations

import time

from skiplock import AsyncQueue
from support.pg import await_for

from .conftest import Cluster, jobqueue_spec


async def test_first_enqueue_at_zero_scales_to_one_within_a_second(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("idle", jobqueue_spec("idle", schema, pollingIntervalSeconds=60))
    await await_for(lambda: cluster.replicas("idle") == 0, what="Deployment at zero")
    await await_for(
        lambda: (cluster.condition("idle", "ScalingActive") or {}).get("status") == "True", what="first poll done"
    )
    await await_for(lambda: listening(pg_dsn), what="operator LISTENs on the channel")

    enqueued = time.monotonic()
    await aqueue.enqueue("idle", {"hello": "world"})
    await await_for(lambda: cluster.replicas("idle") == 1, timeout=5, what="one replica after NOTIFY")
    assert time.monotonic() - enqueued < 1.5, "scale-from-zero took longer than a NOTIFY round trip should"


def listening(dsn: str) -> bool:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skiplock-operator-listen'"
        ).fetchone()
    return bool(row and row[0])
