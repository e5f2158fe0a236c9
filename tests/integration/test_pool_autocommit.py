"""A call on a connection of the caller's pool outside autocommit runs in autocommit for its time, then hands the
connection back as it was: one statement commits by itself (no BEGIN and COMMIT round trips)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import IsolationLevel
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock import AsyncQueue, Queue, Settings
from skiplock.store.call import Call, Result
from skiplock.store.run import CURSORS_KEPT, may_autocommit


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


def _rows(r: Result) -> list:
    return r.rows


def _count(r: Result) -> int:
    return r.rowcount


def test_an_enqueue_runs_on_whatever_connections_the_pool_has_now(settings: Settings, pg_dsn, schema):
    """A call on the pool runs on a cursor kept for each pool connection (skiplock.store.run.KeptCursors): when the
    pool replaces its connections, or one dies under it, the next enqueue runs on the new one, and the closed ones are
    let go."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        q = Queue(pool=pool, settings=settings)
        q.enqueue("q", {"n": 0})
        for n in range(1, CURSORS_KEPT + 5):
            pool.drain()
            pool.wait()
            q.enqueue("q", {"n": n})
        assert _committed(pg_dsn, schema) == CURSORS_KEPT + 5
        assert len(q._run.cursors) <= CURSORS_KEPT
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            q.enqueue("q", {"n": "lost"})
        assert q.enqueue("q", {"n": "after"}).id
        assert _committed(pg_dsn, schema) == CURSORS_KEPT + 6
        q.close()
        assert not q._run.cursors


@pytest.mark.parametrize("autocommit", [True, False])
def test_a_kept_cursor_serves_the_next_call_after_an_error_no_rows_and_other_kinds_of_rows(
    settings: Settings, pg_dsn, schema, autocommit: bool
):
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": autocommit}) as pool:
        q = Queue(pool=pool, settings=settings)
        run = q._run
        assert q.enqueue("q", {"n": 1}).id
        with pytest.raises(psycopg.errors.DivisionByZero):
            run(Call("SELECT 1 / 0", None, _rows, tuples=True))
        assert q.enqueue("q", {"n": 2}).id
        assert run(Call(f'UPDATE "{schema}".jobs SET priority = 1 WHERE false', None, _count, tuples=True)) == 0
        assert run(Call("SELECT 1 AS a", None, _rows)) == [{"a": 1}]
        assert run(Call("SELECT 2 AS a", None, _rows, tuples=True)) == [(2,)]
        assert run(Call("SELECT 3 AS a", None, _rows, binary=True)) == [{"a": 3}]
        with pytest.raises(psycopg.errors.DivisionByZero):
            run(Call("SELECT 1 / 0", None, _rows))
        assert run(Call("SELECT 4 AS a", None, _rows)) == [{"a": 4}]
        assert q.enqueue("q", {"n": 3}).id
        assert _committed(pg_dsn, schema) == 3
        assert len(run.cursors) == 2  # one connection: a cursor for tuples, one for dicts
        with pool.connection() as conn:
            assert conn.autocommit is autocommit


async def test_the_async_enqueue_runs_on_whatever_connections_the_pool_has_now(settings: Settings, pg_dsn, schema):
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        q = AsyncQueue(pool, settings)
        await q.enqueue("q", {"n": 0})
        for n in range(1, CURSORS_KEPT + 5):
            await pool.drain()
            await pool.wait()
            await q.enqueue("q", {"n": n})
        assert _committed(pg_dsn, schema) == CURSORS_KEPT + 5
        assert len(q._run.cursors) <= CURSORS_KEPT
        async with pool.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            await q.enqueue("q", {"n": "lost"})
        assert (await q.enqueue("q", {"n": "after"})).id
        with pytest.raises(psycopg.errors.DivisionByZero):
            await q._run(Call("SELECT 1 / 0", None, _rows, tuples=True))
        assert await q._run(Call("SELECT 1 AS a", None, _rows, binary=True)) == [{"a": 1}]
        assert (await q.enqueue("q", {"n": "last"})).id
        assert _committed(pg_dsn, schema) == CURSORS_KEPT + 7
        await q.close()
        assert not q._run.cursors
