"""Every worker metric and the queue-wide collector (the exporter that serves them is :mod:`skiplock.exporter`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from skiplock.job import OUTCOMES, Outcome
from skiplock.store.health import TableHealth

log = logging.getLogger(__name__)
T = TypeVar("T")
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
FAILURE_REASONS = ("non_retryable", "exhausted", "unknown_task")
DB_OPERATIONS = (
    "claim", "complete", "fail", "heartbeat", "recover", "release", "purge", "schedule", "register_limits",
    "register_tasks",
)  # fmt: skip
WAKEUP_SOURCES = ("notify", "poll", "busy", "recovered", "rate_limit", "completed")


ENQUEUE_DUPLICATES = Counter(
    "skiplock_enqueue_duplicates",
    "Enqueues of a task that found its job already there (unique jobs, idempotency keys), by task: in the "
    "producer's process (the default registry).",
    ["task"],
)


def count_duplicates(task: str, result: T) -> T:
    """Count the duplicates of one enqueue (an :class:`EnqueueResult`) or of a batch (its ``results``)."""
    results = getattr(result, "results", None)
    n = sum(1 for r in results if r.duplicate) if results is not None else int(getattr(result, "duplicate", False))
    if n:
        ENQUEUE_DUPLICATES.labels(task).inc(n)
    return result


class WorkerMetrics:
    """Per-process metrics of one worker. Label values come from bounded sets only (queue, outcome, ...)."""

    def __init__(self, registry: CollectorRegistry = prometheus_client.REGISTRY) -> None:
        self.registry = registry
        self.tally = Tally()
        registry.register(self.tally)  # first: a read of the registry applies what it holds before the rest is read
        self.jobs_claimed = Counter(
            "skiplock_jobs_claimed", "Jobs claimed by this worker.", ["queue"], registry=registry
        )
        self.jobs_finished = Counter(
            "skiplock_jobs_finished",
            "Finished attempts by outcome (" + ", ".join(OUTCOMES) + ").",
            ["queue", "outcome"],
            registry=registry,
        )
        self.jobs_failed = Counter(
            "skiplock_jobs_failed",
            "Attempts that failed the job for good, by reason (non_retryable, exhausted, unknown_task).",
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
        self.jobs_timed_out = Counter(
            "skiplock_jobs_timed_out",
            "Attempts stopped at their timeout (async: cancelled; sync: abandoned), then retried or failed.",
            ["queue"],
            registry=registry,
        )
        self.stuck_slots = Gauge(
            "skiplock_worker_stuck_slots",
            "Slots held by sync handlers still running past their timeout (their jobs were already retried).",
            ["queue"],
            registry=registry,
        )
        self.queue_paused = Gauge(
            "skiplock_worker_queue_paused",
            "1 while this worker sees the queue paused (skiplock pause): it claims nothing from it.",
            ["queue"],
            registry=registry,
        )
        self.jobs_purged = Counter(
            "skiplock_jobs_purged",
            "Old jobs deleted by this worker's scheduled retention, by status (done, failed, cancelled).",
            ["status"],
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
            "Claim-loop wake-ups by source (notify, poll, busy, recovered, rate_limit, completed).",
            ["source"],
            registry=registry,
        )
        self.claims = Counter(
            "skiplock_worker_claims",
            "Claim statements of this worker, by result (jobs: it took at least one job; empty: none was due).",
            ["result"],
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
        self.listener_enabled = Gauge(
            "skiplock_listener_enabled",
            "1 when this worker uses LISTEN/NOTIFY (0: --no-listen, or LISTEN found not to work, e.g. PgBouncer).",
            registry=registry,
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
        self.schedule_ticks = Counter(
            "skiplock_schedule_ticks",
            "Ticks of periodic tasks by result: enqueued by this worker, or skipped (missed while nobody fired them: "
            "only the last missed tick runs).",
            ["task", "result"],
            registry=registry,
        )

    def describe_worker(self, queues: Sequence[str], concurrency: int, version: str) -> dict[str, BoundMetrics]:
        """Create every series of this worker at zero, and return the children bound to each queue it serves
        (the only queue label values it exports: the label sets stay bounded whatever producers write)."""
        self.build_info.info({"version": version})
        for source in WAKEUP_SOURCES:
            self.wakeups.labels(source)
        for operation in DB_OPERATIONS:
            self.db_errors.labels(operation)
        for status in ("done", "failed", "cancelled"):
            self.jobs_purged.labels(status)
        self.database_up.set(0)
        bound = {}
        for queue in queues:
            self.concurrency.labels(queue).set(concurrency)
            bound[queue] = BoundMetrics(self, queue)
        return bound


def observe_many(histogram: Histogram, amounts: Sequence[float]) -> None:
    """``histogram.observe(a)`` for each amount, with one lock round per bucket hit instead of two per amount (the
    worker observes every job's wait and run time in batches). Falls back to ``observe`` if prometheus_client's
    histogram child ever stops keeping ``_upper_bounds``, ``_buckets`` and ``_sum``."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            histogram.observe(amount)
        return
    # observe() puts an amount in the first bucket whose bound is >= it: sorted (a C sort of floats), the amounts of
    # bucket i are those from the end of bucket i-1 up to the last one <= its bound (a bisection per bucket, not per
    # amount: bench/HISTORY.md, "Behind the code")
    ordered = sorted(amounts)
    start, end = 0, len(ordered)
    for i, bound in enumerate(bounds):
        if start == end:
            break
        stop = bisect_right(ordered, bound, start)
        if stop > start:
            buckets[i].inc(stop - start)
            start = stop
    total.inc(math.fsum(ordered))


class Tally:
    """Counts and amounts of the hot path, applied to their Prometheus children in bulk: whenever the registry is
    read (the tally is registered before the metrics, so a scrape or ``get_sample_value`` sees every count added
    before it) and once ``FLUSH_AT`` amounts wait, rather than one locked update per queue and metric for each batch
    of results (what that cost with 50 queues: bench/HISTORY.md, "Behind the code")."""

    FLUSH_AT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Any, float] = {}  # Counter children
        self._amounts: dict[Any, list[float]] = {}  # Histogram children
        self._waiting = 0

    def add(self, counts: Iterable[tuple[Any, float]] = (), amounts: Iterable[tuple[Any, list[float]]] = ()) -> None:
        """``counts``: (counter child, increment) pairs; ``amounts``: (histogram child, observations) pairs."""
        with self._lock:
            pending = self._counts
            for child, n in counts:
                pending[child] = pending.get(child, 0) + n
            for child, values in amounts:
                self._amounts.setdefault(child, []).extend(values)
                self._waiting += len(values)
            if self._waiting >= self.FLUSH_AT:
                self._apply()

    def flush(self) -> None:
        with self._lock:
            self._apply()

    def _apply(self) -> None:
        counts, self._counts = self._counts, {}
        amounts, self._amounts = self._amounts, {}
        self._waiting = 0
        for child, n in counts.items():
            child.inc(n)
        for child, values in amounts.items():
            observe_many(child, values)

    def collect(self) -> Iterator[Any]:
        self.flush()
        return iter(())

    def describe(self) -> Iterator[Any]:
        return iter(())


