"""Running jobs: which function runs a job (routing), the slots, and the two executors that run one job's
fenced unit and report one :data:`Outcome`.

The fenced unit: call the handler with ``job``; a handler that wrote through ``job.conn`` is completed in that
same transaction (fenced: only while this worker still holds this attempt's lease), one that did not is
``deferred`` to the completer's batch. Sync handlers run on ``concurrency`` long-lived threads whose results come
back to the loop in batches (one wake-up for many jobs); async handlers run as tasks. ``job.conn`` is checked out
on first use only, for both kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock.app import App, Task
from skiplock.errors import Snooze
from skiplock.handlers import Handler
from skiplock.job import AsyncLazyConnection, Job, LazyConnection
from skiplock.queue import fence_params
from skiplock.sql import Queries

log = logging.getLogger(__name__)

# While most recent handlers (SHORT_SHARE of them) return within this long, a thread wake-up carries up to CHUNK jobs.
SHORT_HANDLER_SECONDS = 0.00005
SHORT_SHARE = 0.8
CHUNK = 16
# What a chunk has not run this long after dispatch goes to the threads one job at a time (a slow job in a chunk
# never keeps the others from an idle thread for longer).
REBALANCE_SECONDS = 0.002

Outcome = Literal["done", "deferred", "failed", "lease_lost", "released", "cancelled", "timed_out", "snoozed"]
"""done: completed in the handler's transaction; deferred: to be completed in a batch; failed: the handler raised
(or the job cannot run); lease_lost: the fence refused the completion (writes rolled back); released: handed back;
cancelled: the job was cancelled while it ran (its writes rolled back, the row already says so); timed_out: a sync
handler ran past its timeout (reported at the deadline while its thread goes on: the slot is stuck until it returns);
snoozed: the handler raised Snooze (its writes rolled back; to run again later without using an attempt).
"""


def timeout_for(job: Job, target: Target) -> float | None:
    """The job's own timeout, else its task's, else none."""
    if job.timeout_seconds is not None:
        return job.timeout_seconds
    return target.task.options.timeout_seconds if target.task is not None else None


TIMEOUT_NOTE = "skiplock: the job's timeout"


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


@dataclass(frozen=True, slots=True)
class Target:
    """What runs a job: the function, its colour, and the task (for its options), if any."""

    func: Callable[..., Any]
    is_async: bool
    task: Task | None = None


@dataclass(slots=True)
class Result:
    job: Job
    outcome: Outcome
    error: BaseException | None
    finished: float  # time.monotonic()
    task: Task | None = None
    timed_out: bool = False  # the error is the job's timeout


class Router:
    """Job -> Target: the app's task named by the job, or the catch-all handler for jobs without a task."""

    def __init__(self, app: App | None, handler: Handler | None) -> None:
        self.app = app
        self.default = Target(handler.func, handler.is_async) if handler is not None else None
        self._targets = {t.name: Target(t.func, t.is_async, t) for t in (app or ())}

    def resolve(self, job: Job) -> Target | UnknownTaskError:
        if job.task is None:
            if self.default is not None:
                return self.default
            return UnknownTaskError("job has no task and this worker has no default handler (--handler)")
        target = self._targets.get(job.task)
        if target is None:
            return UnknownTaskError(f"no task {job.task!r} registered in this worker")
        return target

    def task(self, name: str | None) -> Task | None:
        target = self._targets.get(name) if name is not None else None
        return target.task if target is not None else None

    @property
    def kinds(self) -> set[bool]:
        """Colours in use: True for async, False for sync (a worker opens pools and threads only for these)."""
        targets = list(self._targets.values()) + ([self.default] if self.default else [])
        return {t.is_async for t in targets}

    def lease_overrides(self) -> dict[str, float]:
        return {t.name: t.options.lease_seconds for t in (self.app or ()) if t.options.lease_seconds is not None}

    def timeouts(self) -> dict[str, float]:
        return {t.name: t.options.timeout_seconds for t in (self.app or ()) if t.options.timeout_seconds is not None}


