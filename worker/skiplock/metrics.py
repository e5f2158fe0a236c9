"""Every worker metric, the queue-wide collector, and the exporter (/metrics, /healthz, /readyz)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from skiplock.job import QueueStats

log = logging.getLogger(__name__)
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
OUTCOMES = ("done", "retried", "failed", "lease_lost")
FAILURE_REASONS = ("non_retryable", "exhausted")


class WorkerMetrics:
    """Per-process metrics of one worker. Label values come from bounded sets only (queue, outcome, ...)."""

    def __init__(self, registry: CollectorRegistry = prometheus_client.REGISTRY) -> None:
        self.registry = registry
        self.jobs_claimed = Counter(
            "skiplock_jobs_claimed", "Jobs claimed by this worker.", ["queue"], registry=registry
        )
        self.jobs_finished = Counter(
            "skiplock_jobs_finished",
            "Finished attempts by outcome (done, retried, failed, lease_lost).",
            ["queue", "outcome"],
            registry=registry,
        )
        self.jobs_failed = Counter(
            "skiplock_jobs_failed",
            "Attempts that failed the job for good, by reason (non_retryable, exhausted).",
            ["queue", "reason"],
            registry=registry,
        )
        self.jobs_recovered = Counter(
            "skiplock_jobs_recovered",
            "Jobs whose lease expired and that this worker recovered, by new status.",
            ["queue", "status"],
            registry=registry,
        )
        self.jobs_released = Counter(
            "skiplock_jobs_released",
            "Jobs handed back unfinished at shutdown, without burning an attempt.",
            ["queue"],
            registry=registry,
        )
        self.job_duration = Histogram(
            "skiplock_job_duration_seconds",
            "Handler run time including completion.",
            ["queue"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.job_wait = Histogram(
            "skiplock_job_wait_seconds",
            "Time from a job becoming visible (enqueue or retry due) to its start.",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "skiplock_worker_jobs_in_flight", "Jobs running in this worker.", ["queue"], registry=registry
        )
        self.concurrency = Gauge(
            "skiplock_worker_concurrency", "Most jobs this worker runs at once.", ["queue"], registry=registry
        )
        self.wakeups = Counter(
            "skiplock_worker_wakeups",
            "Claim-loop wake-ups by source (notify, poll, busy).",
            ["source"],
            registry=registry,
        )
        self.db_errors = Counter(
            "skiplock_worker_db_errors",
            "Transient database errors survived by the worker, by operation.",
            ["operation"],
            registry=registry,
        )
        self.database_up = Gauge(
            "skiplock_worker_database_up", "1 when the last database call of the worker succeeded.", registry=registry
        )
        self.listener_connected = Gauge(
            "skiplock_listener_connected", "1 while the LISTEN connection is up (0: polling only).", registry=registry
        )
        self.last_notification = Gauge(
            "skiplock_listener_last_notification_timestamp_seconds",
            "Unix time of the last notification received (0: none yet).",
            registry=registry,
        )
        self.build_info = Info("skiplock_build", "Version of skiplock.", registry=registry)

    def describe_worker(self, queue: str, concurrency: int, version: str) -> BoundMetrics:
        """Create every series of this worker at zero, and return the children bound to its queue."""
        self.build_info.info({"version": version})
        self.concurrency.labels(queue).set(concurrency)
        for source in ("notify", "poll", "busy"):
            self.wakeups.labels(source)
        self.database_up.set(0)
        return BoundMetrics(self, queue)


class BoundMetrics:
    """The per-queue children, looked up once (``labels()`` takes a lock and a dict lookup per call)."""

    def __init__(self, m: WorkerMetrics, queue: str) -> None:
        self.claimed = m.jobs_claimed.labels(queue)
        self.finished = {outcome: m.jobs_finished.labels(queue, outcome) for outcome in OUTCOMES}
        self.failed = {reason: m.jobs_failed.labels(queue, reason) for reason in FAILURE_REASONS}
        self.recovered = {status: m.jobs_recovered.labels(queue, status) for status in ("pending", "failed")}
        self.released = m.jobs_released.labels(queue)
        self.duration = m.job_duration.labels(queue)
        self.wait = m.job_wait.labels(queue)
        self.in_flight = m.in_flight.labels(queue)


class QueueCollector(Collector):
    """Queue-wide gauges computed at scrape from one cheap query, cached for ``ttl`` seconds.

    Every replica exports the same series: aggregate with ``max by (queue)``, never ``sum``.
    """

    def __init__(self, fetch: Callable[[], list[QueueStats]], ttl: float) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._lock = threading.Lock()
        self._cached: list[QueueStats] | None = None
        self._at = 0.0
        self._ok = 0.0

    def _stats(self) -> list[QueueStats] | None:
        with self._lock:
            if self._cached is None or time.monotonic() - self._at >= self._ttl:
                try:
                    self._cached = self._fetch()
                    self._ok = 1.0
                except Exception as exc:  # a scrape must not fail: report the error through up=0
                    log.warning("queue stats failed: %s", exc, extra={"action": "stats_failed"})
                    self._ok = 0.0
                    self._cached = self._cached if self._cached is not None else []
                self._at = time.monotonic()
            return self._cached

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats() or []
        jobs = GaugeMetricFamily(
            "skiplock_queue_jobs", "Jobs of the queue by state (queue-wide).", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "skiplock_queue_oldest_ready_age_seconds", "Age of the oldest ready job (queue-wide).", labels=["queue"]
        )
        for s in stats:
            for state in ("ready", "delayed", "processing", "stalled", "failed"):
                jobs.add_metric([s.queue, state], getattr(s, state))
            oldest.add_metric([s.queue], s.oldest_ready_age_seconds)
        up = GaugeMetricFamily("skiplock_queue_stats_up", "1 when the last queue-stats query succeeded.")
        up.add_metric([], self._ok)
        yield jobs
        yield oldest
        yield up

    def describe(self) -> Iterable[Any]:
        return []


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class Exporter:
    """/metrics, /healthz (loop alive) and /readyz (database reachable, not draining) on one port, in a thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        healthy: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]],
    ) -> None:
        metrics_app = prometheus_client.make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in ("/healthz", "/readyz"):
                ok, why = (healthy if path == "/healthz" else ready)()
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [why.encode() + b"\n"]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        self._server: WSGIServer = make_server(
            host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="skiplock-exporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
