"""One way to run a :class:`~skiplock.store.call.Call`, sync and async.

:func:`execute` / :func:`aexecute` run a call on a connection. :class:`Runner` / :class:`AsyncRunner` hold a pool
(or none: every call then needs the caller's ``conn=``) and run each call on the caller's connection, inside its
transaction, or on a pool connection switched to autocommit for the time of the call.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from skiplock.errors import ConfigError, DatabaseUnavailableError
from skiplock.settings import Settings, redact
from skiplock.store.call import Call, Result

T = TypeVar("T")
C = TypeVar("C", psycopg.Cursor[Any], psycopg.AsyncCursor[Any])
CURSORS_KEPT = 64
"""Most cursors a runner keeps (one for each pool connection and kind of rows)."""
NOT_CONNECTED = "not connected to a database: pass conn= (your transaction), or connect first"
AnyConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows (read off the result's status: ``cursor.description`` builds a column
    object for each column on every call)."""
    result = cur.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def execute(conn: psycopg.Connection[Any], call: Call[T]) -> T:
    """Run ``call`` on a cursor of its own, closed after."""
    with _cursor(conn, call.tuples) as cur:
        return execute_on(cur, call)


async def aexecute(conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
    async with _cursor(conn, call.tuples) as cur:
        return await aexecute_on(cur, call)


def idle(conn: AnyConnection) -> bool:
    """No transaction open (nor a statement running, nor the connection broken). Read off libpq's connection:
    ``conn.info`` builds a new object on every call."""
    return conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


class KeptCursors(Generic[C]):
    """A cursor for each pool connection and kind of rows (tuples or dicts), kept for the next call on it: making a
    cursor (its adapters, each parameter's dumper looked up again) costs more than a single enqueue's own work around
    its statement. Pool connections only: the pool gives one to a single caller at a time, and owns and closes it. A
    connection the pool discards or replaces is never given again, so its cursor is never used again; past
    ``CURSORS_KEPT`` cursors, those of connections closed meanwhile are forgotten (all of them, if that is not
    enough). A cursor whose statement failed, or returned no rows, is reset by its next ``execute``."""

    def __init__(self, make: Callable[[Any, bool], C]) -> None:
        self._make: Callable[[Any, bool], C] = make
        self._kept: dict[tuple[Any, bool], C] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def __call__(self, conn: Any, tuples: bool) -> C:
        key = (conn, tuples)
        cursor = self._kept.get(key)
        if cursor is None:
            if len(self._kept) >= CURSORS_KEPT:
                for old in [k for k in list(self._kept) if k[0].closed]:
                    self._kept.pop(old, None)
                if len(self._kept) >= CURSORS_KEPT:
                    self._kept.clear()
            cursor = self._kept[key] = self._make(conn, tuples)
        return cursor

    def clear(self) -> None:
        self._kept.clear()


def _cursor(conn: Any, tuples: bool) -> Any:
    return conn.cursor(row_factory=tuple_row if tuples else dict_row)


def execute_on(cur: psycopg.Cursor[Any], call: Call[T]) -> T:
    """Run ``call`` on a kept cursor (its rows' kind already the call's)."""
    cur.execute(call.query, call.params, binary=call.binary)
    return call.read(Result(cur.fetchall() if _has_rows(cur) else [], cur.rowcount))


async def aexecute_on(cur: psycopg.AsyncCursor[Any], call: Call[T]) -> T:
    await cur.execute(call.query, call.params, binary=call.binary)
    return call.read(Result(await cur.fetchall() if _has_rows(cur) else [], cur.rowcount))


_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)s|%|)")
POSITIONAL_KEPT = 64
"""Most query texts whose conversion :func:`positional` keeps."""
_positional: dict[str, tuple[bytes, tuple[str, ...]] | None] = {}


def positional(query: Any) -> tuple[bytes, tuple[str, ...]] | None:
    """``query`` (text with ``%(name)s`` placeholders) as PostgreSQL takes it, with ``$1``, ``$2``... numbered as
    psycopg numbers them (each name once, in the order of its first use), and the names in that order; converted
    once per query text. None for a query this does not take (not ASCII text, or a ``%`` sequence other than
    ``%(name)s`` and ``%%``): psycopg converts that one itself."""
    if not isinstance(query, str):
        return None
    found = _positional.get(query, False)
    if found is not False:
        return found  # type: ignore[return-value]
    names: dict[str, int] = {}
    chunks: list[str] = []
    at = 0
    converted: tuple[bytes, tuple[str, ...]] | None = None
    for m in _PLACEHOLDER.finditer(query):
        chunks.append(query[at : m.start()])
        at = m.end()
        if m.group(1) is not None:
            chunks.append(f"${names.setdefault(m.group(1), len(names) + 1)}")
        elif m.group(0) == "%%":
            chunks.append("%")
        else:  # a placeholder of another kind (%s, %b, %(name)t...): psycopg's own conversion
            break
    else:
        chunks.append(query[at:])
        text = "".join(chunks)
        converted = (text.encode(), tuple(names)) if text.isascii() else None
    if len(_positional) >= POSITIONAL_KEPT:
        _positional.clear()
    _positional[query] = converted
    return converted


