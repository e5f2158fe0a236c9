"""``task.enqueue(..., timeout_seconds=...)``: a per-job timeout through the task API, over the task's own."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from skiplock import Settings
from skiplock.app import App
from skiplock.errors import EnqueueError
from skiplock.worker import Worker
from support.pg import await_for


def stored(dsn: str, schema: str, job_id: int) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(f'SELECT status, timeout_seconds, errors FROM "{schema}".jobs WHERE id = %s', (job_id,))
        found = cur.fetchone()
    assert found is not None
    return found


def test_task_enqueue_stores_the_jobs_own_timeout_and_checks_it(settings: Settings, pg_dsn: str, schema: str):
    app = App()

    @app.task(name="report", queue="q", timeout_seconds=60)
    def report(job: Any) -> None:
        return None

    with app.connect(settings=settings):
        own = report.enqueue({}, timeout_seconds=2.5)
        assert stored(pg_dsn, schema, own.id)["timeout_seconds"] == 2.5
        default = report.enqueue({})  # the task's timeout applies in the worker; the row holds none
        assert stored(pg_dsn, schema, default.id)["timeout_seconds"] is None
        assert stored(pg_dsn, schema, app.enqueue("report", {}, timeout_seconds=7).id)["timeout_seconds"] == 7
        for bad in (0, -1, float("nan"), True, "5"):
            with pytest.raises(EnqueueError, match="timeout_seconds"):
                report.enqueue({}, timeout_seconds=bad)  # type: ignore[arg-type]
        with pytest.raises(EnqueueError, match="unknown enqueue option"):
            report.enqueue_many([{}], timeout_seconds=1)  # type: ignore[call-arg]
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".jobs').fetchone() == (3,), "bad calls wrote nothing"


async def test_task_aenqueue_timeout_is_enforced_over_the_tasks_longer_one(
    settings: Settings, pg_dsn: str, schema: str
):
    app = App()

    @app.task(name="slow", queue="q", timeout_seconds=600, max_attempts=1)
    async def slow(job: Any) -> None:
        await asyncio.sleep(600)

    await app.aconnect(settings=settings)
    try:
        job = await slow.aenqueue({}, timeout_seconds=0.3)
        assert stored(pg_dsn, schema, job.id)["timeout_seconds"] == 0.3
    finally:
        await app.aclose()
    worker = Worker(app, settings=settings.replace(poll_seconds=0.2))
    async with worker:
        await await_for(lambda: stored(pg_dsn, schema, job.id)["status"] == "failed", timeout=20, what="timed out")
    errors = stored(pg_dsn, schema, job.id)["errors"]
    assert len(errors) == 1 and errors[0]["error"].startswith("TimeoutError"), errors
    assert worker.registry.get_sample_value("skiplock_jobs_timed_out_total", {"queue": "q"}) == 1
