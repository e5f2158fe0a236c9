"""The slots of one worker: the jobs it holds, claimed ones waiting for a slot (the prefetch buffer) and running
ones, under one lock shared by the loop, the handler threads and the async runners. Owned by the executors
(:class:`skiplock.worker.executor.Executors`); every other seam asks them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skiplock.app import Task
from skiplock.job import Bound, Job, Outcome

HANDOFF_SECONDS = 0.002
"""An idle worker's loop waits up to this long for the handler thread it woke to take its job (see
:meth:`Slots.wait`)."""


@dataclass(frozen=True, slots=True)
class Target:
    """What runs a job: the function, its colour, and the task (for its options), if any."""

    func: Callable[..., Any]
    is_async: bool
    task: Task | None = None
    by_thread: bool = field(init=False)  # a sync handler whose task sets no timeout (its jobs may set their own)
    timeout_seconds: float | None = field(init=False)  # its task's timeout (a job's own comes first), if any

    def __post_init__(self) -> None:
        timeout = self.task.options.timeout_seconds if self.task is not None else None
        object.__setattr__(self, "timeout_seconds", timeout)
        object.__setattr__(self, "by_thread", not self.is_async and timeout is None)


@dataclass(slots=True, eq=False)
class Entry(Bound):
    """A claimed job on its way through this worker: waiting for a slot (prefetched), then running, then its result
    on its way back to the loop (the executors report the entry itself: no result object per job). While its handler
    runs it is bound to its job (:class:`~skiplock.job.Bound`)."""

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
    result: str | None = None  # done: the handler's return value as JSON (None: it returned None)
    finished: float = 0.0  # time.monotonic() when the handler returned
    conn: Any = None  # job.conn while it runs: its runner's lazy connection (see Bound)
    durable: Any = None  # job.step's store while it runs

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

    def __init__(self, capacity: int, lease: float = float("inf"), freed: asyncio.Event | None = None) -> None:
        self.capacity = capacity
        self.lease = lease  # the shortest lease of any job this worker runs
        self.renewed = 0.0  # time.monotonic() when the last heartbeat that renewed every held lease was sent
        self._expired: list[Entry] = []  # waiting jobs not started because their lease ran out (for the loop)
        # One plain lock, taken directly (a C-level context manager, not Condition.__enter__, which runs Python code
        # on every job); the condition on it is only for the handler threads' sleep and wake-up.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._taken = threading.Condition(self._mutex)  # a woken thread took a job (see wait)
        self._handing = False  # the loop waits on _taken
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
        self.freed = asyncio.Event() if freed is None else freed  # set on the loop whenever results free slots

    # ------------------------------------------------------------------ waiting (the prefetch buffer)
    def wait(self, entries: list[Entry]) -> None:
        """Claimed jobs join the buffer; idle handler threads are woken for theirs.

        When nothing was running and a sleeping thread waits for each job (an idle worker picking up new work), the
        caller (the loop) then blocks until the woken thread has taken its job, at most HANDOFF_SECONDS: the thread
        needs the GIL to start the handler, and a thread waiting for it gets it only when its holder blocks or after
        the switch interval (5 ms), so the loop's bookkeeping after a claim (the completions it carried, metrics, the
        next wait) would come first."""
        with self._mutex:
            idle = not self._busy
            for e in entries:
                target = e.target  # a sync job without a timeout of its own or its task's: a handler thread starts it
                if target.by_thread and e.job.timeout_seconds is None:
                    self._by_thread.append(e)
                else:
                    (self._by_task if target.is_async else self._by_loop).append(e)
            self._wake_threads()
            if idle and self._waking and 0 < len(self._by_thread) <= self._sleeping:  # a pick-up, not a backlog
                self._handing = True
                try:
                    self._taken.wait(HANDOFF_SECONDS)
                finally:
                    self._handing = False

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
        mutex = self._mutex
        mutex.acquire()  # not ``with``, which looks up and binds __enter__ and __exit__ anew each time (a job each)
        try:
            if ended is not None and ended.busy:  # its slot, unless the loop collected its result first (_end,
                ended.busy = False  # inline: bench/HISTORY.md, "Behind the code")
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
                    e.started, e.busy = now, True  # _begin, inline (a job each)
                    self._busy += 1
                    self.started += 1
                    self._running[e.job.id] = e
                if e is not None:
                    if self._handing:  # the loop waits for this (see wait)
                        self._taken.notify()
                    if self._sleeping > self._waking == 0:  # (_wake_threads' own first test: no call a job)
                        self._wake_threads()  # more jobs wait: the next thread, in case this job takes long
                    return e
                self._sleeping += 1
                self._cond.wait()
                self._sleeping -= 1
                self._waking = max(0, self._waking - 1)
                now = None  # it waited: the next job starts later
            return None
        finally:
            mutex.release()

    # ------------------------------------------------------------------ async runners (on the loop)
    def next_for_task(self, ended: Entry | None = None) -> Entry | None:
        """An async runner's next job, once a slot is free; None when there is none now (the runner then waits to be
        woken). ``ended``: the job it ran last, whose slot is freed under the same lock."""
        mutex = self._mutex
        mutex.acquire()  # (see next_for_thread)
        try:
            if ended is not None and ended.busy:  # _end, inline
                ended.busy = False
                self._busy -= 1
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
        finally:
            mutex.release()

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
        timed: list[asyncio.TimerHandle] = []  # timeouts of sync jobs, cancelled outside the lock
        with self._mutex:
            running = self._running
            for e in entries:
                held_now = running.pop(e.job.id, None)  # one lookup a job (not get, then del)
                if held_now is not e:
                    if held_now is not None:  # a later claim of its job: still held
                        running[held_now.job.id] = held_now
                    continue
                if e.busy:
                    e.busy = False
                    self._busy -= 1
                keep(e)
                if e.timer is not None:
                    timed.append(e.timer)
        for timer in timed:
            timer.cancel()
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
