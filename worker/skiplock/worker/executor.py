"""Running jobs: which function runs a job (routing), the slots, and the two executors that run one job's
fenced unit and report one :data:`~skiplock.job.Outcome` (to the completer, which writes and counts it).

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
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock import tracing
from skiplock.app import App, Task
from skiplock.errors import Snooze
from skiplock.handlers import Handler
from skiplock.job import AsyncLazyConnection, Job, LazyConnection, Outcome
from skiplock.store.run import aexecute, execute
from skiplock.store.statements import Statements

log = logging.getLogger(__name__)


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
    by_thread: bool = field(init=False)  # a sync handler whose task sets no timeout (its jobs may set their own)

    def __post_init__(self) -> None:
        no_timeout = self.task is None or self.task.options.timeout_seconds is None
        object.__setattr__(self, "by_thread", not self.is_async and no_timeout)


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


@dataclass(slots=True, eq=False)
class Entry:
    """A claimed job on its way through this worker: waiting for a slot (prefetched), then running, then its result
    on its way back to the loop (the executors report the entry itself: no result object per job)."""

    job: Job
    target: Target
    claimed: float  # time.monotonic() at its claim
    waited: float = 0.0  # seconds from visible (enqueue or retry due) to its claim
    started: float = 0.0  # time.monotonic() at its start
    busy: bool = False  # it takes a slot: from its start until its handler returns (or its entry is dropped)
    handle: asyncio.Task[None] | None = None  # the runner task while it runs this (async) job; threads have none
    cancelled: bool = False  # the job was cancelled while it ran (job.cancelled)
    stuck: bool = False  # a sync handler past its timeout: its job was failed, its thread still runs
    timer: asyncio.TimerHandle | None = None  # the sync handler's timeout
    outcome: Outcome | None = None  # set by the executor once the handler returned (or the job was handed back):
    # done, failed, timed_out, snoozed, cancelled, lease_lost or handed_back (the completer decides the rest)
    written: bool = False  # done: completed in the handler's own transaction (else the completer writes it)
    error: BaseException | None = None  # what the handler raised (failed, timed_out, snoozed)
    finished: float = 0.0  # time.monotonic() when the handler returned

    def is_set(self) -> bool:
        """What ``job.cancelled`` reads in the handler (the entry is the job's cancel flag: one thread sets it and
        another reads it, nothing waits on it, so no Event and no object of its own per job)."""
        return self.cancelled


class Slots:
    """The jobs this worker holds: claimed ones waiting for a slot (the prefetch buffer) and running ones (at most
    ``capacity`` busy), shared by the loop and the handler threads under one lock. A handler thread whose job
    returned starts the next waiting sync job itself: no round trip through the loop between jobs. The loop starts
    the rest (async handlers, sync ones with a timeout), and collects every result: a running job stays held (its
    lease renewed) until then, its slot free as soon as its handler returned. Async jobs are taken the same way by
    the async runners (:meth:`next_for_task`), on the loop. ``freed`` is set on the loop whenever results free
    slots.

    A waiting job whose lease has run out by this worker's estimate (``lease`` seconds after its claim or after the
    last heartbeat that renewed it, whichever is later: the worker stalled, or heartbeats failed) never starts: it
    is set aside for the loop to hand back (:meth:`take_expired`), since another worker may have recovered it."""

    def __init__(self, capacity: int, lease: float = float("inf")) -> None:
        self.capacity = capacity
        self.lease = lease  # the shortest lease of any job this worker runs
        self.renewed = 0.0  # time.monotonic() when the last heartbeat that renewed every held lease was sent
        self._expired: list[Entry] = []  # waiting jobs not started because their lease ran out (for the loop)
        # One plain lock, taken directly (a C-level context manager, not Condition.__enter__, which runs Python code
        # on every job); the condition on it is only for the handler threads' sleep and wake-up.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._running: dict[int, Entry] = {}
        self._busy = 0
        self._by_thread: deque[Entry] = deque()  # waiting: a handler thread starts them
        self._by_task: deque[Entry] = deque()  # waiting: an async runner starts them
        self._by_loop: deque[Entry] = deque()  # waiting: the loop starts them (sync jobs with a timeout)
        self._queues = (self._by_thread, self._by_task, self._by_loop)
        self._handed: deque[Entry] = deque()  # started by the loop, for a handler thread to run
        self.open = True  # False once draining: no waiting job starts any more
        self.closed = False  # the handler threads exit
        self._sleeping = 0  # handler threads waiting for a job
        self._waking = 0  # of them, notified but not running yet
        self.started = 0  # jobs started so far (the pace that sizes the buffer)
        self.freed = asyncio.Event()

    # ------------------------------------------------------------------ waiting (the prefetch buffer)
    def wait(self, entries: list[Entry]) -> None:
        """Claimed jobs join the buffer; idle handler threads are woken for theirs."""
        with self._mutex:
            for e in entries:
                target = e.target  # a sync job without a timeout of its own or its task's: a handler thread starts it
                if target.by_thread and e.job.timeout_seconds is None:
                    self._by_thread.append(e)
                else:
                    (self._by_task if target.is_async else self._by_loop).append(e)
            self._wake_threads()

    def waiting(self) -> int:
        return len(self._by_thread) + len(self._by_task) + len(self._by_loop)

    def oldest_claim(self) -> float | None:
        """When the longest-waiting buffered job was claimed (each queue of waiting jobs is in claim order)."""
        with self._mutex:  # handler threads take from the front
            heads = [q[0].claimed for q in self._queues if q]
        return min(heads) if heads else None

    def waiting_entries(self) -> list[Entry]:
        with self._mutex:
            return [e for q in self._queues for e in q]

    def mark_renewed(self, sent: float) -> None:
        """A heartbeat sent at ``sent`` (time.monotonic()) renewed the lease of every job still waiting."""
        self.renewed = sent

    def take_expired(self) -> list[Entry]:
        """The waiting jobs set aside since the last call because their lease ran out before they could start."""
        if not self._expired:
            return []
        with self._mutex:
            expired, self._expired = self._expired, []
        return expired

    def forget_waiting(self, jobs: list[Job]) -> list[Job]:
        """Remove these jobs (these attempts) from the buffer, if still there: their leases were lost, so they
        never start; returns the ones removed."""
        mine = {id(j) for j in jobs}
        return [e.job for e in self.drop_waiting(lambda e: id(e.job) not in mine)]

    def drop_waiting(self, keep: Callable[[Entry], bool]) -> list[Entry]:
        """Remove the waiting entries ``keep`` refuses (cancelled, waited too long, shutdown): they never start."""
        with self._mutex:
            gone = [e for q in self._queues for e in q if not keep(e)]
            if gone:
                for q in self._queues:
                    kept = [e for e in q if keep(e)]
                    q.clear()
                    q.extend(kept)
            return gone

    def start_for_loop(self) -> list[Entry]:
        """Start the waiting jobs the loop runs, as slots allow; wake handler threads for theirs."""
        now = time.monotonic()
        lease = self.lease
        with self._mutex:
            started = []
            while self.open and self._by_loop and self._busy < self.capacity:
                e = self._by_loop.popleft()
                if now - e.claimed >= lease and now - self.renewed >= lease:
                    self._expired.append(e)
                    continue
                started.append(self._begin(e, now))
            self._wake_threads()
            return started

    def _wake_threads(self) -> None:
        """Wake one sleeping handler thread when jobs wait for one, unless one is waking already: each thread that
        takes a job wakes the next while more wait (a chain), so short jobs never wake every thread on each claim."""
        if self._sleeping > self._waking == 0 and (
            self._handed or (self._by_thread and self.open and self._busy < self.capacity)
        ):
            self._waking += 1
            self._cond.notify()

    def _end(self, e: Entry) -> None:
        """Free ``e``'s slot (its handler returned, or its result was collected), once; under the lock."""
        if e.busy:
            e.busy = False
            self._busy -= 1

    def _begin(self, e: Entry, now: float | None = None) -> Entry:
        e.started = time.monotonic() if now is None else now
        e.busy = True
        self._busy += 1
        self.started += 1
        self._running[e.job.id] = e
        return e

    # ------------------------------------------------------------------ handler threads
    def hand(self, e: Entry) -> None:
        """A job the loop started goes to a handler thread."""
        with self._mutex:
            self._handed.append(e)
            self._wake_threads()

    def next_for_thread(self, ended: Entry | None = None, now: float | None = None) -> Entry | None:
        """A handler thread's next job: one handed to it, else the next waiting sync job once a slot is free; blocks
        until there is one; None once closed. ``ended``: the job this thread ran last, whose handler returned: its
        slot is freed under the same lock (one lock round a job, not two); ``now``: when it returned (the next job's
        start, unless the thread has to wait for one: one clock read a job)."""
        with self._mutex:
            if ended is not None and ended.busy:  # its slot, unless the loop collected its result first (_end, inline:
                ended.busy = False  # a call a job here and in collect cost 1,600 instructions a job, 3.5 %)
                self._busy -= 1
            while not self.closed:
                e: Entry | None = None
                if self._handed:
                    e = self._handed.popleft()
                    if self._running.get(e.job.id) is not e:  # handed back meanwhile (drain)
                        continue
                elif self.open and self._by_thread and self._busy < self.capacity:
                    e = self._by_thread.popleft()
                    if now is None:
                        now = time.monotonic()
                    if now - e.claimed >= self.lease and now - self.renewed >= self.lease:  # see the class
                        self._expired.append(e)
                        continue
                    e = self._begin(e, now)
                if e is not None:
                    if self._sleeping:
                        self._wake_threads()  # more jobs wait: the next thread, in case this job takes long
                    return e
                self._sleeping += 1
                self._cond.wait()
                self._sleeping -= 1
                self._waking = max(0, self._waking - 1)
                now = None  # it waited: the next job starts later
            return None

    # ------------------------------------------------------------------ async runners (on the loop)
    def next_for_task(self, ended: Entry | None = None) -> Entry | None:
        """An async runner's next job, once a slot is free; None when there is none now (the runner then waits to be
        woken). ``ended``: the job it ran last, whose slot is freed under the same lock."""
        with self._mutex:
            if ended is not None:
                self._end(ended)
            while self.open and self._by_task and self._busy < self.capacity:
                e = self._by_task.popleft()
                now = time.monotonic()
                if now - e.claimed >= self.lease and now - self.renewed >= self.lease:  # see the class
                    self._expired.append(e)
                    continue
                return self._begin(e, now)
            if ended is not None:
                self._wake_threads()  # the freed slot may start a waiting sync job
            return None

    def task_work(self) -> bool:
        """Whether an async job waits and may start now (a hint for waking a runner: read without the lock)."""
        return self.open and bool(self._by_task) and self._busy < self.capacity

    def close(self) -> None:
        with self._mutex:
            self.closed = True
            self._cond.notify_all()

    def shut(self) -> None:
        """Draining: no waiting job starts any more."""
        with self._mutex:
            self.open = False

    # ------------------------------------------------------------------ running
    def free(self) -> int:
        return self.capacity - self._busy

    def __len__(self) -> int:
        return len(self._running)

    def add(self, e: Entry) -> Entry:
        """Start ``e`` now, on the loop, whatever the buffer holds."""
        with self._mutex:
            return self._begin(e)

    def pop(self, job: Job) -> Entry | None:
        """Forget ``job`` (same attempt only); None when it was handed back meanwhile."""
        with self._mutex:
            entry = self.get(job)
        return self.collect([entry])[0] if entry is not None else None

    def collect(self, entries: list[Entry]) -> list[Entry]:
        """Forget the entries whose results came back (a batch, under one lock): the ones still held, in order; an
        entry handed back meanwhile (drain), or replaced by a later claim of its job, is left out."""
        held: list[Entry] = []
        keep = held.append
        with self._mutex:
            running = self._running
            for e in entries:
                if running.get(e.job.id) is e:
                    del running[e.job.id]
                    if e.busy:
                        e.busy = False
                        self._busy -= 1
                    keep(e)
        for e in held:
            if e.timer is not None:
                e.timer.cancel()
        if held:
            self.freed.set()
        return held

    def holds(self, job: Job) -> bool:
        """Whether this attempt is this worker's: running (not stuck) or waiting."""
        with self._mutex:
            entry = self.get(job)
            if entry is not None:
                return not entry.stuck
            return any(e.job.id == job.id and e.job.attempts == job.attempts for q in self._queues for e in q)

    def get(self, job: Job) -> Entry | None:
        entry = self._running.get(job.id)
        return entry if entry is not None and entry.job.attempts == job.attempts else None

    def stuck(self) -> int:
        return sum(1 for e in self.entries() if e.stuck)

    def cancel(self, ids: set[int]) -> list[Entry]:
        """Tell the running jobs of ``ids`` they were cancelled: sync handlers see ``job.cancelled``, async ones
        are cancelled. Their results come back as ``cancelled``."""
        hit = [e for e in self.entries() if e.job.id in ids and not e.cancelled]
        for e in hit:
            e.cancelled = True
            if e.handle is not None:
                e.handle.cancel()
        return hit

    def entries(self) -> list[Entry]:
        with self._mutex:
            return list(self._running.values())

    def jobs(self) -> list[Job]:
        """Jobs whose lease this worker holds, waiting or running (a stuck one's job was already failed)."""
        with self._mutex:
            running = [e.job for e in self._running.values() if not e.stuck]
            return running + [e.job for q in self._queues for e in q]

    def running_in(self, queue: str) -> int:
        """Jobs of ``queue`` running now (the in-flight gauge, counted at each scrape: nothing per job)."""
        with self._mutex:
            return sum(1 for e in self._running.values() if e.job.queue == queue)


