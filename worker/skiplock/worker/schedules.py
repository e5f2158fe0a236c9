"""The worker's tick loop: register its app's schedules, then fire the due ones until the worker stops.

It borrows a control connection for each round (no connection of its own), sleeps until the next tick is due
(at most :data:`skiplock.schedule.MAX_WAIT_SECONDS`) and registers again every hour. A least-privilege worker
role may not insert jobs: it then registers only, and the operator (or a worker with more rights) fires.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
from psycopg_pool import PoolTimeout

from skiplock import schedule
from skiplock.app import App
from skiplock.metrics import WorkerMetrics
from skiplock.settings import Settings, redact
from skiplock.store.worker import WorkerStore

log = logging.getLogger(__name__)
ERROR_WAIT_SECONDS = 5.0


class Scheduler:
    def __init__(self, settings: Settings, app: App, metrics: WorkerMetrics, store: WorkerStore) -> None:
        self._settings = settings
        self._schedules = app.schedules
        self._names = [s.name for s in self._schedules]
        self._metrics = metrics
        self._store = store
        self._registered_at = -float("inf")
        self.may_fire = True  # False once the role was refused the INSERT
        self.rounds = 0

    async def run(self) -> None:
        if not self._schedules:
            return
        for task in {s.name for s in self._schedules}:
            for result in ("enqueued", "skipped"):
                self._metrics.schedule_ticks.labels(task, result)
        while True:
            try:
                wait = await self.round()
            except Exception as exc:  # never end the loop: a database error, or a bug, is logged and retried
                if isinstance(exc, psycopg.Error | OSError | PoolTimeout):
                    self._metrics.db_errors.labels("schedule").inc()
                log.warning(
                    "schedules round failed (%s); next in %.0fs",
                    redact(str(exc).strip(), self._settings.dsn),
                    ERROR_WAIT_SECONDS,
                    extra={"action": "schedules_failed"},
                )
                wait = ERROR_WAIT_SECONDS
            await asyncio.sleep(wait)

    async def round(self) -> float:
        """Register when due, fire what is due; returns the seconds to sleep."""
        async with self._store.schedules() as schedules:
            if time.monotonic() - self._registered_at >= schedule.REGISTER_EVERY_SECONDS:
                await schedules.register(self._schedules)
                self._registered_at = time.monotonic()
                log.info(
                    "registered %d schedule(s)",
                    len(self._schedules),
                    extra={"action": "schedules_registered", "schedules": self._names},
                )
            if not self.may_fire:
                return schedule.REGISTER_EVERY_SECONDS
            try:
                fired, next_due = await schedules.fire_due(self._names)
            except psycopg.errors.InsufficientPrivilege:
                self.may_fire = False
                log.info(
                    "this worker's database role may not insert jobs (least privilege): its schedules are fired by "
                    "the operator",
                    extra={"action": "schedules_not_fired"},
                )
                return schedule.REGISTER_EVERY_SECONDS
        self.rounds += 1
        for f in fired:
            if f.job_id is not None:
                self._metrics.schedule_ticks.labels(f.task, "enqueued").inc()
                log.info(
                    "schedule %s: enqueued job %d for %s",
                    f.name,
                    f.job_id,
                    f.tick.isoformat(),
                    extra={"action": "schedule_fired", "job_id": f.job_id, "missed": f.missed},
                )
            if f.missed:
                self._metrics.schedule_ticks.labels(f.task, "skipped").inc(f.missed)
        return schedule.wait_seconds(next_due)
