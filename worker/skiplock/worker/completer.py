"""The completer: the only writer of final states, and where every outcome is counted. The executors report each
finished entry here (:meth:`Completer.finished`, its slot already freed); each is dispatched by its
:data:`~skiplock.job.Outcome` (one ``match``, exhaustive). Done jobs wait in a buffer and ride on the next claim (one
statement, one commit) or are flushed alone after a short delay; failures are recorded at once. A written outcome is
counted once, by its name (the metric label), and told to the worker's observer.

Its neighbours: the store (:class:`CompleterStore`) and the shared :class:`~skiplock.worker.wakeup.Wakeup` (is a
claim coming? a job that held back another was written). It holds no other seam."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import assert_never

from skiplock.app import Task
from skiplock.backoff import backoff_seconds
from skiplock.errors import NonRetryableError, Snooze, format_error, format_traceback
from skiplock.job import Job, Outcome
from skiplock.metrics import BoundMetrics
from skiplock.settings import Settings
from skiplock.store.statements import Failure
from skiplock.store.worker import CompleterStore
from skiplock.worker.scope import Scope
from skiplock.worker.slots import Entry
from skiplock.worker.wakeup import Wakeup

log = logging.getLogger(__name__)
FLUSH_MAX = 500
BY_ID = attrgetter("id")
QUEUE_OF = attrgetter("queue")
# Finished jobs wait up to this long for the next claim to carry their completion; then they are flushed alone.
FLUSH_DELAY_SECONDS = 0.02
# Past that delay, while the claimer says a claim is coming (see Claimer.hurry), they wait for it, checking this often,
# up to this long in all (a claim slowed down by a busy server must not turn into a flush of its own each time).
FLUSH_RECHECK_SECONDS = 0.005
FLUSH_MAX_WAIT_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float
    cap: float
    jitter: float


def queue_counts(jobs: list[Job], queues: int) -> Iterable[tuple[str, int]]:
    """(queue, how many of ``jobs``) pairs: without a pass over the jobs for a worker of one queue (``queues`` 1),
    whose jobs are all of it."""
    if queues == 1:
        return ((jobs[0].queue, len(jobs)),) if jobs else ()
    return Counter(map(QUEUE_OF, jobs)).items()


def failure_for(job: Job, exc: BaseException, task: Task | None, settings: Settings) -> Failure:
    """The failed attempt to record: non-retryable by type (the task's list included), delay by the task's backoff."""
    o = task.options if task is not None else None
    retry = not isinstance(exc, NonRetryableError) and not (o is not None and isinstance(exc, o.non_retryable))
    b = Backoff(
        o.backoff_base_seconds if o and o.backoff_base_seconds is not None else settings.backoff_base_seconds,
        o.backoff_cap_seconds if o and o.backoff_cap_seconds is not None else settings.backoff_cap_seconds,
        o.backoff_jitter if o and o.backoff_jitter is not None else settings.backoff_jitter,
    )
    delay = backoff_seconds(job.attempts, base=b.base, cap=max(b.cap, b.base), jitter=b.jitter) if retry else 0.0
    return Failure(job, format_error(exc), delay, retry, format_traceback(exc))


Observer = Callable[[Job, Outcome], None]
"""Told each outcome counted (every :data:`~skiplock.job.Outcome` but handed_back), on the loop."""

FailureCause = Outcome
"""Why an attempt failed, which names its outcome once written: ``failed`` (the handler raised), ``unknown_task`` or
``timed_out``; written, a plain failure becomes ``retried`` or ``failed``, the others keep their names."""


class Completer:
    def __init__(
        self,
        store: CompleterStore,
        scope: Scope,
        metrics: dict[str, BoundMetrics],
        wakeup: Wakeup,
        observe: Observer | None = None,
    ) -> None:
        self._store = store
        self._settings = scope.settings
        self._identity = scope.identity
        self._m = metrics
        self._wakeup = wakeup
        self._observer = observe  # each outcome counted here (not handed_back); None: nobody observes
        # tasks at a global concurrency limit: one of their jobs ending may let another start (as a serial key's)
        self._gating = frozenset(x.task for x in scope.limits if x.global_concurrency is not None)
        self._done: list[Job] = []
        self._with_results: list[tuple[Job, str]] = []  # done jobs whose handlers returned a value (JSON)
        self._done_since: float | None = None  # when the oldest done job not yet taken by a claim finished
        self._failed: list[tuple[Failure, FailureCause]] = []
        self._refused: list[Job] = []  # completions the fence refused in the handler's transaction
        self._snoozed: list[tuple[Job, float]] = []  # jobs to reschedule without using an attempt
        self._writing: list[Job] = []  # a flush in flight: still held (heartbeats, orphan release) until settled
        self._handed_back: list[Job] = []  # running jobs handed back at the end of a drain (written at exit)
        self._needed = asyncio.Event()
        self._closing = False
        self.flushes = 0  # statements that wrote done jobs no claim carried (the flush loop's own)
        self.ended_alone = 0  # flushes that ended jobs, counted once written (their dependents may be released)

    # ------------------------------------------------------------------ buffers
    def defer(self, *jobs: Job) -> None:
        """Jobs whose handlers returned without writing: the next claim completes them (or the flush loop)."""
        if jobs and not self._done:
            self._done_since = time.monotonic()
            self._needed.set()
        self._done.extend(jobs)

    def fail(self, failure: Failure, cause: FailureCause = "failed") -> None:
        self._failed.append((failure, cause))
        self._needed.set()

    def snooze(self, job: Job, seconds: float) -> None:
        self._snoozed.append((job, seconds))
        self._needed.set()

    def refused(self, job: Job) -> None:
        """The fence refused a completion in the handler's transaction: counted as cancelled or lease_lost once the
        database says which."""
        self._refused.append(job)
        self._needed.set()

    def take_done(self, limit: int = FLUSH_MAX) -> list[Job]:
        """Done jobs for the next claim to carry (give them back with :meth:`give_back` if it fails)."""
        taken, self._done = self._done[:limit], self._done[limit:]
        self._done_since = time.monotonic() if self._done else None
        taken.sort(key=BY_ID)  # rows are locked in id order by every writer of this worker
        return taken

    def give_back(self, jobs: list[Job]) -> None:
        self._done[:0] = jobs
        if jobs:
            self._done_since = self._done_since or time.monotonic()
            self._needed.set()

    def jobs(self) -> list[Job]:
        """Jobs finished here but not yet written (or being written): their leases must still be renewed, and
        they are this worker's own, never orphans."""
        return (
            self._done
            + [j for j, _ in self._with_results]
            + [f.job for f, _ in self._failed]
            + [j for j, _ in self._snoozed]
            + self._writing
        )

    def holds(self, job: Job) -> bool:
        return any(j.id == job.id and j.attempts == job.attempts for j in self.jobs())

    @property
    def pending(self) -> int:
        """Outcomes not written yet, those being written included."""
        waiting = (self._done, self._with_results, self._failed, self._refused, self._snoozed, self._writing)
        return sum(len(w) for w in waiting)

    # ------------------------------------------------------------------ counting
    async def settle(self, done: list[Job], completed: set[int]) -> None:
        """Count a written batch. Jobs the fence refused may have been completed by an earlier try whose reply
        was lost with its connection: those are confirmed as done by this worker, not reported as lost."""
        cancelled: set[int] = set()
        if len(completed) < len(done):  # (else every one was written: no pass over the batch)
            refused = [j for j in done if j.id not in completed]
            confirmed = await self._store.confirm_done(refused, worker=self._identity)
            completed = completed | (confirmed or set())
            cancelled = await self.cancelled_among([j for j in done if j.id not in completed])
        self.count_done(done, completed, cancelled)

    async def cancelled_among(self, jobs: list[Job]) -> set[int]:
        """Of jobs whose write the fence refused, the ones cancelled meanwhile (not lost: counted as cancelled)."""
        if not jobs:
            return set()
        found = await self._store.cancelled_among(jobs, worker=self._identity)
        return found or set()

    def count_done(self, done: list[Job], completed: set[int], cancelled: Collection[int] = ()) -> None:
        """Count a written batch: one counter update per queue, a log line per job only at DEBUG."""
        if not done:
            return
        debug = log.isEnabledFor(logging.DEBUG)
        m = self._m
        tally = m[done[0].queue].tally  # one for all queues: a batch's counts are applied together
        if len(completed) == len(done) and not debug and self._observer is None:  # all written, nobody to tell
            counts = queue_counts(done, len(m))
            tally.add(counts=[(m[queue].finished["done"], n) for queue, n in counts])
            return
        by_queue: dict[str, int] = {}
        for job in done:
            if job.id in completed:
                by_queue[job.queue] = by_queue.get(job.queue, 0) + 1
                self._observe(job, "done")
                if debug:
                    log.debug("job done", extra={"action": "job_done", "queue": job.queue, "job_id": job.id})
            elif job.id in cancelled:
                self.count_cancelled(job)
            else:
                self.count(job, "lease_lost")
                warn_lost(job, "completion refused: the lease was lost before it was written")
        tally.add(counts=[(m[queue].finished["done"], n) for queue, n in by_queue.items()])

    def count_unstarted(self, job: Job, cancelled: bool) -> None:
        """A prefetched job whose lease was lost (or that was cancelled) before it started: it never starts."""
        if cancelled:
            self.count_cancelled(job)
            return
        self.count(job, "lease_lost")
        log.warning(
            "a prefetched job's lease was lost before it started (recovered elsewhere): not started",
            extra={"action": "lease_lost_unstarted", "job_id": job.id, "queue": job.queue, "attempt": job.attempts},
        )

    def count_cancelled(self, job: Job) -> None:
        self.count(job, "cancelled")
        log.info("job cancelled while it ran", extra={"action": "job_cancelled", "queue": job.queue, "job_id": job.id})

    def count(self, job: Job, outcome: Outcome) -> None:
        """One outcome of one job: its counter (the label is the outcome's name) and the observer."""
        self._m[job.queue].finished[outcome].inc()
        self._observe(job, outcome)

    def _observe(self, job: Job, outcome: Outcome) -> None:
        """The observer, if any: an exception it raises is logged, never allowed to stop a claim or a flush."""
        if self._observer is not None:
            try:
                self._observer(job, outcome)
            except Exception:
                log.exception("worker callback %r failed", self._observer, extra={"action": "callback_failed"})

    def _count_failure(self, f: Failure, cause: FailureCause, status: str | None) -> None:
        """A written failure (``status``: the job's new status; None: the fence refused it)."""
        job = f.job
        extra = {
            "queue": job.queue,
            "task": job.task,
            "job_id": job.id,
            "attempt": job.attempts,
            "max_attempts": job.max_attempts,
            "error": f.error[:500],
            "cause": cause,
        }
        if status == "cancelled":
            self.count_cancelled(job)
        elif status is None:
            self.count(job, "lease_lost")
            warn_lost(job, "failure not recorded: the lease was lost before it was written")
        elif status == "pending":
            self.count(job, "retried" if cause == "failed" else cause)
            if f.traceback and log.isEnabledFor(logging.DEBUG):  # a retry's traceback at DEBUG only
                extra["traceback"] = f.traceback
            log.warning("job failed, will retry in %.1fs", f.delay_seconds, extra={"action": "job_retry", **extra})
        else:
            reason = "unknown_task" if cause == "unknown_task" else ("exhausted" if f.retry else "non_retryable")
            self._m[job.queue].failed[reason].inc()
            self.count(job, cause)
            if f.traceback:
                extra["traceback"] = f.traceback
            log.error("job failed for good (%s)", reason.replace("_", "-"), extra={"action": "job_failed", **extra})

    # ------------------------------------------------------------------ results (from the executors)
    def finished(self, results: list[Entry]) -> None:
        """Entries whose handlers returned (a batch, their slots already freed by the executors): dispatched by
        outcome, their run and wait times tallied."""
        durations: dict[str, list[float]] = {}  # run times by queue, handed to the tally once per batch
        waits: dict[str, list[float]] = {}  # waits from visible to start, likewise
        deferred: list[Job] = []  # handed to the buffer at once, whatever happens to the rest of the batch
        defer = deferred.append
        try:
            queue: str | None = None
            ran: list[float] = []
            waited: list[float] = []
            for entry in results:
                job = entry.job
                if job.queue != queue:  # a batch is mostly of one queue: its lists are looked up once
                    queue = job.queue
                    ran, waited = durations.setdefault(queue, []), waits.setdefault(queue, [])
                started = entry.started
                ran.append(entry.finished - started)
                waited.append(entry.waited + started - entry.claimed)
                if entry.outcome == "done" and not (entry.written or entry.stuck or entry.cancelled or entry.result):
                    defer(job)
                else:
                    self.record(entry)
        finally:
            self.defer(*deferred)
            bound = self._m
            if durations:  # one tally for every queue
                bound[next(iter(durations))].tally.add(
                    amounts=[
                        *((bound[q].duration, values) for q, values in durations.items()),
                        *((bound[q].wait, values) for q, values in waits.items()),
                    ]
                )

    def record(self, entry: Entry) -> None:
        """A result whose entry the slots just gave up, other than a plain unwritten ``done`` (:meth:`finished`
        buffers those itself; a sync job's timeout comes to :meth:`timed_out` as it happens)."""
        job, outcome, error = entry.job, entry.outcome, entry.error
        assert outcome is not None, "an executor reports an entry once its outcome is set"
        if entry.stuck:  # the thread of a timed-out job returned: its slot is free again
            self._m[job.queue].stuck.dec()
            if outcome == "done" and entry.written:  # it committed before the timeout was recorded (that was refused)
                self.count(job, "done")
            return  # otherwise its job was already failed at the timeout and its writes are rolled back
        if entry.cancelled and not (outcome == "done" and entry.written):
            self.count_cancelled(job)  # the row says cancelled already; its writes were rolled back
            return
        match outcome:
            case "done":
                if entry.written:
                    self.count(job, "done")
                    log.debug("job done", extra={"action": "job_done", "queue": job.queue, "job_id": job.id})
                elif entry.result is not None:  # written with its result by a statement of its own
                    self._with_results.append((job, entry.result))
                    self._needed.set()
                else:
                    self.defer(job)
            case "failed" | "timed_out":
                assert error is not None
                if outcome == "timed_out":  # an async handler stopped at its deadline
                    self._m[job.queue].timed_out.inc()
                self.fail(failure_for(job, error, entry.target.task, self._settings), outcome)
            case "snoozed":
                assert isinstance(error, Snooze)
                self.snooze(job, error.seconds)
            case "cancelled":
                self.count_cancelled(job)
            case "lease_lost":  # lost, or cancelled before this worker was told: the database says which
                self.refused(job)
            case "handed_back":
                self._handed_back.append(job)
            case "retried" | "unknown_task":
                raise AssertionError(f"an executor reported {outcome!r}: only a written failure is named so")
            case _ as never:
                assert_never(never)

    def timed_out(self, entry: Entry, error: BaseException, stuck: int) -> None:
        """A sync handler ran past its timeout (the executors marked its slot stuck: ``stuck`` slots are now): the job
        is failed (retried) now; the thread cannot be stopped, so its slot stays taken until it returns (its late
        writes are fenced out)."""
        job = entry.job
        m = self._m[job.queue]
        m.timed_out.inc()
        m.stuck.inc()
        self.fail(failure_for(job, error, entry.target.task, self._settings), "timed_out")
        log.warning(
            "sync handler past its timeout: job failed, slot stuck until the thread returns",
            extra={"action": "job_timed_out", "queue": job.queue, "job_id": job.id, "stuck": stuck},
        )

    def take_handed_back(self) -> list[Job]:
        """Running jobs given up at the end of a drain: to hand back (no attempt used)."""
        jobs, self._handed_back = self._handed_back, []
        return jobs

    # ------------------------------------------------------------------ writing
    async def run(self) -> None:
        """Flush loop: until :meth:`close`; a flush in flight is never cancelled (its result would be unknown)."""
        stopping, hurry = self._wakeup.stopping, self._wakeup.hurry
        while not self._closing:
            await self._needed.wait()
            self._needed.clear()
            if self._closing:
                break
            # Let the next claim carry the completions; once the oldest waited FLUSH_DELAY_SECONDS, have the claimer
            # claim now if it was only waiting for room for a whole batch (or wait for the claim after the one in
            # flight), else flush them alone (claims that keep coming take them first, and then no statement of its
            # own is needed). They never wait longer than FLUSH_MAX_WAIT_SECONDS.
            while not stopping.is_set() and not self._failed and self._done_since is not None:
                now = time.monotonic()
                wait = self._done_since + FLUSH_DELAY_SECONDS - now
                if wait <= 0:
                    if now - self._done_since >= FLUSH_MAX_WAIT_SECONDS or not hurry():
                        break
                    wait = FLUSH_RECHECK_SECONDS  # a claim takes them meanwhile (or fails and gives them back)
                await asyncio.sleep(wait)
            ended = self._done + [j for j, _ in self._with_results] + [f.job for f, _ in self._failed]
            self.flushes += bool(self._done or self._with_results)
            if not await self.flush():
                await self._store.backoff(stopping)
                self._needed.set()
            elif ended:
                self.ended_alone += 1
                if not stopping.is_set():
                    self._written(ended)

    def _written(self, jobs: list[Job]) -> None:
        """Jobs ended without a claim: wake the claim loop when one may have held back another (the next job of its
        serial key, or of its task at its global concurrency); other jobs' ends unblock nothing (no empty claim)."""
        gating = self._gating
        if any(j.serial_key is not None or j.task in gating for j in jobs):
            self._wakeup.wake("completed")

    async def flush(self) -> bool:
        ok = True
        if self._refused:
            refused, self._refused = self._refused, []
            cancelled = await self.cancelled_among(refused)
            for job in refused:
                if job.id in cancelled:
                    self.count_cancelled(job)
                else:
                    self.count(job, "lease_lost")
                    warn_lost(job, "completion refused: the lease was lost while the handler ran")
        while ok and self._done:
            batch = self.take_done()
            self._writing = list(batch)
            ok = False
            try:
                done = await self._store.complete(batch, worker=self._identity)
                if done is not None:
                    await self.settle(batch, done)
                    ok = True
            finally:  # on failure keep the results for the next or final flush
                self._writing = []
                if not ok:
                    self._done[:0] = batch
                    self._done_since = self._done_since or time.monotonic()
        while ok and self._with_results:
            ok = await self._write_results()
        if ok and self._snoozed:
            ok = await self._write_snoozes()
        while ok and self._failed:
            fails, self._failed = self._failed[:FLUSH_MAX], self._failed[FLUSH_MAX:]
            fails.sort(key=lambda fc: fc[0].job.id)
            self._writing = [f.job for f, _ in fails]
            ok = False
            try:
                failures = [f for f, _ in fails]
                statuses = await self._store.fail(failures, worker=self._identity)
                if statuses is not None:
                    cancelled = await self.cancelled_among([f.job for f in failures if f.job.id not in statuses])
                    for f, cause in fails:
                        status = "cancelled" if f.job.id in cancelled else statuses.get(f.job.id)
                        self._count_failure(f, cause, status)
                    ok = True
            finally:
                self._writing = []
                if not ok:
                    self._failed[:0] = fails
        return ok

    async def _write_results(self) -> bool:
        """Done jobs with their results, one statement per batch (fenced as every completion)."""
        batch = sorted(self._with_results[:FLUSH_MAX], key=lambda d: d[0].id)
        del self._with_results[:FLUSH_MAX]
        jobs = [j for j, _ in batch]
        self._writing = list(jobs)
        done: set[int] | None = None
        try:
            done = await self._store.complete_results(batch, worker=self._identity)
            if done is not None:
                await self.settle(jobs, done)
        finally:
            self._writing = []
            if done is None:
                self._with_results[:0] = batch
        return done is not None

    async def _write_snoozes(self) -> bool:
        batch, self._snoozed = sorted(self._snoozed, key=lambda s: s[0].id), []
        jobs = [j for j, _ in batch]
        self._writing = list(jobs)
        try:
            written = await self._store.snooze(jobs, [d for _, d in batch], worker=self._identity)
        except BaseException:
            self._snoozed[:0] = batch
            raise
        finally:
            self._writing = []
        if written is None:
            self._snoozed[:0] = batch
            return False
        cancelled = await self.cancelled_among([j for j in jobs if j.id not in written])
        for job, seconds in batch:
            if job.id in written:
                self.count(job, "snoozed")
                log.info("job snoozed for %.1fs", seconds, extra={"action": "job_snoozed", "job_id": job.id})
            elif job.id in cancelled:
                self.count_cancelled(job)
            else:
                self.count(job, "lease_lost")
                warn_lost(job, "snooze not recorded: the lease was lost before it was written")
        return True

    async def close(self, flusher: asyncio.Task[None] | None = None) -> None:
        """Stop the flush loop after its current flush, then write what is left (a few tries)."""
        self._closing = True
        self._needed.set()
        if flusher is not None:
            await asyncio.gather(flusher, return_exceptions=True)
        for _ in range(3):
            if await self.flush():
                return
        log.warning(
            "could not record %d result(s) before exit; their leases will expire and they will rerun",
            self.pending,
            extra={"action": "results_lost"},
        )


def warn_lost(job: Job, why: str) -> None:
    log.warning(
        "lease lost: %s; writes rolled back",
        why,
        extra={"action": "lease_lost", "queue": job.queue, "job_id": job.id, "attempt": job.attempts},
    )
