"""Wake-ups without waiting for the poll: NOTIFY at zero and while running, and delayed jobs coming due."""

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


async def test_one_to_n_on_notify_without_waiting_for_the_poll(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("busy", jobqueue_spec("busy", schema, minReplicas=1, pollingIntervalSeconds=60))
    await await_for(lambda: cluster.replicas("busy") == 1, what="one replica")
    await await_for(
        lambda: (cluster.condition("busy", "ScalingActive") or {}).get("status") == "True", what="first poll done"
    )
    await await_for(lambda: listening(pg_dsn), what="operator LISTENs while a worker runs")
    enqueued = time.monotonic()
    await aqueue.enqueue_many("busy", [{"n": i} for i in range(45)])
    await await_for(lambda: cluster.replicas("busy") == 5, timeout=10, what="1 -> 5 on NOTIFY (the poll is 60 s)")
    print(f"1 -> 5 replicas {time.monotonic() - enqueued:.2f}s after the enqueue")


async def test_a_delayed_job_wakes_a_queue_at_zero_when_it_comes_due(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await aqueue.enqueue("later", {"n": 1}, delay=4)
    due = time.monotonic() + 4
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("later", jobqueue_spec("later", schema, pollingIntervalSeconds=60))
    await await_for(lambda: cluster.replicas("later") == 0, what="at zero: the job is not due yet")
    await await_for(lambda: cluster.replicas("later") == 1, timeout=15, what="woken when the job came due")
    woke = time.monotonic()
    assert woke >= due - 0.2, "scaled up before the job was due"
    print(f"delayed job: one replica {woke - due:.2f}s after it came due (poll interval 60 s)")


def listening(dsn: str) -> bool:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skiplock-operator-listen'"
        ).fetchone()
    return bool(row and row[0])


def listeners_here(dsn: str) -> int:
    """The operator's LISTEN connections to this test's database (other databases' tests share the server)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'skiplock-operator-listen' AND datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


async def test_one_listen_connection_per_dsn_and_channel_however_many_queues(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    """Issue 37 item 7: a JobQueue of eight queues and a second JobQueue on the same schema share one listener,
    and a NOTIFY for any of their queues still wakes the right JobQueue."""
    await cluster.apply_secret("db", pg_dsn)
    queues = [f"many-{i}" for i in range(8)]
    many = {**jobqueue_spec("many-0", schema, pollingIntervalSeconds=60), "queues": queues}
    await cluster.create_jobqueue("many", many)
    await cluster.create_jobqueue("solo", jobqueue_spec("solo", schema, pollingIntervalSeconds=60))
    for name in ("many", "solo"):
        await await_for(lambda n=name: cluster.replicas(n) == 0, what=f"{name} at zero")  # type: ignore[misc]
    await await_for(lambda: listeners_here(pg_dsn) >= 1, what="the operator LISTENs")
    await await_for(lambda: (cluster.jobqueue("solo") or {}).get("status", {}).get("connectionBudget"), what="polled")
    assert listeners_here(pg_dsn) == 1

    await aqueue.enqueue("many-5", {"n": 1})
    await await_for(lambda: cluster.replicas("many") == 1, timeout=5, what="woken by a NOTIFY of its sixth queue")
    await aqueue.enqueue("solo", {"n": 1})
    await await_for(lambda: cluster.replicas("solo") == 1, timeout=5, what="woken by its NOTIFY")
    assert listeners_here(pg_dsn) == 1
