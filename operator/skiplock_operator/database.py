"""Database access of the operator: one connection per (DSN, schema), shared by the JobQueues that use it.

What happens here: migrate a schema, read queue stats and the next due time of delayed jobs, read the
server's connection limits, pause and resume queues (``spec.paused``), and purge old jobs in batches (the
scheduled retention). Each (DSN, schema) has its own lock, so a tenant whose database hangs stalls
only the JobQueues that share that very DSN; each JobQueue has its own connect slot, and host names are
resolved by :class:`Resolver` on the operator's own small thread pool (never the pool that runs the Kubernetes
calls). No caller waits for that lock longer than ``timeout``, and a caller that waited while the connection failed
gets the same verdict at once: however many JobQueues share a database, each sees an outage within the one bound.

Every call is bounded by ``timeout``. When a query outlives it, the socket is shut down from our side and
the connection dropped: no cancel request is sent over a link that may be dead (that waits for its own
timeout), so an outage is reported within ``timeout`` plus a moment. Every error leaves as
:class:`DatabaseProblem` with a fixed, classified reason: driver messages can quote the DSN (or whatever
text a Secret held), so none of them reaches a status, an Event or a log line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import ipaddress
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from skiplock import DatabaseUnavailableError, QueueStats
from skiplock.migrate import amigrate
from skiplock.schedule import STALE_SECONDS, Fired, fire_params, scope_params
from skiplock.settings import Settings
from skiplock.store.purge import apurge_batch
from skiplock.store.run import aexecute
from skiplock.store.statements import FlowCursor, PurgePolicy, Statements
from skiplock_operator.scaling import connection_budget

log = logging.getLogger(__name__)
PoolKey = tuple[str, str]
T = TypeVar("T")

# Classified reasons (condition reasons and Event reasons): the only words about a failure that leave here.
DSN_INVALID = "DSNInvalid"
HOST_NOT_ALLOWED = "HostNotAllowed"
HOST_UNKNOWN = "HostUnknown"
CONNECT_REFUSED = "ConnectRefused"
CONNECT_TIMEOUT = "ConnectTimeout"
AUTH_FAILED = "AuthFailed"
DATABASE_MISSING = "DatabaseMissing"
CONNECT_FAILED = "ConnectFailed"
QUERY_TIMEOUT = "QueryTimeout"
CONNECTION_LOST = "ConnectionLost"
QUERY_FAILED = "QueryFailed"
PERMISSION_DENIED = "PermissionDenied"
MESSAGES = {
    DSN_INVALID: "the DSN in the Secret is not a valid PostgreSQL connection string",
    HOST_NOT_ALLOWED: "the DSN's host is not in the operator's allowed database hosts",
    HOST_UNKNOWN: "the DSN's host name does not resolve",
    CONNECT_REFUSED: "the database server refused the connection",
    CONNECT_TIMEOUT: "the database server did not answer the connection in time",
    AUTH_FAILED: "the database rejected the credentials",
    DATABASE_MISSING: "the database named in the DSN does not exist",
    CONNECT_FAILED: "the operator could not connect to the database",
    QUERY_TIMEOUT: "the database did not answer a query in time",
    CONNECTION_LOST: "the connection to the database was lost",
    QUERY_FAILED: "a database query of the operator failed",
    PERMISSION_DENIED: "the operator's database role lacks a privilege it needs (give the operator the schema "
    "owner's DSN: spec.operatorDsnSecretRef)",
}
REASONS = tuple(MESSAGES)
SHARED_REASONS = frozenset(
    {CONNECT_REFUSED, CONNECT_TIMEOUT, HOST_UNKNOWN, CONNECT_FAILED, QUERY_TIMEOUT, CONNECTION_LOST}
)
"""Failures of the link itself: a caller that waited for the connection meanwhile reports the same at once."""
SCHEDULE_COMPUTE_SECONDS = 0.5
"""Longest a schedules round computes ticks (cron arithmetic, on its namespace's schedule thread, never the event
loop); the due schedules left wait for the next round, which comes at once."""
LOOKUPS_PER_NAMESPACE = 2
"""Threads of the resolver per namespace: a tenant whose DNS hangs holds at most these, and only its own."""


class DatabaseProblem(DatabaseUnavailableError):
    """A database failure, classified: ``reason`` is one of :data:`REASONS`, the message is fixed text."""

    def __init__(self, reason: str) -> None:
        super().__init__(MESSAGES[reason])
        self.reason = reason


def classify(exc: BaseException, *, connecting: bool) -> str:
    """The reason of a failure. The driver's text is looked at here, and only here; it is never passed on."""
    if isinstance(exc, DatabaseProblem):
        return exc.reason
    if isinstance(exc, TimeoutError):
        return CONNECT_TIMEOUT if connecting else QUERY_TIMEOUT
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return QUERY_TIMEOUT
    if connecting and isinstance(exc, psycopg.ProgrammingError):
        return DSN_INVALID
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate == "42501":  # insufficient_privilege
        return PERMISSION_DENIED
    text = str(exc).lower()
    role_missing = "role" in text and "does not exist" in text
    if sqlstate.startswith("28") or role_missing or "authentication" in text or "pg_hba.conf" in text:
        return AUTH_FAILED
    if sqlstate == "3D000" or ("database" in text and "does not exist" in text):
        return DATABASE_MISSING
    if not connecting:
        return CONNECTION_LOST if isinstance(exc, psycopg.OperationalError | OSError) else QUERY_FAILED
    if "refused" in text:
        return CONNECT_REFUSED
    if "timeout" in text or "timed out" in text:
        return CONNECT_TIMEOUT
    if "translate host name" in text or "name or service not known" in text or "name resolution" in text:
        return HOST_UNKNOWN
    return CONNECT_FAILED


