"""The completer: the only writer of final states. Finished jobs wait in buffers; done ones ride on the next claim
(one statement, one commit) or are flushed alone after a short delay; failures are recorded at once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from operator import attrgetter

from skiplock.app import Task
from skiplock.backoff import backoff_seconds
from skiplock.errors import NonRetryableError, format_error
from skiplock.job import Job
from skiplock.metrics import BoundMetrics
from skiplock.settings import Settings
from skiplock.store.statements import Failure
from skiplock.worker.executor import UnknownTaskError
from skiplock.worker.scope import Scope

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
    return Failure(job, format_error(exc), delay, retry)


class Completer:
    def __init__(self, scope: Scope, metrics: dict[str, BoundMetrics], observe: Callable[[Job, str], None]) -> None:
        self._observe = observe  # each written outcome: done, retried, failed, unknown_*, lease_lost
        self._store = scope.store
        self._settings = scope.settings
        self._m = metrics
        self._identity = scope.identity
        self._done: list[Job] = []
        self._done_since: float | None = None  # when the oldest done job not yet taken by a claim finished
        self._failed: list[Failure] = []
        self._refused: list[Job] = []  # completions the fence refused in the handler's transaction
        self._snoozed: list[tuple[Job, float]] = []  # jobs to reschedule without using an attempt
        self._writing: list[Job] = []  # a flush in flight: still held (heartbeats, orphan release) until settled
        self._needed = asyncio.Event()
        self._closing = False
        self.flushes = 0  # statements that wrote done jobs no claim carried (the flush loop's own)
        self.observing: Callable[[], bool] = lambda: True
        """Whether anyone is told of each written outcome (else a batch of completions is counted per queue)."""
        self.on_written: Callable[[list[Job]], None] = lambda jobs: None
        """Called with the jobs the flush loop ended on its own (no claim carried them)."""
        self.hurry: Callable[[], bool] = lambda: False
        """Asked once done jobs waited FLUSH_DELAY_SECONDS: True while a claim that carries them is coming (the claimer
        claims at once instead of waiting for room for a whole batch, or one is in flight and the next follows)."""

    # ------------------------------------------------------------------ buffers
    def defer(self, *jobs: Job) -> None:
        """Jobs whose handlers returned without writing: the next claim completes them (or the flush loop)."""
        if jobs and not self._done:
            self._done_since = time.monotonic()
            self._needed.set()
        self._done.extend(jobs)

    def fail(self, failure: Failure) -> None:
        self._failed.append(failure)
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
        return self._done + [f.job for f in self._failed] + [j for j, _ in self._snoozed] + self._writing

    def holds(self, job: Job) -> bool:
        return any(j.id == job.id and j.attempts == job.attempts for j in self.jobs())

    @property
    def pending(self) -> int:
        return len(self._done) + len(self._failed) + len(self._refused) + len(self._snoozed)

    # ------------------------------------------------------------------ counting
    async def settle(self, done: list[Job], completed: set[int]) -> None:
        """Count a written batch. Jobs the fence refused may have been completed by an earlier try whose reply
        was lost with its connection: those are confirmed as done by this worker, not reported as lost."""
        if len(completed) < len(done):
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
        if len(completed) == len(done) and not debug and not self.observing():  # all written, nobody to tell
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
                m[job.queue].finished["lease_lost"].inc()
                self._observe(job, "lease_lost")
                warn_lost(job, "completion refused: the lease was lost before it was written")
        tally.add(counts=[(m[queue].finished["done"], n) for queue, n in by_queue.items()])

    def count_unstarted(self, job: Job, cancelled: bool) -> None:
        """A prefetched job whose lease was lost (or that was cancelled) before it started: it never starts."""
        if cancelled:
            self.count_cancelled(job)
            return
        self._m[job.queue].finished["lease_lost"].inc()
        self._observe(job, "lease_lost")
        log.warning(
            "a prefetched job's lease was lost before it started (recovered elsewhere): not started",
            extra={"action": "lease_lost_unstarted", "job_id": job.id, "queue": job.queue, "attempt": job.attempts},
        )

    def count_cancelled(self, job: Job) -> None:
        self._m[job.queue].finished["cancelled"].inc()
        self._observe(job, "cancelled")
        log.info("job cancelled while it ran", extra={"action": "job_cancelled", "queue": job.queue, "job_id": job.id})

    def _count_failure(self, f: Failure, status: str | None) -> None:
        job = f.job
        m = self._m[job.queue]
        extra = {
            "queue": job.queue,
            "task": job.task,
            "job_id": job.id,
            "attempt": job.attempts,
            "max_attempts": job.max_attempts,
            "error": f.error[:500],
        }
        unknown = f.error.startswith(UnknownTaskError.__name__)
        prefix = "unknown_" if unknown else ""
        if status == "cancelled":
            self.count_cancelled(job)
        elif status is None:
            m.finished["lease_lost"].inc()
            self._observe(job, "lease_lost")
            warn_lost(job, "failure not recorded: the lease was lost before it was written")
        elif status == "pending":
            m.finished["unknown_task" if unknown else "retried"].inc()
            self._observe(job, prefix + "retried")
            log.warning("job failed, will retry in %.1fs", f.delay_seconds, extra={"action": "job_retry", **extra})
        else:
            reason = "unknown_task" if unknown else ("exhausted" if f.retry else "non_retryable")
            m.finished["unknown_task" if unknown else "failed"].inc()
            m.failed[reason].inc()
            self._observe(job, prefix + "failed")
            log.error("job failed for good (%s)", reason.replace("_", "-"), extra={"action": "job_failed", **extra})

    # ------------------------------------------------------------------ writing
    async def run(self, stopping: asyncio.Event) -> None:
        """Flush loop: until :meth:`close`; a flush in flight is never cancelled (its result would be unknown)."""
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
                    if now - self._done_since >= FLUSH_MAX_WAIT_SECONDS or not self.hurry():
                        break
                    wait = FLUSH_RECHECK_SECONDS  # a claim takes them meanwhile (or fails and gives them back)
                await asyncio.sleep(wait)
            ended = self._done + [f.job for f in self._failed]
            self.flushes += bool(self._done)
            if not await self.flush():
                await self._store.backoff(stopping)
                self._needed.set()
            elif ended and not stopping.is_set():
                self.on_written(ended)  # jobs ended without a claim: one may have held back another (serial keys)

    async def flush(self) -> bool:
        ok = True
        if self._refused:
            refused, self._refused = self._refused, []
            cancelled = await self.cancelled_among(refused)
            for job in refused:
                if job.id in cancelled:
                    self.count_cancelled(job)
                else:
                    self._m[job.queue].finished["lease_lost"].inc()
                    self._observe(job, "lease_lost")
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
        if ok and self._snoozed:
            ok = await self._write_snoozes()
        while ok and self._failed:
            fails, self._failed = self._failed[:FLUSH_MAX], self._failed[FLUSH_MAX:]
            fails.sort(key=lambda f: f.job.id)
            self._writing = [f.job for f in fails]
            ok = False
            try:
                statuses = await self._store.fail(fails, worker=self._identity)
                if statuses is not None:
                    cancelled = await self.cancelled_among([f.job for f in fails if f.job.id not in statuses])
                    for f in fails:
                        status = "cancelled" if f.job.id in cancelled else statuses.get(f.job.id)
                        self._count_failure(f, status)
                    ok = True
            finally:
                self._writing = []
                if not ok:
                    self._failed[:0] = fails
        return ok

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
                self._m[job.queue].finished["snoozed"].inc()
                self._observe(job, "snoozed")
                log.info("job snoozed for %.1fs", seconds, extra={"action": "job_snoozed", "job_id": job.id})
            elif job.id in cancelled:
                self.count_cancelled(job)
            else:
                self._m[job.queue].finished["lease_lost"].inc()
                self._observe(job, "lease_lost")
                warn_lost(job, "snooze not recorded: the lease was lost before it was written")
        return True

    async def close(self, flusher: asyncio.Task[None] | None) -> None:
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
