"""Running jobs: which function runs a job (routing), the two executors that run one job's fenced unit and report
one :data:`~skiplock.job.Outcome`, and :class:`Executors`, the seam that owns the slots (:mod:`.slots`) and hands
every result to the completer (:class:`Results`), which writes and counts it.

The fenced unit: call the handler with ``job``; a handler that wrote through ``job.conn`` is completed in that
same transaction (fenced: only while this worker still holds this attempt's lease: ``written``), one that did not
is ``done`` unwritten, for the completer's batch. Sync handlers run on ``concurrency`` long-lived threads, async
handlers on ``concurrency`` long-lived runner tasks; both take their next job from the slots themselves and post
results back to the loop in batches (one wake-up for many jobs). ``job.conn`` is checked out on first use only,
for both kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock import tracing
from skiplock.app import App, is_async_callable
from skiplock.errors import Snooze
from skiplock.handlers import Handler
from skiplock.job import AsyncLazyConnection, Job, LazyConnection, Outcome
from skiplock.metrics import BoundMetrics
from skiplock.settings import SPARE_HANDLER_CONNECTIONS, Settings
from skiplock.store.durable import AsyncDurable, Durable
from skiplock.store.links import complete_one_result, encode_result
from skiplock.store.run import aexecute, execute
from skiplock.store.statements import Failure, Statements
from skiplock.worker.completer import failure_for, queue_counts
from skiplock.worker.pools import async_pool, sync_pool
from skiplock.worker.scope import Scope
from skiplock.worker.slots import Entry, Slots, Target
from skiplock.worker.wakeup import Wakeup

__all__ = [
    "AsyncExecutor",
    "Entry",
    "Executors",
    "HandlerConnectionError",
    "Results",
    "Router",
    "Slots",
    "Target",
    "ThreadExecutor",
    "UnknownTaskError",
    "as_handler",
    "is_timeout",
    "serve_queues",
    "timed_out_error",
    "timeout_for",
]
log = logging.getLogger(__name__)


def timeout_for(job: Job, target: Target) -> float | None:
    """The job's own timeout, else its task's, else none."""
    return job.timeout_seconds if job.timeout_seconds is not None else target.timeout_seconds


TIMEOUT_NOTE = "skiplock: the job's timeout"
_NO_JOB = object()  # equal to no visible_at


def timed_out_error(timeout: float) -> TimeoutError:
    """The error recorded for an attempt stopped at its timeout (a plain TimeoutError, tagged with a note)."""
    exc = TimeoutError(f"the handler ran past its timeout of {timeout:g}s")
    exc.add_note(TIMEOUT_NOTE)
    return exc


def is_timeout(exc: BaseException | None) -> bool:
    return isinstance(exc, TimeoutError) and TIMEOUT_NOTE in getattr(exc, "__notes__", ())


class UnknownTaskError(Exception):
    """The job names a task this worker does not register (a rolling deploy, a typo): retried, then failed."""


class HandlerConnectionError(Exception):
    """The handler's transaction was aborted by a database error it swallowed, or job.conn could not be had."""


def serve_queues(settings: Settings, app: App | None, handler: Handler | None) -> tuple[str, ...]:
    """The queues a worker serves: ``settings.queues``, else every queue its app's tasks name (plus
    ``settings.queue`` for a catch-all handler), else ``settings.queue``."""
    if settings.queues:
        return settings.queues
    if app is not None and len(app):
        extra = (settings.queue,) if handler is not None else ()
        return tuple(dict.fromkeys((*app.queues, *extra)))
    return (settings.queue,)


def as_handler(handler: Handler | Callable[..., Any] | None) -> Handler | None:
    """A catch-all handler given as a plain function, named by its module and qualified name."""
    if handler is None or isinstance(handler, Handler):
        return handler
    name = f"{getattr(handler, '__module__', '?')}:{getattr(handler, '__qualname__', type(handler).__name__)}"
    return Handler(name, handler, is_async_callable(handler))


