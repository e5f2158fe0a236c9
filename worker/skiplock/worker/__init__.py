"""The worker: the lifecycle only. It opens the store, builds the seams in dependency order, starts them, reports
ready, drains and stops; every job, result and lease belongs to a seam.

Seams (each owns its state; each is given the ones it calls, typed by a Protocol in its own module):
- ``completer``: done/failed buffers riding on claims, flushes, every outcome counted; the only writer of final states
- ``executor``: :class:`~skiplock.worker.executor.Executors`, the one owner of the slots (``slots``): routing, the
  prefetch buffer, the async and thread executors (one Outcome each), results handed to the completer
- ``leases``: heartbeats, recovery by the stored deadline, cancels, hand-back, orphan reclaim
- ``claimer``: the claim loop (wake-ups, polling, the room the executors report, one claim statement for all queues)
- ``wakeup``: the one object they share to wake each other (and the listener that sets it)
- ``retention``, ``schedules``: the scheduled purge and periodic tasks; ``scope``: what every seam shares;
  ``pools``: the one pool constructor; ``health``: the probes and the exporter that serves them

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
from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry

from skiplock import __version__
from skiplock.app import App
from skiplock.errors import ConfigError
from skiplock.exporter import Exporter
from skiplock.handlers import Handler
from skiplock.job import Job, Outcome
from skiplock.listener import Listener
from skiplock.metrics import WorkerMetrics
from skiplock.settings import Settings
from skiplock.store.run import check_connect
from skiplock.store.tasks import defaults_of
from skiplock.store.worker import PgWorkerStore
from skiplock.worker import flow, loops, services
from skiplock.worker.claimer import Claimer
from skiplock.worker.completer import Completer
from skiplock.worker.executor import Executors, Router, as_handler, serve_queues
from skiplock.worker.health import Health, Serving
from skiplock.worker.leases import Leases
from skiplock.worker.pools import APPLICATION_NAME
from skiplock.worker.scope import Scope
from skiplock.worker.services import STOP_WAIT_SECONDS
from skiplock.worker.wakeup import Wakeup

__all__ = ["APPLICATION_NAME", "Outcome", "Worker", "serve_queues"]
log = logging.getLogger(__name__)


class Worker:
    """Runs the jobs of an :class:`App` (and/or a catch-all handler) on its queues until asked to stop."""

    def __init__(
        self,
        app: App | None = None,
        *,
        settings: Settings,
        handler: Handler | Callable[..., Any] | None = None,
        registry: CollectorRegistry | None = None,
        observe: Callable[[Job, Outcome], None] | None = None,
    ) -> None:
        """``observe``: called on the loop with each outcome counted (every :data:`~skiplock.job.Outcome` but
        handed_back); an exception it raises is logged."""
        if app is None and handler is None:
            raise ConfigError("a worker needs an app (--app) or a handler (--handler)")
        if app is not None and not len(app) and handler is None:
            raise ConfigError(f"app {app.name!r} registers no task")
        settings.require_dsn()
        self.settings = settings
        self.app = app
        self.handler = as_handler(handler)
        self.router = Router(app, self.handler)
        self.queues = serve_queues(settings, app, self.handler)
        self.identity = f"{settings.worker_id}:{uuid.uuid4().hex[:8]}"
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry)
        self.health = Health(settings, self.registry)
        self._bound = self.metrics.describe_worker(self.queues, settings.concurrency, __version__)
        self.listener: Listener | None = None
        self.released = 0
        self.exit_code: int | None = None
        self._observe = observe
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wakeup: Wakeup | None = None
        self._stop_requests = 0
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[int] | None = None
        self._began: float | None = None  # when it started serving (the stop line says how long it ran)
        # the seams, once built (see _serve): kept for the health checks, the last log line and tests
        self._store: PgWorkerStore | None = None
        self._completer: Completer | None = None
        self._executors: Executors | None = None
        self._leases: Leases | None = None
        self._claimer: Claimer | None = None

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
        if self._wakeup is None or not self._wakeup.stopping.is_set():  # a stop already requested drains, not forced
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
        return self._executors.running() if self._executors is not None else 0

    # ------------------------------------------------------------------------------------------ lifecycle
    async def _run(self, until_idle: bool) -> int:
        wakeup = self._wakeup = Wakeup()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            if self._stop_requests:
                wakeup.stop()
        exporter = self.health.bind()  # a busy port fails before any connection is opened
        try:
            await asyncio.to_thread(check_connect, self.settings.require_dsn())
            return await self._serve(wakeup, exporter, until_idle)
        finally:
            if exporter is not None:
                exporter.stop()

    async def _serve(self, wakeup: Wakeup, exporter: Exporter | None, until_idle: bool) -> int:
        """Open the store, build the seams in dependency order (store -> completer -> executors -> leases -> claimer
        -> listener), start their loops, claim until the stop, drain, and close in reverse."""
        s, bound = self.settings, self._bound
        store = self._store = PgWorkerStore(s, self.metrics)
        await store.open()
        executors: Executors | None = None
        try:
            limits = await flow.register_limits(store, self.app, self.identity) if self.app is not None else ()
            if self.app is not None:  # each task's queue and defaults, for producers enqueueing by name
                await store.register_tasks(map(defaults_of, self.app), app=self.app.name, worker=self.identity)
            scope = Scope(s, self.identity, self.queues, self.router.lease_overrides(), limits)
            completer = self._completer = Completer(store, scope, bound, wakeup, self._observe)
            executors = self._executors = await Executors.open(
                scope, self.router, completer, wakeup, bound, store.statements
            )
            leases = self._leases = Leases(store, scope, bound, completer, executors, wakeup, self.router.timeouts())
            claimer = self._claimer = Claimer(
                store, scope, completer, executors, leases, wakeup, self.metrics, bound, until_idle=until_idle
            )
            flusher = asyncio.create_task(completer.run(), name="completer")
            halt = asyncio.Event()  # set once the drain is over: heartbeats and recovery end by themselves
            lease_loops = [
                asyncio.create_task(leases.heartbeats(halt), name="heartbeat"),
                asyncio.create_task(leases.recoverer(halt), name="recoverer"),
            ]
            tasks = [
                asyncio.create_task(self.health.ticker(), name="ticker"),
                asyncio.create_task(leases.cancellations(), name="cancellations"),
                asyncio.create_task(claimer.watch_paused(), name="paused"),
                asyncio.create_task(claimer.watch_table(), name="replan"),
            ]
            bg = services.start(
                s, self.app, self.queues, store, wakeup, self.metrics, self.registry, until_idle=until_idle
            )
            self.listener = bg.listener
            tasks += bg.upkeep + bg.others
            self.health.serve(Serving(wakeup.stopping, executors, store))
            if exporter is not None:
                exporter.start()
            self._log_started()
            self._started.set()
            try:
                await claimer.run()
                await leases.release(executors.take_buffer())  # never started: handed back at once, no attempt burnt
                for t in bg.upkeep:  # a purge batch in flight commits (and is counted) or not at all
                    t.cancel()
                await executors.drain(s.shutdown_grace_seconds)
            except asyncio.CancelledError:  # run() cancelled (a lifespan's task.cancel(), Ctrl-C): hand back now
                wakeup.stop(force=True)
                executors.shut()
                await executors.drain(s.shutdown_grace_seconds)
                raise
            finally:
                halt.set()
                for t in tasks:
                    t.cancel()
                await services.settle(tasks + lease_loops)
                executors.collect()  # results posted meanwhile are written, not rerun
                await completer.close(flusher)
                await leases.release(
                    executors.take_abandoned() + completer.take_handed_back() + executors.take_buffer()
                )
                self.released = leases.released
        finally:
            if executors is not None:
                await executors.close()
            await store.close()
            stats = self._claimer.stats() if self._claimer is not None else {}
            flushes = self._completer.flushes if self._completer is not None else 0
            ran = time.monotonic() - self._began if self._began is not None else 0.0
            log.info(
                "worker stopped after %.1fs; %d running job(s) handed back for another worker",
                ran,
                self.released,
                extra={"action": "worker_stopped", "queues": ",".join(self.queues)},
            )
            log.info(  # for benchmarks (bench/scenario.py reads them), apart from the stop line
                "claim statistics", extra={"action": "worker_claims", **stats, "flushes": flushes}
            )
        return 0

    def _on_stop(self) -> None:
        wakeup = self._wakeup
        assert wakeup is not None
        if wakeup.forced:
            return
        draining = wakeup.stopping.is_set()
        wakeup.stop()  # the first request drains, a second stops waiting for running jobs
        if not draining:
            log.info("stop requested: draining", extra={"action": "drain_started", "in_flight": self.in_flight})
            if self._executors is not None:
                self._executors.shut()  # handler threads start no buffered job any more

    def _log_started(self) -> None:
        s = self.settings
        self._began = time.monotonic()
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
