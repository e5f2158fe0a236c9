"""The operator's metrics endpoint with one JobQueue's queue-wide series, refreshed from PostgreSQL at each scrape.

The operator is the one source of ``skiplock_queue_jobs{namespace,jobqueue,queue,state}``,
``skiplock_queue_oldest_ready_age_seconds{namespace,jobqueue,queue}`` and
``skiplock_operator_database_up{namespace,jobqueue}``, set from its backlog poll. This registry runs the same
poll (``Queue.stats`` on a real database) before every collection and hands the rows to the operator's own
``OperatorMetrics.observe_queues``. An ``OperatorMetrics`` without that method (an operator that does not export
queue gauges yet) gets stand-in gauges of the same names and labels, so the rules and the dashboard are always
tested against the series the operator publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import Metric

from skiplock import Queue, Settings
from skiplock.job import QueueStats
from skiplock_operator.metrics import OperatorMetrics

STATES = ("ready", "delayed", "processing", "stalled", "failed")
QUEUE_WIDE = ("skiplock_queue_jobs", "skiplock_queue_oldest_ready_age_seconds", "skiplock_operator_database_up")

Observe = Callable[[str, str, Mapping[str, QueueStats]], None]


class PolledRegistry(CollectorRegistry):
    """A registry that runs ``refresh`` before each collection (each scrape)."""

    def __init__(self) -> None:
        super().__init__()
        self.refresh: Callable[[], None] = lambda: None

    def collect(self) -> Iterator[Metric]:
        self.refresh()
        yield from super().collect()


def stand_in(registry: CollectorRegistry) -> tuple[Observe, Gauge]:
    """Queue gauges with the operator's names and labels, for an OperatorMetrics that lacks them."""
    jobs = Gauge(
        "skiplock_queue_jobs",
        "Jobs of a queue by state.",
        ["namespace", "jobqueue", "queue", "state"],
        registry=registry,
    )
    age = Gauge(
        "skiplock_queue_oldest_ready_age_seconds",
        "Age of the oldest ready job.",
        ["namespace", "jobqueue", "queue"],
        registry=registry,
    )
    up = Gauge(
        "skiplock_operator_database_up", "1 when the last poll succeeded.", ["namespace", "jobqueue"], registry=registry
    )

    def observe(namespace: str, jobqueue: str, stats: Mapping[str, QueueStats]) -> None:
        for queue, row in stats.items():
            for state in STATES:
                jobs.labels(namespace, jobqueue, queue, state).set(getattr(row, state))
            age.labels(namespace, jobqueue, queue).set(row.oldest_ready_age_seconds)
        up.labels(namespace, jobqueue).set(1)

    return observe, up


def operator_registry(settings: Settings, *, namespace: str, jobqueue: str, queues: Iterable[str]) -> CollectorRegistry:
    """The operator's registry (OperatorMetrics) with JobQueue ``namespace/jobqueue`` polled at each scrape."""
    registry = PolledRegistry()
    metrics: Any = OperatorMetrics(registry)
    if hasattr(metrics, "observe_queues"):
        observe, up = metrics.observe_queues, metrics.database_up
    else:
        observe, up = stand_in(registry)
    names = tuple(queues)

    def refresh() -> None:
        try:
            with Queue(settings=settings, max_size=1) as queue:
                found = {s.queue: s for s in queue.stats()}
        except psycopg.Error:
            up.labels(namespace, jobqueue).set(0)
            return
        idle = {name: QueueStats(name, 0, 0, 0, 0, 0, 0.0) for name in names}
        observe(namespace, jobqueue, {name: found.get(name, idle[name]) for name in names})

    if hasattr(metrics, "watch_retention"):
        metrics.watch_retention(namespace, jobqueue)  # as the operator's retention daemon does at its start
    if hasattr(metrics, "watch_schedules"):
        metrics.watch_schedules(namespace, jobqueue)  # as the operator's schedule firer does at its start
    registry.refresh = refresh
    return registry