class Router:
    """Job -> Target: the app's task named by the job, or the catch-all handler for jobs without a task."""

    def __init__(self, app: App | None, handler: Handler | None) -> None:
        self.app = app
        self.targets: dict[str | None, Target] = {t.name: Target(t.func, t.is_async, t) for t in (app or ())}
        """A job's ``task`` -> its Target (``None``: the catch-all handler, if any); a task missing here is unknown."""
        if handler is not None:
            self.targets[None] = Target(handler.func, handler.is_async)

    @staticmethod
    def unknown(job: Job) -> UnknownTaskError:
        """Why ``job`` has no Target here."""
        if job.task is None:
            return UnknownTaskError("job has no task and this worker has no default handler (--handler)")
        return UnknownTaskError(f"no task {job.task!r} registered in this worker")

    @property
    def kinds(self) -> set[bool]:
        """Colours in use: True for async, False for sync (a worker opens pools and threads only for these)."""
        return {t.is_async for t in self.targets.values()}

    def lease_overrides(self) -> dict[str, float]:
        return {t.name: t.options.lease_seconds for t in (self.app or ()) if t.options.lease_seconds is not None}

    def timeouts(self) -> dict[str, float]:
        return {t.name: t.options.timeout_seconds for t in (self.app or ()) if t.options.timeout_seconds is not None}


def _finish_sync(
    conn: psycopg.Connection[Any], job: Job, worker: str, q: Statements, result: str | None
) -> Outcome | None:
    """After a sync handler that used job.conn returned: complete in its transaction (``done``, or ``lease_lost`` when
    the fence refused it), else None: the completer's batch writes it. (IDLE: the handler ended the job's transaction
    itself, with ``commit()`` or ``rollback()``: documented as unfenced; the job is completed in the batch.)"""
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return None
    if status != TransactionStatus.INTRANS:
        conn.rollback()
        raise HandlerConnectionError("the handler's transaction was aborted by a database error it caught")
    if not execute(
        conn, q.complete_one(job, worker) if result is None else complete_one_result(q.q, job, worker, result)
    ):
        conn.rollback()
        return "lease_lost"
    conn.commit()
    return "done"


async def _finish_async(
    conn: psycopg.AsyncConnection[Any], job: Job, worker: str, q: Statements, result: str | None
) -> Outcome | None:
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return None
    if status != TransactionStatus.INTRANS:
        await conn.rollback()
        raise HandlerConnectionError("the handler's transaction was aborted by a database error it caught")
    call = q.complete_one(job, worker) if result is None else complete_one_result(q.q, job, worker, result)
    if not await aexecute(conn, call):
        await conn.rollback()
        return "lease_lost"
    await conn.commit()
    return "done"


RUNNER_STREAK = 50
"""Jobs an async runner runs back to back before it lets the loop run its other callbacks (claims, results, leases).
A job that awaits lets them run anyway; this bounds a run of jobs that never await. Each yield costs a collection
of results and a look by the claim loop (the streak's measurement: bench/HISTORY.md, "Behind the code")."""


