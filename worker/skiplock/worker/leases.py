"""Leases: heartbeats that move each job's stored lease deadline, recovery of expired leases (judged by the
deadline in the row, never by this worker's setting), hand-back on drain, and reclaiming jobs whose claim
committed but whose reply was lost with the connection.

Its neighbours, given in that order: the store (:class:`LeaseStore`), the completer (:class:`Unwritten`: jobs finished
but not written yet), the executors (:class:`Held`: jobs waiting or running) and the shared wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from skiplock.job import Job
from skiplock.metrics import BoundMetrics
from skiplock.store.worker import LeaseStore
from skiplock.worker.scope import Scope
from skiplock.worker.wakeup import Wakeup

log = logging.getLogger(__name__)


class Unwritten(Protocol):
    """The completer's side: jobs finished here whose results are not written yet, and how an unstarted one ends."""

    def jobs(self) -> list[Job]: ...
    def holds(self, job: Job) -> bool: ...
    def count_unstarted(self, job: Job, cancelled: bool) -> None: ...
    def count_cancelled(self, job: Job) -> None: ...


class Held(Protocol):
    """The executors' side: jobs waiting in the buffer or running."""

    def jobs(self) -> list[Job]: ...
    def holds(self, job: Job) -> bool: ...
    def forget_waiting(self, jobs: list[Job]) -> list[Job]: ...
    def mark_renewed(self, sent: float) -> None: ...
    def cancel(self, ids: set[int]) -> list[Job]: ...