def _finish_sync(conn: psycopg.Connection[Any], job: Job, worker: str, q: Statements) -> Outcome | None:
    """After a sync handler that used job.conn returned: complete in its transaction (``done``, or ``lease_lost`` when
    the fence refused it), else None: the completer's batch writes it. (IDLE: the handler ended the job's transaction
    itself, with ``commit()`` or ``rollback()``: documented as unfenced; the job is completed in the batch.)"""
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return None
    if status != TransactionStatus.INTRANS:
        conn.rollback()
        raise HandlerConnectionError("the handler's transaction was aborted by a database error it caught")
    if not execute(conn, q.complete_one(job, worker)):
        conn.rollback()
        return "lease_lost"
    conn.commit()
    return "done"


async def _finish_async(conn: psycopg.AsyncConnection[Any], job: Job, worker: str, q: Statements) -> Outcome | None:
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return None
    if status != TransactionStatus.INTRANS:
        await conn.rollback()
        raise HandlerConnectionError("the handler's transaction was aborted by a database error it caught")
    if not await aexecute(conn, q.complete_one(job, worker)):
        await conn.rollback()
        return "lease_lost"
    await conn.commit()
    return "done"


RUNNER_STREAK = 50
"""Jobs an async runner runs back to back before it lets the loop run its other callbacks (claims, results, leases).
A job that awaits lets them run anyway; this bounds a run of jobs that never await (50 no-op jobs take about 0.2 ms).
Each yield costs a collection of results and a look by the claim loop: yielding every 10 jobs cost a tenth more
instructions a job than every 50."""


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
            self.wake()  # more jobs wait: another runner, in case this job awaits
            entry.handle = task
            lazy.conn = lazy.failed = None
            try:
                await self._run(entry, lazy)
            finally:
                entry.handle = None
            if task.cancelling() or contextvars.copy_context() != context:
                self._spawn(entry)  # the next job runs in a clean task; the successor frees this job's slot
                return
            streak += 1
            if streak >= RUNNER_STREAK:
                streak = 0
                await asyncio.sleep(0)

    async def _run(self, entry: Entry, lazy: AsyncLazyConnection) -> None:
        span = tracing.start(entry.job)  # None unless a tracer provider is configured (skiplock.tracing)
        try:
            entry.outcome = await self._unit(entry, lazy)
        except asyncio.CancelledError:
            # cancelled: its writes are rolled back, the row says cancelled; else past the grace period of a drain:
            # the job is handed back
            entry.outcome = "cancelled" if entry.cancelled else "handed_back"
            entry.finished = time.monotonic()
            tracing.end(span, entry.job, entry.outcome, None)
            self._report(entry)
            if entry.outcome == "handed_back":
                raise
            return
        except Snooze as exc:
            entry.outcome, entry.error = "snoozed", exc
        except BaseException as exc:  # the handler raised: retry or fail, fenced
            entry.outcome, entry.error = ("timed_out" if is_timeout(exc) else "failed"), exc
        entry.finished = time.monotonic()
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
        timeout = timeout_for(job, target)
        try:
            try:
                if timeout is None:
                    await target.func(job._bind(lazy, entry))
                else:
                    deadline = asyncio.timeout(timeout)  # cancels the handler at the deadline
                    try:
                        async with deadline:
                            await target.func(job._bind(lazy, entry))
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
            if lazy.conn is None:  # it never used job.conn (most handlers): no coroutine to learn that
                return "done"
            written = await _finish_async(lazy.conn, job, self._worker, self._q)
            if written is None:
                return "done"
            entry.written = True
            return written
        finally:
            job._bind(None, None)  # the job and its entry no longer refer to each other: freed without the GC
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
        entry = slots.next_for_thread()
        while entry is not None:
            lazy.conn = lazy.failed = None
            span = tracing.start(entry.job)  # None unless a tracer provider is configured (skiplock.tracing)
            try:
                entry.outcome = self._unit(entry, lazy)
            except Snooze as exc:
                entry.outcome, entry.error = "snoozed", exc
            except BaseException as exc:
                entry.outcome, entry.error = "failed", exc
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
        try:
            try:
                entry.target.func(job._bind(lazy, entry))
            except BaseException:
                if lazy.conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        lazy.conn.rollback()
                raise
            if lazy.failed is not None:
                raise HandlerConnectionError(f"job.conn could not be checked out: {lazy.failed}")
            if lazy.conn is None:
                return "done"
            written = _finish_sync(lazy.conn, job, self._worker, self._q)
            if written is None:
                return "done"
            entry.written = True
            return written
        finally:
            job._bind(None, None)  # see AsyncExecutor._unit
            if lazy.conn is not None:
                self.pool.putconn(lazy.conn)

    def close(self, *, join: bool) -> None:
        """Stop the threads after their current job; with ``join``, wait for them and close the pool."""
        self._slots.close()
        if join:
            for t in self._threads:
                t.join(timeout=5)
            self.pool.close()