def dsn_hosts(dsn: str) -> tuple[str, ...]:
    """The hosts a DSN names (``host`` and ``hostaddr``, comma lists split); raises DSNInvalid."""
    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # the parser's message quotes the input: drop it
        raise DatabaseProblem(DSN_INVALID) from None
    hosts: list[str] = []
    for name in ("host", "hostaddr"):
        value = params.get(name)
        if isinstance(value, str):
            hosts.extend(h.strip() for h in value.split(",") if h.strip())
    return tuple(hosts)


@functools.lru_cache(maxsize=1024)
def server_key(dsn: str) -> str:
    """The database server a DSN names (hosts and port), the unit of the connection cap: ``max_connections`` is
    the server's, shared by every database and role on it. Raises DSNInvalid."""
    hosts = ",".join(dsn_hosts(dsn))
    port = str(conninfo_to_dict(dsn).get("port") or os.environ.get("PGPORT") or "5432")
    return f"{hosts or 'local'}:{port}"


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """``allowed`` holds exact names, ``.suffix`` domains and IP networks (``10.0.0.0/8``)."""
    for rule in allowed:
        if rule.startswith("."):
            if host.endswith(rule) and len(host) > len(rule):
                return True
        elif "/" in rule and not rule.startswith("/"):
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(host) in ipaddress.ip_network(rule, strict=False):
                    return True
        elif host == rule:
            return True
    return False


def check_dsn(dsn: str, allowed_hosts: Sequence[str]) -> None:
    """Raise DSNInvalid / HostNotAllowed before any connect (an empty allow-list allows every host)."""
    hosts = dsn_hosts(dsn)
    if allowed_hosts and (not hosts or not all(host_allowed(h, allowed_hosts) for h in hosts)):
        raise DatabaseProblem(HOST_NOT_ALLOWED)


