"""The worker: a thin lifecycle that wires the seams together, starts them, reports ready, drains and stops.

Seams (each owns its state; they talk through small methods):
- ``claimer``: the claim loop (wake-ups, polling, free slots, one claim statement for all queues)
- ``executor``: routing a job to its task, the slots, and the async and thread executors (one Outcome each)
- ``completer``: done/failed buffers riding on claims, flushes; the only writer of final states
- ``leases``: heartbeats, recovery by the stored deadline, hand-back, orphan reclaim
- ``retention``: the scheduled purge of old jobs, one worker of the fleet at a time
- ``scope``: what every seam shares (``skiplock.store.worker.WorkerStore`` is its data access); ``pools``: the
  one pool constructor

Embed it in an asyncio program (``await worker.run()``, ``async with Worker(...)``) or in a thread of a sync one
(``worker.start()`` / ``worker.stop()``). Signal handling is the CLI's: ``request_stop()`` works from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry

from skiplock import __version__
from skiplock.app import App, is_async_callable
from skiplock.errors import ConfigError
from skiplock.exporter import Exporter, serve
from skiplock.handlers import Handler
from skiplock.job import Job, Outcome
from skiplock.listener import Listener
from skiplock.metrics import TableCollector, TableFetcher, WorkerMetrics
from skiplock.settings import Settings
from skiplock.store.run import check_connect
from skiplock.store.statements import Failure
from skiplock.store.worker import PgWorkerStore
from skiplock.worker import flow, loops
from skiplock.worker.claimer import Claimer
from skiplock.worker.completer import Completer, failure_for, queue_counts
from skiplock.worker.executor import AsyncExecutor, Entry, Router, Slots, ThreadExecutor
from skiplock.worker.leases import Leases
from skiplock.worker.pools import APPLICATION_NAME, async_pool, sync_pool
from skiplock.worker.queue_gauges import export_queue_gauges
from skiplock.worker.retention import Retention
from skiplock.worker.schedules import Scheduler
from skiplock.worker.scope import Scope

__all__ = ["APPLICATION_NAME", "Outcome", "Worker", "serve_queues"]
log = logging.getLogger(__name__)
CONTROL_WORDS = ("cancel", "pause")
"""Payloads of the control channel (``Settings.control_channel``): what the workers recheck."""
STOP_WAIT_SECONDS = 5.0


def serve_queues(settings: Settings, app: App | None, handler: Handler | None) -> tuple[str, ...]:
    """The queues a worker serves: ``settings.queues``, else every queue its app's tasks name (plus
    ``settings.queue`` for a catch-all handler), else ``settings.queue``."""
    if settings.queues:
        return settings.queues
    if app is not None and len(app):
        extra = (settings.queue,) if handler is not None else ()
        return tuple(dict.fromkeys((*app.queues, *extra)))
    return (settings.queue,)


def _ignore(*_: Any) -> None:
    return None


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for background tasks to end (a few seconds at most: one may be inside a database call)."""
    done, pending = await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
    for t in pending:
        log.warning("background task %s did not stop in time", t.get_name(), extra={"action": "task_left"})
        t.cancel()
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("background task %s failed: %r", t.get_name(), t.exception(), extra={"action": "task_failed"})


def _as_handler(handler: Handler | Callable[..., Any] | None) -> Handler | None:
    if handler is None or isinstance(handler, Handler):
        return handler
    name = f"{getattr(handler, '__module__', '?')}:{getattr(handler, '__qualname__', type(handler).__name__)}"
    return Handler(name, handler, is_async_callable(handler))


