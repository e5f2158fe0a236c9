"""Issue 37, item 2, through the operator: one row with a time outside the bounds (stored with the constraint
dropped, as by a restore without it) made the backlog query fail ("cannot subtract infinite timestamps"); the
operator then took the database for unreachable and kept the replicas as they were: a queue at 0 replicas with 50
ready jobs stayed at 0. It scales as for any backlog."""

from __future__ import annotations

import psycopg
from psycopg import sql

from skiplock import AsyncQueue
from support.pg import await_for

from .conftest import Cluster, jobqueue_spec


async def test_a_queue_with_rows_at_infinity_still_scales_from_zero(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(  # the bound lives on the column's domain (migration 0021)
            sql.SQL("ALTER DOMAIN {} DROP CONSTRAINT jobs_visible_at_check").format(
                sql.Identifier(schema, "job_visible_at")
            )
        )
        for value in ("infinity", "-infinity"):
            conn.execute(
                sql.SQL("INSERT INTO {} (queue, payload, visible_at) VALUES ('far', '{{}}', %s)").format(jobs), [value]
            )
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("far", jobqueue_spec("far", schema, pollingIntervalSeconds=0.5))
    await await_for(
        lambda: (cluster.condition("far", "DatabaseReachable") or {}).get("status") == "True", what="first poll"
    )
    await aqueue.enqueue_many("far", [{"n": i} for i in range(50)])
    await await_for(lambda: cluster.replicas("far") == 5, timeout=20, what="5 replicas for 50 ready jobs")
    assert (cluster.condition("far", "DatabaseReachable") or {}).get("status") == "True"
