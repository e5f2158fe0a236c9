"""Every ``skiplock_operator_*`` metric, declared on one class that takes a registry."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from skiplock import QueueStats
from skiplock.store.statements import WAITING_REASONS

RESULTS = ("success", "invalid", "retry", "error")
STATES = ("ready", "delayed", "processing", "stalled", "failed", "waiting")
PURGED = ("done", "failed", "cancelled")
TICK_RESULTS = ("enqueued", "skipped", "failed")
disable_created_metrics()  # type: ignore[no-untyped-call]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.reconciles = Counter(
            "skiplock_operator_reconciles",
            "JobQueue reconciles by result (success, invalid, retry, error).",
            ["result"],
            registry=registry,
        )
        self.scale_decisions = Counter(
            "skiplock_operator_scale_decisions",
            "Replica changes applied, by direction and reason.",
            ["direction", "reason"],
            registry=registry,
        )
        self.desired_replicas = Gauge(
            "skiplock_operator_desired_replicas",
            "Replicas the policy wants for a JobQueue.",
            ["namespace", "jobqueue"],
            registry=registry,
        )
        self.current_replicas = Gauge(
            "skiplock_operator_current_replicas",
            "spec.replicas of a JobQueue's worker Deployment.",
            ["namespace", "jobqueue"],
            registry=registry,
        )
        self.ready_backlog = Gauge(
            "skiplock_operator_ready_jobs",
            "Ready (visible pending) jobs the last poll saw.",
            ["namespace", "jobqueue"],
            registry=registry,
        )
        self.schedule_ticks = Counter(
            "skiplock_operator_schedule_ticks",
            "Ticks of periodic tasks by result: enqueued by this operator, skipped (missed while nobody fired "
            "them: only the last missed tick runs), or failed (a schedule row that cannot fire, parked), by JobQueue.",
            ["namespace", "jobqueue", "result"],
            registry=registry,
        )
        self.errors = Counter(
            "skiplock_operator_errors",
            "Errors by kind (database, kubernetes, secret, policy, conflict, unexpected).",
            ["kind"],
            registry=registry,
        )
        self.poll_duration = Histogram(
            "skiplock_operator_poll_duration_seconds",
            "Time of one backlog query.",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.wakeups = Counter(
            "skiplock_operator_wakeups",
            "Autoscaler wake-ups by source (event: a NOTIFY or watched change; poll: timer or job due; stopped).",
            ["source"],
            registry=registry,
        )
        self.queue_jobs = Gauge(
            "skiplock_queue_jobs",
            "Jobs of a queue by state (ready, delayed, processing, stalled, failed, waiting on parents), from the "
            "operator's poll.",
            ["namespace", "jobqueue", "queue", "state"],
            registry=registry,
        )
        self.queue_oldest_ready_age = Gauge(
            "skiplock_queue_oldest_ready_age_seconds",
            "Age of the oldest ready job of a queue (0 when none is ready), from the operator's poll.",
            ["namespace", "jobqueue", "queue"],
            registry=registry,
        )
        self.queue_paused = Gauge(
            "skiplock_queue_paused",
            "1 while a queue is paused in the database (spec.paused or skiplock pause), from the operator's poll.",
            ["namespace", "jobqueue", "queue"],
            registry=registry,
        )
        self.jobs_purged = Counter(
            "skiplock_operator_jobs_purged",
            "Old jobs deleted by the operator's scheduled retention of a JobQueue's schema, by status.",
            ["namespace", "jobqueue", "status"],
            registry=registry,
        )
        self.purge_errors = Counter(
            "skiplock_operator_purge_errors",
            "Failed rounds of the operator's scheduled retention of a JobQueue's schema (the reason is in its Events).",
            ["namespace", "jobqueue"],
            registry=registry,
        )
        self.queue_waiting = Gauge(
            "skiplock_queue_jobs_waiting",
            "Due jobs of a queue held back by flow control, by reason (serial_key, concurrency, rate).",
            ["namespace", "jobqueue", "queue", "reason"],
            registry=registry,
        )
        self.database_up = Gauge(
            "skiplock_operator_database_up",
            "1 when the operator's last poll of a JobQueue's database succeeded, else 0.",
            ["namespace", "jobqueue"],
            registry=registry,
        )
        for result in RESULTS:
            self.reconciles.labels(result)
        self._queues: dict[tuple[str, str], set[str]] = {}
        self._retention: dict[tuple[str, str], bool] = {}
        self._schedules: dict[tuple[str, str], bool] = {}

    def observe_queues(self, namespace: str, jobqueue: str, stats: Mapping[str, QueueStats]) -> None:
        """Set the queue gauges of one JobQueue; queues it no longer serves lose their series."""
        key = (namespace, jobqueue)
        for gone in self._queues.get(key, set()) - set(stats):
            self._remove_queue(namespace, jobqueue, gone)
        for queue, row in stats.items():
            for state in STATES:
                self.queue_jobs.labels(namespace, jobqueue, queue, state).set(getattr(row, state))
            self.queue_oldest_ready_age.labels(namespace, jobqueue, queue).set(row.oldest_ready_age_seconds)
            self.queue_paused.labels(namespace, jobqueue, queue).set(1 if row.paused else 0)
            for reason in WAITING_REASONS:
                self.queue_waiting.labels(namespace, jobqueue, queue, reason).set(getattr(row, f"waiting_{reason}"))
        self._queues[key] = set(stats)
        self.database_up.labels(namespace, jobqueue).set(1)

    def _remove_queue(self, namespace: str, jobqueue: str, queue: str) -> None:
        for state in STATES:
            with contextlib.suppress(KeyError):
                self.queue_jobs.remove(namespace, jobqueue, queue, state)
        for gauge in (self.queue_oldest_ready_age, self.queue_paused):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, jobqueue, queue)
        for reason in WAITING_REASONS:
            with contextlib.suppress(KeyError):
                self.queue_waiting.remove(namespace, jobqueue, queue, reason)

    def forget(self, namespace: str, jobqueue: str) -> None:
        """A JobQueue is gone: every series that names it goes too."""
        for gauge in (self.desired_replicas, self.current_replicas, self.ready_backlog, self.database_up):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, jobqueue)
        for queue in self._queues.pop((namespace, jobqueue), set()):
            self._remove_queue(namespace, jobqueue, queue)
        if self._retention.pop((namespace, jobqueue), False):
            for status in PURGED:
                with contextlib.suppress(KeyError):
                    self.jobs_purged.remove(namespace, jobqueue, status)
            with contextlib.suppress(KeyError):
                self.purge_errors.remove(namespace, jobqueue)
        if self._schedules.pop((namespace, jobqueue), False):
            for result in TICK_RESULTS:
                with contextlib.suppress(KeyError):
                    self.schedule_ticks.remove(namespace, jobqueue, result)

    def watch_schedules(self, namespace: str, jobqueue: str) -> None:
        """The tick series of a JobQueue start at 0 (a first tick then shows in rate/increase)."""
        self._schedules[(namespace, jobqueue)] = True
        for result in TICK_RESULTS:
            self.schedule_ticks.labels(namespace, jobqueue, result)

    def watch_retention(self, namespace: str, jobqueue: str) -> None:
        """The retention series of a JobQueue start at 0 (a first purge or failure then shows in rate/increase)."""
        self._retention[(namespace, jobqueue)] = True
        for status in PURGED:
            self.jobs_purged.labels(namespace, jobqueue, status)
        self.purge_errors.labels(namespace, jobqueue)
