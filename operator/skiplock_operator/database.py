"""Database access of the operator: one small pool per (DSN, schema), shared by the JobQueues that use it.

Only three things happen here: migrate a schema, read one queue's stats (``AsyncQueue.stats``), and close
pools. A pool whose database fails is closed and dropped, so no half-dead pool retries in the background;
the next poll opens a new one. Every error leaves as :class:`DatabaseUnavailableError`, password masked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from skiplock import AsyncQueue, QueueStats, Settings
from skiplock.errors import DatabaseUnavailableError
from skiplock.settings import redact

log = logging.getLogger(__name__)
PoolKey = tuple[str, str]


class Databases:
    def __init__(self, *, timeout: float = 5.0) -> None:
        self._timeout = timeout
        self._queues: dict[PoolKey, AsyncQueue] = {}
        self._users: dict[Hashable, PoolKey] = {}
        self._migrated: set[PoolKey] = set()
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._queues)

    async def _open(self, key: PoolKey) -> AsyncQueue:
        dsn, schema = key
        try:
            async with asyncio.timeout(self._timeout):
                conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, int(self._timeout)))
                await conn.close()
        except (psycopg.Error, TimeoutError, OSError) as exc:
            raise _unavailable(exc, dsn) from None
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=2,
            open=False,
            timeout=self._timeout,
            name=f"skiplock-operator-{schema}",
            kwargs={"connect_timeout": max(1, int(self._timeout)), "application_name": "skiplock-operator"},
            check=AsyncConnectionPool.check_connection,
        )
        await pool.open()
        return AsyncQueue(pool, Settings(dsn=dsn, schema=schema, worker_id="skiplock-operator"), owned=True)

    async def _queue(self, user: Hashable, key: PoolKey) -> AsyncQueue:
        async with self._lock:
            previous = self._users.get(user)
            self._users[user] = key
            if previous is not None and previous != key:
                await self._close_unused(previous)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = await self._open(key)
            return queue

    async def _drop(self, key: PoolKey) -> None:
        async with self._lock:
            queue = self._queues.pop(key, None)
            self._migrated.discard(key)
        if queue is not None:
            await queue.close()

    async def _close_unused(self, key: PoolKey) -> None:
        if key in self._users.values():
            return
        queue = self._queues.pop(key, None)
        self._migrated.discard(key)
        if queue is not None:
            await queue.close()

    async def _call(self, user: Hashable, key: PoolKey, what: str, body: Any) -> Any:
        try:
            queue = await self._queue(user, key)
            async with asyncio.timeout(self._timeout):
                return await body(queue)
        except DatabaseUnavailableError:
            await self._drop(key)
            raise
        except (psycopg.Error, PoolTimeout, TimeoutError, OSError) as exc:
            await self._drop(key)
            raise _unavailable(exc, key[0], what) from None

    async def ensure_schema(self, user: Hashable, dsn: str, schema: str) -> bool:
        """Migrate ``schema`` once per pool (idempotent, advisory lock). True when this call migrated it."""
        key = (dsn, schema)
        if key in self._migrated and key in self._queues:
            return False

        async def migrate(queue: AsyncQueue) -> None:
            await queue.migrate()

        await self._call(user, key, "migrate", migrate)
        self._migrated.add(key)
        return True

    async def stats(self, user: Hashable, dsn: str, schema: str, queue: str, *, lease_seconds: float) -> QueueStats:
        async def read(aq: AsyncQueue) -> list[QueueStats]:
            return await aq.stats(queue, lease_seconds=lease_seconds)

        rows: list[QueueStats] = await self._call(user, (dsn, schema), "stats", read)
        for row in rows:
            if row.queue == queue:
                return row
        return QueueStats(queue, 0, 0, 0, 0, 0, 0.0)

    async def release(self, user: Hashable) -> None:
        async with self._lock:
            key = self._users.pop(user, None)
            if key is not None:
                await self._close_unused(key)

    async def close(self) -> None:
        async with self._lock:
            queues = list(self._queues.values())
            self._queues.clear()
            self._users.clear()
            self._migrated.clear()
        for queue in queues:
            await queue.close()


def _unavailable(exc: BaseException, dsn: str, what: str = "connect") -> DatabaseUnavailableError:
    detail = str(exc).strip() or type(exc).__name__
    if isinstance(exc, TimeoutError):
        detail = f"{what} timed out"
    return DatabaseUnavailableError(redact(f"database unavailable ({what}): {detail}", dsn))
