"""The worker's pools after their connections died (a server restart, every backend terminated): one failed check
at checkout replaces the pool's idle connections at once, instead of trying each dead one in turn with psycopg_pool's
growing pause between tries (1 s, 2 s, 4 s: a checkout, and a claim with it, waited 7 s)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from skiplock.worker import pools

SIZE = 4


def terminate(dsn: str, pids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))


async def test_an_async_pool_of_dead_connections_is_replaced_after_one_failed_check(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[int] = []

    async def counted(conn: Any) -> None:
        try:
            await original(conn)
        except Exception:
            failed.append(conn.info.backend_pid)
            raise

    original = pools.acheck
    monkeypatch.setattr(pools, "acheck", counted)
    monkeypatch.setattr(pools, "IDLE_CHECK_SECONDS", 0.0)  # every checkout checks its connection
    pool = pools.async_pool(pg_dsn, "test-async", SIZE, timeout=30)
    await pool.open()
    try:
        conns = [await pool.getconn() for _ in range(SIZE)]
        pids = [c.info.backend_pid for c in conns]
        for c in conns:
            await pool.putconn(c)
        terminate(pg_dsn, pids)
        await asyncio.sleep(0.1)  # the server has closed them
        conn = await pool.getconn()
        try:
            assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
            assert conn.info.backend_pid not in pids
        finally:
            await pool.putconn(conn)
    finally:
        await pool.close()
    assert len(failed) == 1, f"{len(failed)} dead connections were tried one after another"


def test_a_sync_pool_of_dead_connections_is_replaced_after_one_failed_check(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[int] = []
    original = pools._check

    def counted(conn: Any) -> None:
        try:
            original(conn)
        except Exception:
            failed.append(conn.info.backend_pid)
            raise

    monkeypatch.setattr(pools, "_check", counted)
    monkeypatch.setattr(pools, "IDLE_CHECK_SECONDS", 0.0)
    pool = pools.sync_pool(pg_dsn, "test-sync", SIZE, timeout=30)
    pool.open()
    try:
        conns = [pool.getconn() for _ in range(SIZE)]
        pids = [c.info.backend_pid for c in conns]
        for c in conns:
            pool.putconn(c)
        terminate(pg_dsn, pids)
        conn = pool.getconn()
        try:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.info.backend_pid not in pids
        finally:
            pool.putconn(conn)
    finally:
        pool.close()
    assert len(failed) == 1, f"{len(failed)} dead connections were tried one after another"


async def test_the_idle_check_prepares_nothing_on_a_connection_that_prepares_every_statement(pg_dsn: str) -> None:
    """Behind a pooler in transaction mode a prepared statement may be missing at the next checkout (another server
    connection): an idle check that prepared ``SELECT 1`` failed there at every checkout after the first, so the pool
    replaced its connections in a loop until the calls waiting timed out, and the store, which stops preparing when
    one of its statements finds its prepared statement missing, never heard of it."""
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        conn.prepare_threshold = 0  # what the store's control connections do
        for _ in range(3):
            setattr(conn, "_skiplock_checked_out", 0.0)  # noqa: B010 - idle long enough to be checked
            await pools.acheck(conn)
        cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False)
        assert await cur.fetchone() == (0,)
    with psycopg.connect(pg_dsn, autocommit=True) as sconn:
        sconn.prepare_threshold = 0
        for _ in range(3):
            setattr(sconn, "_skiplock_checked_out", 0.0)  # noqa: B010
            pools._check(sconn)
        assert sconn.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False).fetchone() == (0,)
