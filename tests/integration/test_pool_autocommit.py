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