class Leases:
    def __init__(
        self,
        store: LeaseStore,
        scope: Scope,
        bound: dict[str, BoundMetrics],
        completer: Unwritten,
        executors: Held,
        wakeup: Wakeup,
        timeouts: dict[str, float] | None = None,
    ) -> None:
        settings, lease_overrides = scope.settings, scope.lease_overrides
        self._store = store
        self._scope = scope
        self._settings = settings
        self._identity = scope.identity
        self._queues = list(scope.queues)
        self._m = bound
        self._completer = completer
        self._executors = executors
        self._wakeup = wakeup
        self._timeouts = timeouts or {}  # task -> timeout: no lease is renewed past it
        self._warned: set[tuple[int, int]] = set()
        self.released = 0
        lease = settings.lease_seconds
        shortest = min([lease, *lease_overrides.values()])
        self.shortest = shortest  # the shortest lease of any job this worker runs
        assert settings.heartbeat_seconds is not None and settings.recover_seconds is not None
        # A task with a shorter lease than the worker's renews as often as its lease needs.
        self.heartbeat_seconds = min(settings.heartbeat_seconds, shortest / 4 if shortest < lease else lease)
        self.recover_seconds = settings.recover_seconds

    def tracked(self) -> list[Job]:
        """Every job this worker holds a lease for: waiting, running, or finished but not written."""
        return self._executors.jobs() + self._completer.jobs()

    def holds(self, job: Job) -> bool:
        """Whether it still holds this attempt (it may have finished during a round trip)."""
        return self._executors.holds(job) or self._completer.holds(job)

    def lease_for(self, job: Job) -> float:
        return self._scope.lease_for(job.task)

    def timeout_for(self, job: Job) -> float | None:
        if job.timeout_seconds is not None:
            return job.timeout_seconds
        return self._timeouts.get(job.task) if job.task else None

    # ------------------------------------------------------------------ heartbeats
    async def heartbeats(self, halt: asyncio.Event) -> None:
        """Until ``halt``: a loop that ends by itself, not by cancellation (a cancel that lands inside a database
        call can surface as a query error, be survived, and be lost)."""
        while not await _halted(halt, self.heartbeat_seconds):
            await self.beat()

    async def beat(self) -> None:
        jobs = self.tracked()
        if not jobs:
            return
        leases = [self.lease_for(j) for j in jobs]
        sent = time.monotonic()
        held = await self._store.heartbeat(
            jobs, worker=self._identity, leases=leases, timeouts=[self.timeout_for(j) for j in jobs]
        )
        if held is None:
            return
        lost = {j.id for j in jobs} - held  # heartbeat() returns the ids still held
        # Jobs still in the buffer never start (a handler run twice is worse than a job run late: another worker
        # has it now); they are removed before anything awaits, so no slot that frees meanwhile starts one.
        unstarted = self._executors.forget_waiting([j for j in jobs if j.id in lost]) if lost else []
        self._executors.mark_renewed(sent)  # every lease it found held was renewed: the buffered jobs left may start
        if not lost:
            return
        # the polling fallback of the control channel: a lost lease may be a cancellation
        cancelled = await self.check_cancelled([j for j in jobs if j.id in lost])
        for job in unstarted:
            lost.discard(job.id)
            self._completer.count_unstarted(job, job.id in cancelled)
        lost = lost - cancelled
        for job in jobs:
            key = (job.id, job.attempts)
            # A job that finished during the round trip is not lost: only warn for attempts still held now.
            if job.id in lost and key not in self._warned and self.holds(job):
                self._warned.add(key)
                log.warning(
                    "heartbeat found the lease lost (recovered or cancelled elsewhere); its result will be refused",
                    extra={"action": "lease_lost", "job_id": job.id, "queue": job.queue, "attempt": job.attempts},
                )
        self._warned &= {(j.id, j.attempts) for j in jobs}

    # ------------------------------------------------------------------ cancellation
    async def cancellations(self) -> None:
        """Check the held jobs whenever the control channel announces a cancel."""
        changed = self._wakeup.cancels_changed
        while True:
            await changed.wait()
            changed.clear()
            await self.check_cancelled()

    async def check_cancelled(self, jobs: list[Job] | None = None) -> set[int]:
        """Of the held jobs (or ``jobs``), the ids cancelled in the database; the worker is told of them."""
        held = self.tracked() if jobs is None else jobs
        if not held:
            return set()
        found = await self._store.cancelled_among(held, worker=self._identity, operation="heartbeat")
        if found:
            self.cancelled(found)
        return found or set()

    def cancelled(self, ids: set[int]) -> None:
        """Jobs of this worker found cancelled in the database: buffered ones never start (counted cancelled now),
        running ones are told."""
        for job in self._executors.cancel(ids):
            self._completer.count_cancelled(job)

    # ------------------------------------------------------------------ recovery
    async def recoverer(self, halt: asyncio.Event) -> None:
        while not halt.is_set():
            await self.recover()
            await _halted(halt, self.recover_seconds)

    async def recover(self) -> int:
        recovered = await self._store.recover_expired(queues=self._queues, lease_seconds=self._settings.lease_seconds)
        for r in recovered or []:
            bound = self._m.get(r.queue)
            if bound is not None:
                bound.recovered[r.status].inc()
            log.warning(
                "recovered a job whose lease expired",
                extra={"action": "lease_recovered", "queue": r.queue, "job_id": r.id, "status": r.status},
            )
        if recovered:
            self._wakeup.wake("recovered")
        return len(recovered or [])

    # ------------------------------------------------------------------ hand-back
    async def release(self, jobs: list[Job]) -> int:
        if not jobs:
            return 0
        ids = await self._store.release(jobs, worker=self._identity)
        for job in jobs:
            if ids and job.id in ids:
                m = self._m[job.queue]
                m.released.inc()
                m.finished["handed_back"].inc()
        if ids:
            self.released += len(ids)
            log.info(
                "handed back %d unfinished job(s) without burning an attempt",
                len(ids),
                extra={"action": "jobs_released"},
            )
        return len(ids or ())

    async def reclaim_orphans(self) -> bool:
        """After a call whose reply was lost: hand back jobs leased to this worker that it does not know it runs.
        Returns False when the database did not answer (try again later)."""
        known = [j.id for j in self.tracked()]
        rows = await self._store.release_orphans(worker=self._identity, queues=self._queues, known=known)
        if rows is None:
            return False
        if rows:
            self.released += len(rows)
            log.warning(
                "handed back %d job(s) whose claim reply was lost with the connection (no attempt burnt)",
                len(rows),
                extra={"action": "orphans_released"},
            )
            self._wakeup.wake("recovered")
        return True


async def _halted(halt: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``halt`` is set; True when halted."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await halt.wait()
    return halt.is_set()
