"""The queue gauges of a worker: backlog, delayed, processing, stalled and failed jobs, and the oldest ready job's
age, for the queues it serves, under the names and label values the operator exports.

One query (``AsyncQueue.stats``) refreshes them at most every ``queue_metrics_seconds``, in a task of the worker's
loop, never on the claim path, bounded by a timeout (a cancelled query is cancelled in the server too). A scrape
only reads the last values: a slow or unreachable database never stalls it. Values older than ``STALE_AFTER``
refresh intervals are not exported at all, so a worker that cannot read them shows no numbers rather than old ones.
Nothing is queried until the registry is first collected: a worker whose metrics nobody reads costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from skiplock.job import QueueStats

log = logging.getLogger(__name__)

STATES = ("ready", "delayed", "processing", "stalled", "failed", "waiting")
"""The ``state`` label values of ``skiplock_queue_jobs`` (the operator's too)."""
QUERY_TIMEOUT_SECONDS = 5.0
"""Longest one refresh may take (never more than the refresh interval)."""
STALE_AFTER = 4
"""Refresh intervals after which the last values are no longer exported."""


class StatsSource(Protocol):
    """What the gauges read: :meth:`skiplock.AsyncQueue.stats`."""

    async def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]: ...


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic() of the refresh
    rows: dict[str, QueueStats]


class QueueGauges(Collector):
    """A collector of the last refreshed values; :meth:`run` refreshes them until cancelled."""

    def __init__(self, source: StatsSource, queues: Sequence[str], interval: float) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0 (queue_metrics_seconds 0 means: do not create the gauges)")
        self.source = source
        self.queues = tuple(queues)
        self.interval = interval
        self.timeout = min(QUERY_TIMEOUT_SECONDS, interval)
        self.refreshes = 0
        self.failures = 0
        self._snapshot: Snapshot | None = None
        self._wanted = threading.Event()  # set by the first collect, from any thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    # ------------------------------------------------------------------------------ the refresh task
    async def run(self) -> None:
        """Wait for the first collect, then refresh every ``interval`` until cancelled."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self._wanted.is_set():
            self._wake.set()
        await self._wake.wait()
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    async def refresh(self) -> bool:
        """One bounded query; on any failure the last values stay (until they are too old to export)."""
        try:
            async with asyncio.timeout(self.timeout):
                rows = await self.source.stats()
        except Exception as exc:  # a metric must never stop the worker
            self.failures += 1
            if self.failures == 1 or self.failures % 10 == 0:
                what = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
                log.warning(
                    "queue gauges: the stats query %s; keeping the last values", what, extra={"action": "stats_failed"}
                )
            return False
        served = set(self.queues)
        self._snapshot = Snapshot(time.monotonic(), {r.queue: r for r in rows if r.queue in served})
        self.refreshes += 1
        self.failures = 0
        return True

    # ------------------------------------------------------------------------------ the scrape side
    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._want()
        snap = self._snapshot
        if snap is None or time.monotonic() - snap.at > STALE_AFTER * self.interval:
            return
        jobs = GaugeMetricFamily(
            "skiplock_queue_jobs",
            "Jobs of a queue by state (ready, delayed, processing, stalled, failed, waiting on parents): from the "
            "operator's poll, or from a worker for the queues it serves.",
            labels=["queue", "state"],
        )
        age = GaugeMetricFamily(
            "skiplock_queue_oldest_ready_age_seconds",
            "Age of the oldest ready job of a queue (0 when none is ready): from the operator's poll, or from a "
            "worker for the queues it serves.",
            labels=["queue"],
        )
        for queue in self.queues:
            row = snap.rows.get(queue)  # no row: nothing live in the queue
            for state in STATES:
                jobs.add_metric([queue, state], float(getattr(row, state)) if row is not None else 0.0)
            age.add_metric([queue], row.oldest_ready_age_seconds if row is not None else 0.0)
        yield jobs
        yield age

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []

    def _want(self) -> None:
        if self._wanted.is_set():
            return
        self._wanted.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has stopped
                loop.call_soon_threadsafe(wake.set)


async def export_queue_gauges(
    registry: CollectorRegistry, source: StatsSource, queues: Sequence[str], interval: float
) -> None:
    """Register the queue gauges of ``queues`` on ``registry`` and refresh them until cancelled; then unregister
    them (a stopped worker exports no queue numbers). The worker runs this as one task of its loop."""
    gauges = QueueGauges(source, queues, interval)
    registry.register(gauges)
    try:
        await gauges.run()
    finally:
        registry.unregister(gauges)
