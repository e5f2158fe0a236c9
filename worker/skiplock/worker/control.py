"""Control-plane calls of one worker (claim, complete, fail, heartbeat, recover, release): one autocommit pool,
retries over dead pooled connections, error accounting and the backoff after a failed call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from skiplock.backoff import backoff_seconds
from skiplock.errors import DatabaseUnavailableError
from skiplock.limits import TaskLimits
from skiplock.metrics import WorkerMetrics
from skiplock.queue import AsyncQueue
from skiplock.settings import CONTROL_CONNECTIONS, Settings, redact
from skiplock.worker.pools import acheck, async_pool

log = logging.getLogger(__name__)
T = TypeVar("T")
TRANSIENT = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    PoolTimeout,
    OSError,
    DatabaseUnavailableError,
    # A claim that would run a second job of one serial key (a rare race: see flow control) fails on the unique
    # index that forbids it; tried again, it claims around it. Only claims set jobs running, so only they hit it.
    psycopg.errors.UniqueViolation,
)
# A prepared statement lives in one server session. Behind a pooler that hands each transaction to whichever server
# connection is free (PgBouncer in transaction mode, before 1.21) a statement prepared in one transaction is missing
# in the next, or already there under the name psycopg gives a new one. The call failed before it ran anything, so
# it is tried again, and from then on the worker's control statements are sent unprepared.
UNPREPARED = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)
# Immediate tries of one call before backing off: after a server restart or killed backends every pooled control
# connection may be dead (each failure discards one), so one more than the pool holds.
ATTEMPTS = CONTROL_CONNECTIONS + 1
PLANS_ATTRIBUTE = "_skiplock_plans"  # on a control connection: the replan its plans were made after
BACKOFF_CAP_SECONDS = 10.0


@dataclass(frozen=True)
class Scope:
    """What every seam of one worker shares: its control calls, settings, identity, the queues it serves and
    the leases of tasks that set their own."""

    control: Control
    settings: Settings
    identity: str
    queues: tuple[str, ...]
    lease_overrides: dict[str, float] = field(default_factory=dict)
    limits: tuple[TaskLimits, ...] = ()  # the limited tasks of its app (flow control), as registered at start


class Control:
    """Owns the control pool. ``call`` runs one fenced or idempotent call; a database error is logged, counted and
    survived (``None``), so every seam backs off and tries again instead of dying."""

    def __init__(self, settings: Settings, metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        # Single statements on autocommit connections: one round trip each, not three (BEGIN, statement, COMMIT).
        self.pool = async_pool(
            settings.require_dsn(),
            "skiplock-control",
            CONTROL_CONNECTIONS,
            autocommit=True,
            timeout=10,
            configure=self._configure,
            check=self._check,
        )
        self.queue = AsyncQueue(self.pool, settings, owned=True)
        self.ok = False
        self.failures = 0
        self.uncertain = False  # a try of the last call failed in flight: it may have committed unseen
        self.prepare = True  # control statements are prepared (False once prepared statements went missing)
        self.plans = 0  # replans so far (see replan): a connection's plans are current when made after the last

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A new control connection works in UTC and without JIT (see ``session_control``), and prepares each
        statement at its first use, not its sixth: every one of them is run again and again, and a claim sent
        unprepared cost 1-3 ms of parsing on top of its planning (the first claims of every drain)."""
        await conn.execute(self.queue.queries.session_control, prepare=False)
        conn.prepare_threshold = 0 if self.prepare else None
        setattr(conn, PLANS_ATTRIBUTE, self.plans)

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """At checkout: plans older than the last :meth:`replan` are dropped, then the idle check."""
        await self.forget_stale_plans(conn)
        await acheck(conn)

    def replan(self) -> None:
        """The jobs table has grown far beyond what the prepared statements were planned for: each control
        connection drops their plans before its next use (:meth:`forget_stale_plans`)."""
        self.plans += 1

    async def forget_stale_plans(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """When ``conn``'s plans were made before the last :meth:`replan`, drop them (``DISCARD PLANS``: the
        statements stay, so psycopg's names for them stay valid): each statement is planned again at its next
        execution, for the jobs table as it is now. Raises what the server raises (a pooler that refuses the
        command): the caller then drops the connection, and a new one plans afresh too."""
        if getattr(conn, PLANS_ATTRIBUTE, self.plans) == self.plans:
            return
        if conn.prepare_threshold is not None:  # nothing was prepared on a connection that prepares nothing
            await conn.execute(self.queue.queries.session_forget_plans, prepare=False)
        setattr(conn, PLANS_ATTRIBUTE, self.plans)

    async def open(self) -> None:
        await self.pool.open()

    async def close(self) -> None:
        await self.pool.close()

    async def call(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """``uncertain`` is True afterwards when any try failed: that try may have committed with its reply lost
        (the claimer then reclaims jobs leased to this worker that it does not know)."""
        self.uncertain = False
        for attempt in range(1, ATTEMPTS + 1):
            try:
                result = await fn()
                break
            except TRANSIENT as exc:
                _reraise_cancellation()
                self.uncertain = True
                if attempt < ATTEMPTS:
                    continue
                self._error(operation, exc, logging.WARNING)
                return None
            except UNPREPARED as exc:
                _reraise_cancellation()
                await self._stop_preparing(exc)
                if attempt < ATTEMPTS:
                    continue
                self._error(operation, exc, logging.WARNING)
                return None
            except psycopg.Error as exc:  # not transient: a bug, a privilege, a standby
                _reraise_cancellation()
                self._error(operation, exc, logging.ERROR)
                return None
        _reraise_cancellation()  # a cancel swallowed on the way (by the driver or the pool) still ends the task
        if not self.ok:
            if self.failures:
                log.info("database reachable again", extra={"action": "db_recovered"})
            self.ok = True
            self.failures = 0
            self.metrics.database_up.set(1)
        return result

    async def _stop_preparing(self, exc: psycopg.Error) -> None:
        """Prepared statements went missing between transactions (see UNPREPARED): the pool's connections are
        replaced by ones that prepare nothing."""
        if not self.prepare:
            return
        self.prepare = False
        log.warning(
            "prepared statements do not last from one transaction to the next here (%s: a pooler in transaction "
            "mode?): the worker's statements are sent unprepared from now on",
            type(exc).__name__,
            extra={"action": "unprepared"},
        )
        await self.pool.drain()

    def _error(self, operation: str, exc: BaseException, level: int) -> None:
        self.metrics.db_errors.labels(operation).inc()
        self.metrics.database_up.set(0)
        self.ok = False
        self.failures += 1
        if self.failures == 1 or self.failures % 10 == 0:
            log.log(
                level,
                "database error during %s (%s: %s); retrying",
                operation,
                type(exc).__name__,
                redact(str(exc).strip(), self.settings.dsn),
                extra={"action": "db_error", "operation": operation},
            )

    async def backoff(self, stopping: asyncio.Event) -> None:
        """Wait after a failed call: capped by the poll interval, so work is picked up within it once the
        database answers again (a failover must not cost more than one poll)."""
        cap = min(BACKOFF_CAP_SECONDS, self.settings.poll_seconds)
        delay = backoff_seconds(max(self.failures, 1), base=min(0.2, cap), cap=cap, jitter=0.5)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=delay)


def _reraise_cancellation() -> None:
    """A cancel that landed inside a database call may surface as a query error (the query was cancelled), or be
    swallowed by the driver or the pool: never survive it, or a stopping worker would wait for the next round of
    a loop that was told to end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
