"""The worker: notify/poll claim loop, bounded concurrency, fenced handler transactions, batched completion,
heartbeats, lease recovery, and a graceful SIGTERM drain.

One asyncio loop runs the control plane. Sync handlers run on ``concurrency`` long-lived threads fed through a
queue; their results come back to the loop in batches (one wake-up for many jobs). A sync handler's ``job.conn``
is checked out of the pool on first use only; an async handler gets an async connection for every job. A handler
that wrote through ``job.conn`` is completed, fenced, in its own transaction; the others are completed in a batch
that rides on the worker's next claim (one statement and one commit for both), or is flushed on its own when no
claim is coming.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import psycopg
from prometheus_client import CollectorRegistry
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from skiplock import __version__
from skiplock.backoff import backoff_seconds
from skiplock.errors import DatabaseUnavailableError
from skiplock.handlers import Handler
from skiplock.job import Job, LazyConnection
from skiplock.listener import Listener
from skiplock.metrics import Exporter, QueueCollector, StatsFetcher, WorkerMetrics
from skiplock.queue import AsyncQueue, Failure, Queue, check_connect
from skiplock.settings import CONTROL_CONNECTIONS, Settings, redact

log = logging.getLogger(__name__)
T = TypeVar("T")
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError, DatabaseUnavailableError)
FLUSH_MAX = 500
APPLICATION_NAME = "skiplock-worker"
# Immediate tries of one control-plane call before backing off: after a server restart or killed backends every
# pooled control connection may be dead (each failure discards one), so one more than the pool holds.
DB_ATTEMPTS = CONTROL_CONNECTIONS + 1
# With jobs in flight and work waiting, wait up to this long for a whole batch of slots to free before claiming,
# so one claim statement carries several jobs instead of one per finished job.
CLAIM_GATHER_SECONDS = 0.005
# Finished jobs wait up to this long for the next claim to carry their completion; then they are flushed alone.
FLUSH_DELAY_SECONDS = 0.02
# A pooled connection not checked out for longer than this is pinged before use: after a server restart or a
# killed backend the pool would otherwise hand out one dead connection per slot (and burn a job attempt on each).
# The time is stamped at checkout, in the pool's check callback: a reset callback would cost more than the rest of
# a checkout (about 25 us of the pool's 40).
IDLE_CHECK_SECONDS = 2.0


def _stale(conn: Any) -> bool:
    """True when ``conn`` was last checked out over IDLE_CHECK_SECONDS ago (or never); stamps it now."""
    now = time.monotonic()
    last = getattr(conn, "_skiplock_checked_out", 0.0)
    setattr(conn, "_skiplock_checked_out", now)  # noqa: B010 - psycopg connections take attributes
    return bool(now - last > IDLE_CHECK_SECONDS)


async def _acheck(conn: psycopg.AsyncConnection[Any]) -> None:
    if _stale(conn):
        await conn.execute("SELECT 1")
        if not conn.autocommit:
            await conn.rollback()  # hand it out idle: a handler that never uses job.conn keeps its batching


def _check(conn: psycopg.Connection[Any]) -> None:
    if _stale(conn):
        conn.execute("SELECT 1")
        if not conn.autocommit:
            conn.rollback()


class _HandlerUsedConnection(Exception):
    """Internal: the handler's transaction was aborted by a database error it swallowed."""


@dataclass
class _Running:
    job: Job
    started: float
    task: asyncio.Task[None] | None = None  # async handlers only; sync ones run on the handler threads


