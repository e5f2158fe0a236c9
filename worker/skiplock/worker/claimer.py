"""The claimer: the claim loop. It wakes on NOTIFY, recovered leases or the poll interval, claims only for free
slots (waiting a few milliseconds to fill a batch), serves all its queues from one statement (round-robin across
queues), and carries the completer's finished jobs on each claim (one statement, one commit)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg

from skiplock.job import Job
from skiplock.metrics import BoundMetrics, WorkerMetrics
from skiplock.queue import per_queue_limit
from skiplock.worker import flow
from skiplock.worker.completer import Completer
from skiplock.worker.control import Scope
from skiplock.worker.executor import Slots
from skiplock.worker.leases import Leases

log = logging.getLogger(__name__)
# With jobs in flight and work waiting, wait up to this long for a whole batch of slots to free before claiming,
# so one claim statement carries several jobs instead of one per finished job.
CLAIM_GATHER_SECONDS = 0.005
# After EMPTY_STREAK claims in a row found nothing, wake-ups are folded for EMPTY_CLAIM_QUIET_SECONDS: a flood of
# notifications (anyone may NOTIFY the channel) costs at most ten empty claims a second. A worker that loses a
# race now and then (several idle workers wake on each NOTIFY) stays eager, so pick-up latency is unchanged: a
# worker that keeps losing goes quiet, and the one that wins keeps winning.
EMPTY_STREAK = 3
EMPTY_CLAIM_QUIET_SECONDS = 0.1
# All slots busy this long: the claim connection goes back to the pool (a slow job may run for hours).
BUSY_RETURN_SECONDS = 1.0
# The shortest wait a rate limit's hint asks for: a slot that came free between a claim and the hint is claimed
# again at once, and a job held back by something else as well is retried at most this often (for a second).
RATE_RETRY_SECONDS = 0.01


class Claimer:
    def __init__(
        self,
        scope: Scope,
        slots: Slots,
        completer: Completer,
        leases: Leases,
        start: Callable[[list[Job]], None],
        metrics: WorkerMetrics,
        stopping: asyncio.Event,
    ) -> None:
        self._control = scope.control
        self._settings = scope.settings
        self._identity = scope.identity
        self._queues = list(scope.queues)
        self._leases_by_task = scope.lease_overrides or None
        self._limited = bool(scope.limits)  # a claim may leave a picked job of a limited task for want of a slot
        self._rate_limited = tuple(x.task for x in scope.limits if x.rate is not None)
        self._due_in: float | None = None  # seconds until a rate limit allows the next start (flow.next_start)
        self._slots = slots
        self._completer = completer
        self._leases = leases
        self._start = start
        self._metrics = metrics
        self._stopping = stopping
        self._wake = asyncio.Event()
        self._paused_changed = asyncio.Event()
        self.paused: set[str] = set()  # this worker's view of its paused queues (for metrics and logs)
        self._conn: psycopg.AsyncConnection[Any] | None = None  # kept between claims: no pool checkout per claim
        self._orphans_possible = False
        self._quiet_until = 0.0
        self._empty_streak = 0
        self._rotate = 0
        self._source = "notify"
        self.until_idle = False  # stop once nothing is due and nothing runs (skiplock.testing)
        self.claims = 0
        self.empty_claims = 0

    def wake(self, source: str = "notify") -> None:
        """Wake the claim loop; ``source`` (notify, recovered) is what its wake-up counter says."""
        self._source = source
        self._wake.set()

    # ------------------------------------------------------------------ pause
    def poke_paused(self) -> None:
        """A queue was paused or resumed (control channel): look again now."""
        self._paused_changed.set()

    async def watch_paused(self, bound: dict[str, BoundMetrics]) -> None:
        """Keep ``paused`` (and its gauge) current: on each control notification, else every few polls. The claim
        statement itself skips paused queues, so this view never decides what is claimed."""
        every = max(1.0, self._settings.poll_seconds * 5)
        while True:
            rows = await self._control.call("claim", lambda: self._control.queue.paused(self._queues))
            if rows is not None:
                self.paused = set(rows)
                for queue, m in bound.items():
                    m.paused.set(1 if queue in self.paused else 0)
            self._paused_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._paused_changed.wait(), timeout=every)

    async def run(self) -> None:
        s = self._settings
        more = True
        gather = max(1, min(s.batch, s.concurrency))
        try:
            while not self._stopping.is_set():
                free = self._slots.free()
                if free <= 0:
                    await self._wait_for_slot()
                    continue
                if more and len(self._slots) and free < gather:
                    free = await self._gather_slots(gather)
                if not more:
                    if self.until_idle and not len(self._slots) and not self._completer.pending:
                        self._stopping.set()
                        break
                    await self._return_conn()  # idle: the pool checks and recycles it meanwhile
                    source = await self._wait_for_work()
                    if self._stopping.is_set():
                        break
                    self._metrics.wakeups.labels(source).inc()
                self._wake.clear()
                if self._orphans_possible and await self._leases.reclaim_orphans():
                    self._orphans_possible = False
                more = await self._claim(min(s.batch, free))
        finally:
            await self._return_conn()

    async def _claim(self, want: int) -> bool:
        """One claim carrying the finished jobs; True when it filled the batch (more work is waiting)."""
        done = self._completer.take_done()
        try:
            result = await self._control.call("claim", lambda: self._complete_and_claim(done, want))
        except BaseException:
            self._completer.give_back(done)
            raise
        if self._control.uncertain:  # a try failed in flight: it may have claimed jobs whose reply was lost
            self._orphans_possible = True
        if result is None:
            # The completions must not wait for a claim that keeps failing (a statement timeout, a lock wait):
            # the completer writes them on its own. The claim may have committed with its reply lost.
            self._completer.give_back(done)
            self._orphans_possible = True
            await self._control.backoff(self._stopping)
            return True
        completed, jobs = result
        await self._completer.settle(done, completed)
        self.claims += 1
        self._rotate += 1  # the next claim serves another queue first
        if jobs:
            self._empty_streak = 0
            self._start(jobs)
        else:
            self.empty_claims += 1
            self._empty_streak += 1
            if self._empty_streak >= EMPTY_STREAK:
                self._quiet_until = time.monotonic() + EMPTY_CLAIM_QUIET_SECONDS
        if self._rate_limited and len(jobs) < want:  # due jobs may wait on a rate: wake when the next may start
            self._due_in = await flow.next_start(self._control, self._rate_limited, tuple(self._queues))
        # Full: the batch was filled, or some queue gave all it may give one claim (more of it is waiting).
        full = len(jobs) == want or (self._limited and bool(jobs)) or (
            len(self._queues) > 1 and max(Counter(j.queue for j in jobs).values(), default=0) >= self._per_queue(want)
        )
        if full:
            self._metrics.wakeups.labels("busy").inc()
        return full

    async def _complete_and_claim(self, done: list[Job], want: int) -> tuple[set[int], list[Job]]:
        """The hot path, on the connection kept between claims (a pool checkout per claim cost as much client CPU
        as the statement). A connection that fails goes back to the pool (which drops it if broken)."""
        aq = self._control.queue
        if self._conn is None:
            self._conn = await aq.pool.getconn()
        try:
            return await aq.complete_and_claim(
                done,
                self._queues,
                limit=want,
                worker=self._identity,
                lease_seconds=self._settings.lease_seconds,
                leases=self._leases_by_task,
                rotate=self._rotate,
                limited=self._limited,
                conn=self._conn,
            )
        except BaseException:
            await self._return_conn()
            raise

    def _per_queue(self, want: int) -> int:
        return per_queue_limit(want, len(self._queues))

    async def _return_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._control.queue.pool.putconn(conn)

    async def _wait_for_slot(self) -> None:
        self._slots.freed.clear()
        try:
            async with asyncio.timeout(BUSY_RETURN_SECONDS):
                await self._slots.freed.wait()
        except TimeoutError:
            await self._return_conn()  # all slots busy for a while (maybe hours): the pool has it
            await self._slots.freed.wait()

    async def _gather_slots(self, wanted: int) -> int:
        """Wait a few milliseconds for ``wanted`` free slots (fewer if time runs out); returns the free slots."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLAIM_GATHER_SECONDS):  # one timer, no task per wake-up
                while self._slots.free() < wanted and not self._stopping.is_set():
                    self._slots.freed.clear()
                    await self._slots.freed.wait()
        return self._slots.free()

    async def _wait_for_work(self) -> str:
        """Sleep until a wake-up (NOTIFY, recovered jobs, stop) or the poll interval; wake-ups right after an
        empty claim are folded into one claim at the end of a short quiet period."""
        wait, due_in, self._due_in = self._settings.poll_seconds, self._due_in, None
        if due_in is not None:
            wait = min(wait, max(due_in, RATE_RETRY_SECONDS))
        try:
            async with asyncio.timeout(wait):
                await self._wake.wait()
        except TimeoutError:
            return "poll" if wait == self._settings.poll_seconds else "rate_limit"
        quiet = self._quiet_until - time.monotonic()
        if quiet > 0 and not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=quiet)
        return self._source
