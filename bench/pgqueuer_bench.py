"""pgqueuer as a peer in the same run: a worker process and the producer's enqueue, through its public API only.

Its own schema (``PGQUEUER_SCHEMA``, read by pgqueuer once per process: the harness and every worker set it before
importing pgqueuer), asyncpg and uvloop as its documentation recommends, a no-op entrypoint, ``batch_size`` 100.
``--record DIR``: the entrypoint appends ``job_id enqueue_ts start_ts`` to ``DIR/starts-<pid>.txt`` as it starts
(pick-up latency; the payload carries the enqueue time as ``t``), as ``seed_baseline.py --record`` does.

    PGQUEUER_SCHEMA=bench_pgq python bench/pgqueuer_bench.py --dsn ... worker [--record DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENTRYPOINT = "bench"
BATCH = 100


def available() -> bool:
    """pgqueuer, asyncpg and uvloop importable (``pip install -e '.[bench]'``)."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


async def install(dsn: str) -> None:
    """A fresh pgqueuer schema (dropped first if left over)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        q = Queries(AsyncpgDriver(conn))
        await q.install()
    finally:
        await conn.close()


async def enqueue(dsn: str, n: int) -> float:
    """Enqueue ``n`` jobs in one transaction; returns the database clock just before its commit (epoch seconds)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        q = Queries(AsyncpgDriver(conn))
        async with conn.transaction():
            for start in range(0, n, 5000):
                size = min(n, start + 5000) - start
                await q.enqueue([ENTRYPOINT] * size, [b'{"n": 1}'] * size, [0] * size)
            t = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        return float(t)
    finally:
        await conn.close()


def producer(conn: Any) -> Callable[[dict[str, Any]], int]:
    """Single jobs through pgqueuer's synchronous API on ``conn`` (psycopg, autocommit, as it requires): one
    transaction each; returns the job's id."""
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    q = SyncQueries(SyncPsycopgDriver(conn))
    return lambda payload: int(q.enqueue(ENTRYPOINT, json.dumps(payload).encode())[0])


async def worker(dsn: str, record: Path | None = None) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

    conn = await asyncpg.connect(dsn, server_settings={"application_name": "pgqueuer-bench"})
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    out = (record / f"starts-{os.getpid()}.txt").open("a", buffering=1) if record else None

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        if out is not None:
            started = time.time()
            out.write(f"{job.id} {json.loads(job.payload or b'{}')['t']!r} {started!r}\n")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    loop.call_later(0.3, lambda: print("ready", flush=True))  # after its LISTEN
    await qm.run(batch_size=BATCH)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("command", choices=["worker"])
    p.add_argument("--record", type=Path, help="record each job's start time in this directory (latency)")
    a = p.parse_args(argv)
    import uvloop

    runner: Any = uvloop.run
    runner(worker(a.dsn, a.record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