class Worker:
    """Runs one queue's jobs until :meth:`request_stop`. Build it with settings and a loaded handler."""

    def __init__(self, settings: Settings, handler: Handler, *, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.handler = handler
        self.identity = f"{settings.worker_id}:{uuid.uuid4().hex[:8]}"
        self.queue_name = settings.queue
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry)
        self.m = self.metrics.describe_worker(self.queue_name, settings.concurrency, __version__)
        self._running: dict[int, _Running] = {}
        self._done_buf: list[Job] = []
        self._fail_buf: list[Failure] = []
        self._lost: set[tuple[int, int]] = set()
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._flush_needed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._force = False
        self._last_tick = time.monotonic()
        self._db_ok = False
        self._db_failures = 0
        self._aq: AsyncQueue | None = None
        self._claim_conn: psycopg.AsyncConnection[Any] | None = None  # held by the claim loop between claims
        self._sync_pool: ConnectionPool[Any] | None = None
        self._job_pool: AsyncConnectionPool[Any] | None = None
        self._sync_queue: Queue | None = None
        self._exporter: Exporter | None = None
        self.listener: Listener | None = None
        # sync handlers: jobs go to the threads through the inbox, results come back through the outbox
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._outbox: deque[tuple[Job, str | BaseException, float]] = deque()
        self._collect_scheduled = False
        self.released = 0
        self.abandoned_threads = 0

    # ------------------------------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        """Run until asked to stop; returns the process exit code (0 after a clean drain)."""
        s = self.settings
        dsn = s.require_dsn()
        await asyncio.to_thread(check_connect, dsn)
        # Control-plane calls (claim, batched completion, heartbeat, recovery) are single statements: on
        # autocommit connections they cost one round trip each, not three (BEGIN, statement, COMMIT).
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=CONTROL_CONNECTIONS,
            open=False,
            name="skiplock-control",
            reconnect_timeout=0,
            timeout=10,
            check=_acheck,
            kwargs={"application_name": APPLICATION_NAME, "autocommit": True},
        )
        await pool.open()
        self._aq = AsyncQueue(pool, s, owned=True)
        # job.conn: one transactional connection per slot, from a pool of the handler's colour.
        if self.handler.is_async:
            self._job_pool = AsyncConnectionPool(
                dsn,
                min_size=1,
                max_size=s.concurrency,
                open=False,
                name="skiplock-handlers",
                reconnect_timeout=0,
                timeout=30,
                check=_acheck,
                kwargs={"application_name": APPLICATION_NAME},
            )
            await self._job_pool.open()
        else:
            self._sync_pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=s.concurrency,
                open=False,
                name="skiplock-handlers",
                reconnect_timeout=0,
                timeout=30,
                check=_check,
                kwargs={"application_name": APPLICATION_NAME},
            )
            self._sync_pool.open()
            self._sync_queue = Queue(pool=self._sync_pool, settings=s)
            self._loop = asyncio.get_running_loop()
            # One thread per slot. Daemon threads: one stuck in a handler must not keep the process alive after
            # its job was handed back.
            self._threads = [
                threading.Thread(target=self._handler_thread, name=f"skiplock-handler-{i}", daemon=True)
                for i in range(s.concurrency)
            ]
            for thread in self._threads:
                thread.start()
        if s.metrics_port:
            self._start_exporter()
        log.info(
            "worker started",
            extra={
                "action": "worker_started",
                "queue": self.queue_name,
                "worker": self.identity,
                "handler": self.handler.spec,
                "concurrency": s.concurrency,
                "dsn": s.masked_dsn,
            },
        )
        tasks = [
            asyncio.create_task(self._ticker(), name="ticker"),
            asyncio.create_task(self._flusher(), name="flusher"),
            asyncio.create_task(self._heartbeats(), name="heartbeat"),
            asyncio.create_task(self._recoverer(), name="recoverer"),
        ]
        self.metrics.listener_enabled.set(1 if s.listen else 0)
        if s.listen:
            self.listener = Listener(
                dsn,
                s.channel,
                self.queue_name,
                self._wake.set,
                application_name=APPLICATION_NAME,
                on_state=lambda up: self.metrics.listener_connected.set(1 if up else 0),
                on_notify=lambda: self.metrics.last_notification.set(time.time()),
                on_unsupported=lambda: self.metrics.listener_enabled.set(0),
            )
            tasks.append(asyncio.create_task(self.listener.run(), name="listener"))
        try:
            await self._claim_loop()
            await self._return_claim_conn()
            await self._drain()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._return_claim_conn()
            await self._flush_all(final=True)
            if self._exporter:
                self._exporter.stop()
            if self._sync_pool is not None:
                for _ in self._threads:
                    self._inbox.put(None)
                if self.abandoned_threads:
                    # Handler threads cannot be interrupted; their jobs were handed back and their late
                    # completion is fenced out. The CLI exits without joining them.
                    log.warning(
                        "%d handler thread(s) still running at exit",
                        self.abandoned_threads,
                        extra={"action": "threads_left"},
                    )
                else:
                    await asyncio.to_thread(self._join_threads)
                    await asyncio.to_thread(self._sync_pool.close)
            if self._job_pool is not None:
                await self._job_pool.close()
            await pool.close()
            log.info(
                "worker stopped",
                extra={"action": "worker_stopped", "queue": self.queue_name, "released": self.released},
            )
        return 0

    def request_stop(self) -> None:
        """First call: stop claiming and drain. Second call: stop waiting for in-flight jobs."""
        if self._stopping.is_set():
            self._force = True
            self._slot_freed.set()
            for r in list(self._running.values()):
                if r.task is not None:
                    r.task.cancel()
            return
        log.info("stop requested: draining", extra={"action": "drain_started", "in_flight": len(self._running)})
        self._stopping.set()
        self._wake.set()
        self._slot_freed.set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    # ------------------------------------------------------------------------------------------ claiming
    async def _claim_loop(self) -> None:
        s = self.settings
        more = True
        gather = max(1, min(s.batch, s.concurrency))
        while not self._stopping.is_set():
            free = s.concurrency - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                try:
                    async with asyncio.timeout(1.0):
                        await self._slot_freed.wait()
                except TimeoutError:
                    await self._return_claim_conn()  # all slots busy for a while (maybe hours): the pool has it
                    await self._slot_freed.wait()
                continue
            if more and self._running and free < gather:
                free = await self._gather_slots(gather)
            if not more:
                await self._return_claim_conn()  # idle: the pool checks and recycles it meanwhile
                source = await self._wait_for_work()
                if self._stopping.is_set():
                    break
                self.metrics.wakeups.labels(source).inc()
            self._wake.clear()
            want = min(s.batch, free)
            # The finished jobs waiting for their batch ride on this claim: one statement, one commit.
            done, self._done_buf = self._done_buf[:FLUSH_MAX], self._done_buf[FLUSH_MAX:]
            try:
                result = await self._db("claim", partial(self._complete_and_claim, done, want))
            except BaseException:
                self._done_buf[:0] = done
                raise
            if result is None:
                # The completions must not wait for a claim that keeps failing (a statement timeout on a slow
                # scan, a lock wait): the flusher writes them on their own.
                self._done_buf[:0] = done
                self._flush_needed.set()
                await self._backoff_after_error()
                more = True
                continue
            completed, jobs = result
            self._count_done(done, completed)
            more = len(jobs) == want
            if more:
                self.metrics.wakeups.labels("busy").inc()
            if jobs:
                self.m.claimed.inc(len(jobs))
                now = datetime.now(UTC)
                for job in jobs:
                    self._start(job, now)
                self.m.in_flight.set(len(self._running))

    async def _complete_and_claim(self, done: list[Job], want: int) -> tuple[set[int], list[Job]]:
        """The hot path on the connection the claim loop keeps between claims (no pool checkout per claim: 1.33x
        drain in a same-run A/B). A connection that fails goes back to the pool (which drops it if broken) and
        the next call checks out another."""
        aq = self._queue()
        if self._claim_conn is None:
            self._claim_conn = await aq.pool.getconn()
        try:
            return await aq.complete_and_claim(
                done, self.queue_name, limit=want, worker=self.identity, conn=self._claim_conn
            )
        except BaseException:
            await self._return_claim_conn()
            raise

    async def _return_claim_conn(self) -> None:
        conn, self._claim_conn = self._claim_conn, None
        if conn is not None:
            await self._queue().pool.putconn(conn)

    async def _gather_slots(self, wanted: int) -> int:
        """Wait a few milliseconds for ``wanted`` free slots (fewer if time runs out); returns the free slots."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLAIM_GATHER_SECONDS):  # one timer, no task per wake-up (as wait_for has)
                while self.settings.concurrency - len(self._running) < wanted and not self._stopping.is_set():
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
        return self.settings.concurrency - len(self._running)

    async def _wait_for_work(self) -> str:
        """Sleep until NOTIFY, recovered jobs or a stop request set the wake event, or the poll interval ends."""
        try:
            async with asyncio.timeout(self.settings.poll_seconds):
                await self._wake.wait()
        except TimeoutError:
            return "poll"
        return "notify"

    def _start(self, job: Job, now: datetime) -> None:
        running = _Running(job, time.monotonic())
        self._running[job.id] = running
        if self.handler.is_async:
            running.task = asyncio.create_task(self._run_async_job(job), name=f"job-{job.id}")
        else:
            self._inbox.put(job)
        if job.visible_at is not None:
            self.m.wait.observe(max(0.0, (now - job.visible_at).total_seconds()))

    def _finished(self, job: Job, outcome: str | BaseException, when: float) -> None:
        """Record one finished job; a result for a job handed back meanwhile (shutdown) is dropped."""
        running = self._running.get(job.id)
        if running is None or running.job.attempts != job.attempts:
            return
        del self._running[job.id]
        self.m.duration.observe(when - running.started)
        self._record(job, outcome)

    def _slots_changed(self) -> None:
        self.m.in_flight.set(len(self._running))
        self._slot_freed.set()

    # ------------------------------------------------------------------------------------------ async handlers
    async def _run_async_job(self, job: Job) -> None:
        try:
            outcome: str | BaseException = await self._run_async(job)
        except asyncio.CancelledError:
            # Only at shutdown past the grace period: hand the job back without burning an attempt.
            self._running.pop(job.id, None)
            self._slots_changed()
            await self._release([job])
            raise
        except BaseException as exc:  # the handler raised: retry or fail, fenced (as on the handler threads)
            outcome = exc
        self._finished(job, outcome, time.monotonic())
        self._slots_changed()

    async def _run_async(self, job: Job) -> str:
        assert self._aq is not None and self._job_pool is not None
        async with self._job_pool.connection() as conn:
            try:
                await self.handler.func(job.with_conn(conn))
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # keep the handler's exception; the pool drops a bad conn
                    await conn.rollback()
                raise
            status = conn.info.transaction_status
            if status == TransactionStatus.IDLE:
                return "batch"
            if status != TransactionStatus.INTRANS:
                await conn.rollback()
                raise _HandlerUsedConnection("the handler's transaction was aborted by a database error it caught")
            done = await self._aq.complete([job], worker=self.identity, conn=conn)
            if not done:
                await conn.rollback()
                return "lease_lost"
            await conn.commit()
            return "done"

    # ------------------------------------------------------------------------------------------ sync handlers
    def _handler_thread(self) -> None:
        """One slot: run jobs from the inbox until a None arrives; post each outcome back to the loop."""
        while (job := self._inbox.get()) is not None:
            if job.id not in self._running:  # handed back at shutdown before this thread got to it
                continue
            try:
                outcome: str | BaseException = self._run_sync_unit(job)
            except BaseException as exc:  # the handler raised: retry or fail, fenced
                outcome = exc
            self._outbox.append((job, outcome, time.monotonic()))
            if not self._collect_scheduled:  # one loop wake-up carries every result posted until it runs
                self._collect_scheduled = True
                assert self._loop is not None
                with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has exited
                    self._loop.call_soon_threadsafe(self._collect)

    def _collect(self) -> None:
        self._collect_scheduled = False  # before draining: a result posted from now on schedules another call
        while self._outbox:
            self._finished(*self._outbox.popleft())
        self._slots_changed()

    def _join_threads(self) -> None:
        for t in self._threads:
            t.join(timeout=5)

    def _run_sync_unit(self, job: Job) -> str:
        assert self._sync_pool is not None and self._sync_queue is not None
        pool = self._sync_pool
        lease = LazyConnection(pool.getconn)
        try:
            try:
                self.handler.func(job.with_conn(lease))
            except BaseException:
                if lease.conn is not None:
                    with contextlib.suppress(psycopg.Error):  # keep the handler's exception
                        lease.conn.rollback()
                raise
            if lease.failed is not None:  # the handler swallowed it: its writes never happened
                raise _HandlerUsedConnection(f"job.conn could not be checked out: {lease.failed}")
            conn = lease.conn
            if conn is None:
                return "batch"
            status = conn.info.transaction_status
            if status == TransactionStatus.IDLE:
                return "batch"
            if status != TransactionStatus.INTRANS:
                conn.rollback()
                raise _HandlerUsedConnection("the handler's transaction was aborted by a database error it caught")
            done = self._sync_queue.complete([job], worker=self.identity, conn=conn)
            if not done:
                conn.rollback()
                return "lease_lost"
            conn.commit()
            return "done"
        finally:
            if lease.conn is not None:
                pool.putconn(lease.conn)

    def _record(self, job: Job, outcome: str | BaseException) -> None:
        q = self.queue_name
        if isinstance(outcome, BaseException):
            self._fail_buf.append(Failure.from_exception(job, outcome, self.settings))
            self._flush_needed.set()
            return
        if outcome == "batch":  # the handler did not write through job.conn: complete with the next claim
            self._done_buf.append(job)
            self._flush_needed.set()
            return
        self.m.finished[outcome].inc()
        if outcome == "lease_lost":
            self._warn_lost(job)
        else:
            log.debug("job done", extra={"action": "job_done", "queue": q, "job_id": job.id})

    # ------------------------------------------------------------------------------------------ batched results
    async def _flusher(self) -> None:
        while True:
            await self._flush_needed.wait()
            self._flush_needed.clear()
            if not self._stopping.is_set() and not self._fail_buf:
                # Let the next claim (work waiting, or the next NOTIFY) carry the completions; flush them alone
                # if none comes by then. Failures are recorded at once.
                await asyncio.sleep(FLUSH_DELAY_SECONDS)
            ok = await self._flush_all()
            if not ok:
                await self._backoff_after_error()
                self._flush_needed.set()

    async def _flush_all(self, final: bool = False) -> bool:
        ok = True
        while ok and self._done_buf:
            batch, self._done_buf = self._done_buf[:FLUSH_MAX], self._done_buf[FLUSH_MAX:]
            ok = False
            try:
                ok = await self._flush_done(batch)
            finally:  # on failure or cancellation (shutdown) keep the results for the next or final flush
                if not ok:
                    self._done_buf[:0] = batch
        while ok and self._fail_buf:
            fails, self._fail_buf = self._fail_buf[:FLUSH_MAX], self._fail_buf[FLUSH_MAX:]
            ok = False
            try:
                ok = await self._flush_failed(fails)
            finally:
                if not ok:
                    self._fail_buf[:0] = fails
        if not ok and final:
            log.warning(
                "could not record %d result(s) before exit; their leases will expire and they will rerun",
                len(self._done_buf) + len(self._fail_buf),
                extra={"action": "results_lost"},
            )
        return ok

    async def _flush_done(self, done: list[Job]) -> bool:
        ok_ids = await self._db("complete", lambda: self._queue().complete(done, worker=self.identity))
        if ok_ids is None:
            return False
        self._count_done(done, ok_ids)
        return True

    def _count_done(self, done: list[Job], ok_ids: set[int]) -> None:
        if done:
            self.m.finished["done"].inc(len(ok_ids))
        for job in done:
            if job.id not in ok_ids:
                self.m.finished["lease_lost"].inc()
                self._warn_lost(job)

    async def _flush_failed(self, fails: list[Failure]) -> bool:
        statuses = await self._db("fail", lambda: self._queue().fail(fails, worker=self.identity))
        if statuses is None:
            return False
        for f in fails:
            self._count_failure(f, statuses.get(f.job.id))
        return True

    def _count_failure(self, f: Failure, status: str | None) -> None:
        q, job = self.queue_name, f.job
        extra = {
            "queue": q,
            "job_id": job.id,
            "attempt": job.attempts,
            "max_attempts": job.max_attempts,
            "error": f.error[:500],
        }
        if status is None:
            self.m.finished["lease_lost"].inc()
            self._warn_lost(job)
        elif status == "pending":
            self.m.finished["retried"].inc()
            log.warning("job failed, will retry in %.1fs", f.delay_seconds, extra={"action": "job_retry", **extra})
        else:
            self.m.finished["failed"].inc()
            reason = "non_retryable" if not f.retry else "exhausted"
            self.m.failed[reason].inc()
            log.error("job failed for good (%s)", reason.replace("_", "-"), extra={"action": "job_failed", **extra})

    def _warn_lost(self, job: Job) -> None:
        log.warning(
            "lease lost before completion: result discarded, writes rolled back",
            extra={"action": "lease_lost", "queue": self.queue_name, "job_id": job.id},
        )

    # ------------------------------------------------------------------------------------------ leases
    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds or 15.0)
            jobs = [r.job for r in self._running.values()] + list(self._done_buf) + [f.job for f in self._fail_buf]
            if not jobs:
                continue
            alive = await self._db("heartbeat", partial(self._queue().heartbeat, jobs, worker=self.identity))
            if alive is None:
                continue
            for job in jobs:
                if job.id not in alive and (job.id, job.attempts) not in self._lost:
                    self._lost.add((job.id, job.attempts))
                    log.warning(
                        "heartbeat found the lease lost",
                        extra={"action": "lease_lost", "job_id": job.id, "queue": self.queue_name},
                    )
            self._lost &= {(j.id, j.attempts) for j in jobs}

    async def _recoverer(self) -> None:
        while True:
            recovered = await self._db("recover", lambda: self._queue().recover_expired(queue=self.queue_name))
            for r in recovered or []:
                self.m.recovered[r.status].inc()
                log.warning(
                    "recovered a job whose lease expired",
                    extra={
                        "action": "lease_recovered",
                        "queue": r.queue,
                        "job_id": r.id,
                        "status": r.status,
                        "attempt": r.attempts,
                    },
                )
            if recovered:
                self._wake.set()
            await asyncio.sleep(self.settings.recover_seconds or 30.0)

    async def _release(self, jobs: list[Job]) -> None:
        ids = await self._db("release", lambda: self._queue().release(jobs, worker=self.identity))
        if ids:
            self.released += len(ids)
            self.m.released.inc(len(ids))
            log.info(
                "handed back %d unfinished job(s) without burning an attempt",
                len(ids),
                extra={"action": "jobs_released", "queue": self.queue_name},
            )

    # ------------------------------------------------------------------------------------------ shutdown
    async def _drain(self) -> None:
        if not self._running:
            return
        grace = self.settings.shutdown_grace_seconds
        log.info(
            "waiting up to %.0fs for %d in-flight job(s)", grace, len(self._running), extra={"action": "drain_wait"}
        )
        deadline = time.monotonic() + grace
        while self._running and time.monotonic() < deadline and not self._force:
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), timeout=max(0.01, deadline - time.monotonic()))
        self._collect()  # results already posted by the handler threads count as finished
        left = list(self._running.values())
        if not left:
            return
        log.warning(
            "grace period over: handing back %d job(s) still running", len(left), extra={"action": "drain_timeout"}
        )
        if not self.handler.is_async:
            # Threads cannot be cancelled: forget their jobs and hand them back now; a late result is dropped
            # (and its completion would be fenced out anyway).
            self._running.clear()
            self._slots_changed()
            self.abandoned_threads = len(left)
            await self._release([r.job for r in left])
            return
        tasks = [r.task for r in left if r.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=5)

    # ------------------------------------------------------------------------------------------ plumbing
    def _queue(self) -> AsyncQueue:
        assert self._aq is not None
        return self._aq

    async def _db(self, operation: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """Run one control-plane call. A database error is logged, counted and survived (None): the caller backs
        off and tries again. A transient one is retried at once first, since after a server restart or a killed
        backend the pool can hand out one dead connection per slot (every call here is fenced or idempotent)."""
        for attempt in range(1, DB_ATTEMPTS + 1):
            try:
                result = await call()
                break
            except TRANSIENT as exc:
                if attempt < DB_ATTEMPTS:
                    continue
                self._db_error(operation, exc, logging.WARNING)
                return None
            except (psycopg.Error, DatabaseUnavailableError) as exc:  # not transient: a bug, a privilege, a standby
                self._db_error(operation, exc, logging.ERROR)
                return None
        if not self._db_ok:
            if self._db_failures:
                log.info("database reachable again", extra={"action": "db_recovered"})
            self._db_ok = True
            self._db_failures = 0
            self.metrics.database_up.set(1)
        return result

    def _db_error(self, operation: str, exc: BaseException, level: int) -> None:
        self.metrics.db_errors.labels(operation).inc()
        self.metrics.database_up.set(0)
        self._db_ok = False
        self._db_failures += 1
        if self._db_failures == 1 or self._db_failures % 10 == 0:
            log.log(
                level,
                "database error during %s (%s: %s); retrying",
                operation,
                type(exc).__name__,
                redact(str(exc).strip(), self.settings.dsn),
                extra={"action": "db_error"},
            )

    async def _backoff_after_error(self) -> None:
        delay = backoff_seconds(max(self._db_failures, 1), base=0.2, cap=10.0, jitter=0.5)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)

    async def _ticker(self) -> None:
        while True:
            self._last_tick = time.monotonic()
            await asyncio.sleep(1.0)

    def _start_exporter(self) -> None:
        s = self.settings
        fetch = StatsFetcher(s)
        self.registry.register(QueueCollector(fetch, ttl=max(s.poll_seconds, 5.0)))
        self._exporter = Exporter(self.registry, s.metrics_host, s.metrics_port, self._healthy, self._ready)
        self._exporter.start()
        log.info("metrics on :%d (/metrics, /healthz, /readyz)", self._exporter.port, extra={"action": "exporter_up"})

    def _healthy(self) -> tuple[bool, str]:
        age = time.monotonic() - self._last_tick
        return (age < 30.0, f"event loop tick {age:.1f}s ago")

    def _ready(self) -> tuple[bool, str]:
        if self._stopping.is_set():
            return False, "draining"
        return (self._db_ok, "database reachable" if self._db_ok else "database unreachable")