def raw_cursor(conn: psycopg.AsyncConnection[Any], tuples: bool) -> psycopg.AsyncRawCursor[Any]:
    """A cursor for :func:`aexecute_raw`, kept by the caller for the connection's next calls."""
    return psycopg.AsyncRawCursor(conn, row_factory=tuple_row if tuples else dict_row)


async def aexecute_raw(cur: psycopg.AsyncRawCursor[Any], call: Call[T]) -> T:
    """Run ``call`` on a kept raw cursor (see :func:`raw_cursor`; its rows' kind already the call's), its placeholders
    converted by :func:`positional`: psycopg parses a query longer than 4 kB (a claim's) again at every execution.
    A query :func:`positional` does not take runs on a cursor of its own, converted by psycopg."""
    converted = positional(call.query) if call.params is not None else None
    if converted is None:
        return await aexecute(cur.connection, call)
    query, names = converted
    params = call.params
    assert params is not None
    try:
        values = [params[name] for name in names]
    except KeyError as exc:
        raise psycopg.ProgrammingError(f"query parameter missing: {exc.args[0]}") from None
    await cur.execute(query, values, binary=call.binary)
    return call.read(Result(await cur.fetchall() if _has_rows(cur) else [], cur.rowcount))


def outside_transaction(conn: AnyConnection) -> bool:
    """An autocommit connection with no transaction open: statements that must commit together need their own."""
    return conn.autocommit and idle(conn)


def may_autocommit(conn: AnyConnection) -> bool:
    """Whether a call may switch a pool connection to autocommit for its time (and back): one outside autocommit,
    idle, without transaction characteristics of its own (isolation level, read only, deferrable). A statement then
    runs in a transaction of its own as between BEGIN and COMMIT, two round trips fewer; statements that must
    commit together run in an explicit transaction (see :func:`skiplock.store.copy.copy_jobs`)."""
    plain = conn.isolation_level is None and conn.read_only is None and conn.deferrable is None
    return plain and not conn.autocommit and idle(conn)


def _check_conn(conn: Any, kind: type) -> None:
    """Refuse a caller's ``conn=`` of the wrong kind (a sync call's is a Connection, an async call's an
    AsyncConnection)."""
    if not isinstance(conn, kind):
        what = "a sync" if kind is psycopg.Connection else "an async"
        raise ConfigError(f"conn= of {what} call must be a psycopg.{kind.__name__}, not {type(conn).__name__}")


def unavailable(exc: BaseException, dsn: str | None) -> DatabaseUnavailableError:
    return DatabaseUnavailableError(redact(f"database unavailable: {exc}".strip(), dsn))


def pool_options(
    name: str, max_size: int, connect_timeout: float, connection: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments of an owned pool: one statement per call, so autocommit (no BEGIN/COMMIT round trips);
    ``connection``: more keyword arguments of each connection (``prepare_threshold``, ``application_name``)."""
    return {
        "min_size": 1,
        "max_size": max_size,
        "open": False,
        "name": name,
        "timeout": connect_timeout,
        "kwargs": {"autocommit": True} | (connection or {}),
    }


def check_connect(dsn: str, timeout: float = 10.0) -> None:
    """Connect once, so a wrong DSN fails at once with the server's reason (password masked)."""
    try:
        psycopg.connect(dsn, connect_timeout=max(1, int(timeout))).close()
    except psycopg.Error as exc:
        raise unavailable(exc, dsn) from None


async def acheck_connect(dsn: str, timeout: float = 10.0) -> None:
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, int(timeout)))
    except psycopg.Error as exc:
        raise unavailable(exc, dsn) from None
    await conn.close()


