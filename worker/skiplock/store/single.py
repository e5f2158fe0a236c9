"""The I/O of a single enqueue's insert (``Queue.enqueue``: what a web request does, one statement returning its row
as a tuple). On the pool, the statement runs on a cursor kept for each pool connection (:class:`KeptCursors`): making
a cursor (its adapters, each parameter's dumper looked up again) costs more than all of the enqueue's own work around
its statement. On the caller's connection (``conn=``), on a cursor of its own. Otherwise as
:class:`~skiplock.store.run.Runner` runs a call: a pool connection outside autocommit is switched to it for the call
when :func:`~skiplock.store.run.may_autocommit` says so, else the statement is a transaction of its own.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import psycopg
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import PoolTimeout

from skiplock.errors import ConfigError
from skiplock.store.call import Call, Result
from skiplock.store.run import NOT_CONNECTED, AsyncRunner, Runner, idle, may_autocommit, unavailable

T = TypeVar("T")
C = TypeVar("C", psycopg.Cursor[TupleRow], psycopg.AsyncCursor[TupleRow])
CURSORS_KEPT = 64
"""Most pool connections whose cursor a queue keeps."""


class KeptCursors(Generic[C]):
    """A cursor for each pool connection, kept for the next call on it. Pool connections only: the pool gives one to
    a single caller at a time, and owns and closes it. Past ``CURSORS_KEPT`` connections, those closed meanwhile are
    forgotten (all of them, if that is not enough)."""

    def __init__(self) -> None:
        self._kept: dict[Any, C] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, conn: Any) -> C | None:
        return self._kept.get(conn)

    def keep(self, conn: Any, cursor: C) -> C:
        if len(self._kept) >= CURSORS_KEPT:
            for old in [c for c in list(self._kept) if c.closed]:
                self._kept.pop(old, None)
            if len(self._kept) >= CURSORS_KEPT:
                self._kept.clear()
        self._kept[conn] = cursor
        return cursor

    def clear(self) -> None:
        self._kept.clear()


def _read(cur: psycopg.Cursor[TupleRow], call: Call[T]) -> T:
    return call.read(Result(cur.fetchall(), cur.rowcount))


def insert(
    run: Runner, kept: KeptCursors[psycopg.Cursor[TupleRow]], call: Call[T], conn: psycopg.Connection[Any] | None
) -> T:
    """Run ``call`` on ``conn`` (the caller's, in its transaction), or on a pool connection's kept cursor."""
    if conn is not None:
        if not isinstance(conn, psycopg.Connection):
            return run(call, conn)  # refused with the reason
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(call.query, call.params)
            return _read(cur, call)
    if run.pool is None:
        raise ConfigError(NOT_CONNECTED)
    try:
        own = run.pool.getconn()
    except PoolTimeout as exc:
        raise unavailable(exc, run.settings.dsn) from None
    try:
        if own.autocommit:
            return _on_kept(kept, own, call)
        if not may_autocommit(own):
            with own:
                return _on_kept(kept, own, call)
        own.autocommit = True
        try:
            return _on_kept(kept, own, call)
        finally:
            if idle(own):  # else broken: the pool discards it
                own.autocommit = False
    finally:
        run.pool.putconn(own)


def _on_kept(kept: KeptCursors[psycopg.Cursor[TupleRow]], conn: psycopg.Connection[Any], call: Call[T]) -> T:
    cur = kept.get(conn) or kept.keep(conn, conn.cursor(row_factory=tuple_row))
    cur.execute(call.query, call.params)
    return _read(cur, call)


async def ainsert(
    run: AsyncRunner,
    kept: KeptCursors[psycopg.AsyncCursor[TupleRow]],
    call: Call[T],
    conn: psycopg.AsyncConnection[Any] | None,
) -> T:
    """See :func:`insert`."""
    if conn is not None:
        if not isinstance(conn, psycopg.AsyncConnection):
            return await run(call, conn)
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(call.query, call.params)
            return call.read(Result(await cur.fetchall(), cur.rowcount))
    if run.pool is None:
        raise ConfigError(NOT_CONNECTED)
    try:
        own = await run.pool.getconn()
    except PoolTimeout as exc:
        raise unavailable(exc, run.settings.dsn) from None
    try:
        if own.autocommit:
            return await _aon_kept(kept, own, call)
        if not may_autocommit(own):
            async with own:
                return await _aon_kept(kept, own, call)
        await own.set_autocommit(True)
        try:
            return await _aon_kept(kept, own, call)
        finally:
            if idle(own):
                await own.set_autocommit(False)
    finally:
        await run.pool.putconn(own)


async def _aon_kept(
    kept: KeptCursors[psycopg.AsyncCursor[TupleRow]], conn: psycopg.AsyncConnection[Any], call: Call[T]
) -> T:
    cur = kept.get(conn) or kept.keep(conn, conn.cursor(row_factory=tuple_row))
    await cur.execute(call.query, call.params)
    return call.read(Result(await cur.fetchall(), cur.rowcount))
