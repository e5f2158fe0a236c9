"""The operator's queue-wide series, as the tests' stand-in exporter publishes them.

The operator is the one source of ``skiplock_queue_jobs{namespace,jobqueue,queue,state}``,
``skiplock_queue_oldest_ready_age_seconds{namespace,jobqueue,queue}`` and
``skiplock_operator_database_up{namespace,jobqueue}``. This collector publishes exactly those names and labels,
with values read from a real PostgreSQL at every scrape (``Queue.stats``), next to the operator's own
``OperatorMetrics``; the alert rules and the dashboard are tested against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from skiplock import Queue, Settings
from skiplock_operator.metrics import OperatorMetrics

STATES = ("ready", "delayed", "processing", "stalled", "failed")
QUEUE_WIDE = ("skiplock_queue_jobs", "skiplock_queue_oldest_ready_age_seconds", "skiplock_operator_database_up")


class QueueGauges(Collector):
    """One JobQueue's queue-wide gauges, computed from the database when scraped."""

    def __init__(self, settings: Settings, *, namespace: str, jobqueue: str, queues: Iterable[str]) -> None:
        self.settings, self.namespace, self.jobqueue, self.queues = settings, namespace, jobqueue, tuple(queues)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "skiplock_queue_jobs", "Jobs of a queue by state.", labels=["namespace", "jobqueue", "queue", "state"]
        )
        age = GaugeMetricFamily(
            "skiplock_queue_oldest_ready_age_seconds",
            "Seconds the oldest ready job of a queue has waited.",
            labels=["namespace", "jobqueue", "queue"],
        )
        up = GaugeMetricFamily(
            "skiplock_operator_database_up", "1 when the last poll succeeded.", labels=["namespace", "jobqueue"]
        )
        try:
            with Queue(settings=self.settings, max_size=1) as queue:
                found = {s.queue: s for s in queue.stats()}
        except psycopg.Error:
            up.add_metric([self.namespace, self.jobqueue], 0)
        else:
            up.add_metric([self.namespace, self.jobqueue], 1)
            for name in self.queues:
                stats = found.get(name)
                for state in STATES:
                    value = getattr(stats, state) if stats else 0
                    jobs.add_metric([self.namespace, self.jobqueue, name, state], value)
                age.add_metric([self.namespace, self.jobqueue, name], stats.oldest_ready_age_seconds if stats else 0)
        yield jobs
        yield age
        yield up

    def describe(self) -> Iterable[Any]:
        return []


def operator_registry(settings: Settings, *, namespace: str, jobqueue: str, queues: Iterable[str]) -> CollectorRegistry:
    """A registry like the operator's: its own OperatorMetrics plus one JobQueue's queue-wide gauges."""
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    registry.register(QueueGauges(settings, namespace=namespace, jobqueue=jobqueue, queues=queues))
    return registry
