"""Every ``skiplock_operator_*`` metric, declared on one class that takes a registry."""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

RESULTS = ("success", "invalid", "retry", "error")
disable_created_metrics()  # type: ignore[no-untyped-call]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
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
        self.errors = Counter(
            "skiplock_operator_errors",
            "Errors by kind (database, kubernetes, secret, unexpected).",
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
            "Autoscaler wake-ups by source (notify, poll, change).",
            ["source"],
            registry=registry,
        )
        for result in RESULTS:
            self.reconciles.labels(result)

    def forget(self, namespace: str, jobqueue: str) -> None:
        for gauge in (self.desired_replicas, self.current_replicas, self.ready_backlog):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, jobqueue)