class Runner:
    """Runs calls on a sync pool (owned or the caller's), or on the caller's ``conn=``."""

    def __init__(self, settings: Settings, pool: ConnectionPool[Any] | None, *, owned: bool = False) -> None:
        self.settings, self.pool, self.owned = settings, pool, owned
        self.cursors: KeptCursors[psycopg.Cursor[Any]] = KeptCursors(_cursor)

    @classmethod
    def connect(cls, settings: Settings, *, name: str, max_size: int, connect_timeout: float) -> Runner:
        """An owned pool, open and checked (a wrong DSN fails here with the server's reason)."""
        dsn = settings.require_dsn()
        check_connect(dsn, connect_timeout)
        pool: ConnectionPool[Any] = ConnectionPool(dsn, **pool_options(name, max_size, connect_timeout))
        pool.open()
        try:
            pool.wait(timeout=connect_timeout)
        except PoolTimeout as exc:
            pool.close()
            raise unavailable(exc, dsn) from None
        return cls(settings, pool, owned=True)

    def close(self) -> None:
        self.cursors.clear()
        if self.owned and self.pool is not None:
            self.pool.close()

    def _checkout(self) -> psycopg.Connection[Any]:
        if self.pool is None:
            raise ConfigError(NOT_CONNECTED)
        try:
            conn: psycopg.Connection[Any] = self.pool.getconn()
        except PoolTimeout as exc:  # no connection could be had within the pool's timeout
            raise unavailable(exc, self.settings.dsn) from None
        return conn

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pool connection as it is (a transaction of its own when the pool's connections do not autocommit).
        One in autocommit goes back as it is (nothing to commit; the pool rolls back or replaces what a failed
        statement left), without the commit call of ``pool.connection()``."""
        own = self._checkout()
        try:
            if own.autocommit:
                yield own
            else:
                with own:
                    yield own
        finally:
            self.pool.putconn(own)  # type: ignore[union-attr]

    @contextmanager
    def on(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection (``conn=``), or one of the pool for the time of the call, in autocommit when
        :func:`may_autocommit` says so."""
        if conn is not None:
            _check_conn(conn, psycopg.Connection)
            yield conn
            return
        with self.connection() as own, _switched(own) as on:
            yield on

    def __call__(self, call: Call[T], conn: psycopg.Connection[Any] | None = None) -> T:
        """Run ``call`` on the caller's ``conn=`` (a cursor of its own), or on a pool connection's kept cursor
        (:class:`KeptCursors`), in autocommit when :func:`may_autocommit` says so."""
        if conn is not None:
            _check_conn(conn, psycopg.Connection)
            return execute(conn, call)
        own = self._checkout()  # the usual call (a single enqueue): no context manager but the pool's own
        try:
            cur = self.cursors(own, call.tuples)
            if own.autocommit:  # the pools a Queue makes: the statement is a transaction of its own
                return execute_on(cur, call)
            with own, _switched(own):
                return execute_on(cur, call)
        finally:
            self.pool.putconn(own)  # type: ignore[union-attr]


@contextmanager
def _switched(own: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A pool connection switched to autocommit for the time of a call when :func:`may_autocommit` says so."""
    if not may_autocommit(own):
        yield own
        return
    own.autocommit = True
    try:
        yield own
    finally:
        if idle(own):  # else broken: the pool discards it
            own.autocommit = False


class AsyncRunner:
    """The asynchronous twin of :class:`Runner`."""

    def __init__(self, settings: Settings, pool: AsyncConnectionPool[Any] | None, *, owned: bool = False) -> None:
        self.settings, self.pool, self.owned = settings, pool, owned
        self.cursors: KeptCursors[psycopg.AsyncCursor[Any]] = KeptCursors(_cursor)

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        *,
        name: str,
        max_size: int,
        connect_timeout: float,
        connection: dict[str, Any] | None = None,
        configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> AsyncRunner:
        """See :meth:`Runner.connect`; ``configure`` runs on each new connection (session settings)."""
        dsn = settings.require_dsn()
        await acheck_connect(dsn, connect_timeout)
        options = pool_options(name, max_size, connect_timeout, connection)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, configure=configure, **options)
        await pool.open()
        try:
            await pool.wait(timeout=connect_timeout)
        except PoolTimeout as exc:
            await pool.close()
            raise unavailable(exc, dsn) from None
        return cls(settings, pool, owned=True)

    async def close(self) -> None:
        self.cursors.clear()
        if self.owned and self.pool is not None:
            await self.pool.close()

    async def _checkout(self) -> psycopg.AsyncConnection[Any]:
        if self.pool is None:
            raise ConfigError(NOT_CONNECTED)
        try:
            conn: psycopg.AsyncConnection[Any] = await self.pool.getconn()
        except PoolTimeout as exc:
            raise unavailable(exc, self.settings.dsn) from None
        return conn

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """See :meth:`Runner.connection`."""
        own = await self._checkout()
        try:
            if own.autocommit:
                yield own
            else:
                async with own:
                    yield own
        finally:
            await self.pool.putconn(own)  # type: ignore[union-attr]

    @asynccontextmanager
    async def on(self, conn: psycopg.AsyncConnection[Any] | None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """See :meth:`Runner.on`."""
        if conn is not None:
            _check_conn(conn, psycopg.AsyncConnection)
            yield conn
            return
        async with self.connection() as own, _aswitched(own) as on:
            yield on

    async def __call__(self, call: Call[T], conn: psycopg.AsyncConnection[Any] | None = None) -> T:
        """See :meth:`Runner.__call__`."""
        if conn is not None:
            _check_conn(conn, psycopg.AsyncConnection)
            return await aexecute(conn, call)
        own = await self._checkout()
        try:
            cur = self.cursors(own, call.tuples)
            if own.autocommit:
                return await aexecute_on(cur, call)
            async with own, _aswitched(own):
                return await aexecute_on(cur, call)
        finally:
            await self.pool.putconn(own)  # type: ignore[union-attr]


@asynccontextmanager
async def _aswitched(own: psycopg.AsyncConnection[Any]) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """See :func:`_switched`."""
    if not may_autocommit(own):
        yield own
        return
    await own.set_autocommit(True)
    try:
        yield own
    finally:
        if idle(own):
            await own.set_autocommit(False)