class AsyncExecutor:
    """Runs async handlers on ``size`` long-lived runner tasks of the loop; ``job.conn`` comes from an async pool on
    first use. Like a handler thread, a runner whose job returned frees its slot and takes the next waiting job
    itself (:meth:`Slots.next_for_task`): no task, no name, no scheduling and no loop round trip per job. A runner
    that takes a job while more wait wakes one idle runner first, so a job that awaits never holds the others back.

    Each job still starts in a clean state: a runner whose job left a context variable set, or its task cancelled
    (a cancel the handler swallowed), gives way to a fresh runner (a new task, in a copy of the worker's context)
    before the next job. ``entry.handle`` is the runner's task while it runs that job, so a job's cancel reaches
    only that job."""

    def __init__(
        self,
        size: int,
        slots: Slots,
        pool: AsyncConnectionPool[Any],
        queries: Statements,
        worker: str,
        report: Callable[[Entry], None],
    ) -> None:
        self.pool = pool
        self._slots = slots
        self._q = queries
        self._durable = AsyncDurable(pool, queries.q, queries.settings.max_payload_bytes)  # job.step, parent_results
        self._worker = worker
        self._report = report
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()  # what each runner starts from
        self._idle: list[asyncio.Future[None]] = []  # idle runners, each waiting on its own future
        self._waking = False  # a runner was woken and has not run yet: one at a time (a chain, as for threads)
        self._closing = False
        self._runners: set[asyncio.Task[None]] = set()
        for _ in range(size):
            self._spawn(None)

    def _spawn(self, ended: Entry | None) -> None:
        task = self._loop.create_task(self._runner(ended), name="skiplock-runner", context=self._context.copy())
        self._runners.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A runner task ended: retired (its successor already runs), or cancelled (its job handed back at the end of
        a drain, or the handler cancelled its own task), or broken: a successor keeps the slots served."""
        self._runners.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("async runner failed", exc_info=exc, extra={"action": "runner_failed"})
        elif not task.cancelled():
            return  # retired: its successor was spawned before it returned
        if not self._closing and self._slots.open:
            self._spawn(None)

    def wake(self) -> None:
        """Wake an idle runner when an async job waits and may start (after a claim, or when results freed slots)."""
        while self._idle and not self._waking and self._slots.task_work():
            idle = self._idle.pop()
            if not idle.done():  # not one cancelled meanwhile (stop)
                self._waking = True
                idle.set_result(None)

    async def _runner(self, ended: Entry | None) -> None:
        slots = self._slots
        task = asyncio.current_task()
        assert task is not None
        context = contextvars.copy_context()
        lazy = AsyncLazyConnection(self._checkout)  # job.conn of this runner's jobs, cleared for each
        traced = tracing.state  # traced.tracer: None unless a tracer provider is configured (skiplock.tracing)
        entry: Entry | None = ended
        streak = 0
        while True:
            entry = slots.next_for_task(entry)
            if entry is None:
                idle = self._loop.create_future()
                self._idle.append(idle)
                try:
                    await idle
                finally:
                    if idle.done() and not idle.cancelled():  # it was woken (even if cancelled before it ran)
                        self._waking = False
                streak = 0
                continue
            if self._idle and not self._waking:  # (wake()'s own first test: no call a job while none is idle)
                self.wake()  # more jobs wait: another runner, in case this job awaits
            entry.handle = task
            lazy.conn = lazy.failed = None
            span = tracing.start(entry.job) if traced.tracer is not None else None
            try:
                entry.outcome = await self._unit(entry, lazy)
            except asyncio.CancelledError:
                # cancelled: its writes are rolled back, the row says cancelled; else past the grace period of a
                # drain: the job is handed back
                entry.outcome = "cancelled" if entry.cancelled else "handed_back"
                if entry.outcome == "handed_back":
                    self._ran(entry, span)
                    raise
            except Snooze as exc:
                entry.outcome, entry.error = "snoozed", exc
            except BaseException as exc:  # the handler raised: retry or fail, fenced
                entry.outcome, entry.error = ("timed_out" if is_timeout(exc) else "failed"), exc
            self._ran(entry, span)
            if task.cancelling() or contextvars.copy_context() != context:
                self._spawn(entry)  # the next job runs in a clean task; the successor frees this job's slot
                return
            streak += 1
            if streak >= RUNNER_STREAK:
                streak = 0
                await asyncio.sleep(0)

    def _ran(self, entry: Entry, span: tracing.Running | None) -> None:
        """A job's outcome is known: its span ended, its result reported (its slot is freed by the next job taken)."""
        entry.handle = None
        entry.finished = time.monotonic()
        if span is not None:
            tracing.end(span, entry.job, entry.outcome, entry.error)
        self._report(entry)

    async def _checkout(self) -> Any:
        """A job connection with its transaction already open, so the handler's ``transaction()`` blocks are
        savepoints inside it: nothing the handler writes commits outside the fenced completion."""
        conn = await self.pool.getconn()
        try:
            await conn.execute("BEGIN")
        except BaseException:
            await self.pool.putconn(conn)
            raise
        return conn

    async def _unit(self, entry: Entry, lazy: AsyncLazyConnection) -> Outcome:
        job, target = entry.job, entry.target
        timeout = job.timeout_seconds if job.timeout_seconds is not None else target.timeout_seconds  # timeout_for()
        # bound in place for its handler (no copy of the job, no call): job.conn, job.cancelled and job.step read
        # the entry through the job's field; cleared once it returned
        entry.conn, entry.durable = lazy, self._durable
        fields = job.__dict__
        fields["_cancel"] = entry  # the entry is bound to its job (skiplock.job.Bound): one field, not three
        try:
            try:
                if timeout is None:
                    value = await target.func(job)
                else:
                    deadline = asyncio.timeout(timeout)  # cancels the handler at the deadline
                    try:
                        async with deadline:
                            value = await target.func(job)
                    except TimeoutError:
                        if deadline.expired():
                            raise timed_out_error(timeout) from None
                        raise
                if value is not None:  # the task's return value, stored with `done` (or the attempt fails)
                    entry.result = encode_result(value, self._q.settings.max_payload_bytes)
            except BaseException:
                if lazy.conn is not None:
                    with contextlib.suppress(psycopg.Error):  # keep the handler's exception
                        await lazy.conn.rollback()
                raise
            if lazy.failed is not None:  # the handler swallowed it: its writes never happened
                raise HandlerConnectionError(f"job.conn could not be checked out: {lazy.failed}")
            if lazy.conn is None:  # it never used job.conn (most handlers): no coroutine to learn that
                return "done"
            written = await _finish_async(lazy.conn, job, self._worker, self._q, entry.result)
            if written is None:
                return "done"
            entry.written = True
            return written
        finally:
            # the job and its entry no longer refer to each other: freed without the GC
            fields["_cancel"] = None
            if lazy.conn is not None:
                await self.pool.putconn(lazy.conn)

    async def stop(self) -> None:
        """Stop the runners (idle by now, or running jobs already handed back): no successor starts."""
        self._closing = True
        runners = list(self._runners)
        for t in runners:
            t.cancel()
        await asyncio.gather(*runners, return_exceptions=True)

    async def close(self) -> None:
        await self.stop()
        await self.pool.close()


