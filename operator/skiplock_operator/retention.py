"""The scheduled retention of a JobQueue's schema, run by the operator (a kopf daemon per JobQueue).

Why the operator and not the workers: it always runs (a queue scaled to zero still purges), and it holds the
operator's DSN (``spec.operatorDsnSecretRef``, the schema owner), so a least-privilege worker role needs no
``DELETE``. The workers of a JobQueue are rendered with ``purge_interval_seconds=0``.

Each batch is its own transaction that first takes the schema's retention lock for that transaction
(``pg_try_advisory_xact_lock`` on the key a worker's purge holds at session level): never two purges at once,
whoever runs them. A batch that finds the lock taken ends the round; the holder is purging. A round runs
batches until one comes back short, then sleeps ``spec.retention.purgeIntervalSeconds``; a failed round is
tried again after at most :data:`RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import kopf

from skiplock.store.statements import PurgePolicy
from skiplock_operator.database import DatabaseProblem
from skiplock_operator.runtime import Daemon, Runtime, SecretProblem, wait
from skiplock_operator.spec import JobQueueSpec

BATCH = 1000
"""Rows per status per batch: one batch stays well within the operator's statement timeout."""
RETRY_SECONDS = 300.0
"""A failed round is tried again after this long at most (sooner when the interval is shorter)."""


class Retention(Daemon):
    def __init__(self, rt: Runtime, body: kopf.Body, logger: logging.Logger | Any) -> None:
        super().__init__(rt, body, logger)
        self.user = (*self.key, "retention")  # shares the JobQueue's connection, released on its own
        self.failing = False

    async def run(self, stopped: Any) -> None:
        never = asyncio.Event()
        self.rt.metrics.watch_retention(*self.key)
        try:
            while not stopped:
                delay = await self.step(stopped)
                await wait(never, stopped, delay)
        finally:
            await self.rt.databases.release(self.user)

    async def step(self, stopped: Any) -> float:
        """One round if one is due; returns the seconds until the next look."""
        spec = self.allowed()
        if spec is None or not spec.purge_interval_seconds:
            return self.IDLE_SECONDS
        try:
            await self.purge(spec, stopped)
        except (SecretProblem, DatabaseProblem) as exc:
            self.failed(exc.reason, str(exc))
            return min(spec.purge_interval_seconds, RETRY_SECONDS)
        if self.failing:
            self.failing = False
            self.logger.info("scheduled purge works again")
        return spec.purge_interval_seconds

    async def purge(self, spec: JobQueueSpec, stopped: Any) -> Counter[str]:
        """Batches until one comes back short, another purger holds the lock, or the daemon stops."""
        dsn = await self.dsn(spec)
        policy = PurgePolicy.retention(spec.worker_settings())
        total: Counter[str] = Counter()
        while not stopped:
            batch = await self.rt.databases.purge_batch(self.user, dsn, spec.schema, policy, BATCH)
            if batch is None:
                break  # someone else purges this schema now
            for status, n in batch.items():
                self.rt.metrics.jobs_purged.labels(*self.key, status).inc(n)
            total += batch
            if not batch or max(batch.values()) < BATCH:
                break
        if total:
            self.logger.info(
                f"purged {sum(total.values())} old job(s) of schema {spec.schema!r} "
                f"({', '.join(f'{n} {s}' for s, n in sorted(total.items()))})"
            )
        return total

    def failed(self, reason: str, message: str) -> None:
        self.rt.metrics.purge_errors.labels(*self.key).inc()
        if self.failing:
            return  # one line and one Event per streak of failures
        self.failing = True
        self.logger.warning(f"scheduled purge failed ({reason}); tried again later")
        kopf.event(
            self.body, type="Warning", reason="PurgeFailed", message=f"scheduled purge failed ({reason}): {message}"
        )
