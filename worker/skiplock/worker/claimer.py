"""The claimer: the claim loop. It wakes on NOTIFY, recovered leases or the poll interval, claims for its free slots
plus a bounded local buffer (prefetch: the next jobs are claimed while the current ones run, so a slot that frees
starts its next job without a round trip), serves all its queues from one statement (round-robin across queues),
and carries the completer's finished jobs on each claim (one statement, one commit).

The buffer holds at most ``prefetch`` jobs and at most what this worker starts in ``PREFETCH_WAIT_FRACTION`` of a
lease at its recent pace (so a worker of slow jobs prefetches next to nothing); its jobs are covered by heartbeats,
a job that waited longer than that fraction of its lease is handed back (no attempt burnt), and on shutdown the
whole buffer is handed back at once.

Its neighbours, given in dependency order: the store (:class:`ClaimStore`), the completer (:class:`DoneJobs`: the
finished jobs a claim carries), the executors (:class:`Room`: free slots and the buffer, which they own), the leases
(:class:`HandBack`) and the shared :class:`~skiplock.worker.wakeup.Wakeup`, on which it waits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from skiplock.job import Job
from skiplock.metrics import BoundMetrics, WorkerMetrics
from skiplock.store.statements import Claim, per_queue_limit
from skiplock.store.worker import ClaimStore
from skiplock.worker import drain, flow
from skiplock.worker.scope import Scope
from skiplock.worker.wakeup import Wakeup

log = logging.getLogger(__name__)
# A prepared statement keeps the plan made for the jobs table as it was when it was prepared, until an ANALYZE of
# the table invalidates it. A worker that prepared its claim while the table was small (idle, or jobs trickling in)
# went on reading the whole table for the completions each claim carries once a backlog arrived: 100,000 jobs
# drained at a quarter of the speed, for as long as autovacuum took to analyze the table (for ever with it off).
# The claim and the completions now find their rows by primary key whatever the table's size (SQL part
# by_attempts); other statements of the control connections (heartbeat, failures, snoozes) still join. So
# whenever the table's file has grown REPLAN_GROWTH times over since, every control connection drops its plans
# before its next use (DISCARD PLANS, in its own session: cheaper than replacing the connections, which costs
# backend starts and plans made with cold caches) and the next claims are planned for the table as
# it is: a plan is never made for less than half the table. Below REPLAN_FLOOR_BYTES every plan is cheap. The size
# is read without touching a row.
REPLAN_GROWTH = 2
REPLAN_FLOOR_BYTES = 1 << 20
REPLAN_CHECK_SECONDS = 1.0
# A claim walks the claim index from its start, and every job claimed since the table's last VACUUM left a dead
# entry there (what that reads deep into a backlog: bench/HISTORY.md, "Behind the code"). So while a backlog of
# one queue drains (the last claim filled its batch), a claim starts after the last job this worker claimed (same
# priority, later in claim order: the scan starts there), and a claim from the start is made again once
# AFTER_WINDOW_FACTOR times the last one's duration has passed (at most AFTER_MAX_SECONDS), or at once when a claim
# from the position comes back short. A job that sorts before the position (a higher priority, a handed-back job,
# a serial key's next job, one committed by a long transaction) waits at most that window longer.
AFTER_WINDOW_FACTOR = 10
AFTER_MAX_SECONDS = 0.5
# CLAIM_PLANS: once a claim fills its batch, or (several queues) brings several jobs while a queue gave its whole
# share (busy: see Claimer._busy), the claimer's kept connection plans its claims once
# (plan_cache_mode = force_generic_plan; reset before it returns to the pool; an idle worker's claims of
# a job or two pay no extra round trips). Once the jobs table has statistics PostgreSQL planned every claim afresh (a
# custom plan was estimated cheaper than the generic one, whose LIMIT is unknown; what that cost: bench/HISTORY.md,
# "Behind the code"). The generic claim finds its rows by primary key (claim_update), and a plan made for a much
# smaller table is replaced (REPLAN_GROWTH).
# With jobs in flight and work waiting, wait up to this long for room for a whole batch before claiming, so one
# claim statement carries many jobs instead of one per finished job. A prefetch buffer that runs low (half its
# allowed size, at least one job per slot) ends the wait at once: the next claim must land before the slots run dry.
CLAIM_GATHER_SECONDS = 0.005
CLAIM_GATHER_BUFFERED_SECONDS = 0.05
# After EMPTY_STREAK claims in a row found nothing, wake-ups are folded for EMPTY_CLAIM_QUIET_SECONDS: a flood of
# notifications (anyone may NOTIFY the channel) costs at most ten empty claims a second. A worker that loses a
# race now and then (several idle workers wake on each NOTIFY) stays eager, so pick-up latency is unchanged: a
# worker that keeps losing goes quiet, and the one that wins keeps winning.
EMPTY_STREAK = 3
EMPTY_CLAIM_QUIET_SECONDS = 0.1
# All slots busy this long: the claim connection goes back to the pool (a slow job may run for hours).
BUSY_RETURN_SECONDS = 1.0
# Idle (nothing claimed, no wake-up) this long: the claim connection goes back to the pool, which checks and recycles
# it meanwhile. A worker picking up jobs as they come keeps it between them: a checkout and a return for each pick-up
# cost more of the worker's CPU than building and reading the claim (bench/pickup_instructions.py).
IDLE_RETURN_SECONDS = 1.0
# A prefetched job waits in the local buffer at most about this fraction of its lease (3 s of the default 60 s).
PREFETCH_WAIT_FRACTION = 0.05
# The pace (jobs started per second) that sizes the buffer is measured over windows this long.
RATE_WINDOW_SECONDS = 0.25
# With no pace known yet, a first one is taken this early once two slots' worth of jobs started (the first fill and
# one more): a drain's first claims are of a slot's worth each until then, so every round trip of the ramp counts.
# Any pace above prefetch / (lease * PREFETCH_WAIT_FRACTION) (133 jobs a second at the defaults) allows the whole
# buffer, so the first estimate need not be precise: it counts the claims' round trips, which makes it low.
RATE_FIRST_SECONDS = 0.002
RATE_FIRST_FILLS = 2
# A claim that came back short but with at least this many jobs is followed by another (see Claimer._claim).
MORE_AFTER_JOBS = 2
# Until idle (skiplock.testing): how soon an empty claim made beside running jobs is made again.
UNTIL_IDLE_RECHECK_SECONDS = 0.01
# The shortest wait a rate limit's hint asks for: a slot that came free between a claim and the hint is claimed
# again at once, and a job held back by something else as well is retried at most this often (for a second).
RATE_RETRY_SECONDS = 0.01


class DoneJobs(Protocol):
    """The completer's side: finished jobs for the claims to carry, counted once written."""

    @property
    def pending(self) -> int: ...
    @property
    def ended_alone(self) -> int: ...
    def take_done(self) -> list[Job]: ...
    def give_back(self, jobs: list[Job]) -> None: ...
    async def settle(self, done: list[Job], completed: set[int]) -> None: ...


