"""What the worker asks of the database: the async-only :class:`WorkerStore` protocol, and :class:`PgWorkerStore`,
its PostgreSQL implementation (one autocommit control pool, retries over dead pooled connections, error accounting,
the backoff after a failed call, replans, and the connection the claimer keeps between claims).

Every method but :meth:`WorkerStore.purging` and :meth:`WorkerStore.schedules` survives a database error: it is
logged, counted (``skiplock_worker_db_errors_total{operation}``) and the method returns ``None``, so each seam
backs off and tries again instead of dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from skiplock.backoff import backoff_seconds
from skiplock.errors import DatabaseUnavailableError
from skiplock.job import Job, QueueStats
from skiplock.limits import TaskLimits
from skiplock.metrics import WorkerMetrics
from skiplock.settings import CONTROL_CONNECTIONS, Settings, redact
from skiplock.store.call import Call
from skiplock.store.links import complete_results
from skiplock.store.purge import apurge_batch
from skiplock.store.run import aexecute, aexecute_raw, raw_cursor
from skiplock.store.schedules import ScheduleSession
from skiplock.store.statements import Claim, Failure, PurgePolicy, Recovered, Statements
from skiplock.store.tasks import TaskDefaults

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
PurgeBatch = Callable[[PurgePolicy, int], Awaitable[Counter[str] | None]]


class CompleterStore(Protocol):
    """What the worker's completer asks: writing results. Each call returns ``None`` when the database failed."""

    async def backoff(self, stopping: asyncio.Event) -> None: ...
    async def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int] | None: ...
    async def complete(self, jobs: Sequence[Job], *, worker: str) -> set[int] | None: ...
    async def complete_results(self, done: Sequence[tuple[Job, str]], *, worker: str) -> set[int] | None: ...
    async def fail(self, failures: Sequence[Failure], *, worker: str) -> dict[int, str] | None: ...
    async def snooze(self, jobs: Sequence[Job], delays: Sequence[float], *, worker: str) -> set[int] | None: ...
    async def cancelled_among(
        self, jobs: Sequence[Job], *, worker: str, operation: str = "complete"
    ) -> set[int] | None: ...


class LeaseStore(Protocol):
    """What the worker's leases ask: renewing, recovering and handing back. ``None``: the database failed."""

    async def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        timeouts: Sequence[float | None] | None = None,
    ) -> set[int] | None: ...
    async def cancelled_among(
        self, jobs: Sequence[Job], *, worker: str, operation: str = "complete"
    ) -> set[int] | None: ...
    async def recover_expired(
        self, *, queues: Sequence[str], lease_seconds: float | None = None
    ) -> list[Recovered] | None: ...
    async def release(self, jobs: Sequence[Job], *, worker: str) -> set[int] | None: ...
    async def release_orphans(
        self, *, worker: str, queues: Sequence[str], known: Sequence[int]
    ) -> list[int] | None: ...


class ClaimStore(Protocol):
    """What the worker's claimer asks: claims (carrying completions) on a kept connection, and what decides them.
    Each call but :meth:`drain_requested` returns ``None`` when the database failed."""

    @property
    def uncertain(self) -> bool:
        """A try of the last call failed in flight: it may have committed with its reply lost."""

    async def backoff(self, stopping: asyncio.Event) -> None: ...
    def replan(self) -> None: ...
    async def complete_and_claim(
        self, done: Sequence[Job], claim: Claim, limit: int
    ) -> tuple[set[int], list[Job]] | None: ...
    async def stream_claims(self) -> None: ...
    async def give_back_claim_connection(self) -> None: ...
    async def paused(self, queues: Sequence[str]) -> list[str] | None: ...
    async def jobs_table_bytes(self) -> int | None: ...
    async def next_start(self, tasks: Sequence[str], queues: Sequence[str]) -> float | None: ...
    async def drain_requested(self, pod: str) -> bool:
        """Raises: the caller decides what a failure means (it is not on the claim path)."""


