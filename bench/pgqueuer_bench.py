"""pgqueuer as a peer in the same run: a worker process and the producer's enqueue, through its public API only.

Its own schema (``PGQUEUER_SCHEMA``, read by pgqueuer once per process: the harness and every worker set it before
importing pgqueuer), asyncpg and uvloop as its documentation recommends, a no-op entrypoint, ``batch_size`` 100.

    PGQUEUER_SCHEMA=bench_pgq python bench/pgqueuer_bench.py --dsn ... worker
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
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


async def worker(dsn: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

    conn = await asyncpg.connect(dsn, server_settings={"application_name": "pgqueuer-bench"})
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    loop.call_later(0.3, lambda: print("ready", flush=True))  # after its LISTEN
    await qm.run(batch_size=BATCH)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("command", choices=["worker"])
    a = p.parse_args(argv)
    import uvloop

    runner: Any = uvloop.run
    runner(worker(a.dsn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
