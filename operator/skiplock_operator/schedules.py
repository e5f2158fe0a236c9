"""Fire periodic tasks from the database for a JobQueue's queues (a kopf daemon per JobQueue).

The operator cannot import application code, and needs none: workers (or ``skiplock schedules sync`` at deploy)
store each schedule in the database with its timing, and firing a tick only needs that row. So a queue scaled
to zero still gets its ticks: the job's NOTIFY wakes the autoscaler, which starts a worker. Several operator
replicas and the workers fire the same rows safely (a compare-and-set per tick, see :mod:`skiplock.schedule`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from skiplock import schedule
from skiplock_operator.database import DatabaseProblem
from skiplock_operator.reconcile import Runtime, SecretProblem, key_of, read_dsn, wait
from skiplock_operator.spec import InvalidSpecError, parse_spec

ERROR_WAIT_SECONDS = 5.0


class ScheduleFirer:
    """One JobQueue's tick loop: fire what is due on its queues, sleep until the next tick (at most 30 s)."""

    def __init__(self, rt: Runtime, body: kopf.Body, logger: logging.Logger | Any) -> None:
        self.rt, self.body, self.logger = rt, body, logger
        self.key = key_of(body)

    async def run(self, stopped: Any) -> None:
        idle = asyncio.Event()  # never set: only the timeout or the stop ends a wait
        self.rt.metrics.watch_schedules(*self.key)
        while not stopped:
            await wait(idle, stopped, await self.step())

    async def step(self) -> float:
        """One round; returns the seconds to wait."""
        try:
            spec = parse_spec(self.body.get("spec"))
            dsn = await read_dsn(self.rt, self.key, spec)
            fired, next_due = await self.rt.databases.fire_schedules(
                self.key, dsn, spec.schema, spec.served_queues, spec.worker_settings().channel
            )
        except (InvalidSpecError, SecretProblem, DatabaseProblem):
            return ERROR_WAIT_SECONDS  # the reconcile handler and the autoscaler report these
        except Exception as exc:  # never end the loop (CancelledError still passes)
            self.rt.metrics.errors.labels("unexpected").inc()
            self.logger.error(f"schedules round failed unexpectedly: {type(exc).__name__}")
            return ERROR_WAIT_SECONDS
        for f in fired:
            if f.job_id is not None:
                self.rt.metrics.schedule_ticks.labels(*self.key, "enqueued").inc()
                self.logger.info(f"schedule {f.name}: enqueued job {f.job_id} for {f.tick.isoformat()}")
            if f.missed:
                self.rt.metrics.schedule_ticks.labels(*self.key, "skipped").inc(f.missed)
        return schedule.wait_seconds(next_due)
