"""``Queue`` and ``AsyncQueue``: the public producer and admin façade (the same methods on both, awaited on the
async one). Each method is one line of I/O around :mod:`skiplock.store`: the statement and its parameters come
from :class:`~skiplock.store.statements.Statements`, and :mod:`skiplock.store.run` runs it, on a pool connection
or on the caller's ``conn=`` (inside the caller's transaction).

``claim``, ``complete`` and ``fail`` are the three statements of a job's life, for someone writing their own loop;
the worker itself talks to the database through :class:`skiplock.store.worker.WorkerStore`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock import migrate as migrations
from skiplock import tracing
from skiplock.errors import ConfigError
from skiplock.job import EnqueueManyResult, EnqueueResult, Job, QueueStats
from skiplock.schedule import STALE_SECONDS, Schedule
from skiplock.settings import Settings
from skiplock.store import links, schedules, waiter
from skiplock.store.copy import CopyJobs, acopy_jobs, copy_jobs
from skiplock.store.links import check_not_own_parent, link, lock_parents, split_links
from skiplock.store.purge import apurge_batch, more_left, purge_batch
from skiplock.store.run import NOT_CONNECTED, AsyncRunner, Runner, unavailable
from skiplock.store.statements import PURGE_BATCH, Claim, Failure, PurgePolicy, Statements
from skiplock.store.tasks import TaskDefaults
from skiplock.store.validation import (
    TASK_NAME_MAX,
    EnqueueManyOptions,
    EnqueueOptions,
    TaskEnqueueManyOptions,
    TaskEnqueueOptions,
    task_name_problem,
)

__all__ = [
    "TASK_NAME_MAX",
    "AsyncQueue",
    "EnqueueManyOptions",
    "EnqueueOptions",
    "Failure",
    "Queue",
    "TaskEnqueueManyOptions",
    "TaskEnqueueOptions",
    "task_name_problem",
]
T = TypeVar("T")
DEFAULT_PURGE_STATUSES = ("done", "failed")


def _settings(dsn: str | None, settings: Settings | None) -> Settings:
    """Settings from the arguments only (the environment is read by ``Settings.from_env``, never here)."""
    if settings is None:
        return Settings(dsn=dsn)
    return settings if dsn is None else settings.replace(dsn=dsn)


class Queue:
    """Synchronous queue API. ``Queue(dsn)`` / ``Queue.open(dsn | settings=)`` make and own a pool; or pass your
    own ``psycopg_pool.ConnectionPool`` as ``pool=``. Settings come from the arguments only.

    Methods that write take ``conn=``: then they run on your connection, inside your transaction (not committed).
    """

    is_async = False

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: ConnectionPool[Any] | None = None,
        settings: Settings | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        s = _settings(dsn, settings)
        self.settings = s
        self._s = Statements(s)
        if pool is not None:
            self._run = Runner(s, pool)
        else:
            self._run = Runner.connect(s, name="skiplock", max_size=max_size, connect_timeout=connect_timeout)
        self._closed = False

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        pool: ConnectionPool[Any] | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> Self:
        """Connect (the same as the constructor; the twin of ``await AsyncQueue.open(...)``)."""
        return cls(dsn, settings=settings, pool=pool, max_size=max_size, connect_timeout=connect_timeout)

    @classmethod
    def detached(cls, settings: Settings) -> Self:
        """A queue with no pool: every call must pass ``conn=`` (enqueue inside the caller's transaction)."""
        q = cls.__new__(cls)
        q.settings, q._s, q._run, q._closed = settings, Statements(settings), Runner(settings, None), False
        return q

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pool(self) -> ConnectionPool[Any]:
        if self._run.pool is None:
            raise ConfigError(NOT_CONNECTED)
        return self._run.pool

    def close(self) -> None:
        self._run.close()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # producer
    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Add one job. Options: ``task``, ``delay`` (seconds or timedelta), ``run_at`` (aware datetime),
        ``priority``, ``max_attempts``, ``idempotency_key``, ``timeout_seconds``, the unique and serial options.
        With ``task``, the priority, max_attempts and serial_skip_on_retry not given are the ones the workers
        registered for the task (:meth:`task_defaults`), read in the same statement. Bad arguments raise
        :class:`EnqueueError` (nothing is written)."""
        links, rest = split_links(options)
        if links is None:
            return self._insert(queue, payload, conn, rest).bound(self)
        with self._atomic(conn) as on:
            if links.parents:
                self._run(lock_parents(self._s.q, links), on)  # nothing is inserted when one is missing
            result = self._insert(queue, payload, on, rest)
            check_not_own_parent(result, links)
            if not result.duplicate:  # a duplicate keeps the parents it has
                self._run(link(self._s.q, [result.id], links), on)
        return result.bound(self)

    @contextmanager
    def _atomic(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """A transaction for a linked enqueue: your own (``conn=``, unless in autocommit), else one of its own."""
        with self._run.on(conn) as on:
            if conn is not None and not on.autocommit:
                yield on
                return
            with on.transaction():
                yield on

    def _insert(
        self, queue: str, payload: Any, conn: psycopg.Connection[Any] | None, options: dict[str, Any]
    ) -> EnqueueResult:
        with tracing.sending(queue, options) as sent:
            insert = self._s.enqueue(queue, payload, options, sent.carrier)
            inserted = self._run(insert, conn)
            result = inserted if inserted is not None else self._run(self._s.enqueued(insert), conn)
            if result.duplicate and (replace := self._s.replace_unique(insert.params or {})) is not None:
                self._run(replace, conn)
            sent.jobs(result.id)
        return result

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[EnqueueManyOptions],
    ) -> EnqueueManyResult:
        """Add many jobs of one queue in one transaction (yours with ``conn=``). Without keys the ids are reserved
        and the jobs written with COPY; with keys, one INSERT where payloads whose key is taken insert nothing.
        Returns the new ids in payload order (a list) whose ``results`` give each payload its job and whether it
        was a duplicate."""
        links, rest = split_links(options)
        if links is None:
            return self._insert_many(queue, payloads, conn, rest)
        with self._atomic(conn) as on:
            if links.parents:
                self._run(lock_parents(self._s.q, links), on)
            result = self._insert_many(queue, payloads, on, rest)
            if result:
                self._run(link(self._s.q, result, links), on)
        return result

    def _insert_many(
        self, queue: str, payloads: Iterable[Any], conn: psycopg.Connection[Any] | None, options: dict[str, Any]
    ) -> EnqueueManyResult:
        with tracing.sending(queue, options, batch=True) as sent:
            many = self._s.enqueue_many(queue, payloads, options, sent.carrier)
            if isinstance(many, CopyJobs):
                with self._run.on(conn) as on:
                    result = copy_jobs(on, many)
            else:
                rows = self._run(many.insert, conn)
                missing = many.missing(rows)
                if missing and (replace := many.replace(missing)) is not None:
                    self._run(replace, conn)
                result = many.result(rows, self._run(many.find(missing), conn) if missing else {})
            sent.jobs(result)
        return result

    # a loop of your own: the three statements of a job's life
    def claim(
        self,
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` visible jobs of one queue or several (round-robin), each for ``lease_seconds``
        (default the settings' lease): the deadline is stored in the row. A job whose lease runs out is recovered
        by any worker (``skiplock worker``); finish each claimed job with :meth:`complete` or :meth:`fail`."""
        return self._run(self._s.complete_and_claim((), Claim(queue, worker, lease_seconds), limit, now))[1]

    def complete(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        now: datetime | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> set[int]:
        """Mark claimed jobs done (fenced by worker and attempt). Returns the ids completed; the others had lost
        their lease. With ``conn=``, in your transaction (with the job's own writes)."""
        return self._run(self._s.complete(jobs, worker, now), conn)

    def fail(self, failures: Sequence[Failure], *, worker: str, now: datetime | None = None) -> dict[int, str]:
        """Record failed attempts (fenced; ``Failure.from_exception(job, exc, settings)`` builds one): a retry
        after its backoff, or ``failed`` for good. Returns id -> new status for the jobs whose lease was held."""
        return self._run(self._s.fail(failures, worker, now))

    # observability and admin
    def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        """Per queue: ready, delayed, processing, stalled and failed jobs, the oldest ready job's age, paused."""
        return self._run(self._s.stats(queue, lease_seconds, now))

    def get(self, job_id: int) -> dict[str, Any] | None:
        """One job with every column and its error history (None: no such job); ``result`` is what its task
        returned."""
        return self._run(self._s.get(job_id))

    def wait(self, job_id: int, *, timeout: float | None = None) -> Any:
        """Block until the job ends and return its result; :class:`JobFailedError` when it ended failed or
        cancelled, ``TimeoutError`` after ``timeout`` seconds (on a pool connection, woken by NOTIFY)."""
        with self._run.connection() as conn:
            return waiter.wait(conn, self.settings, self._s.q, job_id, timeout)

    def relatives(self, job_id: int) -> dict[str, Any]:
        """A job's parents and children (id, status) and its durable steps (name -> result)."""
        return self._run(links.relatives(self._s.q, job_id))

    def workflow_jobs(self, workflow_id: str) -> list[int]:
        """The jobs of a workflow that have not ended."""
        return self._run(links.workflow_ids(self._s.q, workflow_id))

    def cancel_workflow(self, workflow_id: str, *, reason: str = "workflow cancelled") -> list[int]:
        """Cancel every job of a workflow that has not ended (running ones through :meth:`cancel`'s path)."""
        ids = self.workflow_jobs(workflow_id)
        return self.cancel(ids=ids, reason=reason) if ids else []

    def statuses(self, ids: Sequence[int]) -> dict[int, str]:
        """The status of each existing job of ``ids``."""
        return self._run(self._s.statuses(ids))

    def list_failed(self, queue: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        """Failed jobs, newest first."""
        return self._run(self._s.list_failed(queue, limit))

    def list_stalled(
        self,
        queue: str | None = None,
        *,
        lease_seconds: float | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Processing jobs past their stored lease deadline (their worker died or hangs), oldest first."""
        return self._run(self._s.list_stalled(queue, lease_seconds, limit, now))

    def retry_failed(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        include_cancelled: bool = False,
        now: datetime | None = None,
    ) -> list[int]:
        """Re-drive failed jobs (and cancelled ones with ``include_cancelled``) with a fresh set of attempts."""
        return self._run(self._s.retry_failed(ids, queue, now, include_cancelled))

    def cancel(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        task: str | None = None,
        reason: str = "by operator",
        now: datetime | None = None,
    ) -> list[int]:
        """Cancel pending jobs at once and running ones cooperatively (their worker is told; the fence refuses
        their completion). Returns the ids cancelled; finished jobs are left as they are."""
        return self._run(self._s.cancel(ids, queue, reason, now, task))

    def pause(self, queue: str, *, now: datetime | None = None) -> None:
        """Pause a queue: running jobs finish, no worker claims from it until :meth:`resume`."""
        self._run(self._s.set_paused(queue, True, now))

    def resume(self, queue: str, *, now: datetime | None = None) -> None:
        self._run(self._s.set_paused(queue, False, now))

    def paused(self, queues: Sequence[str] | None = None) -> list[str]:
        """The paused queues (of ``queues``, or all)."""
        return self._run(self._s.paused(queues))

    def limits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Every registered task limit with the slots in use (running, recent starts)."""
        return self._run(self._s.limits(now))

    def waiting(self, queue: str | None = None, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Due pending jobs held back per queue: by a serial key, a global concurrency limit or a rate limit."""
        return self._run(self._s.waiting(queue, now))

    def schedules(self) -> list[dict[str, Any]]:
        """Every registered schedule with its next and last run (``stale``: not registered for long)."""
        return self._run(self._s.schedule_list(STALE_SECONDS))

    def task_defaults(self, task: str) -> TaskDefaults | None:
        """The queue and enqueue defaults the workers running ``task`` registered (None: none did). An enqueue by
        name (``enqueue(queue, payload, task=...)``) applies the defaults itself, in its statement; this tells a
        producer without the task's code which queue to use (``d.queue``)."""
        return self._run(self._s.task_defaults(task))

    def task_names(self) -> list[str]:
        """Every registered task name, in order."""
        return self._run(self._s.task_names())

    def done_recently(self, queue: str | None = None, *, seconds: float = 3600, cap: int = 10_000) -> dict[str, int]:
        """Jobs finished as done in the last ``seconds`` by queue, counted up to ``cap`` in all."""
        return self._run(self._s.done_recently(queue, seconds, cap))

    def register_schedules(self, given: Sequence[Schedule]) -> None:
        """Register (or refresh) periodic tasks, as a worker does at start (``skiplock schedules sync``)."""
        with self._run.connection() as conn:
            schedules.register_sync(conn, self._s, given)

    def remove_schedules(self, names: Sequence[str]) -> set[str]:
        """Remove schedules by name; returns those that existed."""
        return self._run(self._s.schedule_delete(names))

    def prune_schedules(self, app: str, keep: Sequence[str]) -> list[str]:
        """Remove the schedules of ``app`` other than ``keep``; returns their names."""
        return self._run(self._s.schedule_prune(app, keep))

    def purge(
        self,
        *,
        older_than_seconds: float,
        statuses: Sequence[str] = DEFAULT_PURGE_STATUSES,
        queue: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """Delete finished jobs older than the cutoff in batches, each its own short transaction under the schema's
        purge lock (it waits for a purge in progress). Returns the number deleted."""
        policy = PurgePolicy.older_than(older_than_seconds, statuses, queue)
        total = 0
        with self._run.connection() as conn:
            while True:
                batch = purge_batch(conn, self._s, policy, PURGE_BATCH, wait=True, now=now)
                total += sum((batch or {}).values())
                if not more_left(batch, PURGE_BATCH):
                    return total

    def migrate(self) -> migrations.MigrationReport:
        """Create or upgrade the schema (idempotent, safe from several processes at once)."""
        with self._run.connection() as conn:
            conn.commit()
            return migrations.migrate(conn, self.settings.schema)

    def check_schema(self) -> None:
        """Raise :class:`SchemaNotReadyError` unless the schema is migrated to this version."""
        try:
            with self._run.connection() as conn:
                version = migrations.current_version(conn, self.settings.schema)
        except psycopg.OperationalError as exc:
            raise unavailable(exc, self.settings.dsn) from None
        migrations.check_version(version, self.settings.schema)


class AsyncQueue:
    """Asynchronous twin of :class:`Queue`: the same methods, awaited. Open with ``await AsyncQueue.open(dsn |
    settings=)``, or wrap your own ``psycopg_pool.AsyncConnectionPool``: ``AsyncQueue(pool, settings)``."""

    is_async = True

    def __init__(self, pool: AsyncConnectionPool[Any] | None, settings: Settings, *, owned: bool = False) -> None:
        self.settings = settings
        self._s = Statements(settings)
        self._run = AsyncRunner(settings, pool, owned=owned)
        self._closed = False

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> Self:
        s = _settings(dsn, settings)
        if pool is not None:
            return cls(pool, s)
        run = await AsyncRunner.connect(s, name="skiplock-async", max_size=max_size, connect_timeout=connect_timeout)
        return cls(run.pool, s, owned=True)

    @classmethod
    def detached(cls, settings: Settings) -> Self:
        """A queue with no pool: every call must pass ``conn=``."""
        return cls(None, settings)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        if self._run.pool is None:
            raise ConfigError(NOT_CONNECTED)
        return self._run.pool

    async def close(self) -> None:
        await self._run.close()
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """See :meth:`Queue.enqueue`."""
        links, rest = split_links(options)
        if links is None:
            return (await self._insert(queue, payload, conn, rest)).bound(self)
        async with self._atomic(conn) as on:
            if links.parents:
                await self._run(lock_parents(self._s.q, links), on)
            result = await self._insert(queue, payload, on, rest)
            check_not_own_parent(result, links)
            if not result.duplicate:
                await self._run(link(self._s.q, [result.id], links), on)
        return result.bound(self)

    @asynccontextmanager
    async def _atomic(self, conn: psycopg.AsyncConnection[Any] | None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._run.on(conn) as on:
            if conn is not None and not on.autocommit:
                yield on
                return
            async with on.transaction():
                yield on

    async def _insert(
        self, queue: str, payload: Any, conn: psycopg.AsyncConnection[Any] | None, options: dict[str, Any]
    ) -> EnqueueResult:
        with tracing.sending(queue, options) as sent:
            insert = self._s.enqueue(queue, payload, options, sent.carrier)
            inserted = await self._run(insert, conn)
            result = inserted if inserted is not None else await self._run(self._s.enqueued(insert), conn)
            if result.duplicate and (replace := self._s.replace_unique(insert.params or {})) is not None:
                await self._run(replace, conn)
            sent.jobs(result.id)
        return result

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueManyOptions],
    ) -> EnqueueManyResult:
        """See :meth:`Queue.enqueue_many`."""
        links, rest = split_links(options)
        if links is None:
            return await self._insert_many(queue, payloads, conn, rest)
        async with self._atomic(conn) as on:
            if links.parents:
                await self._run(lock_parents(self._s.q, links), on)
            result = await self._insert_many(queue, payloads, on, rest)
            if result:
                await self._run(link(self._s.q, result, links), on)
        return result

    async def _insert_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        conn: psycopg.AsyncConnection[Any] | None,
        options: dict[str, Any],
    ) -> EnqueueManyResult:
        with tracing.sending(queue, options, batch=True) as sent:
            many = self._s.enqueue_many(queue, payloads, options, sent.carrier)
            if isinstance(many, CopyJobs):
                async with self._run.on(conn) as on:
                    result = await acopy_jobs(on, many)
            else:
                rows = await self._run(many.insert, conn)
                missing = many.missing(rows)
                if missing and (replace := many.replace(missing)) is not None:
                    await self._run(replace, conn)
                result = many.result(rows, await self._run(many.find(missing), conn) if missing else {})
            sent.jobs(result)
        return result

    async def claim(
        self,
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        return (await self._run(self._s.complete_and_claim((), Claim(queue, worker, lease_seconds), limit, now)))[1]

    async def complete(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        now: datetime | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> set[int]:
        return await self._run(self._s.complete(jobs, worker, now), conn)

    async def fail(self, failures: Sequence[Failure], *, worker: str, now: datetime | None = None) -> dict[int, str]:
        return await self._run(self._s.fail(failures, worker, now))

    async def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        return await self._run(self._s.stats(queue, lease_seconds, now))

    async def get(self, job_id: int) -> dict[str, Any] | None:
        return await self._run(self._s.get(job_id))

    async def wait(self, job_id: int, *, timeout: float | None = None) -> Any:
        """See :meth:`Queue.wait`."""
        async with self._run.connection() as conn:
            return await waiter.await_result(conn, self.settings, self._s.q, job_id, timeout)

    async def relatives(self, job_id: int) -> dict[str, Any]:
        return await self._run(links.relatives(self._s.q, job_id))

    async def workflow_jobs(self, workflow_id: str) -> list[int]:
        return await self._run(links.workflow_ids(self._s.q, workflow_id))

    async def cancel_workflow(self, workflow_id: str, *, reason: str = "workflow cancelled") -> list[int]:
        ids = await self.workflow_jobs(workflow_id)
        return await self.cancel(ids=ids, reason=reason) if ids else []

    async def statuses(self, ids: Sequence[int]) -> dict[int, str]:
        return await self._run(self._s.statuses(ids))

    async def list_failed(self, queue: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        return await self._run(self._s.list_failed(queue, limit))

    async def list_stalled(
        self,
        queue: str | None = None,
        *,
        lease_seconds: float | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        return await self._run(self._s.list_stalled(queue, lease_seconds, limit, now))

    async def retry_failed(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        include_cancelled: bool = False,
        now: datetime | None = None,
    ) -> list[int]:
        return await self._run(self._s.retry_failed(ids, queue, now, include_cancelled))

    async def cancel(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        task: str | None = None,
        reason: str = "by operator",
        now: datetime | None = None,
    ) -> list[int]:
        return await self._run(self._s.cancel(ids, queue, reason, now, task))

    async def pause(self, queue: str, *, now: datetime | None = None) -> None:
        await self._run(self._s.set_paused(queue, True, now))

    async def resume(self, queue: str, *, now: datetime | None = None) -> None:
        await self._run(self._s.set_paused(queue, False, now))

    async def paused(self, queues: Sequence[str] | None = None) -> list[str]:
        return await self._run(self._s.paused(queues))

    async def limits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._run(self._s.limits(now))

    async def waiting(self, queue: str | None = None, *, now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._run(self._s.waiting(queue, now))

    async def schedules(self) -> list[dict[str, Any]]:
        return await self._run(self._s.schedule_list(STALE_SECONDS))

    async def task_defaults(self, task: str) -> TaskDefaults | None:
        return await self._run(self._s.task_defaults(task))

    async def task_names(self) -> list[str]:
        return await self._run(self._s.task_names())

    async def done_recently(
        self, queue: str | None = None, *, seconds: float = 3600, cap: int = 10_000
    ) -> dict[str, int]:
        return await self._run(self._s.done_recently(queue, seconds, cap))

    async def register_schedules(self, given: Sequence[Schedule]) -> None:
        async with self._run.connection() as conn:
            await schedules.register(conn, self._s, given)

    async def remove_schedules(self, names: Sequence[str]) -> set[str]:
        return await self._run(self._s.schedule_delete(names))

    async def prune_schedules(self, app: str, keep: Sequence[str]) -> list[str]:
        return await self._run(self._s.schedule_prune(app, keep))

    async def purge(
        self,
        *,
        older_than_seconds: float,
        statuses: Sequence[str] = DEFAULT_PURGE_STATUSES,
        queue: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """See :meth:`Queue.purge`."""
        policy = PurgePolicy.older_than(older_than_seconds, statuses, queue)
        total = 0
        async with self._run.connection() as conn:
            while True:
                batch = await apurge_batch(conn, self._s, policy, PURGE_BATCH, wait=True, now=now)
                total += sum((batch or {}).values())
                if not more_left(batch, PURGE_BATCH):
                    return total

    async def migrate(self) -> migrations.MigrationReport:
        async with self._run.connection() as conn:
            await conn.commit()
            return await migrations.amigrate(conn, self.settings.schema)

    async def check_schema(self) -> None:
        try:
            async with self._run.connection() as conn:
                version = await migrations.acurrent_version(conn, self.settings.schema)
        except psycopg.OperationalError as exc:
            raise unavailable(exc, self.settings.dsn) from None
        migrations.check_version(version, self.settings.schema)
