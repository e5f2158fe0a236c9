"""The one pool constructor of the worker, and the idle check every pooled connection passes at checkout."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

log = logging.getLogger(__name__)
APPLICATION_NAME = "skiplock-worker"
# A pooled connection not checked out for longer than this is pinged before use: after a server restart or a
# killed backend the pool would otherwise hand out one dead connection per slot (and burn a job attempt on each).
# The time is stamped at checkout, in the pool's check callback: a reset callback would cost more than the rest of
# a checkout (bench/HISTORY.md, "Behind the code").
IDLE_CHECK_SECONDS = 2.0


def _stale(conn: Any) -> bool:
    """True when ``conn`` was last checked out over IDLE_CHECK_SECONDS ago (or never); stamps it now."""
    now = time.monotonic()
    last = getattr(conn, "_skiplock_checked_out", 0.0)
    setattr(conn, "_skiplock_checked_out", now)  # noqa: B010 - psycopg connections take attributes
    return bool(now - last > IDLE_CHECK_SECONDS)


async def acheck(conn: psycopg.AsyncConnection[Any]) -> None:
    """The idle check of an async pool's connection at checkout (see IDLE_CHECK_SECONDS). Never prepared: behind a
    pooler in transaction mode the next checkout may find a prepared statement missing, and a failed check is
    taken for a dead connection (the store, which stops preparing then, would never hear of it)."""
    if _stale(conn):
        await conn.execute("SELECT 1", prepare=False)
        if not conn.autocommit:
            await conn.rollback()  # hand it out idle: a handler that never writes keeps its batching


def _check(conn: psycopg.Connection[Any]) -> None:
    if _stale(conn):
        conn.execute("SELECT 1", prepare=False)
        if not conn.autocommit:
            conn.rollback()


BORN_ATTRIBUTE = "_skiplock_born"  # on a pooled connection: time.monotonic() when the pool opened it


class DeadPoolGuard:
    """Wraps a pool's ``check`` and ``configure``: a connection that fails its check at checkout empties the pool of
    its idle connections at once (``drain``: they are replaced by new ones), unless the pool was emptied since that
    connection was opened.

    psycopg_pool tries the next idle connection after a failed check, but backs off before each further try (1 s, 2 s,
    4 s, ...): after a server restart or terminated backends, a pool of four dead connections made a checkout wait
    7 s, and a claim with it, with nothing logged. One dead connection means the others, as old, are most likely
    dead too."""

    def __init__(
        self,
        check: Callable[[Any], Any],
        configure: Callable[[Any], Awaitable[None]] | None,
    ) -> None:
        self._check = check
        self._configure = configure
        self.drained_at = 0.0  # time.monotonic() of the last drain
        self.drains = 0
        self.pool: Any = None  # the pool it guards (set by make_pool right after creating it)

    def _failed(self, conn: Any) -> bool:
        """After ``conn`` failed its check: whether the pool should be drained now (counted and logged)."""
        if getattr(conn, BORN_ATTRIBUTE, 0.0) < self.drained_at:
            return False  # it was already in the pool when it was last drained: the others are new
        self.drained_at = time.monotonic()
        self.drains += 1
        log.info(
            "a pooled connection was found dead at checkout: its pool's idle connections are replaced",
            extra={"action": "pool_drained", "pool": getattr(self.pool, "name", "?")},
        )
        return True

    async def aconfigure(self, conn: Any) -> None:
        setattr(conn, BORN_ATTRIBUTE, time.monotonic())
        if self._configure is not None:
            await self._configure(conn)

    def configure(self, conn: Any) -> None:
        setattr(conn, BORN_ATTRIBUTE, time.monotonic())

    async def acheck(self, conn: Any) -> None:
        try:
            await self._check(conn)
        except Exception:
            if self._failed(conn):
                await self.pool.drain()
            raise

    def check(self, conn: Any) -> None:
        try:
            self._check(conn)
        except Exception:
            if self._failed(conn):
                self.pool.drain()
            raise


def make_pool(
    dsn: str,
    name: str,
    size: int,
    *,
    asynchronous: bool,
    autocommit: bool,
    timeout: float,
    configure: Callable[[Any], Awaitable[None]] | None = None,
    check: Callable[[Any], Awaitable[None]] | None = None,
) -> AsyncConnectionPool[Any] | ConnectionPool[Any]:
    """The one pool constructor of the worker, unopened: control calls (async, autocommit) and ``job.conn``
    (the handler's colour; autocommit too, since the executor opens the job's transaction itself at checkout
    with ``BEGIN``, so a handler's ``transaction()`` blocks nest in it as savepoints)."""
    cls: Any = AsyncConnectionPool if asynchronous else ConnectionPool
    guard = DeadPoolGuard(check or (acheck if asynchronous else _check), configure)
    pool = cls(
        dsn,
        min_size=1,
        max_size=size,
        open=False,
        name=name,
        reconnect_timeout=0,
        timeout=timeout,
        check=guard.acheck if asynchronous else guard.check,
        configure=guard.aconfigure if asynchronous else guard.configure,
        kwargs={"application_name": APPLICATION_NAME, "autocommit": autocommit},
    )
    guard.pool = pool
    return pool  # type: ignore[no-any-return]


def async_pool(
    dsn: str,
    name: str,
    size: int,
    *,
    timeout: float,
    autocommit: bool = True,
    configure: Callable[[Any], Awaitable[None]] | None = None,
    check: Callable[[Any], Awaitable[None]] | None = None,
) -> AsyncConnectionPool[Any]:
    """``configure``: run on each new connection before the pool hands it out; ``check``: on each checkout instead of
    :func:`acheck` (a connection it fails is dropped and another one checked out)."""
    pool = make_pool(
        dsn, name, size, asynchronous=True, autocommit=autocommit, timeout=timeout, configure=configure, check=check
    )
    assert isinstance(pool, AsyncConnectionPool)
    return pool


def sync_pool(dsn: str, name: str, size: int, *, timeout: float) -> ConnectionPool[Any]:
    pool = make_pool(dsn, name, size, asynchronous=False, autocommit=True, timeout=timeout)
    assert isinstance(pool, ConnectionPool)
    return pool
