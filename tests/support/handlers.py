"""Handlers the worker tests load by name (``support.handlers:...``), sync and async."""

from __future__ import annotations

import asyncio
import os
import time

from skiplock import Job, NonRetryableError


def _effect_sql(job: Job) -> str:
    return f'INSERT INTO "{os.environ["SKIPLOCK_SCHEMA"]}".effects (job_id, attempt) VALUES (%s, %s)'


def noop(job: Job) -> None:
    return None


async def anoop(job: Job) -> None:
    return None


def write_effect(job: Job) -> None:
    """Write the job's effect through job.conn: committed only with completion."""
    job.conn.execute(_effect_sql(job), (job.id, job.attempts))
    delay = float(job.payload.get("sleep", 0)) if isinstance(job.payload, dict) else 0.0
    if delay:
        time.sleep(delay)


async def awrite_effect(job: Job) -> None:
    await job.conn.execute(_effect_sql(job), (job.id, job.attempts))
    delay = float(job.payload.get("sleep", 0)) if isinstance(job.payload, dict) else 0.0
    if delay:
        await asyncio.sleep(delay)


def mixed(job: Job) -> None:
    """Behaviour picked by the payload: fail k times, always fail, non-retryable, sleep, then write the effect."""
    p = job.payload
    if p.get("non_retryable"):
        raise NonRetryableError("bad input")
    if p.get("always_fail"):
        raise RuntimeError(f"always fails (attempt {job.attempts})")
    if job.attempts <= p.get("fail_times", 0):
        raise ConnectionError(f"transient failure {job.attempts}")
    if p.get("sleep"):
        time.sleep(p["sleep"])
    job.conn.execute(_effect_sql(job), (job.id, job.attempts))


def crash(job: Job) -> None:
    """A poison job: kills its worker process."""
    os._exit(17)


not_callable = 42


def sleepy(job: Job) -> None:
    """Sleeps ``payload['seconds']`` (a job whose worker gets killed mid-run)."""
    time.sleep(float(job.payload.get("seconds", 1)))
