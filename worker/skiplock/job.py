"""The Job a handler receives, the status words, and row mapping (no I/O)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

import orjson

JobStatus = Literal["waiting", "pending", "processing", "done", "failed", "cancelled"]
STATUSES: tuple[JobStatus, ...] = ("waiting", "pending", "processing", "done", "failed", "cancelled")
Outcome = Literal[
    "done", "retried", "failed", "unknown_task", "timed_out", "lease_lost", "cancelled", "snoozed", "handed_back"
]
"""How one attempt ended, in one vocabulary from the executor to the logs and the metric labels
(``skiplock_jobs_finished_total{outcome}``): ``done``; ``retried`` (the handler raised: due again after a backoff);
``failed`` (for good: non-retryable, or its attempts spent); ``unknown_task`` (no task of that name in this worker:
retried, or failed once its attempts are spent); ``timed_out`` (stopped at its timeout: retried, or failed once its
attempts are spent); ``lease_lost`` (the lease was taken back before the result was written: writes rolled back, or
never started); ``cancelled`` (cancelled while it ran or waited); ``snoozed`` (the handler asked to run later: no
attempt used); ``handed_back`` (returned unfinished at shutdown: no attempt used)."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

CLAIM_ROW = (
    "id",
    "queue",
    "task",
    "payload",
    "attempts",
    "max_attempts",
    "priority",
    "created_at",
    "visible_at",
    "idempotency_key",
    "timeout_seconds",
    "serial_key",
    "trace_context",
)
"""The columns a claim returns, in order (after its ``completed`` flag): see ``job_complete_and_claim``.
A job built from a dict row (:func:`job_from_row`) takes the same names, in any order."""


class LazyConnection:
    """``job.conn`` of a sync handler: checked out of the worker's pool on first use only, so a handler that
    never touches it costs no pool checkout and its completion can join a batch."""

    __slots__ = ("_acquire", "conn", "failed")

    def __init__(self, acquire: Callable[[], Any]) -> None:
        self._acquire = acquire
        self.conn: Any = None
        self.failed: BaseException | None = None  # a failed checkout, even if the handler swallowed it

    def get(self) -> Any:
        if self.conn is None:
            try:
                self.conn = self._acquire()
            except BaseException as exc:
                self.failed = exc
                raise
        return self.conn


