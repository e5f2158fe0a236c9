"""Fire periodic tasks from the database for a JobQueue's queues (a kopf daemon per JobQueue).

The operator cannot import application code, and needs none: workers (or ``skiplock schedules sync`` at deploy)
store each schedule in the database with its timing, and firing a tick only needs that row. So a queue scaled
to zero still gets its ticks: the job's NOTIFY wakes the autoscaler, which starts a worker. Several operator
replicas and the workers fire the same rows safely (a compare-and-set per tick, see :mod:`skiplock.schedule`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from skiplock import schedule
from skiplock_operator.database import DatabaseProblem
from skiplock_operator.runtime import Daemon, SecretProblem, wait

ERROR_WAIT_SECONDS = 5.0
PARK_SECONDS = 300.0
"""How long a schedule row that cannot fire is left aside before it is tried again (fixed rows fire then)."""


class ScheduleFirer(Daemon):
    """One JobQueue's tick loop: fire what is due on its queues, sleep until the next tick (at most 30 s).
    Nothing fires for a JobQueue whose spec is invalid or not allowed by the policy. A row that cannot fire is
    parked for PARK_SECONDS (a Warning in the log, ``result="failed"``), and the others fire meanwhile."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parked: dict[str, float] = {}

    async def run(self, stopped: Any) -> None:
        idle = asyncio.Event()  # never set: only the timeout or the stop ends a wait
        self.rt.metrics.watch_schedules(*self.key)
        while not stopped:
            await wait(idle, stopped, await self.step())

    async def step(self) -> float:
        """One round; returns the seconds to wait."""
        spec = self.allowed()
        if spec is None:
            return self.IDLE_SECONDS  # the reconcile handler reports why
        now = time.monotonic()
        self.parked = {name: until for name, until in self.parked.items() if until > now}
        try:
            dsn = await self.dsn(spec)
            done = await self.rt.databases.fire_schedules(
                self.key, dsn, spec.schema, spec.served_queues, spec.worker_settings().channel, parked=set(self.parked)
            )
        except (SecretProblem, DatabaseProblem):
            return ERROR_WAIT_SECONDS  # the reconcile handler and the autoscaler report these
        except Exception as exc:  # never end the loop (CancelledError still passes)
            self.rt.metrics.errors.labels("unexpected").inc()
            self.logger.error(f"schedules round failed unexpectedly: {type(exc).__name__}")
            return ERROR_WAIT_SECONDS
        for f in done.fired:
            if f.job_id is not None:
                self.rt.metrics.schedule_ticks.labels(*self.key, "enqueued").inc()
                self.logger.info(f"schedule {f.name}: enqueued job {f.job_id} for {f.tick.isoformat()}")
            if f.missed:
                self.rt.metrics.schedule_ticks.labels(*self.key, "skipped").inc(f.missed)
        for name in done.failed:
            self.parked[name] = now + PARK_SECONDS
            self.rt.metrics.schedule_ticks.labels(*self.key, "failed").inc()
            self.logger.warning(f"schedule {name!r} cannot fire (fix or remove its row): parked {PARK_SECONDS:.0f}s")
        return schedule.wait_seconds(done.next_due)  # parked rows are left out of the next due time too