class WorkerStore(ClaimStore, CompleterStore, LeaseStore, Protocol):
    """The worker's data access: each seam's part (a seam is given only its part, so a test fakes only that), and
    what the lifecycle and the background tasks use. Each call returns ``None`` when the database failed (logged and
    counted), but for the last four, which raise."""

    ok: bool
    """The last call reached the database."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    @property
    def claim_connection_kept(self) -> bool: ...
    @property
    def streaming_claims(self) -> bool: ...
    async def register_limits(self, limits: Iterable[TaskLimits], *, worker: str) -> list[dict[str, Any]] | None: ...
    async def register_tasks(self, tasks: Iterable[TaskDefaults], *, app: str, worker: str) -> list[str] | None: ...

    # these raise: the caller decides what a failure means (none of them is on the claim path)
    async def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]: ...
    def purging(self) -> AbstractAsyncContextManager[PurgeBatch]: ...
    def schedules(self) -> AbstractAsyncContextManager[ScheduleSession]: ...


class PgWorkerStore:
    """:class:`WorkerStore` on PostgreSQL. Owns the control pool (autocommit: one round trip a statement)."""

    def __init__(self, settings: Settings, metrics: WorkerMetrics) -> None:
        from skiplock.worker.pools import async_pool  # the worker's one pool constructor (imports this module)

        self.settings = settings
        self.metrics = metrics
        self.statements = Statements(settings)
        self.pool = async_pool(
            settings.require_dsn(),
            "skiplock-control",
            CONTROL_CONNECTIONS,
            autocommit=True,
            timeout=10,
            configure=self._configure,
            check=self._check,
        )
        self.ok = False
        self.failures = 0
        self.uncertain = False
        self.prepare = True  # control statements are prepared (False once prepared statements went missing)
        self.plans = 0  # replans so far (see replan): a connection's plans are current when made after the last
        self._claim_conn: psycopg.AsyncConnection[Any] | None = None  # kept between claims: no checkout per claim
        self._claim_cursor: psycopg.AsyncRawCursor[Any] | None = None  # the kept connection's (see aexecute_raw)
        self._streaming = False  # the kept connection plans its claims once (see stream_claims)
        self._refilling: asyncio.Task[None] | None = None  # see connect_now

    # ------------------------------------------------------------------ pool and plans
    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A new control connection works in UTC and without JIT (see ``session_control``), and prepares each
        statement at its first use, not its sixth: every one of them is run again and again (see
        docs/adr/0007-one-data-access-layer.md)."""
        await self._session(conn, "session_control")
        conn.prepare_threshold = 0 if self.prepare else None
        setattr(conn, PLANS_ATTRIBUTE, self.plans)

    async def _session(self, conn: psycopg.AsyncConnection[Any], name: str) -> None:
        await conn.execute(self.statements.session(name).query, prepare=False)

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """At checkout: plans older than the last :meth:`replan` are dropped, then the idle check."""
        from skiplock.worker.pools import acheck

        await self._forget_stale_plans(conn)
        await acheck(conn)

    def replan(self) -> None:
        """The jobs table has grown far beyond what the prepared statements were planned for: each control
        connection drops their plans before its next use."""
        self.plans += 1

    async def _forget_stale_plans(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """When ``conn``'s plans were made before the last :meth:`replan`, drop them (``DISCARD PLANS``: the
        statements stay, so psycopg's names for them stay valid): each statement is planned again at its next
        execution, for the jobs table as it is now. Raises what the server raises (a pooler that refuses the
        command): the caller then drops the connection, and a new one plans afresh too."""
        if getattr(conn, PLANS_ATTRIBUTE, self.plans) == self.plans:
            return
        if conn.prepare_threshold is not None:  # nothing was prepared on a connection that prepares nothing
            await self._session(conn, "session_forget_plans")
        setattr(conn, PLANS_ATTRIBUTE, self.plans)

    async def open(self) -> None:
        await self.pool.open()

    def connect_now(self) -> None:
        """The database answers again (the listener is back): the pool connects now, for the calls waiting.
        psycopg_pool gives a failed connection attempt up at once here (``reconnect_timeout=0``) and tries again
        only at a later checkout, so a call already waiting for a connection waited out its whole timeout (10 s)
        after the database was back, and the claim with it."""
        if self._refilling is None or self._refilling.done():
            self._refilling = asyncio.create_task(self._refill(), name="pool-refill")

    async def _refill(self) -> None:
        with contextlib.suppress(PoolClosed):
            await self.pool.check()  # grows the pool if it holds no connection, and pings the idle ones

    async def close(self) -> None:
        if self._refilling is not None:
            self._refilling.cancel()
            await asyncio.gather(self._refilling, return_exceptions=True)
        await self.pool.close()

    # ------------------------------------------------------------------ retries and error accounting
    async def call(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """Run ``fn`` (one fenced or idempotent call), tried again over dead pooled connections. ``uncertain`` is
        True afterwards when any try failed: that try may have committed with its reply lost (the claimer then
        reclaims jobs leased to this worker that it does not know)."""
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

    async def _run(self, operation: str, call: Call[T]) -> T | None:
        """One statement on a pooled control connection, through :meth:`call`."""

        async def once() -> T:
            async with self.pool.connection() as conn:
                return await aexecute(conn, call)

        return await self.call(operation, once)

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

    # ------------------------------------------------------------------ the claimer
    async def complete_and_claim(
        self, done: Sequence[Job], claim: Claim, limit: int
    ) -> tuple[set[int], list[Job]] | None:
        """The hot path: complete ``done`` and claim up to ``limit`` jobs in one statement, on the connection kept
        between claims (a pool checkout per claim cost as much client CPU as the statement)."""
        call = self.statements.complete_and_claim(done, claim, limit, None)

        async def run() -> tuple[set[int], list[Job]]:
            try:
                return await self._claim(call)
            except psycopg.errors.UniqueViolation as exc:  # retried by call(): first fail the jobs that caused it
                if exc.diag.constraint_name == "jobs_unique_idx":
                    await self._fail_unique_blocked(claim.queues)
                raise

        return await self.call("claim", run)

    async def _fail_unique_blocked(self, queues: str | Sequence[str]) -> None:
        """A claim broke the unique-key index: only a row stored outside ``jobs_unique_states_check`` can make it do
        that, and it would again on every claim. Those jobs fail, each saying why; the claim is then tried again."""
        try:
            failed = await self._raw(self.statements.fail_unique_blocked(queues))
        except psycopg.Error:
            return  # the claim's own error is counted; its next try cleans up again
        if failed:
            log.warning(
                "failed %d job(s) whose unique key another job holds (their unique_states lack pending)",
                len(failed),
                extra={"action": "unique_blocked", "job_ids": failed},
            )

    async def _claim(self, call: Call[tuple[set[int], list[Job]]]) -> tuple[set[int], list[Job]]:
        """A connection that fails goes back to the pool (which drops it if broken)."""
        if self._claim_conn is not None:  # kept since its checkout: its plans may be older than the last replan
            try:
                await self._forget_stale_plans(self._claim_conn)
            except psycopg.Error:  # a pooler that refuses the command: a new connection plans afresh as well
                await self._claim_conn.close()
                await self.give_back_claim_connection()
        try:
            if self._claim_conn is None:
                self._claim_conn = await self.pool.getconn()
                self._claim_cursor = None
            if self._claim_cursor is None:
                self._claim_cursor = raw_cursor(self._claim_conn, call.tuples)
            return await aexecute_raw(self._claim_cursor, call)
        except BaseException:
            await self.give_back_claim_connection()
            raise

    @property
    def claim_connection_kept(self) -> bool:
        return self._claim_conn is not None

    @property
    def streaming_claims(self) -> bool:
        return self._streaming

    async def stream_claims(self) -> None:
        """Claims come in a stream (work is waiting): the kept connection plans them once (``plan_cache_mode =
        force_generic_plan``), reset before it goes back to the pool. A failure hands the connection back (closed
        if it kept the setting); the jobs claimed stand."""
        if self._streaming or self._claim_conn is None:
            return
        try:
            self._streaming = True
            await self._session(self._claim_conn, "session_generic_plans")
        except psycopg.Error:
            await self.give_back_claim_connection()

    async def give_back_claim_connection(self) -> None:
        """The kept connection goes back to the pool (idle, or all slots busy for a while): plans reset first."""
        conn, self._claim_conn, self._claim_cursor = self._claim_conn, None, None
        if conn is None:
            return
        if not self._streaming:
            await self.pool.putconn(conn)
            return
        self._streaming = False
        reset = False
        try:
            with contextlib.suppress(psycopg.Error):
                await self._session(conn, "session_reset_plans")
                reset = True
        finally:
            if not reset:  # the pool's other users must not inherit the setting: the pool drops a closed one
                await conn.close()
            await self.pool.putconn(conn)

    async def paused(self, queues: Sequence[str]) -> list[str] | None:
        return await self._run("claim", self.statements.paused(queues))

    async def jobs_table_bytes(self) -> int | None:
        return await self._run("claim", self.statements.jobs_table_bytes())

    async def next_start(self, tasks: Sequence[str], queues: Sequence[str]) -> float | None:
        return await self._run("claim", self.statements.next_start(tasks, queues, None))

    async def register_limits(self, limits: Iterable[TaskLimits], *, worker: str) -> list[dict[str, Any]] | None:
        return await self._run("register_limits", self.statements.register_limits(limits, worker))

    async def register_tasks(self, tasks: Iterable[TaskDefaults], *, app: str, worker: str) -> list[str] | None:
        return await self._run("register_tasks", self.statements.register_tasks(tasks, app, worker))

    # ------------------------------------------------------------------ the completer
    async def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int] | None:
        return await self._run("complete", self.statements.confirm_done(jobs, worker))

    async def complete(self, jobs: Sequence[Job], *, worker: str) -> set[int] | None:
        return await self._run("complete", self.statements.complete(jobs, worker, None))

    async def complete_results(self, done: Sequence[tuple[Job, str]], *, worker: str) -> set[int] | None:
        return await self._run("complete", complete_results(self.statements.q, done, worker))

    async def fail(self, failures: Sequence[Failure], *, worker: str) -> dict[int, str] | None:
        return await self._run("fail", self.statements.fail(failures, worker, None))

    async def snooze(self, jobs: Sequence[Job], delays: Sequence[float], *, worker: str) -> set[int] | None:
        return await self._run("fail", self.statements.snooze(jobs, delays, worker, None))

    async def cancelled_among(
        self, jobs: Sequence[Job], *, worker: str, operation: str = "complete"
    ) -> set[int] | None:
        return await self._run(operation, self.statements.cancelled_among(jobs, worker))

    # ------------------------------------------------------------------ leases
    async def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        timeouts: Sequence[float | None] | None = None,
    ) -> set[int] | None:
        return await self._run("heartbeat", self.statements.heartbeat(jobs, worker, leases, None, timeouts))

    async def recover_expired(
        self, *, queues: Sequence[str], lease_seconds: float | None = None
    ) -> list[Recovered] | None:
        return await self._run("recover", self.statements.recover_expired(queues, lease_seconds, 1000, None))

    async def release(self, jobs: Sequence[Job], *, worker: str) -> set[int] | None:
        return await self._run("release", self.statements.release(jobs, worker, None))

    async def release_orphans(self, *, worker: str, queues: Sequence[str], known: Sequence[int]) -> list[int] | None:
        return await self._run("release", self.statements.release_orphans(worker, queues, known, None))

    # ------------------------------------------------------------------ raising: drain requests, gauges, retention
    async def _raw(self, call: Call[T]) -> T:
        async with self.pool.connection() as conn:
            return await aexecute(conn, call)

    async def drain_requested(self, pod: str) -> bool:
        """Whether the operator asked this pod to drain (not through :meth:`call`: its retry bookkeeping belongs
        to the claims)."""
        return await self._raw(self.statements.drain_requested(pod))

    async def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        """The queue gauges' numbers (``skiplock.worker.queue_gauges``)."""
        return await self._raw(self.statements.stats(queue, lease_seconds, now))

    @asynccontextmanager
    async def purging(self) -> AsyncIterator[PurgeBatch]:
        """A connection of its own for one purge round (a round may take a while: no control connection is held),
        closed afterwards; yields the batch function (see :mod:`skiplock.store.purge`)."""
        from skiplock.worker.pools import APPLICATION_NAME

        conn = await psycopg.AsyncConnection.connect(
            self.settings.require_dsn(), autocommit=True, application_name=APPLICATION_NAME
        )
        async with conn:

            async def batch(policy: PurgePolicy, limit: int) -> Counter[str] | None:
                return await apurge_batch(conn, self.statements, policy, limit, wait=False)

            yield batch

    @asynccontextmanager
    async def schedules(self) -> AsyncIterator[ScheduleSession]:
        """A control connection borrowed for one round of the scheduler."""
        async with self.pool.connection() as conn:
            yield ScheduleSession(conn, self.statements)


def _reraise_cancellation() -> None:
    """A cancel that landed inside a database call may surface as a query error (the query was cancelled), or be
    swallowed by the driver or the pool: never survive it, or a stopping worker would wait for the next round of
    a loop that was told to end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
