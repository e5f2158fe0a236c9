"""A worker's own queue gauges (skiplock.worker.queue_gauges) on a real PostgreSQL: the seed's three signals
(backlog, stalled, failed) from a worker that runs without the operator, refreshed in the background, bounded
by a timeout, never read at scrape time."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from skiplock import AsyncQueue, Queue, Settings
from skiplock.worker import Worker
from skiplock.worker.queue_gauges import STALE_AFTER, STATES, QueueGauges
from support.pg import wait_for

QUEUE = "emails"


def seed(
    settings: Settings, *, ready: int = 50, stalled: int = 3, failed: int = 4, delayed: int = 2, waiting: int = 5
) -> None:
    """The issue's example: a queue with ready, stalled (processing past an expired lease), failed and delayed jobs,
    jobs waiting on a parent (of another queue), and another queue the worker does not serve."""
    with Queue(settings=settings, max_size=2) as queue:
        queue.enqueue_many(QUEUE, [{"n": i} for i in range(ready)])
        queue.enqueue_many(QUEUE, [{"later": i} for i in range(delayed)], delay=3600)
        queue.enqueue_many("other", [{"n": i} for i in range(7)])
        parent = queue.enqueue("other", {"parent": True}, delay=3600)
        queue.enqueue_many(QUEUE, [{"child": i} for i in range(waiting)], after=[parent.id])
    table = f'"{settings.schema}".jobs'
    with psycopg.connect(settings.require_dsn(), autocommit=True) as conn:
        for _ in range(stalled):
            conn.execute(
                f"INSERT INTO {table} (queue, payload, status, attempts, locked_by, locked_at, lease_expires_at) "
                "VALUES (%s, '{}', 'processing', 1, 'gone:1:x', now() - interval '1 hour', "
                "now() - interval '50 minutes')",
                [QUEUE],
            )
        for _ in range(failed):
            conn.execute(
                f"INSERT INTO {table} (queue, payload, status, attempts, last_error) "
                "VALUES (%s, '{}', 'failed', 5, 'RuntimeError: boom')",
                [QUEUE],
            )


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("skiplock_queue_")
    }


def jobs(queue: str, state: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("skiplock_queue_jobs", (("queue", queue), ("state", state)))


async def test_the_gauges_of_the_served_queues_come_from_one_background_refresh(settings: Settings) -> None:
    seed(settings)
    registry = CollectorRegistry()
    async with await AsyncQueue.open(settings=settings, max_size=1) as source:
        gauges = QueueGauges(source, [QUEUE, "quiet"], interval=0.2)
        registry.register(gauges)
        task = asyncio.create_task(gauges.run())
        try:
            await asyncio.sleep(0.5)
            assert gauges.refreshes == 0, "nothing is queried before anyone reads the metrics"
            assert samples(registry) == {}, "no values yet: the first read only asks for a refresh"
            while gauges.refreshes < 2:  # the first read woke the task; it keeps refreshing
                await asyncio.sleep(0.05)
            got = samples(registry)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    want = {"ready": 50, "delayed": 2, "processing": 3, "stalled": 3, "failed": 4, "waiting": 5}
    for state in STATES:
        assert got[jobs(QUEUE, state)] == want[state], state
        assert got[jobs("quiet", state)] == 0, state  # a served queue with nothing live: zeros, not absent
    assert 0 <= got[("skiplock_queue_oldest_ready_age_seconds", (("queue", QUEUE),))] < 600
    assert got[("skiplock_queue_oldest_ready_age_seconds", (("queue", "quiet"),))] == 0
    assert not [key for key in got if ("queue", "other") in key[1]], "a queue the worker does not serve"


async def test_a_blocked_query_times_out_in_the_server_and_a_scrape_serves_the_last_values(
    settings: Settings,
) -> None:
    seed(settings, ready=5, stalled=0, failed=0, delayed=0)
    registry = CollectorRegistry()
    async with await AsyncQueue.open(settings=settings, max_size=1) as source:
        gauges = QueueGauges(source, [QUEUE], interval=0.3)
        registry.register(gauges)
        gauges.collect()  # someone reads the metrics
        assert await gauges.refresh()
        with psycopg.connect(settings.require_dsn()) as locker:  # a migration holding the table, say
            locker.execute(f'LOCK TABLE "{settings.schema}".jobs IN ACCESS EXCLUSIVE MODE')
            assert not await gauges.refresh(), "the query waits on the lock until its timeout"
            assert samples(registry)[jobs(QUEUE, "ready")] == 5  # the scrape never touches the database
            with psycopg.connect(settings.require_dsn(), autocommit=True) as watcher:
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND query LIKE %s",
                    [f'%"{settings.schema}".jobs%'],
                ).fetchone()
            assert waiting == (0,), "the timed-out statement was cancelled in the server, not left waiting"
            stale = STALE_AFTER * gauges.interval
            await asyncio.sleep(stale + 0.1)
            assert not await gauges.refresh()
            assert samples(registry) == {}, "values too old to trust are not exported"
            locker.rollback()
        assert await gauges.refresh(), "the gauges come back with the database"
        assert samples(registry)[jobs(QUEUE, "ready")] == 5


def test_gauges_off_is_an_interval_of_zero() -> None:
    with pytest.raises(ValueError, match="queue_metrics_seconds 0"):
        QueueGauges(source=None, queues=[QUEUE], interval=0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def paused_worker(settings: Settings) -> Iterator[Worker]:
    """A worker started without any operator, serving a paused queue (so its backlog stays), with /metrics."""
    with Queue(settings=settings, max_size=1) as queue:
        queue.pause(QUEUE)
    s = settings.replace(metrics_port=free_port(), metrics_host="127.0.0.1", queue=QUEUE, queue_metrics_seconds=0.2)
    worker = Worker(settings=s, handler=lambda job: None)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=30)


def test_a_worker_without_the_operator_exports_backlog_stalls_and_failures(
    settings: Settings, paused_worker: Worker
) -> None:
    seed(settings, stalled=0)  # the worker's own lease recovery would clear stalls: shown above on the collector
    url = f"http://127.0.0.1:{paused_worker.settings.metrics_port}/metrics"

    def scrape() -> str | None:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: str = response.read().decode()
        return body if f'skiplock_queue_jobs{{queue="{QUEUE}",state="ready"}} 50.0' in body else None

    body = wait_for(scrape, timeout=20, interval=0.1, what="the worker's queue gauges")
    assert body is not None
    lines = set(body.splitlines())
    assert f'skiplock_queue_jobs{{queue="{QUEUE}",state="failed"}} 4.0' in lines
    assert f'skiplock_queue_jobs{{queue="{QUEUE}",state="delayed"}} 2.0' in lines
    assert f'skiplock_queue_jobs{{queue="{QUEUE}",state="stalled"}} 0.0' in lines
    assert f'skiplock_queue_jobs{{queue="{QUEUE}",state="waiting"}} 5.0' in lines
    assert any(line.startswith(f'skiplock_queue_oldest_ready_age_seconds{{queue="{QUEUE}"}} ') for line in lines)
    assert 'queue="other"' not in body


def test_a_stopped_worker_exports_no_queue_gauges(settings: Settings) -> None:
    s = settings.replace(queue=QUEUE, queue_metrics_seconds=0.2)
    registry = CollectorRegistry()
    worker = Worker(settings=s, handler=lambda job: None, registry=registry)
    worker.start()
    try:
        generate_latest(registry)  # a read asks for the gauges
        wait_for(lambda: samples(registry), timeout=20, interval=0.1, what="the queue gauges")
    finally:
        worker.stop(timeout=30)
    assert samples(registry) == {}
