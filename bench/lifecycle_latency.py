"""How long ``skiplock cancel`` takes to stop a running handler (async: cancelled; sync: ``job.cancelled`` seen),
from the cancel call to the handler's reaction, on a real PostgreSQL with one in-process worker listening.

``.venv/bin/python bench/lifecycle_latency.py [--dsn DSN] [--repeat N]`` (default DSN: ``SKIPLOCK_BENCH_DSN``,
else ``SKIPLOCK_TEST_DSN``). Prints JSON lines (one per sample, then the summary) and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import psycopg

from skiplock import App, Queue, Settings
from skiplock.migrate import migrate
from skiplock.worker import Worker


def build_app(events: dict[str, Any]) -> App:
    app = App()

    @app.task(name="slow_async", queue="lat")
    async def slow_async(job: Any) -> None:
        events["started"].set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events["stopped_at"] = time.perf_counter()
            events["stopped"].set()
            raise

    @app.task(name="slow_sync", queue="lat")
    def slow_sync(job: Any) -> None:
        events["started"].set()
        while not job.cancelled:
            time.sleep(0.0005)
        events["stopped_at"] = time.perf_counter()
        events["stopped"].set()

    return app


async def measure(dsn: str, repeat: int) -> list[dict[str, Any]]:
    schema = f"bench_lat_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, schema)
    settings = Settings.load(env={}, dsn=dsn, schema=schema, queue="lat", metrics_port=0, purge_interval_seconds=0)
    events: dict[str, Any] = {}
    app = build_app(events)
    worker = Worker(app, settings=settings)
    run = asyncio.create_task(worker.run())
    samples: list[dict[str, Any]] = []
    try:
        await worker.wait_ready(timeout=30)
        with Queue(settings=settings, max_size=2) as q:
            for i in range(repeat):
                for task in ("slow_async", "slow_sync"):
                    events.update(started=threading.Event(), stopped=threading.Event(), stopped_at=None)
                    job = q.enqueue("lat", {"i": i}, task=task)
                    await asyncio.to_thread(events["started"].wait, 30)
                    t0 = time.perf_counter()
                    await asyncio.to_thread(q.cancel, ids=[job.id])
                    await asyncio.to_thread(events["stopped"].wait, 30)
                    ms = (events["stopped_at"] - t0) * 1000
                    samples.append({"case": f"cancel_{task.removeprefix('slow_')}", "ms": round(ms, 3)})
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("SKIPLOCK_BENCH_DSN") or os.environ.get("SKIPLOCK_TEST_DSN"))
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn (or set SKIPLOCK_BENCH_DSN)")
    samples = asyncio.run(measure(args.dsn, args.repeat))
    for s in samples:
        print(json.dumps(s))
    print(f"{'case':16} {'n':>4} {'p50 ms':>8} {'max ms':>8}", file=sys.stderr)
    for case in dict.fromkeys(s["case"] for s in samples):
        ms = [s["ms"] for s in samples if s["case"] == case]
        summary = {"case": case, "n": len(ms), "p50_ms": round(statistics.median(ms), 3), "max_ms": max(ms)}
        print(json.dumps({"summary": summary}))
        print(f"{case:16} {len(ms):>4} {summary['p50_ms']:>8.2f} {summary['max_ms']:>8.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