class Room(Protocol):
    """The executors' side: how many slots are free, and the prefetch buffer they keep."""

    @property
    def capacity(self) -> int: ...
    @property
    def started(self) -> int: ...
    def free(self) -> int: ...
    def running(self) -> int: ...
    def waiting(self) -> int: ...
    def oldest_claim(self) -> float | None: ...
    def admit(self, jobs: list[Job]) -> None: ...
    def start(self) -> None: ...
    def take_buffer(self) -> list[Job]: ...
    def take_expired(self) -> list[Job]: ...
    def drop_waiting_longer(self, limit: Callable[[Job], float], now: float) -> list[Job]: ...


class HandBack(Protocol):
    """The leases' side: hand unstarted jobs back, and what a lease is."""

    @property
    def shortest(self) -> float: ...
    def lease_for(self, job: Job) -> float: ...
    async def release(self, jobs: list[Job]) -> int: ...
    async def reclaim_orphans(self) -> bool: ...


class Claimer:
    def __init__(
        self,
        store: ClaimStore,
        scope: Scope,
        completer: DoneJobs,
        executors: Room,
        leases: HandBack,
        wakeup: Wakeup,
        metrics: WorkerMetrics,
        bound: dict[str, BoundMetrics],
        *,
        until_idle: bool = False,
    ) -> None:
        self._store = store
        self._settings = scope.settings
        self._identity = scope.identity
        self._queues = list(scope.queues)
        self._leases_by_task = scope.lease_overrides or None
        self._limited = bool(scope.limits)  # a claim may leave a picked job of a limited task for want of a slot
        self._rate_limited = tuple(x.task for x in scope.limits if x.rate is not None)
        self._due_in: float | None = None  # seconds until a rate limit allows the next start (flow.next_start)
        self._completer = completer
        self._executors = executors
        self._leases = leases
        self._wakeup = wakeup
        self._metrics = metrics
        self._bound = bound
        self.until_idle = until_idle  # stop once nothing is due and nothing runs (skiplock.testing)
        self.paused: set[str] = set()  # this worker's view of its paused queues (for metrics and logs)
        self.draining = False  # the operator asked this pod to stop claiming (scale-in; see drain.py)
        self._orphans_possible = False
        self._quiet_until = 0.0
        self._claimed_jobs_at = 0.0  # when (monotonic) the last claim that brought jobs started
        self._empty_streak = 0
        self._rotate = 0
        self._started_seen = 0  # the executors' count of started jobs at the last pace update
        self._prefetch = scope.settings.prefetch
        self._rate = 0.0  # jobs started per second, recent
        self._window_start = time.monotonic()
        self._window_count = 0
        self._flushes_seen = 0  # the completer's own flushes when the last claim was made
        self._claimed_busy = False  # the last claim was made while jobs ran, waited in the buffer or were completed
        self.claims = 0
        self.empty_claims = 0
        self.replans = 0  # times the control connections were replaced for a grown table
        self.claims_after = 0  # claims that started after the last job claimed (see AFTER_WINDOW_FACTOR)
        self._short: dict[str, int] = {}  # queues that came back short in the last claim: their next share
        self._after: Job | None = None  # the last job of a full batch of one queue: where the next claim may start
        self._after_until = 0.0  # claims start after it until then (monotonic)
        self._claimed_jobs = metrics.claims.labels("jobs")
        self._claimed_none = metrics.claims.labels("empty")

    def stats(self) -> dict[str, int]:
        """Counts for the worker's last log line."""
        return {
            "claims": self.claims,
            "empty_claims": self.empty_claims,
            "claims_after": self.claims_after,
            "claims_hurried": self._wakeup.hurried,
        }

    # ------------------------------------------------------------------ prefetch buffer (held by the executors)
    def allowed(self) -> int:
        """How many jobs the buffer may hold now: ``prefetch``, and no more than this worker starts in
        ``PREFETCH_WAIT_FRACTION`` of a lease at its recent pace."""
        if self._prefetch <= 0:
            return 0
        self._count_started()
        return min(self._prefetch, int(self._rate * self._settings.lease_seconds * PREFETCH_WAIT_FRACTION))

    def _count_started(self) -> None:
        total = self._executors.started
        new, self._started_seen = total - self._started_seen, total
        now = time.monotonic()
        if not self._window_count:
            if new:
                # A window opens with its first start. (It opened at the last look, so a burst after an idle spell
                # averaged its first jobs over the idle seconds before them: a pace of a few jobs a second, and
                # claims of a few jobs, for the first quarter second of every drain.)
                self._window_start = now
            elif now - self._window_start >= RATE_WINDOW_SECONDS:
                # A whole window without a start (idle, or slow jobs): the pace is unknown again, and the next
                # burst gets its first estimate within RATE_FIRST_SECONDS.
                self._rate, self._window_start = 0.0, now
                return
        self._window_count += new
        elapsed = now - self._window_start
        if elapsed >= RATE_WINDOW_SECONDS:  # the past window weighs as one window, however long this one was
            self._rate = (self._rate * RATE_WINDOW_SECONDS + self._window_count) / (RATE_WINDOW_SECONDS + elapsed)
            self._window_start, self._window_count = now, 0
        elif (
            not self._rate
            and elapsed >= RATE_FIRST_SECONDS
            and self._window_count >= RATE_FIRST_FILLS * self._executors.capacity
        ):
            # Fast jobs: a first estimate before the window closes (a drain's first quarter second is not spent
            # claiming for free slots only), leaving out the slots' first fill (a burst slow jobs also start with).
            self._rate = (self._window_count - self._executors.capacity) / elapsed

    def gather_target(self) -> int:
        """The room the claim loop waits for (a few milliseconds) before it claims: a whole batch, but with a buffer
        at most the slots plus half the buffer, so the other half keeps the slots busy while the claim is in flight
        (waiting for room for a batch as large as the whole buffer left them idle during every claim)."""
        s = self._settings
        return max(1, min(s.batch, s.concurrency + self.allowed() // 2))

    def _room(self) -> int:
        """Jobs the next claim may take: the free slots plus the buffer's free room (none while draining)."""
        if self.draining or self._wakeup.paused_changed.is_set():  # drained, or a control notification unread
            return 0
        return self._executors.free() + self.allowed() - self._executors.waiting()

    async def _expire_buffer(self) -> None:
        """Hand back buffered jobs that waited longer than their share of the lease (their slots stayed busy), and
        the ones a slot refused to start because their lease had run out meanwhile (see :class:`Slots`)."""
        expired = self._executors.take_expired()
        if expired:
            log.warning(
                "%d prefetched job(s) not started: their leases ran out while they waited (the worker stalled, or "
                "heartbeats failed); handed back if still held",
                len(expired),
                extra={"action": "lease_expired_unstarted", "job_ids": [j.id for j in expired][:20]},
            )
            await self._leases.release(expired)
        oldest = self._executors.oldest_claim()
        now = time.monotonic()
        if oldest is None or now - oldest <= self._leases.shortest * PREFETCH_WAIT_FRACTION:
            return  # none waited its share of even the shortest lease: no scan of the buffer on every loop
        lease_for = self._leases.lease_for
        stale = self._executors.drop_waiting_longer(lambda job: lease_for(job) * PREFETCH_WAIT_FRACTION, now)
        if stale:
            self._rate = 0.0  # the pace fell (slots stayed busy): prefetch again once jobs start again
            await self._leases.release(stale)

    # ------------------------------------------------------------------ pause
    async def watch_paused(self) -> None:
        """Keep ``paused`` (and its gauge) current: on each control notification, else every few polls. The claim
        statement itself skips paused queues, so this view never decides what is claimed."""
        every = max(1.0, self._settings.poll_seconds * 5)
        bound, changed = self._bound, self._wakeup.paused_changed
        while True:
            rows = await self._store.paused(self._queues)
            if rows is not None:
                self.paused = set(rows)
                for queue, m in bound.items():
                    m.paused.set(1 if queue in self.paused else 0)
            draining = await drain.requested(self._store, self._settings.worker_id)  # drain.py: the scale-in hook
            if draining is not None and draining != self.draining:
                self.draining = draining
                drain.report(draining, self._settings.worker_id)
                await self._leases.release(self._executors.take_buffer() if draining else [])  # prefetched: back
            changed.clear()
            self._wakeup.freed.set()  # claims held while it looked (see _room) go on
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=every)

    async def watch_table(self) -> None:
        """Replace the control connections, and with them their prepared plans, whenever the jobs table has grown
        REPLAN_GROWTH times over since they were planned (see REPLAN_GROWTH)."""
        planned: int | None = None
        while True:
            size = await self._store.jobs_table_bytes()
            if size is not None and planned is not None and size > REPLAN_GROWTH * max(planned, REPLAN_FLOOR_BYTES):
                self._store.replan()  # each control connection before its next use, the claimer's kept one too
                self.replans += 1
                log.info(
                    "jobs table grew from %d to %d bytes: claims are planned again",
                    planned,
                    size,
                    extra={"action": "replanned"},
                )
                planned = size
            elif planned is None:
                planned = size
            await asyncio.sleep(REPLAN_CHECK_SECONDS)

    async def run(self) -> None:
        s = self._settings
        stopping, executors = self._wakeup.stopping, self._executors
        more = True
        try:
            while not stopping.is_set():
                executors.start()
                await self._expire_buffer()
                free = self._room()
                if free <= 0:
                    await self._wait_for_slot()
                    continue
                # Wait a few milliseconds for room for a whole batch, so one claim carries many jobs.
                gather = self.gather_target()
                if more and (executors.running() or executors.waiting()) and free < gather:
                    free = await self._gather_slots(gather)
                    if free <= 0:  # a control notification came meanwhile (see _room): no claim of nothing
                        continue
                if not more and self.until_idle and self._claimed_busy:
                    # The empty claim ran beside running jobs (it claimed ahead): a job they enqueue or unblock may
                    # have committed after its snapshot, so idle is only judged by a claim made with nothing running.
                    await asyncio.sleep(UNTIL_IDLE_RECHECK_SECONDS)
                elif not more:
                    idle = not executors.running() and not executors.waiting() and not self._completer.pending
                    # completions written without a claim since the last one may have released dependents
                    idle = idle and self._completer.ended_alone == self._flushes_seen
                    if self.until_idle and idle:
                        stopping.set()
                        break
                    source = await self._wait_for_work()
                    if stopping.is_set():
                        break
                    self._metrics.wakeups.labels(source).inc()
                    if self._room() <= 0:  # drained, or a control notification not looked at yet (see _room)
                        more = True
                        continue
                self._wakeup.work.clear()
                if self._orphans_possible and await self._leases.reclaim_orphans():
                    self._orphans_possible = False
                more = await self._claim(min(s.batch, free))
        finally:
            await self._store.give_back_claim_connection()

    async def _claim(self, want: int) -> bool:
        """One claim carrying the finished jobs; True when it filled the batch (more work is waiting)."""
        done = self._completer.take_done()
        self._flushes_seen = self._completer.ended_alone
        # a claim carrying completions may release their dependents, which commit with it, after its snapshot
        idle = not (self._executors.running() or self._executors.waiting())
        self._claimed_busy = bool(not idle or done)
        started = time.monotonic()
        after = self._after if started < self._after_until else None
        shares = self.shares(want)
        self._wakeup.claiming(True)
        try:
            result = await self._complete_and_claim(done, want, after, shares)
        except BaseException:
            self._completer.give_back(done)
            raise
        finally:
            self._wakeup.claiming(False)
        self._after = None
        if self._store.uncertain:  # a try failed in flight: it may have claimed jobs whose reply was lost
            self._orphans_possible = True
        if result is None:
            # The completions must not wait for a claim that keeps failing (a statement timeout, a lock wait):
            # the completer writes them on its own. The claim may have committed with its reply lost.
            self._completer.give_back(done)
            self._orphans_possible = True
            await self._store.backoff(self._wakeup.stopping)
            return True
        completed, jobs = result
        if jobs:  # first: the jobs start before any bookkeeping of this claim (pick-up latency)
            self._executors.admit(jobs)
            self._executors.start()
            if idle:  # a pick-up: an async runner woken for them starts now, not after this claim's bookkeeping
                await asyncio.sleep(0)
        if after is None:  # from the start: the next claims may start after its last job, for a while
            self._after_until = started + min(AFTER_MAX_SECONDS, AFTER_WINDOW_FACTOR * (time.monotonic() - started))
        else:
            self.claims_after += 1
        if len(jobs) == want and len(self._queues) == 1:
            self._after = jobs[-1]
        if shares is not None:
            self._short = self._short_queues(shares, jobs)
        some_queue_full = shares is not None and len(self._short) < len(self._queues)
        await self._completer.settle(done, completed)
        self.claims += 1
        self._rotate += 1  # the next claim serves another queue first
        if jobs:
            self._claimed_jobs.inc()
            self._claimed_jobs_at = started
            self._empty_streak = 0
        else:
            self._claimed_none.inc()
            self.empty_claims += 1
            self._empty_streak += 1
            if self._empty_streak >= EMPTY_STREAK:
                self._quiet_until = time.monotonic() + EMPTY_CLAIM_QUIET_SECONDS
        if self._rate_limited and len(jobs) < want:  # due jobs may wait on a rate: wake when the next may start
            self._due_in = await flow.next_start(self._store, self._rate_limited, tuple(self._queues))
        # Full: the batch was filled, or some queue gave all it may give one claim (more of it is waiting), or it
        # brought several jobs: a claim that asks for a whole batch may come back short while more jobs are due
        # (serial keys whose earlier jobs this worker holds), so the next one follows, without waiting for a NOTIFY
        # (a claim of one job, as an idle worker makes for each NOTIFY, is not followed by another).
        full = (
            len(jobs) == want
            or after is not None  # short from a position: jobs before it may be due, so claim from the start next
            or len(jobs) >= MORE_AFTER_JOBS
            or (self._limited and bool(jobs))
            or some_queue_full
        )
        if full:
            self._metrics.wakeups.labels("busy").inc()
        return full

    async def _complete_and_claim(
        self, done: list[Job], want: int, after: Job | None, shares: list[int] | None
    ) -> tuple[set[int], list[Job]] | None:
        """The hot path, on the connection the store keeps between claims."""
        claim = Claim(
            queues=self._queues,
            worker=self._identity,
            lease_seconds=self._settings.lease_seconds,
            leases=self._leases_by_task,
            limited=self._limited,
            rotate=self._rotate,
            after=after,
            shares=shares,
        )
        result = await self._store.complete_and_claim(done, claim, want)
        if result is not None and want > 1 and self._busy(want, shares, result[1]):  # see CLAIM_PLANS
            await self._store.stream_claims()
        return result

    def shares(self, want: int) -> list[int] | None:
        """The most jobs the next claim of ``want`` takes of each queue (None: one queue); the candidates the claim
        locks add up to about ``want``. Equal shares cut a claim to half its size while only one of two queues had
        work (a 200,000-job backlog in one of two queues drained at 0.64x the one-queue worker). So a queue that came
        back short in the last claim (nothing more was due there) gets one job more than it gave, at most the equal
        share, and the queues that gave their whole share split the rest. Every queue is probed by every claim, and
        one that fills its small share gets an equal one again in the next claim."""
        n = len(self._queues)
        if n == 1:
            return None
        equal = per_queue_limit(want, n)
        if not self._short or len(self._short) == n:  # none or all came back short: nobody to give more
            return [equal] * n
        short = {q: min(equal, s) for q, s in self._short.items()}
        rest = max(equal, -(-(want - sum(short.values())) // (n - len(short))))
        return [short.get(q, rest) for q in self._queues]

    def _short_queues(self, shares: list[int], jobs: list[Job]) -> dict[str, int]:
        """The queues a claim left short (they gave fewer than their share: nothing more is due there), each with
        its next share; the others gave their whole share, and more of them may be due."""
        given = Counter(j.queue for j in jobs)
        return {q: given[q] + 1 for q, share in zip(self._queues, shares, strict=True) if given[q] < share}

    def _busy(self, want: int, shares: list[int] | None, jobs: list[Job]) -> bool:
        """A claim that filled its batch, or (several queues) one that brought several jobs while some queue gave
        its whole share: work is waiting, so claims come in a stream (see CLAIM_PLANS)."""
        if len(jobs) == want:
            return True
        return shares is not None and len(jobs) > 1 and len(self._short_queues(shares, jobs)) < len(self._queues)

    async def _wait_for_slot(self) -> None:
        freed = self._wakeup.freed
        freed.clear()
        try:
            async with asyncio.timeout(BUSY_RETURN_SECONDS):
                await freed.wait()
        except TimeoutError:
            await self._store.give_back_claim_connection()  # all slots busy for a while (maybe hours): the pool has it
            if self._executors.waiting():
                return  # the loop hands back buffered jobs that waited too long
            await freed.wait()

    async def _gather_slots(self, wanted: int) -> int:
        """Wait a few milliseconds for room for ``wanted`` jobs (fewer if time runs out, or once the buffer runs
        low); returns the room."""
        executors, wakeup = self._executors, self._wakeup
        low = max(executors.capacity, self.allowed() // 2)  # what covers the slots while the claim is in flight
        buffered = executors.waiting() > low
        wakeup.gathering(True)
        try:
            with contextlib.suppress(TimeoutError):
                # one timer, no task per wake-up
                async with asyncio.timeout(CLAIM_GATHER_BUFFERED_SECONDS if buffered else CLAIM_GATHER_SECONDS):
                    while self._room() < wanted and not wakeup.stopping.is_set() and not wakeup.hurried_now:
                        if buffered and executors.waiting() <= low:
                            break
                        wakeup.freed.clear()
                        await wakeup.freed.wait()
        finally:
            wakeup.gathering(False)
        return self._room()

    async def _woken_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self._wakeup.work.wait()
        except TimeoutError:
            return False
        return True

    async def _wait_for_work(self) -> str:
        """Sleep until a wake-up (NOTIFY, recovered jobs, stop) or the poll interval; wake-ups right after an
        empty claim are folded into one claim at the end of a short quiet period."""
        wait, due_in, self._due_in = self._settings.poll_seconds, self._due_in, None
        if due_in is not None:
            wait = min(wait, max(due_in, RATE_RETRY_SECONDS))
        wakeup = self._wakeup
        # the claim connection stays checked out until IDLE_RETURN_SECONDS after the last claim that brought jobs
        keep = min(wait, self._claimed_jobs_at + IDLE_RETURN_SECONDS - time.monotonic())
        if not (keep > 0 and await self._woken_within(keep)):
            await self._store.give_back_claim_connection()  # idle: the pool checks and recycles it meanwhile
            if not await self._woken_within(wait - max(keep, 0.0)):
                return "poll" if wait == self._settings.poll_seconds else "rate_limit"
        quiet = self._quiet_until - time.monotonic()
        if quiet > 0 and not wakeup.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.stopping.wait(), timeout=quiet)
        return wakeup.source
