"""A call on a connection of the caller's pool outside autocommit runs in autocommit for its time, then hands the
connection back as it was: one statement commits by itself (no BEGIN and COMMIT round trips)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import IsolationLevel
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock import AsyncQueue, Queue, Settings
from skiplock.store.run import may_autocommit
from skiplock.store.single import CURSORS_KEPT


def _committed(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".jobs').fetchone()
        assert row is not None
        return int(row[0])


def test_calls_commit_by_themselves_and_hand_the_connection_back_outside_autocommit(settings: Settings, pg_dsn, schema):
    with ConnectionPool(pg_dsn, min_size=1, max_size=1) as pool:
        q = Queue(pool=pool, settings=settings)
        job = q.enqueue("q", {"n": 1})
        ids = q.enqueue_many("q", [{"n": 2}, {"n": 3}])
        assert q.stats("q")[0].ready == 3
        assert _committed(pg_dsn, schema) == 3 and job.id < ids[0] < ids[1]
        with pool.connection() as conn:
            assert conn.autocommit is False and may_autocommit(conn)


def test_a_failing_call_hands_the_connection_back_outside_autocommit(pg_dsn):
    wrong = Settings.load(env={}, dsn=pg_dsn, schema=f"t_never_{uuid.uuid4().hex[:8]}")
    with ConnectionPool(pg_dsn, min_size=1, max_size=1) as pool:
        with pytest.raises(psycopg.errors.UndefinedTable):
            Queue(pool=pool, settings=wrong).enqueue("q", {})
        with pool.connection() as conn:
            assert conn.autocommit is False


def test_a_pool_with_an_isolation_level_keeps_its_transactions(settings: Settings, pg_dsn, schema):
    def serializable(conn: psycopg.Connection) -> None:
        conn.isolation_level = IsolationLevel.SERIALIZABLE

    with ConnectionPool(pg_dsn, min_size=1, max_size=1, configure=serializable) as pool:
        with pool.connection() as conn:
            assert not may_autocommit(conn)
        q = Queue(pool=pool, settings=settings)
        q.enqueue("q", {})
        q.enqueue_many("q", [{}, {}])
        assert _committed(pg_dsn, schema) == 3


async def test_the_async_twin_hands_the_connection_back_outside_autocommit(settings: Settings, pg_dsn, schema):
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=1) as pool:
        q = AsyncQueue(pool, settings)
        await q.enqueue("q", {"n": 1})
        await q.enqueue_many("q", [{"n": 2}])
        assert _committed(pg_dsn, schema) == 2
        async with pool.connection() as conn:
            assert conn.autocommit is False


def test_an_enqueue_runs_on_whatever_connections_the_pool_has_now(settings: Settings, pg_dsn, schema):
    """A single enqueue keeps a cursor for each pool connection (skiplock.store.single): when the pool replaces its
    connections, or one dies under it, the next enqueue runs on the new one, and the closed ones are let go."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        q = Queue(pool=pool, settings=settings)
        q.enqueue("q", {"n": 0})
        for n in range(1, CURSORS_KEPT + 5):
            pool.drain()
            pool.wait()
            q.enqueue("q", {"n": n})
        assert _committed(pg_dsn, schema) == CURSORS_KEPT + 5
        assert len(q._cursors) <= CURSORS_KEPT
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            q.enqueue("q", {"n": "lost"})
        assert q.enqueue("q", {"n": "after"}).id
        assert _committed(pg_dsn, schema) == CURSORS_KEPT + 6
        q.close()
        assert not q._cursors


async def test_the_async_enqueue_runs_on_whatever_connections_the_pool_has_now(settings: Settings, pg_dsn, schema):
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        q = AsyncQueue(pool, settings)
        await q.enqueue("q", {"n": 0})
        for n in range(1, 4):
            await pool.drain()
            await pool.wait()
            await q.enqueue("q", {"n": n})
        assert _committed(pg_dsn, schema) == 4
        async with pool.connection() as conn:
            assert conn.autocommit is True