class Resolver:
    """Host names to addresses for the connects (``hostaddr``), so psycopg resolves nothing itself. Each namespace
    has its own LOOKUPS_PER_NAMESPACE threads, and each lookup is bounded by ``timeout`` (one that is still queued
    then is dropped; one that hangs keeps its thread). A blackholed DNS costs the tenant whose names it serves,
    never another namespace and never the event loop's default executor, which runs every Kubernetes call."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}

    async def hostaddr(self, namespace: str, dsn: str) -> str | None:
        """The ``hostaddr`` list for ``dsn`` (one address per host, in order), or None when there is nothing to
        resolve (no host, a socket path, or ``hostaddr`` given). Raises DatabaseProblem (HostUnknown)."""
        params = conninfo_to_dict(dsn)
        hosts = [h.strip() for h in str(params.get("host") or "").split(",")]
        if params.get("hostaddr") or not all(hosts) or any(h.startswith("/") for h in hosts):
            return None
        names = [h for h in hosts if not _is_ip(h)]
        if not names:
            return None
        port = str(params.get("port") or "5432").split(",")[0]
        pool = self._pools.get(namespace)
        if pool is None:
            pool = self._pools[namespace] = concurrent.futures.ThreadPoolExecutor(
                max_workers=LOOKUPS_PER_NAMESPACE, thread_name_prefix="skiplock-resolve"
            )
        loop = asyncio.get_running_loop()
        found: dict[str, str] = {}
        try:
            async with asyncio.timeout(self._timeout):
                for name in dict.fromkeys(names):
                    answers = await loop.run_in_executor(
                        pool, socket.getaddrinfo, name, port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP
                    )
                    found[name] = str(answers[0][4][0])
        except (TimeoutError, OSError, IndexError):
            raise DatabaseProblem(HOST_UNKNOWN) from None
        return ",".join(found.get(h, h) for h in hosts)

    def forget(self, namespace: str) -> None:
        """Let the threads of a namespace none of whose JobQueues is left go (a lookup that hangs keeps its own)."""
        pool = self._pools.pop(namespace, None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        for namespace in list(self._pools):
            self.forget(namespace)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def sever(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut the socket down under a pending read: the read fails at once, and psycopg sends no cancel."""
    with contextlib.suppress(Exception):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


@dataclass(frozen=True)
class ScheduleRound:
    """What one schedules round did: the ticks fired, the seconds until the next is due (0: more are due now),
    and the schedules that could not fire (a row the jobs table or the cron arithmetic refuses: park them)."""

    fired: list[Fired]
    next_due: float | None
    failed: list[str]


def compute_ticks(
    rows: Sequence[dict[str, Any]], channel: str, budget_seconds: float
) -> list[tuple[dict[str, Any], tuple[dict[str, Any], int] | None]]:
    """Each due row with its ``schedule_fire`` parameters and skipped ticks (None: it cannot fire), until
    ``budget_seconds`` are spent (at least one row). Pure and CPU-bound: run it off the event loop."""
    out: list[tuple[dict[str, Any], tuple[dict[str, Any], int] | None]] = []
    started = time.monotonic()
    for row in rows:
        if out and time.monotonic() - started > budget_seconds:
            break
        try:
            out.append((row, fire_params(row, channel)))
        except Exception:  # a row written by hand (bad cron, zone, bounds): it alone fails
            out.append((row, None))
    return out


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: psycopg.AsyncConnection[Any] | None = None
    migrated: bool = False
    limits: tuple[int, int] | None = None
    failed: tuple[float, str] | None = None
    """When (monotonic) and why the connection last failed: callers that waited meanwhile share the verdict."""


