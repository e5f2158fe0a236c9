"""Retention: the scheduled purge of old done, failed and cancelled jobs, run by the workers themselves (the
operator runs the same purge for the schemas of its JobQueues).

It is the one purge of :mod:`skiplock.store.purge`: batches, each its own short transaction that first takes the
schema's purge lock. A batch that finds the lock taken ends the round (another worker, the operator or
``skiplock purge`` is purging); a round runs batches until one comes back short.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import psycopg

from skiplock.metrics import WorkerMetrics
from skiplock.settings import Settings, redact
from skiplock.store.purge import more_left
from skiplock.store.statements import PURGE_BATCH, PurgePolicy
from skiplock.store.worker import PurgeBatch, WorkerStore

log = logging.getLogger(__name__)
BATCH_WAIT_SECONDS = 30.0
"""On a stop, how long the batch in flight may take to finish (so what it deleted is counted)."""


class Retention:
    def __init__(
        self, settings: Settings, metrics: WorkerMetrics, store: WorkerStore, batch: int = PURGE_BATCH
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._store = store
        self._policy = PurgePolicy.retention(settings)
        self._batch = batch
        self.rounds = 0  # purges this worker ran (it held the lock)
        self.refused = False  # the role may not delete: no further rounds

    async def run(self) -> None:
        """Purge now, then every ``purge_interval_seconds`` (0: never)."""
        interval = self._settings.purge_interval_seconds
        if not interval:
            return
        while not self.refused:
            await self.purge_once()
            await asyncio.sleep(interval)

    async def purge_once(self) -> Counter[str] | None:
        """One round: the rows purged by status, or None when another purge holds the lock or the database
        failed (the next round tries again)."""
        try:
            async with self._store.purging() as batch:
                return await self._batches(batch)
        except psycopg.errors.InsufficientPrivilege:
            # A least-privilege worker role has no DELETE: retention is then the operator role's job (the
            # operator of a JobQueue runs it; elsewhere, `skiplock purge` as the owner role).
            self.refused = True
            log.info(
                "scheduled purge off: this worker's database role may not delete jobs (a least-privilege worker "
                "role); the skiplock operator purges a JobQueue's schema with its owner role, elsewhere run "
                "`skiplock purge` as the owner role, or set purge_interval_seconds=0",
                extra={"action": "purge_disabled"},
            )
            return None
        except (psycopg.Error, OSError) as exc:
            self._metrics.db_errors.labels("purge").inc()
            log.warning(
                "scheduled purge failed (%s); next round in %.0fs",
                redact(str(exc).strip(), self._settings.dsn),
                self._settings.purge_interval_seconds,
                extra={"action": "purge_failed"},
            )
            return None

    async def _batches(self, purge: PurgeBatch) -> Counter[str] | None:
        total: Counter[str] = Counter()
        while True:
            inner = asyncio.ensure_future(self._batch_once(purge))
            try:
                batch = await asyncio.shield(inner)
            except asyncio.CancelledError:  # a stop: the batch in flight commits and is counted, or not at all
                await asyncio.wait([inner], timeout=BATCH_WAIT_SECONDS)
                raise
            if batch is None and not total:
                return None  # another purge holds the lock: this round is theirs
            total += batch or Counter()
            if not more_left(batch, self._batch):
                break
        self.rounds += 1
        if total:
            log.info(
                "purged %d old job(s)",
                sum(total.values()),
                extra={"action": "jobs_purged", **{f"purged_{k}": v for k, v in total.items()}},
            )
        return total

    async def _batch_once(self, purge: PurgeBatch) -> Counter[str] | None:
        """One batch (its own transaction), counted as soon as it returns."""
        batch = await purge(self._policy, self._batch)
        for status, n in (batch or {}).items():
            self._metrics.jobs_purged.labels(status).inc(n)
        return batch