class AsyncLazyConnection:
    """``job.conn`` of an async handler: an async connection checked out of the worker's pool on first use only.

    ``await job.conn.execute(...)``, ``async with job.conn.cursor() as cur``, ``async with job.conn.transaction()``
    check out on first use; ``conn = await job.conn.acquire()`` gives the real ``psycopg.AsyncConnection``. Any
    other attribute is the real connection's once it has been checked out.
    """

    __slots__ = ("_acquire", "conn", "failed")

    def __init__(self, acquire: Callable[[], Awaitable[Any]]) -> None:
        self._acquire = acquire
        self.conn: Any = None
        self.failed: BaseException | None = None

    async def acquire(self) -> Any:
        if self.conn is None:
            try:
                self.conn = await self._acquire()
            except BaseException as exc:
                self.failed = exc
                raise
        return self.conn

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        return await (await self.acquire()).execute(*args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> _Deferred:
        return _Deferred(self, "cursor", args, kwargs)

    def transaction(self, *args: Any, **kwargs: Any) -> _Deferred:
        return _Deferred(self, "transaction", args, kwargs)

    async def commit(self) -> None:
        if self.conn is not None:
            await self.conn.commit()

    async def rollback(self) -> None:
        if self.conn is not None:
            await self.conn.rollback()

    def __getattr__(self, name: str) -> Any:
        if self.conn is None:
            raise AttributeError(
                f"job.conn.{name}: the connection is checked out on first use; call `conn = await job.conn.acquire()`"
            )
        return getattr(self.conn, name)


class _Deferred:
    """``job.conn.cursor()`` / ``.transaction()`` of an async handler before the connection is checked out."""

    __slots__ = ("_args", "_cm", "_kwargs", "_lazy", "_method")

    def __init__(self, lazy: AsyncLazyConnection, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._lazy, self._method, self._args, self._kwargs = lazy, method, args, kwargs
        self._cm: Any = None

    async def __aenter__(self) -> Any:
        conn = await self._lazy.acquire()
        self._cm = getattr(conn, self._method)(*self._args, **self._kwargs)
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._cm.__aexit__(*exc)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:  # `cur = job.conn.cursor(); await cur.execute()`
        if self._cm is None:
            conn = await self._lazy.acquire()
            self._cm = getattr(conn, self._method)(*self._args, **self._kwargs)
        return await self._cm.execute(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if self._cm is None:
            raise AttributeError(f"{self._method}().{name}: use `async with job.conn.{self._method}() as ...`")
        return getattr(self._cm, name)


class Bound:
    """What a worker binds to the job its handler runs, in the job's one field ``_cancel`` (set and cleared once a job,
    one dictionary store each, where three fields cost three): the job's cancel flag (``is_set``), the lazy
    ``job.conn`` (``conn``) and ``job.step``'s store (``durable``). The worker's entry for the job is one."""

    __slots__ = ()
    conn: Any
    durable: Any

    def is_set(self) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Job:
    """One claimed attempt of a job.

    ``conn`` is a database connection whose open transaction also marks the job done: write through it and
    your writes commit atomically with completion, or roll back when the lease was lost (fenced completion).
    It is ``None`` outside a worker.
    """

    id: int
    queue: str
    payload: Any
    attempts: int
    max_attempts: int
    priority: int = 0
    created_at: datetime | None = None
    visible_at: datetime | None = None
    idempotency_key: str | None = None
    task: str | None = None
    """The registered task this job runs (``None``: the queue's default handler)."""
    timeout_seconds: float | None = None
    """Longest run of one attempt set at enqueue (``None``: the task's ``timeout_seconds``, else no limit)."""
    serial_key: str | None = None
    """The key this job runs serially with (no two jobs of one key at once, in id order), if any."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context (``traceparent``, ``tracestate``) of the span that enqueued it, when that was traced
    (docs/tracing.md)."""
    _conn: Any = field(default=None, compare=False, repr=False)
    _decode_error: str | None = field(default=None, compare=False, repr=False)
    _cancel: Any = field(default=None, compare=False, repr=False)
    _durable: Any = field(default=None, compare=False, repr=False)

    @property
    def conn(self) -> Any:
        c = self._conn
        if c is None and isinstance(bound := self._cancel, Bound):  # run by a worker (see Bound)
            c = bound.conn
        return c.get() if type(c) is LazyConnection else c

    @property
    def decode_error(self) -> str | None:
        """Why the stored payload could not be decoded, or another value of the row cannot be kept (a timeout out of
        bounds): the job then fails without running. Else None."""
        return self._decode_error

    @property
    def cancelled(self) -> bool:
        """True once this job was cancelled (``skiplock cancel``) while it ran: a sync handler should stop; its
        ``job.conn`` writes will be rolled back whatever it does. Async handlers are cancelled outright."""
        c = self._cancel
        return c is not None and bool(c.is_set())

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts

    def _durable_side(self, is_async: bool, what: str) -> Any:
        d = self._durable
        if d is None and isinstance(bound := self._cancel, Bound):  # run by a worker (see Bound)
            d = bound.durable
        if d is None:
            raise RuntimeError(f"{what} needs a job run by a skiplock worker")
        if d.is_async != is_async:
            hint = "the async twin (await ..._async)" if d.is_async else "the sync one"
            raise RuntimeError(f"{what}: this job runs in a {'n async' if d.is_async else ' sync'} handler: use {hint}")
        return d

    @property
    def parent_results(self) -> dict[int, Any]:
        """The results of this job's parents (``after=``), by parent id; a purged parent is missing. Read on each
        access (sync handlers; async ones ``await job.parent_results_async()``)."""
        return self._durable_side(False, "job.parent_results").parent_results(self.id)  # type: ignore[no-any-return]

    async def parent_results_async(self) -> dict[int, Any]:
        return await self._durable_side(True, "job.parent_results_async()").parent_results(self.id)  # type: ignore[no-any-return]

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job: its JSON result is committed as soon as it returns (its own
        short transaction), and a later attempt gets the stored value back without calling ``fn``. Names are unique
        within a job."""
        return self._durable_side(False, "job.step").step(self.id, check_step_name(name), fn, args, kwargs)

    async def step_async(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The async twin of :meth:`step` (``fn`` may be a coroutine function)."""
        return await self._durable_side(True, "job.step_async").step(self.id, check_step_name(name), fn, args, kwargs)

    def with_conn(self, conn: Any, cancel: Any = None) -> Job:
        """A copy for the handler: ``conn`` as ``job.conn`` and, from a worker, the event ``job.cancelled`` reads."""
        job: Job = _new_job(type(self))  # a shallow copy of the fields (copy.copy costs 4x as much), once per job
        fields = job.__dict__
        fields.update(self.__dict__)
        fields["_conn"] = conn
        if cancel is not None:
            fields["_cancel"] = cancel
        return job


STEP_NAME_MAX = 200
"""Longest durable step name (``job.step``)."""


def check_step_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= STEP_NAME_MAX or "\x00" in name:
        raise ValueError(f"a step name must be a string of 1..{STEP_NAME_MAX} characters (got {name!r:.80})")
    return name


MAX_PAYLOAD_DEPTH = 200
"""Deepest nesting of a payload's arrays and objects: deeper payloads are refused at enqueue and fail at claim."""
TIMEOUT_SECONDS_MAX = 365 * 86400
"""Longest ``timeout_seconds`` (a year): refused beyond at enqueue and by the database, failed at claim."""


def timeout_error(timeout: Any) -> str | None:
    """Why a claimed row's ``timeout_seconds`` cannot be kept (NaN, infinite, <= 0, over a year: a row stored outside
    the database's bound), or None: such a job fails without running, never the worker or its claim."""
    if timeout is None or 0 < timeout <= TIMEOUT_SECONDS_MAX:  # NaN compares false
        return None
    return f"ValueError: timeout_seconds {timeout!r} is outside 0 < t <= {TIMEOUT_SECONDS_MAX}: failed without running"


def payload_depth_exceeded(text: str, limit: int = MAX_PAYLOAD_DEPTH) -> bool:
    """True when JSON text nests deeper than ``limit`` (a linear scan that skips strings; no recursion)."""
    if text.count("[") + text.count("{") <= limit:  # C-speed: depth never exceeds the number of openers
        return False
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


LONG_INTEGER_DIGITS = 19  # the shortest integer that may not fit 64 bits
_LONG_INTEGER = re.compile(rf"\d{{{LONG_INTEGER_DIGITS}}}")


def decode_payload(text: Any) -> tuple[Any, str | None]:
    """The payload of a claimed row (sent as text so each job is decoded on its own): (value, None), or
    (None, reason) when it cannot be decoded, so one bad row never fails the claim of its batch.

    orjson reads it (8x faster than json here) unless it may hold an integer of 19 digits or more, which orjson
    would turn into a float; what orjson refuses (a number out of a float's range, a lone surrogate) json reads as
    it always did."""
    if not isinstance(text, str):
        return text, None
    try:
        if len(text) < LONG_INTEGER_DIGITS or _LONG_INTEGER.search(text) is None:
            try:  # not contextlib.suppress: this runs for every claimed job
                return orjson.loads(text), None
            except orjson.JSONDecodeError:
                pass
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, f"PayloadError: payload cannot be decoded: {type(exc).__name__}"


def job_from_row(row: dict[str, Any]) -> Job:
    values = {name: row[name] for name in CLAIM_ROW if name in row}
    payload, error = decode_payload(values.get("payload"))
    values["payload"] = payload
    if (bad := timeout_error(values.get("timeout_seconds"))) is not None:
        values["timeout_seconds"], error = None, error or bad
    job = Job(**values)
    if error is not None:
        object.__setattr__(job, "_decode_error", error)
    return job


_new_job = object.__new__


def job_from_claim(row: tuple[Any, ...]) -> Job:
    """The Job of a claim's row (``completed``, then ``CLAIM_ROW``), built without the frozen ``__init__`` (which
    sets each field through ``object.__setattr__``): this runs for every claimed job. Its instance dictionary holds
    only the fields whose value differs from the class default (a field left out reads the default, as the private
    fields do until a worker binds them): each key a dictionary takes costs more than the test that leaves it out."""
    _, id_, queue, task, text, attempts, max_attempts, priority, created_at, visible_at, key, timeout, serial, tc = row
    payload, error = decode_payload(text)
    fields = {
        "id": id_,
        "queue": queue,
        "payload": payload,
        "attempts": attempts,
        "max_attempts": max_attempts,
        "created_at": created_at,
        "visible_at": visible_at,
    }
    if task is not None:
        fields["task"] = task
    if priority:
        fields["priority"] = priority
    if key is not None:
        fields["idempotency_key"] = key
    if timeout is not None:
        if (bad := timeout_error(timeout)) is not None:
            error = error or bad
        else:
            fields["timeout_seconds"] = timeout
    if serial is not None:
        fields["serial_key"] = serial
    if tc is not None:
        fields["trace_context"] = tc
    if error is not None:
        fields["_decode_error"] = error
    job: Job = _new_job(Job)
    _set_job_dict(job, fields)
    return job


_set_job_dict = Job.__dict__["__dict__"].__set__  # a frozen instance's __dict__, set in one C call


@dataclass(frozen=True)
class EnqueueResult:
    """What enqueue did: the job id, and whether an existing job with the same idempotency key was found."""

    id: int
    duplicate: bool = False
    source: Any = field(default=None, compare=False, repr=False)
    """The ``Queue`` or ``AsyncQueue`` that enqueued it (what :meth:`wait` asks)."""

    def __int__(self) -> int:
        return self.id

    def bound(self, source: Any) -> EnqueueResult:
        """This result, waitable through ``source`` (a ``Queue`` or an ``AsyncQueue``)."""
        object.__setattr__(self, "source", source)
        return self

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job ends: its result (None when its task returned nothing); ``JobFailedError`` when it
        ended failed or cancelled; ``TimeoutError`` after ``timeout`` seconds. Uses NOTIFY, not polling."""
        waiter = getattr(self.source, "wait", None)
        if waiter is None or getattr(self.source, "is_async", False):
            raise TypeError("wait() needs a result enqueued through a sync Queue (or a task); use await wait_async()")
        return waiter(self.id, timeout=timeout)

    async def wait_async(self, timeout: float | None = None) -> Any:
        """The async twin of :meth:`wait` (a result enqueued through an ``AsyncQueue`` or ``task.aenqueue``)."""
        if not getattr(self.source, "is_async", False):
            raise TypeError("wait_async() needs a result enqueued through an AsyncQueue (or task.aenqueue); use wait()")
        return await self.source.wait(self.id, timeout=timeout)


class EnqueueManyResult(list[int]):
    """What ``enqueue_many`` did: the ids of the jobs it inserted, in payload order (a plain list of ints, as
    before), and ``results``: for each payload given, in order, its job and whether it was a duplicate (the job
    already holding its key, or an earlier payload of the same batch with the same key)."""

    def __init__(self, ids: list[int], results: list[EnqueueResult] | None = None) -> None:
        super().__init__(ids)
        self._results = results

    @property
    def results(self) -> list[EnqueueResult]:
        if self._results is None:  # no keys: every payload inserted its job (built on first use only)
            self._results = [EnqueueResult(i) for i in self]
        return self._results

    @property
    def duplicates(self) -> list[int]:
        """The positions of the payloads that inserted nothing."""
        return [i for i, r in enumerate(self.results) if r.duplicate]


@dataclass(frozen=True)
class QueueStats:
    """Health of one queue (the seed's overview): computed from partial indexes only."""

    queue: str
    ready: int
    delayed: int
    processing: int
    stalled: int
    failed: int
    oldest_ready_age_seconds: float
    next_due: datetime | None = None
    """When the next delayed job becomes visible (None: none is delayed)."""
    paused: bool = False
    """Paused with ``skiplock pause``: workers claim nothing from it."""
    avg_attempts_done: float | None = None
    """Average attempts of the queue's last 1000 done jobs (None: none kept)."""
    waiting_serial_key: int = 0
    """Due jobs held back by flow control (the operator reads them): behind an earlier or running job of their
    serial key, on a task's global concurrency, on a task's rate limit."""
    waiting_concurrency: int = 0
    waiting_rate: int = 0
    waiting: int = 0
    """Jobs waiting on their parents (``after=``): not claimable, so no backlog."""

    @property
    def backlog(self) -> int:
        return self.ready