class BoundMetrics:
    """The per-queue children, looked up once (``labels()`` takes a lock and a dict lookup per call)."""

    def __init__(self, m: WorkerMetrics, queue: str) -> None:
        self.tally = m.tally
        self.claimed = m.jobs_claimed.labels(queue)
        self.finished: dict[Outcome, Any] = {outcome: m.jobs_finished.labels(queue, outcome) for outcome in OUTCOMES}
        self.failed = {reason: m.jobs_failed.labels(queue, reason) for reason in FAILURE_REASONS}
        self.recovered = {status: m.jobs_recovered.labels(queue, status) for status in ("pending", "failed")}
        self.released = m.jobs_released.labels(queue)
        self.duration = m.job_duration.labels(queue)
        self.wait = m.job_wait.labels(queue)
        self.in_flight = m.in_flight.labels(queue)
        self.timed_out = m.jobs_timed_out.labels(queue)
        self.stuck = m.stuck_slots.labels(queue)
        self.paused = m.queue_paused.labels(queue)


class TableCollector(Collector):
    """Health of the jobs table (live and dead tuples, size, last vacuum), read at scrape and cached for ``ttl``.

    Queue-wide job counts are not exported here: the worker's queue gauges (skiplock.worker.queue_gauges) and the
    operator's poll export them.
    """

    def __init__(self, fetch: Callable[[], TableHealth | None], ttl: float) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._lock = threading.Lock()
        self._cached: TableHealth | None = None
        self._at = -ttl

    def _snapshot(self) -> TableHealth | None:
        with self._lock:
            if time.monotonic() - self._at >= self._ttl:
                try:
                    self._cached = self._fetch()
                except Exception as exc:  # a scrape must not fail: keep the last values
                    log.warning("table stats failed: %s", type(exc).__name__, extra={"action": "stats_failed"})
                self._at = time.monotonic()
            return self._cached

    def collect(self) -> Iterator[GaugeMetricFamily]:
        t = self._snapshot()
        if t is None:
            return
        for name, doc, value in (
            ("skiplock_table_live_tuples", "Live tuples of the jobs table (statistics).", t.live),
            ("skiplock_table_dead_tuples", "Dead tuples of the jobs table awaiting vacuum (statistics).", t.dead),
            ("skiplock_table_size_bytes", "Size of the jobs table with its indexes and TOAST.", t.size_bytes),
            (
                "skiplock_table_last_autovacuum_timestamp_seconds",
                "Unix time of the last (auto)vacuum of the jobs table (0: never).",
                t.last_vacuum,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["schema"])
            family.add_metric([t.schema], value)
            yield family

    def describe(self) -> Iterable[Any]:
        return []
