"""The background services of a serving worker that are no seam's own loop: the scheduled purge, the periodic
tasks' ticks, the queue gauges and the listener (:func:`start`), and how the lifecycle waits for background tasks
to end (:func:`settle`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from skiplock.app import App
from skiplock.listener import Listener
from skiplock.metrics import WorkerMetrics
from skiplock.settings import Settings
from skiplock.store.worker import PgWorkerStore
from skiplock.worker.queue_gauges import export_queue_gauges
from skiplock.worker.retention import Retention
from skiplock.worker.schedules import Scheduler
from skiplock.worker.wakeup import Wakeup, listener

log = logging.getLogger(__name__)
STOP_WAIT_SECONDS = 5.0
"""How long the stop waits for a background task (one may be inside a database call) before it cancels it."""


@dataclass(frozen=True)
class Services:
    upkeep: list[asyncio.Task[None]]
    """The purge and the ticks: cancelled when the drain starts (a purge batch in flight commits or not at all)."""
    others: list[asyncio.Task[Any]]
    """The gauges and the listener: cancelled when the worker stops."""
    listener: Listener | None


def start(
    settings: Settings,
    app: App | None,
    queues: Sequence[str],
    store: PgWorkerStore,
    wakeup: Wakeup,
    metrics: WorkerMetrics,
    registry: CollectorRegistry,
    *,
    until_idle: bool,
) -> Services:
    """Start the services a worker runs (a worker run until idle purges nothing, fires no tick and listens to
    nothing: it polls)."""
    s = settings
    upkeep: list[asyncio.Task[None]] = []
    others: list[asyncio.Task[Any]] = []
    if s.queue_metrics_seconds:  # the queue gauges of its queues: one bounded query in the background
        gauges = export_queue_gauges(registry, store, queues, s.queue_metrics_seconds)
        others.append(asyncio.create_task(gauges, name="queue-gauges"))
    if not until_idle:
        upkeep.append(asyncio.create_task(Retention(s, metrics, store).run(), name="retention"))
        if app is not None and app.schedules:  # periodic tasks: register and fire their ticks
            upkeep.append(asyncio.create_task(Scheduler(s, app, metrics, store).run(), name="ticks"))
    metrics.listener_enabled.set(1 if s.listen else 0)
    heard = None
    if s.listen and not until_idle:  # its return after an outage makes the pool connect now (see connect_now)
        heard = listener(s, queues, wakeup, metrics, store.statements, on_up=store.connect_now)
    if heard is not None:
        others.append(asyncio.create_task(heard.run(), name="listener"))
    return Services(upkeep, others, heard)


async def settle(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for background tasks to end (:data:`STOP_WAIT_SECONDS` at most: one may be inside a database call)."""
    done, pending = await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
    for t in pending:
        log.warning("background task %s did not stop in time", t.get_name(), extra={"action": "task_left"})
        t.cancel()
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("background task %s failed: %r", t.get_name(), t.exception(), extra={"action": "task_failed"})