class ThreadExecutor:
    """Runs sync handlers on ``size`` long-lived daemon threads. Each thread takes its next job from the slots itself
    (:meth:`Slots.next_for_thread`) and posts its result back to the loop, in batches (one loop wake-up for every
    result posted until it runs). Threads cannot be cancelled: a job still running past the grace period is handed
    back and its late result is dropped (its completion would be fenced out anyway)."""

    def __init__(
        self,
        size: int,
        slots: Slots,
        pool: ConnectionPool[Any],
        queries: Statements,
        worker: str,
        report: Callable[[list[Entry]], None],
        expire: Callable[[Entry, BaseException], None],
    ) -> None:
        self.pool = pool
        self._slots = slots
        self._q = queries
        self._durable = Durable(pool, queries.q, queries.settings.max_payload_bytes)
        self._worker = worker
        self._report = report
        self._expire = expire  # on the loop, at a sync job's timeout (its thread goes on)
        self._loop = asyncio.get_running_loop()
        self._outbox: deque[Entry] = deque()
        self._scheduled = False
        # Daemon threads: one stuck in a handler must not keep the process alive after its job was handed back.
        self._threads = [
            threading.Thread(target=self._thread, name=f"skiplock-handler-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, entry: Entry) -> None:
        """A sync job the loop started (one with a timeout: the thread cannot be interrupted, so at the deadline the
        job is reported timed out) goes to a thread."""
        timeout = timeout_for(entry.job, entry.target)
        if timeout is not None:
            entry.timer = self._loop.call_later(timeout, self._expire, entry, timed_out_error(timeout))
        self._slots.hand(entry)

    def _thread(self) -> None:
        clock = time.monotonic
        slots = self._slots
        outbox = self._outbox
        lazy = LazyConnection(self._checkout)  # job.conn of this thread's jobs, cleared for each
        traced = tracing.state  # traced.tracer: None unless a tracer provider is configured (skiplock.tracing)
        entry = slots.next_for_thread()
        while entry is not None:
            lazy.conn = lazy.failed = None
            span = tracing.start(entry.job) if traced.tracer is not None else None
            try:
                entry.outcome = self._unit(entry, lazy)
            except Snooze as exc:
                entry.outcome, entry.error = "snoozed", exc
            except BaseException as exc:
                entry.outcome, entry.error = "failed", exc
            if span is not None:
                tracing.end(span, entry.job, entry.outcome, entry.error)
            now = entry.finished = clock()
            outbox.append(entry)
            if not self._scheduled:
                self._post()
            # its slot is free for the next job now; the job stays held until its result is written
            entry = slots.next_for_thread(entry, now)

    def _post(self) -> None:
        """Have the loop collect the posted results (one loop wake-up carries every result posted until it runs)."""
        if not self._scheduled:
            self._scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has exited
                self._loop.call_soon_threadsafe(self.collect)

    def collect(self) -> None:
        """On the loop: hand every posted result to the worker."""
        self._scheduled = False  # before draining: a result posted from now on schedules another call
        outbox = self._outbox
        results = [outbox.popleft() for _ in range(len(outbox))]  # each thread only appends meanwhile
        if results:
            self._report(results)

    def _checkout(self) -> Any:
        """As :meth:`AsyncExecutor._checkout`: the job's transaction is open before the handler sees it."""
        conn = self.pool.getconn()
        try:
            conn.execute("BEGIN")
        except BaseException:
            self.pool.putconn(conn)
            raise
        return conn

    def _unit(self, entry: Entry, lazy: LazyConnection) -> Outcome:
        job = entry.job
        # bound in place for its handler (no copy of the job, no call): job.conn, job.cancelled and job.step read
        # the entry through the job's field; cleared once it returned
        entry.conn, entry.durable = lazy, self._durable
        fields = job.__dict__
        fields["_cancel"] = entry  # (see AsyncExecutor._unit)
        try:
            try:
                value = entry.target.func(job)
                if value is not None:
                    entry.result = encode_result(value, self._q.settings.max_payload_bytes)
            except BaseException:
                if lazy.conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        lazy.conn.rollback()
                raise
            if lazy.failed is not None:
                raise HandlerConnectionError(f"job.conn could not be checked out: {lazy.failed}")
            if lazy.conn is None:
                return "done"
            written = _finish_sync(lazy.conn, job, self._worker, self._q, entry.result)
            if written is None:
                return "done"
            entry.written = True
            return written
        finally:
            fields["_cancel"] = None  # see AsyncExecutor._unit
            if lazy.conn is not None:
                self.pool.putconn(lazy.conn)

    def close(self, *, join: bool) -> None:
        """Stop the threads after their current job; with ``join``, wait for them and close the pool."""
        self._slots.close()
        if join:
            for t in self._threads:
                t.join(timeout=5)
            self.pool.close()


class Results(Protocol):
    """What the executors report to: the completer (:class:`skiplock.worker.completer.Completer`)."""

    def finished(self, results: list[Entry]) -> None:
        """Entries whose handlers returned, their slots freed: dispatched by outcome."""

    def fail(self, failure: Failure, cause: Outcome = "failed") -> None:
        """A claimed job that cannot run here (a payload no handler can receive, a task this worker lacks)."""

    def timed_out(self, entry: Entry, error: BaseException, stuck: int) -> None:
        """A sync handler ran past its timeout; its slot is now stuck (``stuck`` slots are)."""


class Executors:
    """The executors seam: the one owner of the slots. It admits claimed jobs to the buffer (routing each to what
    runs it), starts them as slots free (handler threads and async runners take theirs themselves), hands each batch
    of results to the completer, and answers the claimer (room, the buffer) and the leases (the jobs it holds) with
    small methods: no other seam touches the slots."""

    def __init__(
        self,
        scope: Scope,
        router: Router,
        results: Results,
        wakeup: Wakeup,
        bound: dict[str, BoundMetrics],
        *,
        statements: Statements | None = None,
        thread_pool: ConnectionPool[Any] | None = None,
        task_pool: AsyncConnectionPool[Any] | None = None,
    ) -> None:
        s = scope.settings
        self._settings = s
        self._router = router
        self._results = results
        self._wakeup = wakeup
        self._bound = bound
        lease = min([s.lease_seconds, *scope.lease_overrides.values()])  # the shortest lease of any job it runs
        slots = self._slots = Slots(s.concurrency, lease=lease, freed=wakeup.freed)
        for queue, m in bound.items():  # read at each scrape: handler threads start jobs the loop never sees
            m.in_flight.set_function(partial(slots.running_in, queue))
        self._async_results: list[Entry] = []  # async results of this loop iteration, collected together
        self._abandoned: list[Job] = []  # jobs of handler threads still running after the grace period
        self.abandoned = 0  # handler threads left in their handlers at the end of a drain
        self._threads = self._tasks = None
        if thread_pool is not None:
            assert statements is not None
            self._threads = ThreadExecutor(
                s.concurrency, slots, thread_pool, statements, scope.identity, self._collected, self._expire
            )
        if task_pool is not None:
            assert statements is not None
            self._tasks = AsyncExecutor(s.concurrency, slots, task_pool, statements, scope.identity, self._finished_one)

    @classmethod
    async def open(
        cls,
        scope: Scope,
        router: Router,
        results: Results,
        wakeup: Wakeup,
        bound: dict[str, BoundMetrics],
        statements: Statements,
    ) -> Executors:
        """Open ``job.conn``'s pool for each colour of handler the router has (sync, async), and start the executors."""
        s = scope.settings
        dsn, kinds = s.require_dsn(), router.kinds
        size = s.concurrency + SPARE_HANDLER_CONNECTIONS  # a step of a handler holding job.conn takes the spare
        task_pool = async_pool(dsn, "skiplock-handlers", size, timeout=30) if True in kinds else None
        thread_pool = sync_pool(dsn, "skiplock-handlers", size, timeout=30) if False in kinds else None
        try:
            if task_pool is not None:
                await task_pool.open()
            if thread_pool is not None:
                await asyncio.to_thread(thread_pool.open)
        except BaseException:
            if task_pool is not None:
                await task_pool.close()
            if thread_pool is not None:
                await asyncio.to_thread(thread_pool.close)
            raise
        return cls(
            scope, router, results, wakeup, bound, statements=statements, thread_pool=thread_pool, task_pool=task_pool
        )

    # ------------------------------------------------------------------ the claimer's side: the buffer
    def admit(self, jobs: list[Job]) -> None:
        """A claim's jobs: each routed to what runs it and buffered (a payload no handler can receive, or a task this
        worker does not know, is failed at once)."""
        # the clock in the rows' own time zone: datetimes sharing one tzinfo subtract without asking it for offsets
        zone = jobs[0].visible_at.tzinfo if jobs and jobs[0].visible_at is not None else None
        now = datetime.now(zone or UTC)
        claimed = time.monotonic()
        targets = self._router.targets
        entries = []
        visible: object = _NO_JOB  # the last job's visible_at, whose wait the next job visible then reuses
        waited = 0.0
        for job in jobs:
            if job._decode_error is not None:  # never retried
                self._results.fail(Failure(job, job._decode_error, 0.0, False))
                continue
            target = targets.get(job.task)
            if target is None:  # retried with backoff, failed when attempts are spent
                self._results.fail(failure_for(job, self._router.unknown(job), None, self._settings), "unknown_task")
                continue
            if job.visible_at != visible:  # jobs enqueued together are claimed together (claim order: due time)
                visible = at = job.visible_at
                delta = (now - at).total_seconds() if at is not None else 0.0
                waited = delta if delta > 0.0 else 0.0  # not max(), which parses keyword arguments
            entries.append(Entry(job, target, claimed, waited))
        bound = self._bound
        if jobs:
            counts = [(bound[queue].claimed, n) for queue, n in queue_counts(jobs, len(bound))]
            bound[jobs[0].queue].tally.add(counts=counts)  # one tally for every queue
            tracing.claimed(len(jobs))  # no tracer yet: looks for one every so many jobs
        self._slots.wait(entries)

    def start(self) -> None:
        """Start the buffered jobs the loop runs in the free slots (sync jobs with a timeout) and wake an async runner
        for the async ones; handler threads take theirs themselves. Called after a claim and whenever slots free."""
        if self._wakeup.stopping.is_set():
            return
        threads = self._threads
        for entry in self._slots.start_for_loop():
            assert threads is not None
            threads.submit(entry)
        if self._tasks is not None:
            self._tasks.wake()

    @property
    def capacity(self) -> int:
        return self._slots.capacity

    @property
    def started(self) -> int:
        """Jobs started so far (the pace that sizes the buffer)."""
        return self._slots.started

    def free(self) -> int:
        return self._slots.free()

    def running(self) -> int:
        """Jobs held from their start until their results are collected."""
        return len(self._slots)

    def waiting(self) -> int:
        """Jobs in the buffer (claimed, not started)."""
        return self._slots.waiting()

    def oldest_claim(self) -> float | None:
        return self._slots.oldest_claim()

    def buffered(self) -> list[Job]:
        """Jobs claimed but not started."""
        return [e.job for e in self._slots.waiting_entries()]

    def take_buffer(self) -> list[Job]:
        """Empty the buffer (a drain): the jobs to hand back."""
        return [e.job for e in self._slots.drop_waiting(lambda e: False)]

    def take_expired(self) -> list[Job]:
        """Buffered jobs a slot refused to start because their lease had run out (see :class:`Slots`)."""
        return [e.job for e in self._slots.take_expired()]

    def drop_waiting_longer(self, limit: Callable[[Job], float], now: float) -> list[Job]:
        """Remove the buffered jobs claimed more than ``limit(job)`` seconds before ``now``: they never start."""
        return [e.job for e in self._slots.drop_waiting(lambda e: now - e.claimed <= limit(e.job))]

    # ------------------------------------------------------------------ the leases' side: the jobs held
    def jobs(self) -> list[Job]:
        """Jobs whose lease this worker holds here, waiting or running (a stuck one's job was already failed)."""
        return self._slots.jobs()

    def holds(self, job: Job) -> bool:
        return self._slots.holds(job)

    def forget_waiting(self, jobs: list[Job]) -> list[Job]:
        """Remove these attempts from the buffer (their leases were lost): returns the ones removed."""
        return self._slots.forget_waiting(jobs)

    def mark_renewed(self, sent: float) -> None:
        self._slots.mark_renewed(sent)

    def cancel(self, ids: set[int]) -> list[Job]:
        """Jobs of ``ids`` were cancelled in the database: buffered ones never start (returned), running ones are told
        (sync handlers see ``job.cancelled``, async ones are cancelled; their results come back ``cancelled``)."""
        dropped = [e.job for e in self._slots.drop_waiting(lambda e: e.job.id not in ids)]
        for e in self._slots.cancel(ids):
            log.info(
                "cancelling a running job", extra={"action": "job_cancelling", "queue": e.job.queue, "job_id": e.job.id}
            )
        return dropped

    # ------------------------------------------------------------------ results
    def _collected(self, results: list[Entry]) -> None:
        """Results of a batch (on the loop): the ones still held are forgotten (their slots freed) and go to the
        completer; then buffered jobs start in the freed slots. A late result of a job handed back is dropped."""
        held = self._slots.collect(results)
        if held:
            self._results.finished(held)
        self.start()

    def _finished_one(self, entry: Entry) -> None:
        """An async job's result: collected with the others of this loop iteration (one batch, one refill)."""
        if not self._async_results:
            asyncio.get_running_loop().call_soon(self._collect_async)
        self._async_results.append(entry)

    def _collect_async(self) -> None:
        results, self._async_results = self._async_results, []
        if results:
            self._collected(results)

    def collect(self) -> None:
        """Every result posted so far (drain, exit): counted as finished, not rerun."""
        if self._threads is not None:
            self._threads.collect()
        self._collect_async()

    def _expire(self, entry: Entry, error: BaseException) -> None:
        """A sync job's timeout (on the loop): unless its result was collected or it was handed back, its slot is
        stuck until the thread returns, and the completer fails the job now."""
        if self._slots.get(entry.job) is not entry or entry.stuck:
            return
        entry.stuck = True
        self._results.timed_out(entry, error, self._slots.stuck())

    # ------------------------------------------------------------------ lifecycle
    def stuck(self) -> int:
        """Slots taken by sync handlers past their timeout."""
        return self._slots.stuck()

    def shut(self) -> None:
        """Draining: no buffered job starts any more."""
        self._slots.shut()

    async def drain(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the running jobs (less once the stop is forced), then give up on the rest:
        async jobs are cancelled (reported handed back), handler threads are left to run (their jobs handed back,
        see :meth:`take_abandoned`)."""
        slots = self._slots
        if not len(slots):
            return
        log.info("waiting up to %.0fs for %d in-flight job(s)", grace, len(slots), extra={"action": "drain_wait"})
        deadline = time.monotonic() + grace
        while len(slots) and time.monotonic() < deadline and not self._wakeup.forced:
            slots.freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slots.freed.wait(), timeout=max(0.01, deadline - time.monotonic()))
        self.collect()  # results already posted count as finished
        left = slots.entries()
        if not left:
            return
        log.warning(
            "grace period over: handing back %d job(s) still running", len(left), extra={"action": "drain_timeout"}
        )
        handles = [e.handle for e in left if e.handle is not None]
        for e in left:
            if e.handle is None and slots.pop(e.job) is not None:  # a thread: forget it, hand its job back
                self._abandoned.append(e.job)
                self.abandoned += 1
        for h in handles:
            h.cancel()
        if handles:
            await asyncio.wait(handles, timeout=5)

    def take_abandoned(self) -> list[Job]:
        """Jobs of handler threads given up at the end of a drain: to hand back."""
        jobs, self._abandoned = self._abandoned, []
        return jobs

    async def close(self) -> None:
        """Stop the handler threads and the runners, close their pools. Threads left in their handlers (they cannot be
        interrupted; their jobs were handed back and a late completion is fenced out) are not joined: the CLI exits
        without them."""
        if self._threads is not None:
            if self.abandoned:
                log.warning(
                    "%d handler thread(s) still running at exit", self.abandoned, extra={"action": "threads_left"}
                )
                self._threads.close(join=False)
            else:
                await asyncio.to_thread(self._threads.close, join=True)
        if self._tasks is not None:
            await self._tasks.close()
