"""Retention: the scheduled purge of old done, failed and cancelled jobs, run by the workers themselves (the
operator runs the same purge, batch by batch under the same lock key, for the schemas of its JobQueues).

One worker of the fleet purges at a time: it takes a session-level advisory lock of the schema on a connection of
its own (closing it releases the lock whatever happened), then deletes in batches, each statement its own
transaction, until nothing older than the retention is left. The others find the lock taken and skip the round.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from typing import Any

import psycopg

from skiplock.metrics import WorkerMetrics
from skiplock.queue import PURGE_BATCH
from skiplock.settings import Settings, redact
from skiplock.sql import queries_for
from skiplock.worker.pools import APPLICATION_NAME

log = logging.getLogger(__name__)
BATCH_WAIT_SECONDS = 30.0
"""On a stop, how long the batch in flight may take to finish (so what it deleted is counted)."""


def retention_lock_key(schema: str) -> int:
    """A stable signed 64-bit advisory-lock key for the retention of one schema."""
    digest = hashlib.blake2b(f"skiplock.retention:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def purge_params(settings: Settings, batch: int) -> dict[str, Any]:
    """The parameters of ``job_purge_expired``: each status's retention and the batch size."""
    return {
        "done_seconds": float(settings.retain_done_seconds),
        "failed_seconds": float(settings.retain_failed_seconds),
        "cancelled_seconds": float(settings.retain_cancelled_seconds),
        "limit": batch,
    }


class Retention:
    def __init__(self, settings: Settings, metrics: WorkerMetrics, batch: int = PURGE_BATCH) -> None:
        self._settings = settings
        self._metrics = metrics
        self._q = queries_for(settings.schema)
        self._key = retention_lock_key(settings.schema)
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
        """One round: the rows purged by status, or None when another worker holds the lock or the database
        failed (the next round tries again)."""
        try:
            async with await psycopg.AsyncConnection.connect(
                self._settings.require_dsn(), autocommit=True, application_name=APPLICATION_NAME
            ) as conn:
                row = await (await conn.execute(self._q.retention_try_lock, {"key": self._key})).fetchone()
                if not row or not row[0]:
                    return None  # another worker purges this round
                self.rounds += 1
                return await self._batches(conn)
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

    async def _batches(self, conn: psycopg.AsyncConnection[Any]) -> Counter[str]:
        total: Counter[str] = Counter()
        params = purge_params(self._settings, self._batch)
        while True:
            inner = asyncio.ensure_future(self._batch_once(conn, params))
            try:
                batch = await asyncio.shield(inner)
            except asyncio.CancelledError:  # a stop: the batch in flight commits and is counted, or not at all
                await asyncio.wait([inner], timeout=BATCH_WAIT_SECONDS)
                raise
            total += batch
            if not batch or max(batch.values()) < self._batch:
                break
        if total:
            log.info(
                "purged %d old job(s)",
                sum(total.values()),
                extra={"action": "jobs_purged", **{f"purged_{k}": v for k, v in total.items()}},
            )
        return total

    async def _batch_once(self, conn: psycopg.AsyncConnection[Any], params: dict[str, Any]) -> Counter[str]:
        """One DELETE statement (its own transaction), counted as soon as it returns."""
        rows = await (await conn.execute(self._q.job_purge_expired, params)).fetchall()
        batch = Counter(r[0] for r in rows)
        for status, n in batch.items():
            self._metrics.jobs_purged.labels(status).inc(n)
        return batch