class Databases:
    def __init__(
        self,
        *,
        timeout: float = 5.0,
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        self._timeout = timeout
        self._allowed_hosts = tuple(allowed_hosts)
        self._resolver = Resolver(timeout)
        self._entries: dict[PoolKey, _Entry] = {}
        self._users: dict[Hashable, PoolKey] = {}
        self._slots: dict[Hashable, asyncio.Semaphore] = {}
        self._pinned: dict[str, str] = {}
        self._schedule_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Open connections."""
        return sum(1 for e in self._entries.values() if e.conn is not None and not e.conn.closed)

    def open_to(self, server: str) -> int:
        """Open connections to ``server`` (:func:`server_key`)."""
        return sum(
            1
            for (dsn, _), e in self._entries.items()
            if e.conn is not None and not e.conn.closed and server_key(dsn) == server
        )

    # ------------------------------------------------------------------ plumbing
    def _entry(self, user: Hashable, key: PoolKey) -> _Entry:
        previous = self._users.get(user)
        self._users[user] = key
        if previous is not None and previous != key:
            self._close_unused(previous)
        return self._entries.setdefault(key, _Entry())

    def _close_unused(self, key: PoolKey) -> None:
        """Close a connection nobody uses any more, once its in-flight call (if any) is over."""
        if key in self._users.values():
            return
        entry = self._entries.pop(key, None)
        if all(dsn != key[0] for dsn, _ in self._entries):
            self._pinned.pop(key[0], None)  # no connection to that DSN is left to share its addresses with
        if entry is not None and entry.conn is not None:
            task = asyncio.get_running_loop().create_task(_retire(entry))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def pinned(self, dsn: str) -> str:
        """``dsn`` with the addresses its last connect resolved (``hostaddr``), so another connection to it (the
        LISTEN one) resolves nothing; ``dsn`` itself before any connect."""
        hostaddr = self._pinned.get(dsn)
        return make_conninfo(dsn, hostaddr=hostaddr) if hostaddr else dsn

    async def _connect(self, user: Hashable, dsn: str) -> psycopg.AsyncConnection[Any]:
        """One JobQueue connects at a time (its own slot: another JobQueue's hanging connects never delay it)."""
        check_dsn(dsn, self._allowed_hosts)
        seconds = max(2, round(self._timeout))
        namespace = _namespace(user)
        async with self._slots.setdefault(user, asyncio.Semaphore(1)):
            try:
                async with asyncio.timeout(seconds + 1):  # psycopg's connect_timeout fires first
                    hostaddr = await self._resolver.hostaddr(namespace, dsn)
                    if hostaddr:
                        self._pinned[dsn] = hostaddr
                    conn = await psycopg.AsyncConnection.connect(
                        make_conninfo(dsn, hostaddr=hostaddr) if hostaddr else dsn,
                        connect_timeout=seconds,
                        application_name="skiplock-operator",
                        keepalives=1,
                        keepalives_idle=max(1, int(self._timeout)),
                        keepalives_interval=1,
                        keepalives_count=2,
                        tcp_user_timeout=int(self._timeout * 1000),
                    )
            except (psycopg.Error, OSError, TimeoutError) as exc:
                raise DatabaseProblem(classify(exc, connecting=True)) from None
        try:
            async with conn.transaction():
                await aexecute(conn, Statements(Settings()).statement_timeout(self._ms()))
        except BaseException:
            sever(conn)
            await _close(conn)
            raise
        return conn

    def _ms(self) -> int:
        return max(1, int(self._timeout * 1000))

    async def _bounded(self, conn: psycopg.AsyncConnection[Any], work: Awaitable[T]) -> T:
        """``work`` within the timeout. On timeout (or our own cancellation) the socket is shut down, so the
        pending read fails at once; the task is never cancelled, since psycopg would answer a cancellation
        with a cancel request, which waits on a dead link for its own timeout."""
        task = asyncio.ensure_future(_captured(work))  # never ends in an error: kopf re-raises those at exit
        try:
            done, _ = await asyncio.wait({task}, timeout=self._timeout)
        except asyncio.CancelledError:
            sever(conn)
            await asyncio.wait({task}, timeout=1.0)
            raise
        if not done:
            sever(conn)
            await asyncio.wait({task}, timeout=1.0)  # it fails at once on the severed socket
            raise TimeoutError
        ok, value = task.result()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    async def _call(
        self,
        user: Hashable,
        key: PoolKey,
        body: Callable[[psycopg.AsyncConnection[Any], _Entry], Awaitable[T]],
    ) -> T:
        entry = self._entry(user, key)
        asked = time.monotonic()
        try:
            async with asyncio.timeout(self._timeout):  # never wait on another caller's stuck call past the bound
                await entry.lock.acquire()
        except TimeoutError:
            raise DatabaseProblem(QUERY_TIMEOUT) from None
        try:
            if entry.failed is not None and entry.failed[0] >= asked:
                raise DatabaseProblem(entry.failed[1])  # it failed while we waited: no second wait on a dead link
            connecting = entry.conn is None or entry.conn.closed
            try:
                if connecting:
                    entry.conn = await self._connect(user, key[0])
                    entry.migrated = False
                assert entry.conn is not None
                connecting = False
                result = await self._bounded(entry.conn, body(entry.conn, entry))
                entry.failed = None
                return result
            except (psycopg.Error, OSError, TimeoutError, DatabaseProblem) as exc:
                reason = classify(exc, connecting=connecting)
                if reason in SHARED_REASONS:
                    entry.failed = (time.monotonic(), reason)
                if entry.conn is not None:
                    conn, entry.conn = entry.conn, None
                    sever(conn)
                    await _close(conn)
                raise DatabaseProblem(reason) from None
        finally:
            entry.lock.release()

    # ------------------------------------------------------------------ calls
    async def ensure_schema(self, user: Hashable, dsn: str, schema: str) -> bool:
        """Migrate ``schema`` once per connection (idempotent, advisory lock). True when this call migrated it."""

        async def migrate(conn: psycopg.AsyncConnection[Any], entry: _Entry) -> bool:
            if entry.migrated:
                return False
            await amigrate(conn, schema)
            entry.migrated = True
            return True

        return await self._call(user, (dsn, schema), migrate)

    async def stats(
        self, user: Hashable, dsn: str, schema: str, queues: Sequence[str], *, lease_seconds: float
    ) -> dict[str, QueueStats]:
        """Stats of each of ``queues`` (zeros for a queue without jobs), in one round trip per queue."""
        s = _statements(schema)

        async def read(conn: psycopg.AsyncConnection[Any], _: _Entry) -> dict[str, QueueStats]:
            out: dict[str, QueueStats] = {}
            async with conn.transaction():
                for name in queues:
                    rows = await aexecute(conn, s.stats(name, lease_seconds, None))
                    out[name] = next((r for r in rows if r.queue == name), QueueStats(name, 0, 0, 0, 0, 0, 0.0))
                    waiting = await aexecute(conn, s.waiting(name, None))  # flow control
                    held = next((r for r in waiting if r["queue"] == name), {})
                    out[name] = replace(
                        out[name],
                        waiting_serial_key=int(held.get("serial_key", 0)),
                        waiting_concurrency=int(held.get("concurrency", 0)),
                        waiting_rate=int(held.get("rate", 0)),
                    )
            return out

        return await self._call(user, (dsn, schema), read)

    async def next_due_seconds(self, user: Hashable, dsn: str, schema: str, queues: Sequence[str]) -> float | None:
        """Seconds until the first delayed job of ``queues`` becomes visible, or None when none waits."""
        s = _statements(schema)

        async def read(conn: psycopg.AsyncConnection[Any], _: _Entry) -> float | None:
            async with conn.transaction():
                return await aexecute(conn, s.queue_next_due(queues))

        return await self._call(user, (dsn, schema), read)

    async def fire_schedules(
        self,
        user: Hashable,
        dsn: str,
        schema: str,
        queues: Sequence[str],
        channel: str,
        *,
        parked: Collection[str] = (),
    ) -> ScheduleRound:
        """Fire the due schedules of ``queues`` but ``parked`` (see :mod:`skiplock.schedule`; the query leaves them
        out, so parked rows never fill its LIMIT): at most the 100 the query returns and SCHEDULE_COMPUTE_SECONDS of
        cron arithmetic per round, computed on the namespace's own schedule thread; each tick in its own savepoint,
        so a row the jobs table refuses fails alone."""
        s = _statements(schema)
        scope = scope_params(None, queues, parked)
        pool = self._schedule_pool(user)
        loop = asyncio.get_running_loop()

        async def fire(conn: psycopg.AsyncConnection[Any], _: _Entry) -> ScheduleRound:
            fired: list[Fired] = []
            failed: list[str] = []
            async with conn.transaction():
                due = await aexecute(conn, s.schedule_due(scope))
                ticks = await loop.run_in_executor(pool, compute_ticks, due, channel, SCHEDULE_COMPUTE_SECONDS)
                for row, computed in ticks:
                    if computed is None:
                        failed.append(row["name"])
                        continue
                    params, missed = computed
                    try:
                        async with conn.transaction():  # a savepoint per tick
                            job_id = await aexecute(conn, s.schedule_fire(params))
                    except (psycopg.DataError, psycopg.IntegrityError):
                        failed.append(row["name"])
                        continue
                    fired.append(Fired(row["name"], row["task"], params["tick"], job_id, missed if job_id else 0))
                next_due = 0.0 if len(ticks) < len(due) else await aexecute(conn, s.schedule_next_due(scope))
            return ScheduleRound(fired, next_due, failed)

        return await self._call(user, (dsn, schema), fire)

    def _schedule_pool(self, user: Hashable) -> concurrent.futures.ThreadPoolExecutor:
        """One thread per namespace for schedule arithmetic: a tenant's late cron rows cost only its own rounds."""
        namespace = _namespace(user)
        pool = self._schedule_pools.get(namespace)
        if pool is None:
            pool = self._schedule_pools[namespace] = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="skiplock-schedule"
            )
        return pool

    async def default_budget(self, user: Hashable, dsn: str, schema: str) -> int:
        """The budget ``connectionBudget: 0`` stands for (see :func:`skiplock_operator.scaling.connection_budget`)."""
        return budget_from_limits(*await self.server_limits(user, dsn, schema))

    async def server_limits(self, user: Hashable, dsn: str, schema: str) -> tuple[int, int]:
        """The server's (max_connections, superuser_reserved_connections), read once per connection."""

        async def read(conn: psycopg.AsyncConnection[Any], entry: _Entry) -> tuple[int, int]:
            if entry.limits is None:
                async with conn.transaction():
                    limits = await aexecute(conn, _statements(schema).server_connection_limits())
                entry.limits = limits or (100, 3)
            return entry.limits

        return await self._call(user, (dsn, schema), read)

    async def set_paused(self, user: Hashable, dsn: str, schema: str, queues: Sequence[str], paused: bool) -> None:
        """Pause (or resume) each of ``queues`` in the queues table, in one transaction; the statement tells the
        workers on the control channel (and, on resume, wakes those serving the queue)."""
        s = _statements(schema)

        async def write(conn: psycopg.AsyncConnection[Any], _: _Entry) -> None:
            async with conn.transaction():
                for name in queues:
                    await aexecute(conn, s.set_paused(name, paused, None))

        await self._call(user, (dsn, schema), write)

    async def purge_batch(
        self, user: Hashable, dsn: str, schema: str, policy: PurgePolicy, limit: int
    ) -> Counter[str] | None:
        """One batch of the scheduled retention (the one purge of :mod:`skiplock.store.purge`): the rows deleted
        by status, or None when someone else holds the schema's purge lock."""
        s = _statements(schema)

        async def purge(conn: psycopg.AsyncConnection[Any], _: _Entry) -> Counter[str] | None:
            return await apurge_batch(conn, s, policy, limit, wait=False)

        return await self._call(user, (dsn, schema), purge)

    async def holdings(
        self, user: Hashable, dsn: str, schema: str, queues: Sequence[str]
    ) -> dict[str, tuple[int, float]]:
        """Per pod (the first part of a worker id): the jobs of ``queues`` it holds and the seconds since the
        oldest of them was claimed."""
        s = _statements(schema)

        async def read(conn: psycopg.AsyncConnection[Any], _: _Entry) -> dict[str, tuple[int, float]]:
            async with conn.transaction():
                return await aexecute(conn, s.drain_holdings(queues))

        return await self._call(user, (dsn, schema), read)

    async def flow(
        self, user: Hashable, dsn: str, schema: str, queues: Sequence[str], cursor: FlowCursor | None
    ) -> tuple[int, int, FlowCursor]:
        """Jobs of ``queues`` enqueued ready and jobs done since ``cursor`` (the previous call's; None: count
        nothing, only start), and the cursor for the next call."""
        call = _statements(schema).queue_flow(queues, cursor)

        async def read(conn: psycopg.AsyncConnection[Any], _: _Entry) -> tuple[int, int, FlowCursor]:
            async with conn.transaction():
                return await aexecute(conn, call)

        return await self._call(user, (dsn, schema), read)

    async def due_soon(
        self, user: Hashable, dsn: str, schema: str, queues: Sequence[str], horizon: float
    ) -> tuple[int, float | None]:
        """Delayed jobs and live schedules of ``queues`` due within ``horizon`` seconds, and the seconds until the
        first of either (None when none waits)."""
        call = _statements(schema).queue_due_soon(queues, horizon, STALE_SECONDS)

        async def read(conn: psycopg.AsyncConnection[Any], _: _Entry) -> tuple[int, float | None]:
            async with conn.transaction():
                return await aexecute(conn, call)

        return await self._call(user, (dsn, schema), read)

    async def drains(self, user: Hashable, dsn: str, schema: str) -> set[str]:
        """The pods asked to drain (any JobQueue's: callers keep to their own pods)."""
        s = _statements(schema)

        async def read(conn: psycopg.AsyncConnection[Any], _: _Entry) -> set[str]:
            async with conn.transaction():
                return await aexecute(conn, s.drain_list())

        return await self._call(user, (dsn, schema), read)

    async def set_draining(
        self, user: Hashable, dsn: str, schema: str, pods: Sequence[str], draining: bool, reason: str = ""
    ) -> None:
        """Ask the workers of ``pods`` to stop claiming (or withdraw the request); the statement tells the
        workers on the control channel, so they look at once."""
        call = _statements(schema).drain_set(pods, draining, reason)

        async def write(conn: psycopg.AsyncConnection[Any], _: _Entry) -> None:
            async with conn.transaction():
                await aexecute(conn, call)

        if pods:
            await self._call(user, (dsn, schema), write)

    async def release(self, user: Hashable) -> None:
        """``user`` (a JobQueue) is gone: close what only it used, and the threads of its namespace once that
        namespace has no JobQueue left."""
        self._slots.pop(user, None)
        key = self._users.pop(user, None)
        if key is not None:
            self._close_unused(key)
        namespace = _namespace(user)
        if all(_namespace(u) != namespace for u in self._users):
            self._resolver.forget(namespace)
            pool = self._schedule_pools.pop(namespace, None)
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:
        self._resolver.close()
        for pool in self._schedule_pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for task in list(self._retiring):
            task.cancel()
        entries = list(self._entries.values())
        self._entries.clear()
        self._users.clear()
        for entry in entries:
            if entry.conn is not None:
                sever(entry.conn)
                await _close(entry.conn)


def _namespace(user: Hashable) -> str:
    """The namespace of a JobQueue's key (namespace, name); "" for any other user."""
    return str(user[0]) if isinstance(user, tuple) and user else ""


def _statements(schema: str) -> Statements:
    """The statements of one schema (its channels derive from it)."""
    return Statements(Settings(schema=schema))


def budget_from_limits(max_connections: int, reserved: int) -> int:
    return connection_budget(0, (max_connections, reserved), 1).connections


async def _retire(entry: _Entry) -> None:
    with contextlib.suppress(Exception):
        async with entry.lock:
            if entry.conn is not None:
                conn, entry.conn = entry.conn, None
                await _close(conn)


async def _captured(work: Awaitable[Any]) -> tuple[bool, Any]:
    """(True, result) or (False, exception): a task left behind a severed socket ends quietly."""
    try:
        return True, await work
    except Exception as exc:
        return False, exc


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