class CancelFlag:
    """``job.cancelled``: a flag one thread sets and another reads (a threading.Event costs a lock and a
    condition per job; nothing here ever waits on it)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


Item = tuple[Job, Target, CancelFlag]
"""A job handed to a handler thread, with what runs it and its cancel flag."""


@dataclass(slots=True)
class Entry:
    job: Job
    started: float
    handle: asyncio.Task[None] | None = None  # async jobs only; sync ones run on the handler threads
    cancel: CancelFlag = field(default_factory=CancelFlag)  # set when the job is cancelled (job.cancelled)
    stuck: bool = False  # a sync handler past its timeout: its job was failed, its thread still runs
    timer: asyncio.TimerHandle | None = None  # the sync handler's timeout

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()


class Slots:
    """The jobs running now (at most ``capacity``); ``freed`` is set whenever one ends."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._running: dict[int, Entry] = {}
        self.freed = asyncio.Event()
        self.per_queue: dict[str, int] = {}  # running jobs by queue (the in-flight gauges, set once per batch)

    def free(self) -> int:
        return self.capacity - len(self._running)

    def __len__(self) -> int:
        return len(self._running)

    def add(self, job: Job, started: float) -> Entry:
        entry = self._running[job.id] = Entry(job, started)
        self.per_queue[job.queue] = self.per_queue.get(job.queue, 0) + 1
        return entry

    def pop(self, job: Job) -> Entry | None:
        """Forget ``job`` (same attempt only); None when it was handed back meanwhile."""
        entry = self._running.get(job.id)
        if entry is None or entry.job.attempts != job.attempts:
            return None
        del self._running[job.id]
        if entry.timer is not None:
            entry.timer.cancel()
        self.per_queue[job.queue] -= 1
        self.freed.set()
        return entry

    def holds(self, job: Job) -> bool:
        entry = self._running.get(job.id)
        return entry is not None and entry.job.attempts == job.attempts and not entry.stuck

    def get(self, job: Job) -> Entry | None:
        entry = self._running.get(job.id)
        return entry if entry is not None and entry.job.attempts == job.attempts else None

    def stuck(self) -> int:
        return sum(1 for e in self._running.values() if e.stuck)

    def cancel(self, ids: set[int]) -> list[Entry]:
        """Tell the running jobs of ``ids`` they were cancelled: sync handlers see ``job.cancelled``, async ones
        are cancelled. Their results come back as ``cancelled``."""
        hit = [e for e in self._running.values() if e.job.id in ids and not e.cancelled]
        for e in hit:
            e.cancel.set()
            if e.handle is not None:
                e.handle.cancel()
        return hit

    def entries(self) -> list[Entry]:
        return list(self._running.values())

    def jobs(self) -> list[Job]:
        """Jobs whose lease this worker holds (a stuck one's job was already failed)."""
        return [e.job for e in self._running.values() if not e.stuck]


def _finish_sync(conn: psycopg.Connection[Any] | None, job: Job, worker: str, q: Queries) -> Outcome:
    """After a sync handler returned: complete in its transaction when it used job.conn, else defer to the batch.
    (IDLE: the handler ended the job's transaction itself, with ``commit()`` or ``rollback()``: documented as
    unfenced; the job is completed in the batch.)"""
    if conn is None:
        return "deferred"
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return "deferred"
    if status != TransactionStatus.INTRANS:
        conn.rollback()
        raise HandlerConnectionError("the handler's transaction was aborted by a database error it caught")
    if conn.execute(q.job_complete, fence_params([job], worker, None)).fetchone() is None:
        conn.rollback()
        return "lease_lost"
    conn.commit()
    return "done"


async def _finish_async(conn: psycopg.AsyncConnection[Any] | None, job: Job, worker: str, q: Queries) -> Outcome:
    if conn is None:
        return "deferred"
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return "deferred"
    if status != TransactionStatus.INTRANS:
        await conn.rollback()
        raise HandlerConnectionError("the handler's transaction was aborted by a database error it caught")
    if await (await conn.execute(q.job_complete, fence_params([job], worker, None))).fetchone() is None:
        await conn.rollback()
        return "lease_lost"
    await conn.commit()
    return "done"


