"""An app whose tasks record each run (start and end by the database clock) for the flow-control tests.

Each run writes one row of ``runs`` in the job's own transaction (so only runs that completed count), with the
start read when the handler began: overlapping runs of one serial key, or more than N at once, show up as
overlapping intervals. ``FLOW_SCHEMA`` names the schema of the table (the worker's schema)."""

from __future__ import annotations

import os
import time

import psycopg

from skiplock import App, Job

app = App()
SCHEMA = os.environ.get("SKIPLOCK_SCHEMA", "skiplock")


def create_runs_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".runs (job_id bigint, task text, attempt int, '
            "serial_key text, started timestamptz, ended timestamptz)"
        )


def _run(job: Job, task: str) -> None:
    started = job.conn.execute("SELECT clock_timestamp()").fetchone()[0]
    payload = job.payload
    time.sleep(float(payload.get("sleep", 0.05)))
    if job.attempts <= int(payload.get("fail_attempts", 0)):
        raise RuntimeError(f"failing attempt {job.attempts} on purpose")
    job.conn.execute(
        f'INSERT INTO "{SCHEMA}".runs VALUES (%s, %s, %s, %s, %s, clock_timestamp())',
        (job.id, task, job.attempts, payload.get("key"), started),
    )


@app.task(name="flow.serial", queue="flow", max_attempts=5, backoff_base_seconds=0.5, backoff_cap_seconds=0.5,
          backoff_jitter=0.0)  # fmt: skip
def serial(job: Job) -> None:
    _run(job, "flow.serial")


@app.task(name="flow.limited", queue="flow", global_concurrency=2)
def limited(job: Job) -> None:
    _run(job, "flow.limited")


@app.task(name="flow.rated", queue="flow", rate_limit="3/2s")
def rated(job: Job) -> None:
    _run(job, "flow.rated")


@app.task(name="flow.plain", queue="flow")
def plain(job: Job) -> None:
    _run(job, "flow.plain")
