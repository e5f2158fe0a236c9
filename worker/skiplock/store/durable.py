"""What a running job reads and writes outside its own transaction: its parents' results and its durable steps
(``job.parent_results``, ``job.step``). Each call takes a worker pool connection for one short autocommit
statement, so a step's result is committed as soon as ``fn`` returns, whatever the job's transaction does later."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock.sql import Queries
from skiplock.store import links
from skiplock.store.call import Call
from skiplock.store.run import aexecute, execute


class Durable:
    """The sync side (``job.step``, ``job.parent_results`` of sync handlers)."""

    is_async = False

    def __init__(self, pool: ConnectionPool[Any], q: Queries, max_bytes: int) -> None:
        self._pool, self._q, self._max_bytes = pool, q, max_bytes

    def _run(self, call: Call[Any]) -> Any:
        with self._pool.connection() as conn:
            was, conn.autocommit = conn.autocommit, True
            try:
                return execute(conn, call)
            finally:
                conn.autocommit = was

    def parent_results(self, job_id: int) -> dict[int, Any]:
        return self._run(links.parent_results(self._q, job_id))  # type: ignore[no-any-return]

    def step(
        self, job_id: int, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        stored, value = self._run(links.step_get(self._q, job_id, name))
        if stored:
            return value
        encoded = links.encode_step(fn(*args, **kwargs), self._max_bytes, name)
        return self._run(links.step_put(self._q, job_id, name, encoded))


class AsyncDurable:
    """The async side (``await job.step_async``, ``await job.parent_results_async()``)."""

    is_async = True

    def __init__(self, pool: AsyncConnectionPool[Any], q: Queries, max_bytes: int) -> None:
        self._pool, self._q, self._max_bytes = pool, q, max_bytes

    async def _run(self, call: Call[Any]) -> Any:
        async with self._pool.connection() as conn:
            was = conn.autocommit
            await conn.set_autocommit(True)
            try:
                return await aexecute(conn, call)
            finally:
                await conn.set_autocommit(was)

    async def parent_results(self, job_id: int) -> dict[int, Any]:
        return await self._run(links.parent_results(self._q, job_id))  # type: ignore[no-any-return]

    async def step(
        self,
        job_id: int,
        name: str,
        fn: Callable[..., Awaitable[Any] | Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Any:
        stored, value = await self._run(links.step_get(self._q, job_id, name))
        if stored:
            return value
        out = fn(*args, **kwargs)
        if isinstance(out, Awaitable):
            out = await out
        return await self._run(links.step_put(self._q, job_id, name, links.encode_step(out, self._max_bytes, name)))