class AsyncExecutor:
    """Runs async handlers as tasks of the loop; ``job.conn`` comes from an async pool on first use."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], queries: Queries, worker: str, report: Callable[[Result], None]
    ) -> None:
        self.pool = pool
        self._q = queries
        self._worker = worker
        self._report = report

    def submit(self, job: Job, target: Target, entry: Entry) -> None:
        entry.handle = asyncio.create_task(self._run(job, target, entry.cancel), name=f"job-{job.id}")

    async def _run(self, job: Job, target: Target, cancel: CancelFlag) -> None:
        try:
            outcome = await self._unit(job, target, cancel)
            result = Result(job, outcome, None, time.monotonic(), target.task)
        except asyncio.CancelledError:
            if cancel.is_set():  # the job was cancelled: its writes are rolled back, the row says cancelled
                self._report(Result(job, "cancelled", None, time.monotonic(), target.task))
                return
            # past the grace period of a drain: the job is handed back
            self._report(Result(job, "released", None, time.monotonic(), target.task))
            raise
        except Snooze as exc:
            result = Result(job, "snoozed", exc, time.monotonic(), target.task)
        except BaseException as exc:  # the handler raised: retry or fail, fenced
            result = Result(job, "failed", exc, time.monotonic(), target.task, is_timeout(exc))
        self._report(result)

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

    async def _unit(self, job: Job, target: Target, cancel: CancelFlag) -> Outcome:
        pool = self.pool
        lazy = AsyncLazyConnection(self._checkout)
        timeout = timeout_for(job, target)
        try:
            try:
                if timeout is None:
                    await target.func(job.with_conn(lazy, cancel))
                else:
                    deadline = asyncio.timeout(timeout)  # cancels the handler at the deadline
                    try:
                        async with deadline:
                            await target.func(job.with_conn(lazy, cancel))
                    except TimeoutError:
                        if deadline.expired():
                            raise timed_out_error(timeout) from None
                        raise
            except BaseException:
                if lazy.conn is not None:
                    with contextlib.suppress(psycopg.Error):  # keep the handler's exception
                        await lazy.conn.rollback()
                raise
            if lazy.failed is not None:  # the handler swallowed it: its writes never happened
                raise HandlerConnectionError(f"job.conn could not be checked out: {lazy.failed}")
            return await _finish_async(lazy.conn, job, self._worker, self._q)
        finally:
            if lazy.conn is not None:
                await pool.putconn(lazy.conn)

    async def close(self) -> None:
        await self.pool.close()


class ThreadExecutor:
    """Runs sync handlers on ``size`` long-lived daemon threads fed by a queue; results are posted back to the loop
    in batches. Threads cannot be cancelled: a job still running past the grace period is handed back and its late
    result is dropped (its completion would be fenced out anyway)."""

    def __init__(
        self,
        size: int,
        pool: ConnectionPool[Any],
        queries: Queries,
        worker: str,
        report: Callable[[list[Result]], None],
    ) -> None:
        self.pool = pool
        self._q = queries
        self._worker = worker
        self._report = report
        self._loop = asyncio.get_running_loop()
        self._inbox: queue.SimpleQueue[Item | deque[Item] | None] = queue.SimpleQueue()
        self._staged: list[Item] = []
        self._chunks: list[deque[Item]] = []  # dispatched chunks, until the rebalance after REBALANCE_SECONDS
        self._rebalancing = False
        # The recent share of handlers that returned within SHORT_HANDLER_SECONDS (an average the threads keep; a
        # share, not a mean time, so a thread that waited once for the GIL does not switch chunking off). Starts slow.
        self.short = 0.0
        self._outbox: deque[Result] = deque()
        self._scheduled = False
        self.skip: Callable[[Job], bool] = lambda job: False  # a job handed back before its thread got to it
        # Daemon threads: one stuck in a handler must not keep the process alive after its job was handed back.
        self._threads = [
            threading.Thread(target=self._thread, name=f"skiplock-handler-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job, target: Target, entry: Entry) -> None:
        """Stage a job; :meth:`dispatch` hands the staged jobs to the threads."""
        timeout = timeout_for(job, target)
        if timeout is not None:  # the thread cannot be interrupted: at the deadline the job is reported timed out
            entry.timer = self._loop.call_later(timeout, self._expire, job, target, timeout)
            self._inbox.put((job, target, entry.cancel))  # never queued behind another job: its clock runs
            return
        self._staged.append((job, target, entry.cancel))

    def dispatch(self) -> None:
        """Hand the staged jobs to the threads: one per wake-up, or, while recent handlers return within
        ``SHORT_HANDLER_SECONDS`` (trivial work: the GIL runs them one at a time anyway), up to ``CHUNK`` per wake-up,
        run in turn by one thread: waking a thread costs more than such a handler. A job that turns out slow holds
        the rest of its chunk for at most ``REBALANCE_SECONDS``; then they go to other threads one by one."""
        staged, self._staged = self._staged, []
        if self.short > SHORT_SHARE and len(staged) > 1:
            for i in range(0, len(staged), CHUNK):
                chunk = deque(staged[i : i + CHUNK])
                self._chunks.append(chunk)
                self._inbox.put(chunk)
            if not self._rebalancing:
                self._rebalancing = True
                self._loop.call_later(REBALANCE_SECONDS, self._rebalance)
        else:
            for item in staged:
                self._inbox.put(item)

    def _rebalance(self) -> None:
        """Jobs still waiting in a chunk a moment after dispatch (one of its jobs is slow after all) go to the
        threads one by one, so an idle thread takes them; results a chunk posted so far are collected."""
        self._rebalancing = False
        self.collect()
        chunks, self._chunks = self._chunks, []
        for chunk in chunks:
            while True:
                try:
                    item = chunk.popleft()  # atomic: each job is taken once, by its chunk's thread or from here
                except IndexError:
                    break
                self._inbox.put(item)

    def _expire(self, job: Job, target: Target, timeout: float) -> None:
        self._report([Result(job, "timed_out", timed_out_error(timeout), time.monotonic(), target.task, True)])

    def _thread(self) -> None:
        clock = time.monotonic
        while (item := self._inbox.get()) is not None:
            chunk: deque[Item]
            if isinstance(item, deque):
                chunked, chunk = True, item
            else:
                chunked, chunk = False, deque((item,))
            while True:
                try:
                    job, target, cancel = chunk.popleft()
                except IndexError:
                    break
                if self.skip(job):
                    continue
                t0 = clock()
                try:
                    outcome = self._unit(job, target, cancel)
                    result = Result(job, outcome, None, clock(), target.task)
                except Snooze as exc:
                    result = Result(job, "snoozed", exc, clock(), target.task)
                except BaseException as exc:
                    result = Result(job, "failed", exc, clock(), target.task)
                short = result.finished - t0 < SHORT_HANDLER_SECONDS
                self.short += (short - self.short) * 0.05  # a benign race between threads: an estimate
                self._outbox.append(result)
                if not chunked or not short:  # a chunk posts once at its end (or at the rebalance), unless slow
                    self._post()
            if chunked:
                self._post()

    def _post(self) -> None:
        """Have the loop collect the posted results (one loop wake-up carries every result posted until it runs)."""
        if not self._scheduled:
            self._scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has exited
                self._loop.call_soon_threadsafe(self.collect)

    def collect(self) -> None:
        """On the loop: hand every posted result to the worker."""
        self._scheduled = False  # before draining: a result posted from now on schedules another call
        results = []
        while self._outbox:
            results.append(self._outbox.popleft())
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

    def _unit(self, job: Job, target: Target, cancel: CancelFlag) -> Outcome:
        pool = self.pool
        lazy = LazyConnection(self._checkout)
        try:
            try:
                target.func(job.with_conn(lazy, cancel))
            except BaseException:
                if lazy.conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        lazy.conn.rollback()
                raise
            if lazy.failed is not None:
                raise HandlerConnectionError(f"job.conn could not be checked out: {lazy.failed}")
            return _finish_sync(lazy.conn, job, self._worker, self._q)
        finally:
            if lazy.conn is not None:
                pool.putconn(lazy.conn)

    def busy_threads(self) -> int:
        return sum(1 for t in self._threads if t.is_alive())

    def close(self, *, join: bool) -> None:
        """Stop the threads after their current job; with ``join``, wait for them and close the pool."""
        for _ in self._threads:
            self._inbox.put(None)
        if join:
            for t in self._threads:
                t.join(timeout=5)
            self.pool.close()
