"""``Queue`` and ``AsyncQueue``: enqueue, claim, complete, fail, recover, stats and admin verbs.

Each method is a few lines of I/O around shared pure helpers (parameters, row mapping), so both classes
run the same SQL with the same parameters. No loops, sleeps or metrics here: that is the worker's job.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from skiplock import migrate as migrations
from skiplock.backoff import backoff_seconds
from skiplock.errors import DatabaseUnavailableError, NonRetryableError, PayloadError
from skiplock.job import EnqueueResult, Job, QueueStats, job_from_row
from skiplock.settings import QUEUE_NAME, Settings, redact
from skiplock.sql import Queries, queries_for

MAX_ERROR_CHARS = 4000
# A \u0000 escape in JSON text, not preceded by an escaped backslash (a literal "\\u0000" is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
PURGE_BATCH = 5000


# ---------------------------------------------------------------------------------------------- pure helpers
def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text, or :class:`PayloadError` (nothing is written)."""
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise PayloadError("payload nests too deeply to serialise") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    if _NUL_ESCAPE.search(text):
        raise PayloadError("payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise PayloadError(
            f"payload is {size} bytes, over the {max_bytes}-byte limit (max_payload_bytes): "
            "store large data elsewhere and enqueue a reference"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError("payload contains text that is not valid Unicode (lone surrogates)") from None
    return text


def check_queue_name(queue: str) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise ValueError(f"queue name {queue!r} must match {QUEUE_NAME.pattern}")
    return queue


def format_error(exc: BaseException) -> str:
    """``"<Type>: <message>"``, bounded and storable (no NUL, valid UTF-8)."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the failure
        message = "<unprintable exception>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    text = text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 20] + " ...[truncated]"
    return text


def enqueue_params(
    settings: Settings,
    queue: str,
    payload: Any,
    *,
    delay: float,
    run_at: datetime | None,
    priority: int,
    max_attempts: int | None,
    idempotency_key: str | None,
) -> dict[str, Any]:
    check_queue_name(queue)
    attempts = settings.max_attempts if max_attempts is None else max_attempts
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"max_attempts must be an integer >= 1 (got {max_attempts!r})")
    if not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise ValueError(f"priority must be an integer within -32768..32767 (got {priority!r})")
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
        raise ValueError(f"delay must be a finite number of seconds >= 0 (got {delay!r})")
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise ValueError("run_at must be a timezone-aware datetime")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise ValueError("idempotency_key must be a non-empty string")
    return {
        "queue": queue,
        "payload": encode_payload(payload, settings.max_payload_bytes),
        "priority": priority,
        "max_attempts": attempts,
        "delay": float(delay),
        "run_at": run_at,
        "idempotency_key": idempotency_key,
        "channel": settings.channel,
    }


def enqueue_many_params(
    settings: Settings,
    queue: str,
    payloads: Iterable[Any],
    *,
    delay: float,
    run_at: datetime | None,
    priority: int,
    max_attempts: int | None,
    idempotency_keys: Sequence[str | None] | None,
) -> dict[str, Any]:
    encoded = [encode_payload(p, settings.max_payload_bytes) for p in payloads]
    keys: list[str | None] = list(idempotency_keys) if idempotency_keys is not None else [None] * len(encoded)
    if len(keys) != len(encoded):
        raise ValueError(f"{len(keys)} idempotency keys for {len(encoded)} payloads")
    for key in keys:
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"each idempotency key must be None or a non-empty string (got {key!r})")
    params = enqueue_params(
        settings,
        queue,
        None,
        delay=delay,
        run_at=run_at,
        priority=priority,
        max_attempts=max_attempts,
        idempotency_key=None,
    )
    params.pop("payload")
    params.pop("idempotency_key")
    # One JSON array of already-encoded payloads: no per-element array escaping (2x faster than jsonb[]).
    params.update(payloads="[" + ",".join(encoded) + "]", keys=keys if idempotency_keys is not None else None)
    return params


def claim_params(
    queues: str | Sequence[str],
    limit: int,
    worker: str,
    now: datetime | None,
    *,
    lease_seconds: float,
    leases: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Parameters of a claim: the queues (round-robin), the claimer's lease and per-task lease overrides."""
    names = [queues] if isinstance(queues, str) else list(queues)
    return {
        "queues": names,
        "limit": limit,
        "worker": worker,
        "now": now,
        "lease_seconds": float(lease_seconds),
        "leases": json.dumps(leases) if leases else None,
    }


def fence_params(jobs: Sequence[Job], worker: str, now: datetime | None) -> dict[str, Any]:
    return {"ids": [j.id for j in jobs], "attempts": [j.attempts for j in jobs], "worker": worker, "now": now}


def heartbeat_params(jobs: Sequence[Job], worker: str, leases: Sequence[float], now: datetime | None) -> dict[str, Any]:
    if len(leases) != len(jobs):
        raise ValueError(f"{len(leases)} leases for {len(jobs)} jobs")
    return fence_params(jobs, worker, now) | {"leases": [float(x) for x in leases]}


def complete_and_claim_params(
    done: Sequence[Job],
    queues: str | Sequence[str],
    limit: int,
    worker: str,
    now: datetime | None,
    *,
    lease_seconds: float,
    leases: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Parameters of ``job_complete_and_claim`` (claim alone: no ``done``)."""
    return claim_params(queues, limit, worker, now, lease_seconds=lease_seconds, leases=leases) | fence_params(
        done, worker, now
    )


def recover_params(
    queues: str | Sequence[str] | None, lease_seconds: float, limit: int, now: datetime | None
) -> dict[str, Any]:
    names = None if queues is None else ([queues] if isinstance(queues, str) else list(queues))
    return {"queues": names, "lease_seconds": lease_seconds, "limit": limit, "now": now}


def completed_and_claimed(rows: list[dict[str, Any]]) -> tuple[set[int], list[Job]]:
    """The ids completed and the jobs claimed, from the rows of ``job_complete_and_claim``."""
    return {r["id"] for r in rows if r["completed"]}, [job_from_row(r) for r in rows if not r["completed"]]


@dataclass(frozen=True)
class Failure:
    """One failed attempt, ready to record: its error text, retry delay and whether to retry at all."""

    job: Job
    error: str
    delay_seconds: float
    retry: bool

    @classmethod
    def from_exception(cls, job: Job, exc: BaseException, settings: Settings) -> Failure:
        retry = not isinstance(exc, NonRetryableError)
        delay = backoff_seconds(
            job.attempts,
            base=settings.backoff_base_seconds,
            cap=settings.backoff_cap_seconds,
            jitter=settings.backoff_jitter,
        )
        return cls(job, format_error(exc), delay, retry)

    @property
    def final(self) -> bool:
        return not self.retry or self.job.attempts >= self.job.max_attempts


def fail_params(failures: Sequence[Failure], worker: str, now: datetime | None) -> dict[str, Any]:
    return {
        "ids": [f.job.id for f in failures],
        "attempts": [f.job.attempts for f in failures],
        "errors": [f.error for f in failures],
        "delays": [f.delay_seconds for f in failures],
        "retry": [f.retry for f in failures],
        "worker": worker,
        "now": now,
    }


@dataclass(frozen=True)
class Recovered:
    id: int
    queue: str
    status: str
    attempts: int


def stats_from_row(row: dict[str, Any]) -> QueueStats:
    return QueueStats(**row)


def purge_params(
    older_than_seconds: float, statuses: Sequence[str], queue: str | None, now: datetime
) -> dict[str, Any]:
    bad = set(statuses) - {"done", "failed"}
    if bad or not statuses:
        raise ValueError(f"purge only removes done and failed jobs, not {sorted(bad) or 'nothing'}")
    if older_than_seconds < 0:
        raise ValueError("older_than must be >= 0")
    return {
        "before": now - timedelta(seconds=older_than_seconds),
        "statuses": list(statuses),
        "queue": queue,
        "limit": PURGE_BATCH,
    }


def unavailable(exc: BaseException, dsn: str | None) -> DatabaseUnavailableError:
    return DatabaseUnavailableError(redact(f"database unavailable: {exc}".strip(), dsn))


# ---------------------------------------------------------------------------------------------- sync
class Queue:
    """Synchronous queue API. Pass a DSN (a pool is made and owned) or your own ``psycopg_pool.ConnectionPool``.

    Every method also takes ``conn=``: then it runs on your connection, inside your transaction (not committed).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: ConnectionPool[Any] | None = None,
        settings: Settings | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        self.settings = settings or Settings.load(dsn=dsn)
        self._q: Queries = queries_for(self.settings.schema)
        self._owned = pool is None
        if pool is None:
            dsn = self.settings.require_dsn()
            check_connect(dsn, connect_timeout)
            pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=max_size,
                open=False,
                name="skiplock",
                timeout=connect_timeout,
                kwargs={"autocommit": True},  # every call is one statement: no BEGIN/COMMIT round trips
            )
            pool.open()
            try:
                pool.wait(timeout=connect_timeout)
            except PoolTimeout as exc:
                pool.close()
                raise unavailable(exc, dsn) from None
        self._pool = pool

    # context management
    def close(self) -> None:
        if self._owned:
            self._pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queries(self) -> Queries:
        return self._q

    def _run(
        self, query: Any, params: dict[str, Any] | None, conn: psycopg.Connection[Any] | None
    ) -> list[dict[str, Any]]:
        if conn is not None:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        try:
            with self._pool.connection() as own, own.cursor(row_factory=dict_row) as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        except PoolTimeout as exc:  # no connection could be had within the pool's timeout
            raise unavailable(exc, self.settings.dsn) from None

    # producer
    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        delay: float = 0,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> EnqueueResult:
        params = enqueue_params(
            self.settings,
            queue,
            payload,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
        )
        rows = self._run(self._q.job_enqueue, params, conn)
        if not rows:  # a concurrent insert with the same key committed after our snapshot
            rows = self._run(self._q.job_find_by_key, params, conn)
            return EnqueueResult(rows[0]["id"], duplicate=True)
        return EnqueueResult(rows[0]["id"], duplicate=rows[0]["duplicate"])

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        delay: float = 0,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        idempotency_keys: Sequence[str | None] | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[int]:
        params = enqueue_many_params(
            self.settings,
            queue,
            payloads,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            idempotency_keys=idempotency_keys,
        )
        return [r["id"] for r in self._run(self._q.job_enqueue_many, params, conn)]

    # worker primitives
    def claim(
        self,
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` visible jobs of one queue or several (round-robin), each for ``lease_seconds``
        (default the settings' lease): the deadline is stored in the row."""
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = complete_and_claim_params((), queue, limit, worker, now, lease_seconds=lease)
        return completed_and_claimed(self._run(self._q.job_complete_and_claim, params, None))[1]

    def complete(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        now: datetime | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> set[int]:
        """Mark jobs done (fenced). Returns the ids completed; the others had lost their lease."""
        return {r["id"] for r in self._run(self._q.job_complete, fence_params(jobs, worker, now), conn)}

    def fail(self, failures: Sequence[Failure], *, worker: str, now: datetime | None = None) -> dict[int, str]:
        """Record failed attempts (fenced). Returns id -> new status for the jobs whose lease was still held."""
        return {r["id"]: r["status"] for r in self._run(self._q.job_fail, fail_params(failures, worker, now), None)}

    def release(self, jobs: Sequence[Job], *, worker: str, now: datetime | None = None) -> set[int]:
        return {r["id"] for r in self._run(self._q.job_release, fence_params(jobs, worker, now), None)}

    def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        now: datetime | None = None,
    ) -> set[int]:
        """Renew the leases of ``jobs`` (each by its lease, default the settings'); returns the ids still held."""
        lease = [self.settings.lease_seconds] * len(jobs) if leases is None else leases
        lost = {r["id"] for r in self._run(self._q.job_heartbeat, heartbeat_params(jobs, worker, lease, now), None)}
        return {j.id for j in jobs} - lost

    def recover_expired(
        self,
        *,
        queue: str | None = None,
        queues: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        limit: int = 1000,
        now: datetime | None = None,
    ) -> list[Recovered]:
        """Recover processing jobs past their stored lease deadline (rows without one: locked_at + lease_seconds)."""
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = recover_params(queues if queues is not None else queue, lease, limit, now)
        return [Recovered(**r) for r in self._run(self._q.job_recover_expired, params, None)]

    def release_orphans(
        self, *, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None = None
    ) -> list[int]:
        """Hand back jobs leased to ``worker`` in ``queues`` other than ``known`` (a lost claim reply)."""
        params = {"worker": worker, "queues": list(queues), "known": list(known), "now": now}
        return [r["id"] for r in self._run(self._q.job_release_orphans, params, None)]

    # observability and admin
    def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        rows = self._run(self._q.queue_stats, {"queue": queue, "lease_seconds": lease, "now": now}, None)
        return [stats_from_row(r) for r in rows]

    def get(self, job_id: int) -> dict[str, Any] | None:
        rows = self._run(self._q.job_get, {"id": job_id}, None)
        return rows[0] if rows else None

    def list_failed(self, queue: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        return self._run(self._q.job_list_failed, {"queue": queue, "limit": limit}, None)

    def retry_failed(
        self, *, ids: Sequence[int] | None = None, queue: str | None = None, now: datetime | None = None
    ) -> list[int]:
        _require_selection(ids, queue)
        params = {"ids": list(ids) if ids is not None else None, "queue": queue, "now": now}
        return [r["id"] for r in self._run(self._q.job_retry_failed, params, None)]

    def cancel(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        reason: str = "by operator",
        now: datetime | None = None,
    ) -> list[int]:
        _require_selection(ids, queue)
        params = {"ids": list(ids) if ids is not None else None, "queue": queue, "reason": reason, "now": now}
        return [r["id"] for r in self._run(self._q.job_cancel, params, None)]

    def purge(
        self,
        *,
        older_than_seconds: float,
        statuses: Sequence[str] = ("done", "failed"),
        queue: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """Delete finished jobs older than the cutoff in batches, each batch its own short transaction."""
        with self._pool.connection() as conn:
            cutoff_now = now or conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        params = purge_params(older_than_seconds, statuses, queue, cutoff_now)
        total = 0
        while True:
            with self._pool.connection() as conn:
                deleted: int = conn.execute(self._q.job_purge_batch, params).rowcount
            total += deleted
            if deleted < PURGE_BATCH:
                return total

    def migrate(self) -> migrations.MigrationReport:
        with self._pool.connection() as conn:
            conn.commit()
            return migrations.migrate(conn, self.settings.schema)

    def check_schema(self) -> None:
        """Raise :class:`SchemaNotReadyError` unless the schema is migrated to this version."""
        try:
            with self._pool.connection() as conn:
                version = migrations.current_version(conn, self.settings.schema)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise unavailable(exc, self.settings.dsn) from None
        migrations.check_version(version, self.settings.schema)


# ---------------------------------------------------------------------------------------------- async
class AsyncQueue:
    """Asynchronous twin of :class:`Queue` (same method names, awaited). Create with ``await AsyncQueue.open(...)``."""

    def __init__(self, pool: AsyncConnectionPool[Any], settings: Settings, *, owned: bool = False) -> None:
        self.settings = settings
        self._q: Queries = queries_for(settings.schema)
        self._pool = pool
        self._owned = owned

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> AsyncQueue:
        settings = settings or Settings.load(dsn=dsn)
        dsn = settings.require_dsn()
        await acheck_connect(dsn, connect_timeout)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=False,
            name="skiplock-async",
            timeout=connect_timeout,
            kwargs={"autocommit": True},
        )
        await pool.open()
        try:
            await pool.wait(timeout=connect_timeout)
        except PoolTimeout as exc:
            await pool.close()
            raise unavailable(exc, dsn) from None
        return cls(pool, settings, owned=True)

    async def close(self) -> None:
        if self._owned:
            await self._pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    @property
    def queries(self) -> Queries:
        return self._q

    async def _run(
        self, query: Any, params: dict[str, Any] | None, conn: psycopg.AsyncConnection[Any] | None
    ) -> list[dict[str, Any]]:
        if conn is not None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []
        try:
            async with self._pool.connection() as own, own.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []
        except PoolTimeout as exc:
            raise unavailable(exc, self.settings.dsn) from None

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        delay: float = 0,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> EnqueueResult:
        params = enqueue_params(
            self.settings,
            queue,
            payload,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
        )
        rows = await self._run(self._q.job_enqueue, params, conn)
        if not rows:
            rows = await self._run(self._q.job_find_by_key, params, conn)
            return EnqueueResult(rows[0]["id"], duplicate=True)
        return EnqueueResult(rows[0]["id"], duplicate=rows[0]["duplicate"])

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        delay: float = 0,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        idempotency_keys: Sequence[str | None] | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[int]:
        params = enqueue_many_params(
            self.settings,
            queue,
            payloads,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            idempotency_keys=idempotency_keys,
        )
        return [r["id"] for r in await self._run(self._q.job_enqueue_many, params, conn)]

    async def claim(
        self,
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = complete_and_claim_params((), queue, limit, worker, now, lease_seconds=lease)
        return completed_and_claimed(await self._run(self._q.job_complete_and_claim, params, None))[1]

    async def complete_and_claim(
        self,
        done: Sequence[Job],
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
        leases: dict[str, float] | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> tuple[set[int], list[Job]]:
        """Mark ``done`` jobs done (fenced, as :meth:`complete`) and claim up to ``limit`` new ones of one queue or
        several (round-robin across queues), in one statement and one commit: the worker's hot path. Returns the
        ids completed and the jobs claimed. ``leases`` maps task names to their own lease. ``conn`` must be in
        autocommit mode (the worker passes the connection its claim loop holds)."""
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = complete_and_claim_params(done, queue, limit, worker, now, lease_seconds=lease, leases=leases)
        return completed_and_claimed(await self._run(self._q.job_complete_and_claim, params, conn))

    async def complete(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        now: datetime | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> set[int]:
        return {r["id"] for r in await self._run(self._q.job_complete, fence_params(jobs, worker, now), conn)}

    async def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        """Of ``jobs``, the ids already marked done by ``worker`` at that attempt."""
        return {r["id"] for r in await self._run(self._q.job_confirm_done, fence_params(jobs, worker, None), None)}

    async def fail(self, failures: Sequence[Failure], *, worker: str, now: datetime | None = None) -> dict[int, str]:
        rows = await self._run(self._q.job_fail, fail_params(failures, worker, now), None)
        return {r["id"]: r["status"] for r in rows}

    async def release(self, jobs: Sequence[Job], *, worker: str, now: datetime | None = None) -> set[int]:
        return {r["id"] for r in await self._run(self._q.job_release, fence_params(jobs, worker, now), None)}

    async def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        now: datetime | None = None,
    ) -> set[int]:
        lease = [self.settings.lease_seconds] * len(jobs) if leases is None else leases
        rows = await self._run(self._q.job_heartbeat, heartbeat_params(jobs, worker, lease, now), None)
        return {j.id for j in jobs} - {r["id"] for r in rows}

    async def recover_expired(
        self,
        *,
        queue: str | None = None,
        queues: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        limit: int = 1000,
        now: datetime | None = None,
    ) -> list[Recovered]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = recover_params(queues if queues is not None else queue, lease, limit, now)
        return [Recovered(**r) for r in await self._run(self._q.job_recover_expired, params, None)]

    async def release_orphans(
        self, *, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None = None
    ) -> list[int]:
        params = {"worker": worker, "queues": list(queues), "known": list(known), "now": now}
        return [r["id"] for r in await self._run(self._q.job_release_orphans, params, None)]

    async def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        rows = await self._run(self._q.queue_stats, {"queue": queue, "lease_seconds": lease, "now": now}, None)
        return [stats_from_row(r) for r in rows]

    async def get(self, job_id: int) -> dict[str, Any] | None:
        rows = await self._run(self._q.job_get, {"id": job_id}, None)
        return rows[0] if rows else None

    async def migrate(self) -> migrations.MigrationReport:
        async with self._pool.connection() as conn:
            await conn.commit()
            return await migrations.amigrate(conn, self.settings.schema)

    async def check_schema(self) -> None:
        async with self._pool.connection() as conn:
            version = await migrations.acurrent_version(conn, self.settings.schema)
        migrations.check_version(version, self.settings.schema)


def _require_selection(ids: Sequence[int] | None, queue: str | None) -> None:
    if ids is None and queue is None:
        raise ValueError("name the jobs: give ids, a queue, or both")


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
