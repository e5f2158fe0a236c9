"""The wait-time target on the emulator: a worker is started a pod start-up before a delayed job or a cron tick
comes due, and the status (and the Wait printer column) shows the predicted wait and what it comes from."""

from __future__ import annotations

from typing import Any

import psycopg
import yaml

from skiplock import AsyncQueue
from skiplock.cli import main
from support.pg import await_for

from .conftest import CRDS, Cluster, jobqueue_spec

CRD = next(p for p in CRDS if p.name == "jobqueues.skiplock.io.yaml")


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.jobqueue(name) or {}).get("status") or {})


def still_delayed(dsn: str, schema: str, job_id: int) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f'SELECT visible_at > now() FROM "{schema}".jobs WHERE id = %s', (job_id,)).fetchone()
    return bool(row and row[0])


async def test_a_worker_starts_a_pod_start_up_before_a_delayed_job_comes_due(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    spec = jobqueue_spec("later", schema, targetWaitSeconds=30, podStartupSeconds=4, pollingIntervalSeconds=1)
    await cluster.create_jobqueue("later", spec)
    await await_for(lambda: cluster.replicas("later") == 0, what="a Deployment at zero")
    job = await aqueue.enqueue("later", {"n": 1}, delay=9)
    await await_for(lambda: (status_of(cluster, "later").get("backlog") or {}).get("delayed") == 1, what="seen")
    assert cluster.replicas("later") == 0, "nothing is due within podStartupSeconds yet"
    await await_for(lambda: cluster.replicas("later") == 1, timeout=15, what="the pre-scale")
    assert still_delayed(pg_dsn, schema, job.id), "the worker must be asked for before the job comes due"
    events = await await_for(lambda: [e for e in cluster.events() if e.get("reason") == "DueSoon"], what="an Event")
    assert "dueSoon=1" in events[0]["message"]
    await await_for(lambda: (status_of(cluster, "later").get("load") or {}).get("dueSoon") == 1, what="dueSoon")


async def test_cron_ticks_about_to_come_due_count_as_due_soon_work(
    pg_dsn: str, schema: str, queue: object, cluster: Cluster, operator: object
) -> None:
    assert main(["schedules", "sync", "--app", "support.periodic_app:app", "--dsn", pg_dsn, "--schema", schema]) == 0
    await cluster.apply_secret("db", pg_dsn)
    spec = jobqueue_spec("ticks", schema, targetWaitSeconds=30, podStartupSeconds=5, pollingIntervalSeconds=0.5)
    await cluster.create_jobqueue("ticks", spec)
    await await_for(lambda: (status_of(cluster, "ticks").get("load") or {}).get("dueSoon", 0) >= 1, what="a tick")
    await await_for(lambda: cluster.replicas("ticks") == 1, timeout=10, what="a worker for the ticks")


async def test_the_status_shows_the_predicted_wait_in_the_wait_column(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("wait", jobqueue_spec("wait", schema, targetWaitSeconds=60, minReplicas=1))
    await aqueue.enqueue_many("wait", [{"n": i} for i in range(8)])
    await await_for(lambda: (status_of(cluster, "wait").get("backlog") or {}).get("ready") == 8, what="backlog")
    columns = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]
    column = next(c for c in columns if c["name"] == "Wait")
    assert column["jsonPath"] == ".status.predictedWaitSeconds"
    status = status_of(cluster, "wait")
    # No job finished yet: 1 s each (the default), 8 ready over 4 slots of the one replica asked for.
    assert status["load"] == {"arrivalRate": 0.0, "serviceSeconds": 1.0, "dueSoon": 0}
    assert status["desiredReplicas"] == 1
    assert status["predictedWaitSeconds"] == 2.0