class Worker:
    """Runs the jobs of an :class:`App` (and/or a catch-all handler) on its queues until asked to stop."""

    def __init__(
        self,
        app: App | None = None,
        *,
        settings: Settings,
        handler: Handler | Callable[..., Any] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if app is None and handler is None:
            raise ConfigError("a worker needs an app (--app) or a handler (--handler)")
        if app is not None and not len(app) and handler is None:
            raise ConfigError(f"app {app.name!r} registers no task")
        settings.require_dsn()
        self.settings = settings
        self.app = app
        self.handler = _as_handler(handler)
        self.router = Router(app, self.handler)
        self.queues = serve_queues(settings, app, self.handler)
        self.identity = f"{settings.worker_id}:{uuid.uuid4().hex[:8]}"
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry)
        self._bound = self.metrics.describe_worker(self.queues, settings.concurrency, __version__)
        self.listener: Listener | None = None
        self.released = 0
        self.abandoned_threads = 0
        self.exit_code: int | None = None
        self.observe: Callable[[Job, Outcome], None] = _ignore
        """Called on the loop with each outcome counted (every :data:`~skiplock.job.Outcome` but handed_back)."""
        self.on_claimed: Callable[[int], None] = lambda n: None
        """Called on the loop with the number of jobs of each non-empty claim."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requests = 0
        self._lock = threading.Lock()
        self._force = False
        self._started = threading.Event()
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[int] | None = None
        self._last_tick = time.monotonic()
        self._to_release: list[Job] = []
        self._slots: Slots | None = None
        self._store: PgWorkerStore | None = None
        self._claimer: Claimer | None = None
        self._completer: Completer | None = None
        self._leases: Leases | None = None
        self._async: AsyncExecutor | None = None
        self._threads: ThreadExecutor | None = None
        self.retention: Retention | None = None

    # ------------------------------------------------------------------------------------------ public
    async def run(self, *, until_idle: bool = False) -> int:
        """Run until :meth:`request_stop` (or, with ``until_idle``, until nothing is due and nothing runs);
        returns the exit code (0 after a clean drain). Startup errors raise (ConfigError, DatabaseUnavailableError)."""
        try:
            code = await self._run(until_idle)
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._finished.set()
            self._started.set()  # unblock start() on a startup failure
        self.exit_code = code
        return code

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the worker claims (pools open, seams started); raises the startup error if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._started.is_set():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("worker not ready in time")
            await asyncio.sleep(0.01)
        if self._error is not None:
            raise self._error

    @property
    def ready(self) -> bool:
        return self._started.is_set() and self._error is None and not self._finished.is_set()

    def request_stop(self) -> None:
        """First call: stop claiming and drain. Second: stop waiting for running jobs. Safe from any thread."""
        with self._lock:
            loop = self._loop
            if loop is None or loop.is_closed():
                self._stop_requests += 1  # before run(): it stops at once
                return
        if threading.get_ident() == self._loop_thread:
            self._on_stop()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to stop
                loop.call_soon_threadsafe(self._on_stop)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name="skiplock-worker")
        try:
            await self.wait_ready()
        except BaseException:
            with contextlib.suppress(BaseException):
                await self._task
            raise
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._stopping is None or not self._stopping.is_set():  # a stop already requested drains, never forced
            self.request_stop()
        if self._task is not None:
            await self._task

    def start(self, timeout: float = 60.0) -> None:
        """Run in a background thread with its own event loop; returns once ready (raises a startup error)."""
        if self._thread is not None:
            raise RuntimeError("worker already started")

        def main() -> None:
            with contextlib.suppress(BaseException):  # kept in self._error, raised by start() or stop()
                loops.run(self.run(), self.settings.event_loop)

        self._thread = threading.Thread(target=main, name="skiplock-worker", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            self.request_stop()
            self._thread.join(STOP_WAIT_SECONDS)
            raise TimeoutError(f"worker not ready within {timeout:g}s (stopped)")
        if self._error is not None:
            raise self._error

    def stop(self, timeout: float | None = None) -> int | None:
        """Drain and wait (from any thread but the worker's own loop: await the task of ``run()`` there);
        returns the exit code, or None if it did not stop within ``timeout``."""
        if self._loop is not None and threading.get_ident() == self._loop_thread:
            raise RuntimeError("stop() would block the worker's own event loop: call request_stop() and await run()")
        self.request_stop()
        if self._loop is None and self._thread is None:  # never started
            return self.exit_code
        if self._thread is not None:
            self._thread.join(timeout)
        elif not self._finished.wait(timeout):
            return None
        if self._error is not None and not isinstance(self._error, asyncio.CancelledError):
            raise self._error
        return self.exit_code

    @property
    def in_flight(self) -> int:
        return len(self._slots) if self._slots is not None else 0

    # ------------------------------------------------------------------------------------------ lifecycle
    async def _run(self, until_idle: bool) -> int:
        s = self.settings
        stopping = self._stopping = asyncio.Event()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            if self._stop_requests:
                stopping.set()
        exporter = self._bind_exporter()  # a busy port fails before any connection is opened
        try:
            await asyncio.to_thread(check_connect, s.require_dsn())
            return await self._serve(stopping, exporter, until_idle)
        finally:
            if exporter is not None:
                exporter.stop()

    async def _serve(self, stopping: asyncio.Event, exporter: Exporter | None, until_idle: bool) -> int:
        s = self.settings
        dsn = s.require_dsn()
        store = self._store = PgWorkerStore(s, self.metrics)
        await store.open()
        kinds = self.router.kinds
        overrides = self.router.lease_overrides()
        slots = self._slots = Slots(s.concurrency, lease=min([s.lease_seconds, *overrides.values()]))
        for queue, m in self._bound.items():  # read at each scrape: handler threads start jobs the loop never sees
            m.in_flight.set_function(partial(slots.running_in, queue))
        limits = await flow.register_limits(store, self.app, self.identity) if self.app is not None else ()
        scope = Scope(store, s, self.identity, self.queues, overrides, limits)
        completer = self._completer = Completer(scope, self._bound, self._observe, slots, self._refill)
        completer.observing = lambda: self.observe is not _ignore
        leases = self._leases = Leases(
            scope,
            self._bound,
            tracked=lambda: slots.jobs() + completer.jobs(),
            holds=lambda job: slots.holds(job) or completer.holds(job),
            wake=lambda: self._wake("recovered"),
            cancelled=self._on_cancelled,
            timeouts=self.router.timeouts(),
            unstarted=slots.forget_waiting,
            renewed=slots.mark_renewed,
            unstarted_lost=completer.count_unstarted,
        )
        completer.on_written = partial(self._on_written, {x.task for x in limits if x.global_concurrency is not None})
        claimer = self._claimer = Claimer(
            scope, slots, completer, leases, self._admit, self._start_jobs, self.metrics, stopping
        )
        claimer.until_idle = until_idle
        completer.hurry = claimer.hurry
        tasks: list[asyncio.Task[Any]] = []
        try:
            if True in kinds:
                pool = async_pool(dsn, "skiplock-handlers", s.concurrency, autocommit=True, timeout=30)
                await pool.open()
                self._async = AsyncExecutor(
                    s.concurrency, slots, pool, store.statements, self.identity, completer.finished_one
                )
            if False in kinds:
                spool = sync_pool(dsn, "skiplock-handlers", s.concurrency, timeout=30)
                await asyncio.to_thread(spool.open)
                self._threads = ThreadExecutor(
                    s.concurrency,
                    slots,
                    spool,
                    store.statements,
                    self.identity,
                    completer.finished,
                    completer.timed_out,
                )
            flusher = asyncio.create_task(completer.run(stopping), name="completer")
            halt = asyncio.Event()  # set once the drain is over: heartbeats and recovery end by themselves
            loops = [
                asyncio.create_task(leases.heartbeats(halt), name="heartbeat"),
                asyncio.create_task(leases.recoverer(halt), name="recoverer"),
            ]
            tasks = [
                asyncio.create_task(self._ticker(), name="ticker"),
                asyncio.create_task(leases.cancellations(), name="cancellations"),
                asyncio.create_task(claimer.watch_paused(self._bound), name="paused"),
                asyncio.create_task(claimer.watch_table(), name="replan"),
            ]
            if s.queue_metrics_seconds:  # the queue gauges of its queues: one bounded query in the background
                gauges = export_queue_gauges(self.registry, store, self.queues, s.queue_metrics_seconds)
                tasks.append(asyncio.create_task(gauges, name="queue-gauges"))
            upkeep: list[asyncio.Task[None]] = []  # purge and ticks: they stop when the drain starts
            if not until_idle:
                self.retention = Retention(s, self.metrics, store)
                upkeep.append(asyncio.create_task(self.retention.run(), name="retention"))
                if self.app is not None and self.app.schedules:  # periodic tasks: register and fire their ticks
                    scheduler = Scheduler(s, self.app, self.metrics, store)
                    upkeep.append(asyncio.create_task(scheduler.run(), name="schedules"))
                tasks += upkeep
            self.metrics.listener_enabled.set(1 if s.listen else 0)
            if s.listen and not until_idle:
                self.listener = Listener(
                    dsn,
                    s.channel,
                    self.queues,
                    lambda: self._wake("notify"),
                    application_name=APPLICATION_NAME,
                    on_state=self._listener_state,
                    on_notify=lambda: self.metrics.last_notification.set(time.time()),
                    on_unsupported=lambda: self.metrics.listener_enabled.set(0),
                    also={s.control_channel: (CONTROL_WORDS, self._on_control)},  # one connection for both
                )
                tasks.append(asyncio.create_task(self.listener.run(), name="listener"))
            if exporter is not None:
                exporter.start()
            self._log_started()
            self._started.set()
            try:
                await claimer.run()
                await leases.release(claimer.take_buffer())  # never started: handed back at once, no attempt burnt
                for t in upkeep:  # a purge batch in flight commits (and is counted) or not at all
                    t.cancel()
                await self._drain()
            except asyncio.CancelledError:  # run() cancelled (a lifespan's task.cancel(), Ctrl-C): hand back now
                stopping.set()
                slots.shut()
                self._force = True
                await self._drain()
                raise
            finally:
                halt.set()
                for t in tasks:
                    t.cancel()
                await _settle(tasks + loops)
                self._collect()  # results posted meanwhile are written, not rerun
                await completer.close(flusher)
                await leases.release(self._to_release + completer.take_handed_back() + claimer.take_buffer())
                self.released = leases.released
        finally:
            await self._close_executors()
            await store.close()
            c = self._claimer
            log.info(
                "worker stopped",
                extra={
                    "action": "worker_stopped",
                    "queues": self.queues,
                    "released": self.released,
                    "claims": c.claims if c is not None else 0,
                    "empty_claims": c.empty_claims if c is not None else 0,
                    "claims_after": c.claims_after if c is not None else 0,
                    "claims_hurried": c.hurried if c is not None else 0,
                    "flushes": self._completer.flushes if self._completer is not None else 0,
                },
            )
        return 0

    async def _close_executors(self) -> None:
        if self._threads is not None:
            if self.abandoned_threads:
                # Handler threads cannot be interrupted; their jobs were handed back and a late completion is
                # fenced out. The CLI exits without joining them.
                log.warning(
                    "%d handler thread(s) still running at exit",
                    self.abandoned_threads,
                    extra={"action": "threads_left"},
                )
                self._threads.close(join=False)
            else:
                await asyncio.to_thread(self._threads.close, join=True)
        if self._async is not None:
            await self._async.close()

    def _on_stop(self) -> None:
        assert self._stopping is not None
        if self._stopping.is_set():
            if self._force:
                return
            self._force = True  # second request: stop waiting for running jobs
            if self._slots is not None:
                self._slots.freed.set()
            return
        log.info("stop requested: draining", extra={"action": "drain_started", "in_flight": self.in_flight})
        self._stopping.set()
        if self._slots is not None:
            self._slots.shut()  # handler threads start no buffered job any more
        if self._claimer is not None:
            self._claimer.wake()
        if self._slots is not None:
            self._slots.freed.set()

    async def _drain(self) -> None:
        slots = self._slots
        assert slots is not None and self._leases is not None
        if not len(slots):
            return
        grace = self.settings.shutdown_grace_seconds
        log.info("waiting up to %.0fs for %d in-flight job(s)", grace, len(slots), extra={"action": "drain_wait"})
        deadline = time.monotonic() + grace
        while len(slots) and time.monotonic() < deadline and not self._force:
            slots.freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slots.freed.wait(), timeout=max(0.01, deadline - time.monotonic()))
        self._collect()  # results already posted count as finished
        left = slots.entries()
        if not left:
            return
        log.warning(
            "grace period over: handing back %d job(s) still running", len(left), extra={"action": "drain_timeout"}
        )
        handles = [e.handle for e in left if e.handle is not None]
        for e in left:
            if e.handle is None and slots.pop(e.job) is not None:  # a thread: forget it, hand its job back
                self.abandoned_threads += 1
                self._to_release.append(e.job)
        for h in handles:
            h.cancel()
        if handles:
            await asyncio.wait(handles, timeout=5)

    # ------------------------------------------------------------------------------------------ jobs
    def _admit(self, jobs: list[Job]) -> None:
        """A claim's jobs: each routed to what runs it and buffered in the slots (a payload no handler can receive,
        or a task this worker does not know, is failed at once)."""
        assert self._slots is not None and self._completer is not None
        # the clock in the rows' own time zone: datetimes sharing one tzinfo subtract without asking it for offsets
        zone = jobs[0].visible_at.tzinfo if jobs and jobs[0].visible_at is not None else None
        now = datetime.now(zone or UTC)
        claimed = time.monotonic()
        self._callback(self.on_claimed, len(jobs))
        targets = self.router.targets
        entries = []
        for job in jobs:
            if job._decode_error is not None:  # never retried
                self._completer.fail(Failure(job, job._decode_error, 0.0, False))
                continue
            target = targets.get(job.task)
            if target is None:  # retried with backoff, failed when attempts are spent
                self._completer.fail(failure_for(job, self.router.unknown(job), None, self.settings), "unknown_task")
                continue
            visible = job.visible_at
            delta = (now - visible).total_seconds() if visible is not None else 0.0
            waited = delta if delta > 0.0 else 0.0  # not max(): it parses keyword arguments, 500 instructions a call
            entries.append(Entry(job, target, claimed, waited))
        bound = self._bound
        self.metrics.tally.add(counts=[(bound[queue].claimed, n) for queue, n in queue_counts(jobs, len(bound))])
        self._slots.wait(entries)

    def _start_jobs(self, entries: list[Entry]) -> None:
        """Slots are free or jobs were buffered: the loop starts the sync jobs with a timeout, and wakes an async
        runner for the async ones (the runners then take them themselves)."""
        for entry in entries:
            assert self._threads is not None
            self._threads.submit(entry)
        if self._async is not None:
            self._async.wake()

    def _collect(self) -> None:
        """Every result posted so far (drain, exit): counted as finished, not rerun."""
        if self._threads is not None:
            self._threads.collect()
        if self._completer is not None:
            self._completer.collect_async()

    def _refill(self) -> None:
        """Slots freed: start prefetched jobs in them now (the claim loop refills the buffer meanwhile)."""
        if self._claimer is not None:
            self._claimer.feed()

    def _on_cancelled(self, ids: set[int]) -> None:
        """Jobs of this worker found cancelled in the database (control notification or heartbeat)."""
        assert self._slots is not None and self._completer is not None
        for job in self._claimer.drop(ids) if self._claimer is not None else []:  # prefetched, never started
            self._completer.count_cancelled(job)
        for e in self._slots.cancel(ids):
            log.info(
                "cancelling a running job", extra={"action": "job_cancelling", "queue": e.job.queue, "job_id": e.job.id}
            )

    def _on_control(self) -> None:
        """A notification on the control channel (cancel, pause): each seam rechecks what it owns."""
        if self._leases is not None:
            self._leases.poke()
        if self._claimer is not None:
            self._claimer.poke_paused()

    def _listener_state(self, up: bool) -> None:
        self.metrics.listener_connected.set(1 if up else 0)
        if up:
            self.metrics.listener_enabled.set(1)  # a later probe proved it after all

    def _observe(self, job: Job, outcome: Outcome) -> None:
        if self.observe is not _ignore:  # the hot path pays nothing when nobody observes
            self._callback(self.observe, job, outcome)

    @staticmethod
    def _callback(fn: Callable[..., None], *args: Any) -> None:
        """A user callback: an exception is logged, never allowed to stop the claim loop or a flush."""
        try:
            fn(*args)
        except Exception:
            log.exception("worker callback %r failed", fn, extra={"action": "callback_failed"})

    def _on_written(self, gating: set[str], jobs: list[Job]) -> None:
        """Jobs ended without a claim: wake the claim loop when one may have held back another (the next job of its
        serial key, or of its task at its global concurrency); other jobs' ends unblock nothing (no empty claim)."""
        if any(j.serial_key is not None or j.task in gating for j in jobs):
            self._wake("completed")

    def _wake(self, source: str) -> None:
        if self._claimer is not None:
            self._claimer.wake(source)

    # ------------------------------------------------------------------------------------------ health
    async def _ticker(self) -> None:
        while True:
            self._last_tick = time.monotonic()
            await asyncio.sleep(1.0)

    def _bind_exporter(self) -> Exporter | None:
        s = self.settings
        if not s.metrics_port:
            return None
        exporter = serve(
            self.registry, s.metrics_host, s.metrics_port, {"/healthz": self._healthy, "/readyz": self._ready}
        )
        self.registry.register(TableCollector(TableFetcher(s), ttl=max(s.poll_seconds, 5.0)))
        log.info("metrics on :%d (/metrics, /healthz, /readyz)", exporter.port, extra={"action": "exporter_up"})
        return exporter

    def _healthy(self) -> tuple[bool, str]:
        age = time.monotonic() - self._last_tick
        return (age < 30.0, f"event loop tick {age:.1f}s ago")

    def _ready(self) -> tuple[bool, str]:
        if self._stopping is not None and self._stopping.is_set():
            return False, "draining"
        stuck = self._slots.stuck() if self._slots is not None else 0
        if stuck and self._slots is not None and stuck >= self._slots.capacity:
            return False, f"all {stuck} slots stuck in handlers past their timeout"
        ok = self._store is not None and self._store.ok
        note = f"; {stuck} slot(s) stuck past their timeout" if stuck else ""
        return (ok, ("database reachable" if ok else "database unreachable") + note)

    def _log_started(self) -> None:
        s = self.settings
        log.info(
            "worker started",
            extra={
                "action": "worker_started",
                "queues": list(self.queues),
                "worker": self.identity,
                "tasks": len(self.app) if self.app is not None else 0,
                "handler": self.handler.spec if self.handler is not None else None,
                "concurrency": s.concurrency,
                "loop": loops.name(asyncio.get_running_loop()),
                "dsn": s.masked_dsn,
            },
        )
