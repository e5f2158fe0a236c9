"""``Queue`` and ``AsyncQueue``: enqueue, claim, complete, fail, recover, stats and admin verbs.

Each method is a few lines of I/O around shared pure helpers (parameters, row mapping), so both classes
run the same SQL with the same parameters. No loops, sleeps or metrics here: that is the worker's job.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from skiplock import migrate as migrations
from skiplock.backoff import backoff_seconds
from skiplock.errors import ConfigError, DatabaseUnavailableError, EnqueueError, NonRetryableError, PayloadError
from skiplock.job import (
    CLAIM_ROW,
    MAX_PAYLOAD_DEPTH,
    EnqueueManyResult,
    EnqueueResult,
    Job,
    QueueStats,
    job_from_claim,
    payload_depth_exceeded,
)
from skiplock.limits import TaskLimits, register_params
from skiplock.settings import QUEUE_NAME, Settings, redact
from skiplock.sql import Queries, queries_for
from skiplock.unique import UNIQUE_KEY_MAX, states_for, unique_problem

MAX_ERROR_CHARS = 4000
HISTORY_ERROR_CHARS = 1000
"""Longest error text of one entry of a job's error history (``errors``: the last 20 failed attempts)."""
# A \u0000 escape in JSON text, not preceded by an escaped backslash (a literal "\\u0000" is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
PURGE_BATCH = 5000
TASK_NAME_MAX = 200
"""Longest task name (the database checks it too)."""
IDEMPOTENCY_KEY_MAX = 255
"""Longest idempotency key (the database checks it too)."""
WAITING_REASONS = ("serial_key", "concurrency", "rate")
"""Why a due job waits (queue_waiting): an earlier or running job of its serial key, a global concurrency limit,
a rate limit."""
SERIAL_KEY_MAX = 255
"""Longest serial key (the database checks it too)."""
PRIORITY_RANGE = (-32768, 32767)
MAX_ATTEMPTS_LIMIT = 1000
MAX_DELAY_SECONDS = 100 * 365 * 86400
T = TypeVar("T")


class _Visibility(TypedDict, total=False):
    delay: float | timedelta
    run_at: datetime | None
    priority: int | None
    max_attempts: int | None


class EnqueueOptions(_Visibility, total=False):
    """Options of one enqueue, all optional: ``task``, ``delay`` (seconds or timedelta), ``run_at`` (aware
    datetime), ``priority``, ``max_attempts``, ``idempotency_key``, ``timeout_seconds`` (how long one attempt
    may run; default the task's timeout, else none)."""

    task: str | None
    idempotency_key: str | None
    timeout_seconds: float | None
    unique_key: str | None
    unique_states: Sequence[str] | None
    unique_conflict: str | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


class EnqueueManyOptions(_Visibility, total=False):
    """Options of ``enqueue_many``: those of one enqueue, with one idempotency key (or unique key) per payload."""

    task: str | None
    idempotency_keys: Sequence[str | None] | None
    unique_keys: Sequence[str] | None
    unique_states: Sequence[str] | None
    unique_conflict: str | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


class TaskEnqueueOptions(_Visibility, total=False):
    """Options of ``task.enqueue``: those of one enqueue with the queue (the task is the task itself).
    The task's defaults (queue, priority, max_attempts) fill what is not given; explicit options win
    (``timeout_seconds`` is this job's own timeout, over the task's ``timeout_seconds``)."""

    queue: str
    idempotency_key: str | None
    timeout_seconds: float | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


class TaskEnqueueManyOptions(_Visibility, total=False):
    """Options of ``task.enqueue_many``."""

    queue: str
    idempotency_keys: Sequence[str | None] | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__optional_keys__)
ENQUEUE_MANY_OPTIONS = frozenset(EnqueueManyOptions.__optional_keys__)


# ---------------------------------------------------------------------------------------------- pure helpers
_JSON = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
"""The payload encoder, built once (``json.dumps`` with these options builds one per call)."""


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text, or :class:`PayloadError` (nothing is written)."""
    try:
        text = _JSON.encode(payload)
    except RecursionError:
        raise PayloadError("payload nests too deeply to serialise") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    if _has_nul(text):
        raise PayloadError("payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    if payload_depth_exceeded(text):  # a worker must be able to decode what a producer stores
        raise PayloadError(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects")
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


def batch_encoder() -> Callable[[Any], str]:
    """``_JSON.encode`` for a batch of payloads: CPython's C encoder built once with ``_JSON``'s options, where
    ``encode`` builds one for every payload (0.5 against 1.4 µs a small payload); ``_JSON.encode`` itself where
    there is no C encoder. A fresh one per batch: the C encoder's record of the containers it is inside (circular
    references) may keep entries after an error."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _JSON.encode
    e = _JSON
    strings = json.encoder.encode_basestring_ascii if e.ensure_ascii else json.encoder.encode_basestring
    markers: dict[int, Any] | None = {} if e.check_circular else None
    separators = (e.key_separator, e.item_separator)
    chunks = make(markers, e.default, strings, None, *separators, e.sort_keys, e.skipkeys, e.allow_nan)
    return lambda payload: "".join(chunks(payload, 0))


def encode_payloads(payloads: Iterable[Any], max_bytes: int) -> list[str]:
    """Each payload as :func:`encode_payload` gives it, with its checks made once over the whole batch: a batch
    that fails one goes payload by payload through :func:`encode_payload`, which raises the first one's error."""
    given = list(payloads)
    try:
        encode = batch_encoder()
        texts = [encode(p) for p in given]
        joined = "\n".join(texts)  # JSON text holds no raw newline: no \u0000 escape spans two payloads
        joined.encode("utf-8")  # no lone surrogates
    except (RecursionError, TypeError, ValueError):
        return [encode_payload(p, max_bytes) for p in given]
    deep = [t for t in texts if t.count("[") + t.count("{") > MAX_PAYLOAD_DEPTH]  # the only candidates
    # At most 4 UTF-8 bytes a character: the longest text within max_bytes / 4 means every payload fits.
    if _has_nul(joined) or max(map(len, texts), default=0) * 4 > max_bytes or any(map(payload_depth_exceeded, deep)):
        return [encode_payload(p, max_bytes) for p in given]
    return texts


def _has_nul(text: str) -> bool:
    """A ``\\u0000`` escape in JSON text (the substring test first: the pattern costs 100 times more)."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


def _shown(value: Any) -> str:
    """``repr`` of a bad argument, cut short (an error message must not echo a 9,000-character key)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}... ({len(value) if isinstance(value, str) else '?'} chars)"


def check_queue_name(queue: Any) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise EnqueueError(f"queue name {_shown(queue)} must match {QUEUE_NAME.pattern}")
    return queue


def task_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a task name, or ``None``."""
    if not isinstance(name, str) or not name or len(name) > TASK_NAME_MAX or not name.isprintable():
        return f"task name {_shown(name)} must be 1..{TASK_NAME_MAX} printable characters"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_idempotency_key(key: Any) -> str | None:
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX):
        raise EnqueueError(
            f"idempotency_key must be None or a string of 1..{IDEMPOTENCY_KEY_MAX} characters (got {_shown(key)})"
        )
    return key


def serial_params(options: Mapping[str, Any]) -> dict[str, Any]:
    """``serial_key`` (jobs sharing it run one at a time, in enqueue order) and ``serial_skip_on_retry`` (later jobs
    of the key may run while this one waits for a retry), validated."""
    key = options.get("serial_key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= SERIAL_KEY_MAX or "\x00" in key):
        raise EnqueueError(f"serial_key must be None or a string of 1..{SERIAL_KEY_MAX} characters (got {_shown(key)})")
    skip = options.get("serial_skip_on_retry")
    if skip is not None and not isinstance(skip, bool):
        raise EnqueueError(f"serial_skip_on_retry must be True or False (got {_shown(skip)})")
    return {"serial_key": key, "serial_skip_on_retry": bool(skip)}


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


def _common_params(settings: Settings, queue: str, options: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """Validated parameters shared by one and many enqueues; :class:`EnqueueError` names what is wrong."""
    unknown = set(options) - known
    if unknown:
        raise EnqueueError(
            f"unknown enqueue option(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})"
        )
    check_queue_name(queue)
    task = options.get("task")
    if task is not None and (problem := task_name_problem(task)):
        raise EnqueueError(problem)
    priority = options.get("priority")
    priority = 0 if priority is None else priority
    low, high = PRIORITY_RANGE
    if not _is_int(priority) or not low <= priority <= high:
        raise EnqueueError(f"priority must be an integer within {low}..{high} (got {_shown(priority)})")
    attempts = options.get("max_attempts")
    attempts = settings.max_attempts if attempts is None else attempts
    if not _is_int(attempts) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise EnqueueError(f"max_attempts must be an integer within 1..{MAX_ATTEMPTS_LIMIT} (got {_shown(attempts)})")
    delay = options.get("delay", 0)
    delay = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= MAX_DELAY_SECONDS:
        raise EnqueueError(
            f"delay must be a finite number of seconds within 0..{MAX_DELAY_SECONDS} (got {_shown(delay)})"
        )
    run_at = options.get("run_at")
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise EnqueueError(f"run_at must be a timezone-aware datetime (got {_shown(run_at)})")
    t = options.get("timeout_seconds")
    if t is not None and (not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t <= 0):
        raise EnqueueError(f"timeout_seconds must be a finite number of seconds > 0 (got {_shown(t)})")
    return {
        "queue": queue,
        "task": task,
        "priority": priority,
        "max_attempts": attempts,
        "delay": float(delay),
        "run_at": run_at,
        "channel": settings.channel,
        "timeout_seconds": None if t is None else float(t),
    } | serial_params(options)


def enqueue_params(settings: Settings, queue: str, payload: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters of ``job_enqueue`` (``job_enqueue_unique`` with a unique key), or :class:`EnqueueError`."""
    params = _common_params(settings, queue, options, ENQUEUE_OPTIONS)
    key = check_idempotency_key(options.get("idempotency_key"))
    params |= {"payload": encode_payload(payload, settings.max_payload_bytes), "idempotency_key": key}
    unique = options.get("unique_key")
    if unique is not None or options.get("unique_states") is not None or options.get("unique_conflict") is not None:
        params |= unique_params(options, [unique], idempotency=key is not None)
    return params


def unique_params(options: Mapping[str, Any], keys: Sequence[Any], *, idempotency: bool) -> dict[str, Any]:
    """The unique part of an enqueue's parameters (``unique_key`` / ``keys``, ``unique_states``, ``replace``)."""
    if idempotency:
        raise EnqueueError("a unique job takes no idempotency key: its unique key plays that part")
    states, conflict = options.get("unique_states"), options.get("unique_conflict")
    if problem := unique_problem(None, None, states, conflict, explicit_key=True):
        raise EnqueueError(problem)
    for key in keys:
        if not isinstance(key, str) or not 1 <= len(key) <= UNIQUE_KEY_MAX:
            raise EnqueueError(f"unique key must be a string of 1..{UNIQUE_KEY_MAX} characters (got {_shown(key)})")
    return {
        "unique_key": keys[0] if len(keys) == 1 else None,
        "keys": list(keys),
        "unique_states": states_for(None, states),
        "replace": conflict == "replace",
    }


def enqueue_many_params(
    settings: Settings, queue: str, payloads: Iterable[Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """Parameters of ``job_enqueue_many``, or :class:`EnqueueError` (nothing is written)."""
    params = _common_params(settings, queue, options, ENQUEUE_MANY_OPTIONS)
    values = list(payloads)
    given = options.get("idempotency_keys")
    keys: list[str | None] = list(given) if given is not None else [None] * len(values)
    if len(keys) != len(values):
        raise EnqueueError(f"{len(keys)} idempotency keys for {len(values)} payloads")
    for key in given or ():
        check_idempotency_key(key)
    unique = options.get("unique_keys")
    keyed = any(k is not None for k in keys)
    uniques = (
        unique is not None or options.get("unique_states") is not None or options.get("unique_conflict") is not None
    )
    if values and not keyed and not uniques:  # a COPY: it encodes the payloads as it writes them (see CopyJobs)
        return params | {"keys": None, "values": values, "max_bytes": settings.max_payload_bytes}
    encoded = encode_payloads(values, settings.max_payload_bytes)
    if uniques:
        if unique is None or len(unique) != len(encoded):
            raise EnqueueError(f"unique_keys must give one key for each of the {len(encoded)} payloads")
        params |= unique_params(options, unique, idempotency=keyed)
        firsts = sorted({k: i for i, k in reversed(list(enumerate(unique)))}.values())  # a repeated key: its first
        encoded = [encoded[i] for i in firsts]
        params["keys"] = [unique[i] for i in firsts]
        return params | {"payloads": "[" + ",".join(encoded) + "]", "payload_keys": list(unique), "encoded": encoded}
    # One JSON array of already-encoded payloads: no per-element array escaping (2x faster than jsonb[]).
    return params | {
        "payloads": "[" + ",".join(encoded) + "]",
        "keys": keys if keyed else None,
        "payload_keys": keys,
        "encoded": encoded,
    }


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: Any) -> str:
    """``value`` as one field of COPY's text format (NULL is ``\\N``)."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).translate(_COPY_ESCAPES)


def _names(queues: str | Sequence[str]) -> list[str]:
    return [queues] if isinstance(queues, str) else list(queues)


@functools.lru_cache(maxsize=64)
def text_array(names: tuple[str, ...]) -> str:
    """``names`` as a text[] literal (cast in the statement): a claimer sends the same queues with every claim, and
    psycopg's list dumper costs more than the statement's own use of them."""
    quoted = ['"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in names]
    return "{" + ",".join(quoted) + "}"


def claim_params(
    queues: str | Sequence[str],
    limit: int,
    worker: str,
    now: datetime | None,
    *,
    lease_seconds: float,
    leases: Mapping[str, float] | None = None,
    rotate: int = 0,
    shares: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Parameters of a claim: the queues (round-robin from the one after ``rotate``, at most ``shares[i]`` of queue
    ``i``, by default ``per_queue_limit(limit, queues)`` of each), the claimer's lease and per-task lease
    overrides."""
    names = _names(queues)
    if shares is None:
        shares = [per_queue_limit(limit, len(names))] * len(names)
    elif len(shares) != len(names) or min(shares, default=1) < 1:
        raise ValueError(f"shares must give each of the {len(names)} queues at least 1 job, got {list(shares)}")
    return {
        "queues": text_array(tuple(names)),
        "limit": limit,
        "per_queue": "{" + ",".join([str(int(n)) for n in shares]) + "}",
        "rotate": rotate % max(1, len(names)),
        "worker": worker,
        "now": now,
        "lease_seconds": float(lease_seconds),
        "leases": json.dumps(dict(leases)) if leases else None,
    }


def per_queue_limit(limit: int, queues: int) -> int:
    """Most candidates one claim takes (and locks) per queue: the claim locks about ``limit`` rows in all."""
    return max(1, -(-limit // max(1, queues)))


def fence_params(jobs: Sequence[Job], worker: str, now: datetime | None) -> dict[str, Any]:
    return {"ids": [j.id for j in jobs], "attempts": [j.attempts for j in jobs], "worker": worker, "now": now}


def fence_one_params(job: Job, worker: str) -> dict[str, Any]:
    """Parameters of ``job_complete_one``: one job's attempt, fenced by primary key."""
    return {"id": job.id, "attempts": job.attempts, "worker": worker}


def heartbeat_params(
    jobs: Sequence[Job],
    worker: str,
    leases: Sequence[float],
    now: datetime | None,
    timeouts: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """``timeouts``: each job's timeout (None: none), past which its lease is no longer renewed."""
    if len(leases) != len(jobs):
        raise ValueError(f"{len(leases)} leases for {len(jobs)} jobs")
    limits = [None] * len(jobs) if timeouts is None else [None if t is None else float(t) for t in timeouts]
    return fence_params(jobs, worker, now) | {"leases": [float(x) for x in leases], "timeouts": limits}


def complete_and_claim_params(
    done: Sequence[Job],
    queues: str | Sequence[str],
    limit: int,
    worker: str,
    now: datetime | None,
    *,
    lease_seconds: float,
    leases: Mapping[str, float] | None = None,
    rotate: int = 0,
    shares: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Parameters of ``job_complete_and_claim`` (claim alone: no ``done``). The ids and attempts of the finished jobs
    go as array literals (``{1,2,3}``, cast in the statement): psycopg's list dumper costs more per element than
    the claim's own bookkeeping of a job."""
    claim = claim_params(
        queues, limit, worker, now, lease_seconds=lease_seconds, leases=leases, rotate=rotate, shares=shares
    )
    ids = "{" + ",".join([str(j.id) for j in done]) + "}"
    attempts = "{" + ",".join([str(j.attempts) for j in done]) + "}"
    return claim | {"ids": ids, "attempts": attempts, "worker": worker, "now": now}


def recover_params(
    queues: str | Sequence[str] | None, lease_seconds: float, limit: int, now: datetime | None
) -> dict[str, Any]:
    names = None if queues is None else _names(queues)
    return {"queues": names, "lease_seconds": lease_seconds, "limit": limit, "now": now}


def completed_and_claimed(rows: list[tuple[Any, ...]]) -> tuple[set[int], list[Job]]:
    """The ids completed and the jobs claimed (in claim order: priority, then due time, then id), from the rows
    of ``job_complete_and_claim`` as tuples (``completed``, then ``CLAIM_ROW``; an UPDATE returns its rows in no
    particular order): a claimed job's ``completed`` is NULL, and one more row carries the completed ids as an
    array. Tuples, not dicts: this runs for every claimed job."""
    completed: set[int] = set()
    claimed: list[tuple[Any, ...]] = []
    for r in rows:
        if r[0] is None:
            claimed.append(r)
        else:
            completed.update(r[0])
    # two stable sorts with keys in C (no Python call a row): due time and id, then priority, highest first
    claimed.sort(key=_BY_DUE)
    claimed.sort(key=_BY_PRIORITY, reverse=True)  # reverse keeps equal keys in their order
    return completed, [job_from_claim(r) for r in claimed]


_BY_DUE = operator.itemgetter(1 + CLAIM_ROW.index("visible_at"), 1)  # 1 + : ``completed`` comes first
_BY_PRIORITY = operator.itemgetter(1 + CLAIM_ROW.index("priority"))


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
        "history_chars": HISTORY_ERROR_CHARS,
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
    bad = set(statuses) - {"done", "failed", "cancelled"}
    if bad or not statuses:
        raise ValueError(f"purge only removes done, failed and cancelled jobs, not {sorted(bad) or 'nothing'}")
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


def _require_selection(ids: Sequence[int] | None, queue: str | None) -> None:
    if ids is None and queue is None:
        raise ValueError("name the jobs: give ids, a queue, or both")


def selection_params(ids: Sequence[int] | None, queue: str | None, now: datetime | None) -> dict[str, Any]:
    _require_selection(ids, queue)
    return {"ids": list(ids) if ids is not None else None, "queue": queue, "now": now}


# ---------------------------------------------------------------------------------------------- statements
@dataclass(frozen=True)
class Result:
    """What a statement returned: its rows (dicts, or tuples for a ``Call`` with ``tuples``) and its row count."""

    rows: list[Any]
    rowcount: int


@dataclass(frozen=True)
class Call(Generic[T]):
    """One statement a queue method runs: the query, its parameters, and how the result becomes the return value."""

    query: Any
    params: dict[str, Any] | None
    read: Callable[[Result], T]
    tuples: bool = False  # rows as tuples (the hot claim), not dicts
    binary: bool = False  # rows in binary format (the hot claim: its rows load 17 % faster)


def _ids(r: Result) -> list[int]:
    return [row["id"] for row in r.rows]


def _id_set(r: Result) -> set[int]:
    return {row["id"] for row in r.rows}


def _enqueued(r: Result) -> EnqueueResult | None:
    return EnqueueResult(r.rows[0]["id"], duplicate=r.rows[0]["duplicate"]) if r.rows else None


def replace_call(query: Any, params: dict[str, Any], keys: list[str], encoded: list[str]) -> Call[list[int]]:
    """``job_replace_unique`` for ``keys`` with these payloads (already encoded), the enqueue's other options."""
    return Call(query, params | {"keys": keys, "payloads": "[" + ",".join(encoded) + "]"}, _ids)


def _rows(r: Result) -> list[dict[str, Any]]:
    return r.rows


def _found(r: Result) -> EnqueueResult:
    return EnqueueResult(r.rows[0]["id"], duplicate=True)


@dataclass(frozen=True)
class ManyEnqueue:
    """One ``enqueue_many``: the insert, then (only when some payload was a duplicate) the look-up of the jobs
    holding their keys, and the per-payload result."""

    insert: Call[list[dict[str, Any]]]
    keys: list[str | None]
    """The key of each payload given (None: no key), in order."""
    find_query: Any
    params: dict[str, Any]
    replace_query: Any = None

    def missing(self, rows: list[dict[str, Any]]) -> list[str]:
        """The keys of the payloads that inserted nothing (held by another job)."""
        if self.params["keys"] is None or len(rows) == len(self.keys):
            return []  # no keys, or every payload inserted its job
        got = {r["key"] for r in rows}
        return sorted({k for k in self.keys if k is not None and k not in got})

    def replace(self, keys: list[str]) -> Call[list[int]] | None:
        """With ``unique_conflict="replace"``: the update of the pending jobs holding ``keys`` (else None)."""
        if not self.params.get("replace"):
            return None
        by_key = dict(zip(self.params["keys"], self.params["encoded"], strict=True))
        return replace_call(self.replace_query, self.params, keys, [by_key[k] for k in keys])

    def find(self, keys: list[str]) -> Call[dict[str, int]]:
        params = {"queue": self.params["queue"], "keys": keys}
        return Call(self.find_query, params, lambda r: {x["key"]: x["id"] for x in r.rows})

    def result(self, rows: list[dict[str, Any]], found: dict[str, int]) -> EnqueueManyResult:
        """Per payload, its job: the new one (in payload order, ids ascending), or the one holding its key."""
        if self.params["keys"] is None:
            return EnqueueManyResult([r["id"] for r in rows])  # no keys: one new job per payload
        new = [r["id"] for r in rows if not r.get("duplicate")]
        by_key = {r["key"]: r for r in rows if r["key"] is not None}
        keyless = iter(r["id"] for r in rows if r["key"] is None)
        seen: set[str] = set()
        out: list[EnqueueResult] = []
        for key in self.keys:
            if key is None:
                out.append(EnqueueResult(next(keyless)))
                continue
            row = by_key.get(key)
            if row is not None and key not in seen:
                out.append(EnqueueResult(row["id"], duplicate=bool(row.get("duplicate"))))
            elif row is not None:
                out.append(EnqueueResult(row["id"], duplicate=True))
            elif key in found:
                out.append(EnqueueResult(found[key], duplicate=True))
            else:
                raise EnqueueError(f"the job holding key {_shown(key)} vanished meanwhile (purged): enqueue it again")
            seen.add(key)
        return EnqueueManyResult(new, out)


def _reserved(r: Result) -> tuple[list[int], datetime]:
    return r.rows[0]["ids"], r.rows[0]["visible_at"]


COLUMN_DEFAULTS = {"task": None, "priority": 0, "max_attempts": 5, "serial_key": None, "serial_skip_on_retry": False}
"""The jobs table's defaults (the migrations') of the options an ``enqueue_many`` writes."""


def copies_defaults(params: Mapping[str, Any]) -> bool:
    """Whether the jobs of an ``enqueue_many`` keep every column default: their COPY then writes only id, payload and
    queue (``job_copy_many_plain``), which PostgreSQL reads 6 % faster than all nine columns."""
    return due_now(params) and all(params[k] == v for k, v in COLUMN_DEFAULTS.items())


def due_now(params: Mapping[str, Any]) -> bool:
    """Whether enqueued jobs are due at the transaction's start (no ``run_at``, no delay): the column's ``now()``."""
    return params["run_at"] is None and not params["delay"]


COPY_CHUNK = 125
"""Payloads encoded and written to a COPY at a time: PostgreSQL reads one chunk while the next is encoded."""


@dataclass
class CopyJobs:
    """One ``enqueue_many`` without keys: reserve the ids (``job_reserve_ids``, which also wakes the workers at
    commit when the jobs are due now), then COPY the rows with them (``job_copy_many``), in one transaction.

    The payloads are encoded chunk by chunk as the COPY goes, so the server stores one chunk while the client
    encodes the next; a bad payload then fails the COPY, and with it the transaction the call opened. In a
    transaction that is not the call's own, :meth:`encode_all` checks them all before anything is sent."""

    reserve: Call[tuple[list[int], datetime]]
    query: Any
    params: dict[str, Any]
    plain: bool = False  # every option is the column's default: the query is job_copy_many_plain (id, payload, queue)
    encoded: list[str] | None = None

    def encode_all(self) -> None:
        """Encode (and so check) every payload now: a bad one raises :class:`PayloadError`, nothing sent."""
        if self.encoded is None:
            self.encoded = encode_payloads(self.params["values"], self.params["max_bytes"])

    def chunks(self, ids: list[int], visible_at: datetime | str) -> Iterator[str]:
        """The COPY text of the jobs, :data:`COPY_CHUNK` rows at a time: per payload, in order, its id and JSON text,
        then the options of all. JSON text escapes every control character, so only its backslashes need escaping
        here."""
        p = self.params
        if due_now(p):
            visible_at = "now"  # the transaction's start, as now(): the same value, and 3x cheaper to parse
        options: tuple[Any, ...] = (p["queue"],)
        if not self.plain:
            options += (
                p["task"],
                p["priority"],
                p["max_attempts"],
                visible_at,
                p["serial_key"],
                p["serial_skip_on_retry"],
            )
        tail = "\t".join([copy_text(v) for v in options])
        values, limit = p["values"], p["max_bytes"]
        for start in range(0, len(values), COPY_CHUNK):
            end = start + COPY_CHUNK
            texts = self.encoded[start:end] if self.encoded is not None else encode_payloads(values[start:end], limit)
            escaped = [t.replace("\\", "\\\\") for t in texts]
            yield "".join([f"{i}\t{t}\t{tail}\n" for i, t in zip(ids[start:end], escaped, strict=True)])


class Statements:
    """The calls behind every method of :class:`Queue` and :class:`AsyncQueue`: pure, no I/O, shared by both."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.q: Queries = queries_for(settings.schema)

    def enqueue(
        self, queue: str, payload: Any, options: Mapping[str, Any]
    ) -> tuple[Call[EnqueueResult | None], Call[EnqueueResult]]:
        """The insert, and the look-up to run when it returns nothing (a concurrent insert with the same key
        committed after this statement's snapshot)."""
        params = enqueue_params(self.settings, queue, payload, options)
        if params.get("unique_key") is not None:
            return Call(self.q.job_enqueue_unique, params, _enqueued), Call(
                self.q.job_find_by_unique_key, params, _found
            )
        return Call(self.q.job_enqueue, params, _enqueued), Call(self.q.job_find_by_key, params, _found)

    def enqueue_many(self, queue: str, payloads: Iterable[Any], options: Mapping[str, Any]) -> ManyEnqueue | CopyJobs:
        """Without keys (idempotency or unique), a COPY of the jobs; with keys, one INSERT that skips the taken."""
        params = enqueue_many_params(self.settings, queue, payloads, options)
        if "values" in params:
            reserve = Call(self.q.job_reserve_ids, params | {"n": len(params["values"])}, _reserved)
            if copies_defaults(params):
                return CopyJobs(reserve, self.q.job_copy_many_plain, params, plain=True)
            return CopyJobs(reserve, self.q.job_copy_many, params)
        unique = "unique_states" in params
        insert = Call(self.q.job_enqueue_many_unique if unique else self.q.job_enqueue_many, params, _rows)
        find = self.q.job_find_by_unique_keys if unique else self.q.job_find_by_keys
        return ManyEnqueue(insert, params["payload_keys"], find, params, self.q.job_replace_unique)

    def replace_unique(self, params: dict[str, Any]) -> Call[list[int]] | None:
        """After a unique enqueue found its key taken: with ``unique_conflict="replace"``, the update of the
        pending holder (else None)."""
        if not params.get("replace"):
            return None
        return replace_call(self.q.job_replace_unique, params, [params["unique_key"]], [params["payload"]])

    def complete_and_claim(
        self,
        done: Sequence[Job],
        queues: str | Sequence[str],
        limit: int,
        worker: str,
        now: datetime | None,
        lease_seconds: float | None = None,
        leases: Mapping[str, float] | None = None,
        rotate: int = 0,
        limited: bool = True,
        after: Job | None = None,
        shares: Sequence[int] | None = None,
    ) -> Call[tuple[set[int], list[Job]]]:
        """``limited=False``: the claimer knows no task limits, so it leaves jobs of limited tasks alone and skips
        the slot bookkeeping (the cheaper statement). ``after``: claim only jobs of its priority that come after it
        in claim order (one queue; the index scan starts there). ``shares``: the most jobs taken of each queue."""
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = complete_and_claim_params(
            done, queues, limit, worker, now, lease_seconds=lease, leases=leases, rotate=rotate, shares=shares
        )
        one = isinstance(queues, str) or len(queues) == 1
        if after is not None:
            if not one or after.visible_at is None:
                raise ValueError("after= needs one queue and a claimed job (with its visible_at)")
            params |= {"after_priority": after.priority, "after_at": after.visible_at, "after_id": after.id}
            query = (
                self.q.job_complete_and_claim_one_after
                if limited
                else self.q.job_complete_and_claim_unlimited_one_after
            )
        elif limited:
            query = self.q.job_complete_and_claim_one if one else self.q.job_complete_and_claim
        else:
            query = self.q.job_complete_and_claim_unlimited_one if one else self.q.job_complete_and_claim_unlimited
        return Call(query, params, lambda r: completed_and_claimed(r.rows), tuples=True, binary=True)

    def confirm_done(self, jobs: Sequence[Job], worker: str) -> Call[set[int]]:
        return Call(self.q.job_confirm_done, fence_params(jobs, worker, None), _id_set)

    def complete(self, jobs: Sequence[Job], worker: str, now: datetime | None) -> Call[set[int]]:
        return Call(self.q.job_complete, fence_params(jobs, worker, now), _id_set)

    def fail(self, failures: Sequence[Failure], worker: str, now: datetime | None) -> Call[dict[int, str]]:
        return Call(
            self.q.job_fail, fail_params(failures, worker, now), lambda r: {x["id"]: x["status"] for x in r.rows}
        )

    def release(self, jobs: Sequence[Job], worker: str, now: datetime | None) -> Call[set[int]]:
        return Call(self.q.job_release, fence_params(jobs, worker, now), _id_set)

    def heartbeat(
        self,
        jobs: Sequence[Job],
        worker: str,
        leases: Sequence[float] | None,
        now: datetime | None,
        timeouts: Sequence[float | None] | None = None,
    ) -> Call[set[int]]:
        """Renew each job's lease (default the settings'), never past its timeout; reads back the ids still held
        (the query says which are lost)."""
        lease = [self.settings.lease_seconds] * len(jobs) if leases is None else leases
        ids = {j.id for j in jobs}
        params = heartbeat_params(jobs, worker, lease, now, timeouts)
        return Call(self.q.job_heartbeat, params, lambda r: ids - _id_set(r))

    def recover_expired(
        self, queues: str | Sequence[str] | None, lease_seconds: float | None, limit: int, now: datetime | None
    ) -> Call[list[Recovered]]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = recover_params(queues, lease, limit, now)
        return Call(self.q.job_recover_expired, params, lambda r: [Recovered(**x) for x in r.rows])

    def release_orphans(
        self, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None
    ) -> Call[list[int]]:
        params = {"worker": worker, "queues": list(queues), "known": list(known), "now": now}
        return Call(self.q.job_release_orphans, params, _ids)

    def stats(self, queue: str | None, lease_seconds: float | None, now: datetime | None) -> Call[list[QueueStats]]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = {"queue": queue, "lease_seconds": lease, "now": now}
        return Call(self.q.queue_stats, params, lambda r: [stats_from_row(x) for x in r.rows])

    def get(self, job_id: int) -> Call[dict[str, Any] | None]:
        return Call(self.q.job_get, {"id": job_id}, lambda r: r.rows[0] if r.rows else None)

    def list_failed(self, queue: str | None, limit: int) -> Call[list[dict[str, Any]]]:
        return Call(self.q.job_list_failed, {"queue": queue, "limit": limit}, lambda r: r.rows)

    def list_stalled(
        self, queue: str | None, lease_seconds: float | None, limit: int, now: datetime | None
    ) -> Call[list[dict[str, Any]]]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = {"queue": queue, "lease_seconds": lease, "limit": limit, "now": now}
        return Call(self.q.job_list_stalled, params, lambda r: r.rows)

    def retry_failed(
        self, ids: Sequence[int] | None, queue: str | None, now: datetime | None, include_cancelled: bool = False
    ) -> Call[list[int]]:
        statuses = ["failed", "cancelled"] if include_cancelled else ["failed"]
        return Call(self.q.job_retry_failed, selection_params(ids, queue, now) | {"statuses": statuses}, _ids)

    def cancel(
        self,
        ids: Sequence[int] | None,
        queue: str | None,
        reason: str,
        now: datetime | None,
        task: str | None = None,
    ) -> Call[list[int]]:
        params = selection_params(ids, queue, now) | {
            "task": task,
            "reason": reason,
            "control_channel": self.settings.control_channel,
        }
        return Call(self.q.job_cancel, params, _ids)

    def snooze(self, jobs: Sequence[Job], delays: Sequence[float], worker: str, now: datetime | None) -> Call[set[int]]:
        if len(delays) != len(jobs):
            raise ValueError(f"{len(delays)} delays for {len(jobs)} jobs")
        params = fence_params(jobs, worker, now) | {"delays": [float(d) for d in delays]}
        return Call(self.q.job_snooze, params, _id_set)

    def cancelled_among(self, jobs: Sequence[Job], worker: str) -> Call[set[int]]:
        return Call(self.q.job_cancelled_among, fence_params(jobs, worker, None), _id_set)

    def set_paused(self, queue: str, paused: bool, now: datetime | None) -> Call[None]:
        params = {
            "queue": check_queue_name(queue),
            "paused": paused,
            "now": now,
            "control_channel": self.settings.control_channel,
            "channel": self.settings.channel,
        }
        return Call(self.q.queue_set_paused, params, lambda r: None)

    def paused(self, queues: Sequence[str] | None) -> Call[list[str]]:
        params = {"queues": list(queues) if queues is not None else None}
        return Call(self.q.queue_paused, params, lambda r: [x["queue"] for x in r.rows])

    def jobs_table_bytes(self) -> Call[int]:
        table = f'"{self.settings.schema}".jobs'
        return Call(self.q.jobs_table_bytes, {"table": table}, lambda r: int(r.rows[0]["bytes"]))

    def statuses(self, ids: Sequence[int]) -> Call[dict[int, str]]:
        return Call(self.q.job_get_many, {"ids": list(ids)}, lambda r: {x["id"]: x["status"] for x in r.rows})

    def register_limits(self, limits: Iterable[TaskLimits], worker: str) -> Call[list[dict[str, Any]]]:
        return Call(self.q.task_limits_register, register_params(limits, worker), lambda r: r.rows)

    def limits(self, now: datetime | None) -> Call[list[dict[str, Any]]]:
        return Call(self.q.task_limits_list, {"now": now}, lambda r: r.rows)

    def next_start(self, tasks: Sequence[str], queues: Sequence[str], now: datetime | None) -> Call[float | None]:
        params = {"tasks": list(tasks), "queues": list(queues), "now": now}
        return Call(self.q.task_limits_next_start, params, lambda r: r.rows[0]["due_in_seconds"] if r.rows else None)

    def waiting(self, queue: str | None, now: datetime | None) -> Call[list[dict[str, Any]]]:
        return Call(self.q.queue_waiting, {"queue": queue, "now": now}, lambda r: r.rows)

    def database_now(self) -> Call[datetime]:
        return Call("SELECT now() AS now", None, lambda r: r.rows[0]["now"])

    def purge_batch(
        self, older_than_seconds: float, statuses: Sequence[str], queue: str | None, now: datetime
    ) -> Call[int]:
        params = purge_params(older_than_seconds, statuses, queue, now)
        return Call(self.q.job_purge_batch, params, lambda r: r.rowcount)


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows (read off the result's status: ``cursor.description`` builds a column
    object for each column on every call)."""
    result = cur.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def _execute(conn: psycopg.Connection[Any], call: Call[T]) -> T:
    with conn.cursor(row_factory=tuple_row if call.tuples else dict_row, binary=call.binary) as cur:
        cur.execute(call.query, call.params)
        return call.read(Result(cur.fetchall() if _has_rows(cur) else [], cur.rowcount))


async def _aexecute(conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
    async with conn.cursor(row_factory=tuple_row if call.tuples else dict_row, binary=call.binary) as cur:
        await cur.execute(call.query, call.params)
        return call.read(Result(await cur.fetchall() if _has_rows(cur) else [], cur.rowcount))


def _idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """No transaction open (nor a statement running, nor the connection broken)."""
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _outside_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """An autocommit connection with no transaction open: statements that must commit together need their own."""
    return conn.autocommit and _idle(conn)


def may_autocommit(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a call may switch a pool connection to autocommit for its time (and back): one outside autocommit,
    idle, without transaction characteristics of its own (isolation level, read only, deferrable). A statement then
    runs in a transaction of its own as between BEGIN and COMMIT, two round trips fewer; statements that must
    commit together run in an explicit transaction (see :func:`_copy_jobs`)."""
    plain = conn.isolation_level is None and conn.read_only is None and conn.deferrable is None
    return plain and not conn.autocommit and _idle(conn)


def _copy_jobs(conn: psycopg.Connection[Any], copy: CopyJobs) -> EnqueueManyResult:
    """Reserve the ids, then COPY the jobs: in the connection's transaction (the caller's, or the pool's), or in
    one of their own on an autocommit connection. Nothing is visible, and no worker woken, before it commits."""
    own = _outside_transaction(conn)
    if not own:
        copy.encode_all()  # a bad payload must not fail the caller's transaction
    with conn.transaction() if own else nullcontext():
        ids, visible_at = _execute(conn, copy.reserve)
        with conn.cursor() as cur, cur.copy(copy.query) as writer:
            for text in copy.chunks(ids, visible_at):
                writer.write(text)
    return EnqueueManyResult(ids)


async def _acopy_jobs(conn: psycopg.AsyncConnection[Any], copy: CopyJobs) -> EnqueueManyResult:
    own = _outside_transaction(conn)
    if not own:
        copy.encode_all()
    async with conn.transaction() if own else nullcontext():
        ids, visible_at = await _aexecute(conn, copy.reserve)
        async with conn.cursor() as cur, cur.copy(copy.query) as writer:
            for text in copy.chunks(ids, visible_at):
                await writer.write(text)
    return EnqueueManyResult(ids)


NOT_CONNECTED = "not connected to a database: pass conn= (your transaction), or connect first"


def _settings(dsn: str | None, settings: Settings | None) -> Settings:
    """Settings from the arguments only (the environment is read by ``Settings.from_env``, never here)."""
    if settings is None:
        return Settings(dsn=dsn)
    return settings if dsn is None else settings.replace(dsn=dsn)


def pool_options(name: str, max_size: int, connect_timeout: float) -> dict[str, Any]:
    """Keyword arguments of an owned pool: one statement per call, so autocommit (no BEGIN/COMMIT round trips)."""
    return {
        "min_size": 1,
        "max_size": max_size,
        "open": False,
        "name": name,
        "timeout": connect_timeout,
        "kwargs": {"autocommit": True},
    }


P = TypeVar("P", ConnectionPool[Any], AsyncConnectionPool[Any])


class _QueueState(Generic[P]):
    """What :class:`Queue` and :class:`AsyncQueue` hold: settings, their statements and the pool (if any)."""

    settings: Settings
    _s: Statements
    _pool: P | None
    _owned: bool
    _closed: bool

    def _setup(self, settings: Settings, pool: P | None, *, owned: bool) -> None:
        self.settings, self._s, self._pool, self._owned, self._closed = (
            settings,
            Statements(settings),
            pool,
            owned,
            False,
        )

    @classmethod
    def detached(cls, settings: Settings) -> Self:
        """A queue with no pool: every call must pass ``conn=`` (enqueue inside the caller's transaction)."""
        q = cls.__new__(cls)
        q._setup(settings, None, owned=False)
        return q

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pool(self) -> P:
        if self._pool is None:
            raise ConfigError(NOT_CONNECTED)
        return self._pool

    @property
    def queries(self) -> Queries:
        return self._s.q


# ---------------------------------------------------------------------------------------------- sync
class Queue(_QueueState[ConnectionPool[Any]]):
    """Synchronous queue API. ``Queue(dsn)`` / ``Queue.open(dsn | settings=)`` make and own a pool; or pass your
    own ``psycopg_pool.ConnectionPool`` as ``pool=``. Settings come from the arguments only.

    Methods that write take ``conn=``: then they run on your connection, inside your transaction (not committed).
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
        self._setup(_settings(dsn, settings), pool, owned=pool is None)
        if pool is None:
            dsn = self.settings.require_dsn()
            check_connect(dsn, connect_timeout)
            own: ConnectionPool[Any] = ConnectionPool(dsn, **pool_options("skiplock", max_size, connect_timeout))
            own.open()
            try:
                own.wait(timeout=connect_timeout)
            except PoolTimeout as exc:
                own.close()
                raise unavailable(exc, dsn) from None
            self._pool = own

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        pool: ConnectionPool[Any] | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> Self:
        """Connect (the same as the constructor; the twin of ``await AsyncQueue.open(...)``)."""
        return cls(dsn, settings=settings, pool=pool, max_size=max_size, connect_timeout=connect_timeout)

    # context management
    def close(self) -> None:
        if self._owned and self._pool is not None:
            self._pool.close()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            raise ConfigError(NOT_CONNECTED)
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:  # no connection could be had within the pool's timeout
            raise unavailable(exc, self.settings.dsn) from None

    @contextmanager
    def _on(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection (``conn=``), or one of the pool for the time of the call, in autocommit when
        :func:`may_autocommit` says so."""
        if conn is not None:
            if not isinstance(conn, psycopg.Connection):
                raise ConfigError(f"conn= of a sync call must be a psycopg.Connection, not {type(conn).__name__}")
            yield conn
            return
        with self._connection() as own:
            if not may_autocommit(own):
                yield own
                return
            own.autocommit = True
            try:
                yield own
            finally:
                if _idle(own):  # else broken: the pool discards it
                    own.autocommit = False

    def _call(self, call: Call[T], conn: psycopg.Connection[Any] | None = None) -> T:
        with self._on(conn) as on:
            return _execute(on, call)

    # producer
    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Add one job. Options: ``task``, ``delay`` (seconds or timedelta), ``run_at`` (aware datetime),
        ``priority``, ``max_attempts``, ``idempotency_key``, ``timeout_seconds``. Bad arguments raise
        :class:`EnqueueError`."""
        insert, find = self._s.enqueue(queue, payload, options)
        inserted = self._call(insert, conn)
        result = inserted if inserted is not None else self._call(find, conn)
        if result.duplicate and (replace := self._s.replace_unique(insert.params or {})) is not None:
            self._call(replace, conn)
        return result

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[EnqueueManyOptions],
    ) -> EnqueueManyResult:
        """Add many jobs of one queue in one transaction (yours with ``conn=``). Without keys the ids are reserved
        and the jobs written with COPY; with keys, one INSERT where payloads whose key is taken insert nothing.
        Returns the new ids in payload order (a list, as before) whose ``results`` give each payload its job and
        whether it was a duplicate."""
        many = self._s.enqueue_many(queue, payloads, options)
        if isinstance(many, CopyJobs):
            with self._on(conn) as on:
                return _copy_jobs(on, many)
        rows = self._call(many.insert, conn)
        missing = many.missing(rows)
        if missing and (replace := many.replace(missing)) is not None:
            self._call(replace, conn)
        return many.result(rows, self._call(many.find(missing), conn) if missing else {})

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
        return self._call(self._s.complete_and_claim((), queue, limit, worker, now, lease_seconds))[1]

    def complete_and_claim(
        self,
        done: Sequence[Job],
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
        leases: Mapping[str, float] | None = None,
        rotate: int = 0,
        limited: bool = True,
        after: Job | None = None,
        shares: Sequence[int] | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> tuple[set[int], list[Job]]:
        """Mark ``done`` jobs done (fenced, as :meth:`complete`) and claim up to ``limit`` new ones of one queue or
        several (round-robin across queues), in one statement and one commit. Returns the ids completed and the
        jobs claimed. ``leases`` maps task names to their own lease; ``rotate`` picks the queue served first
        (at most ``shares[i]`` jobs of queue ``i``, by default ``per_queue_limit`` of each: the claim locks about
        ``limit`` candidate rows in all); ``limited=False`` leaves the jobs of tasks with a
        global concurrency or rate limit to other claimers (a cheaper statement); ``after`` (a job claimed from one
        queue) claims only jobs of its priority after it in claim order, starting the index scan there (the worker
        uses it while a backlog drains). ``conn`` must autocommit."""
        call = self._s.complete_and_claim(
            done, queue, limit, worker, now, lease_seconds, leases, rotate, limited, after, shares
        )
        return self._call(call, conn)

    def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        """Of ``jobs``, the ids already marked done by ``worker`` at that attempt (a retried completion)."""
        return self._call(self._s.confirm_done(jobs, worker))

    def complete(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        now: datetime | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> set[int]:
        """Mark jobs done (fenced). Returns the ids completed; the others had lost their lease."""
        return self._call(self._s.complete(jobs, worker, now), conn)

    def fail(self, failures: Sequence[Failure], *, worker: str, now: datetime | None = None) -> dict[int, str]:
        """Record failed attempts (fenced). Returns id -> new status for the jobs whose lease was still held."""
        return self._call(self._s.fail(failures, worker, now))

    def snooze(
        self, jobs: Sequence[Job], delays: Sequence[float], *, worker: str, now: datetime | None = None
    ) -> set[int]:
        """Reschedule claimed jobs after ``delays`` seconds without using an attempt (fenced); returns the ids."""
        return self._call(self._s.snooze(jobs, delays, worker, now))

    def release(self, jobs: Sequence[Job], *, worker: str, now: datetime | None = None) -> set[int]:
        return self._call(self._s.release(jobs, worker, now))

    def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        now: datetime | None = None,
        timeouts: Sequence[float | None] | None = None,
    ) -> set[int]:
        """Renew the leases of ``jobs`` (each by its lease, default the settings'); returns the ids still held."""
        return self._call(self._s.heartbeat(jobs, worker, leases, now, timeouts))

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
        return self._call(self._s.recover_expired(queues if queues is not None else queue, lease_seconds, limit, now))

    def release_orphans(
        self, *, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None = None
    ) -> list[int]:
        """Hand back jobs leased to ``worker`` in ``queues`` other than ``known`` (a lost claim reply)."""
        return self._call(self._s.release_orphans(worker, queues, known, now))

    # observability and admin
    def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        return self._call(self._s.stats(queue, lease_seconds, now))

    def get(self, job_id: int) -> dict[str, Any] | None:
        return self._call(self._s.get(job_id))

    # flow control (skiplock.limits)
    def register_limits(self, limits: Iterable[TaskLimits], *, worker: str) -> list[dict[str, Any]]:
        """Register the tasks' limits for the whole cluster (the latest registration wins; a task without limits
        drops its registration). Returns, per task, the limits registered and what was there before."""
        return self._call(self._s.register_limits(limits, worker))

    def limits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Every registered task limit with the slots in use (running, recent starts)."""
        return self._call(self._s.limits(now))

    def next_start(self, tasks: Sequence[str], queues: Sequence[str], *, now: datetime | None = None) -> float | None:
        """Seconds until a rate limit of ``tasks`` lets a due job of ``queues`` start (None: none waits)."""
        return self._call(self._s.next_start(tasks, queues, now))

    def waiting(self, queue: str | None = None, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Due pending jobs held back per queue: by a serial key, a global concurrency limit or a rate limit."""
        return self._call(self._s.waiting(queue, now))

    def list_failed(self, queue: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        return self._call(self._s.list_failed(queue, limit))

    def list_stalled(
        self,
        queue: str | None = None,
        *,
        lease_seconds: float | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Processing jobs past their stored lease deadline (their worker died or hangs), oldest first."""
        return self._call(self._s.list_stalled(queue, lease_seconds, limit, now))

    def retry_failed(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        include_cancelled: bool = False,
        now: datetime | None = None,
    ) -> list[int]:
        """Re-drive failed jobs (and cancelled ones with ``include_cancelled``) with a fresh set of attempts."""
        return self._call(self._s.retry_failed(ids, queue, now, include_cancelled))

    def cancel(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        task: str | None = None,
        reason: str = "by operator",
        now: datetime | None = None,
    ) -> list[int]:
        """Cancel pending jobs at once and running ones cooperatively (their worker is told; the fence refuses
        their completion). Returns the ids cancelled; finished jobs are left as they are."""
        return self._call(self._s.cancel(ids, queue, reason, now, task))

    def pause(self, queue: str, *, now: datetime | None = None) -> None:
        """Pause a queue: running jobs finish, no worker claims from it until :meth:`resume`."""
        self._call(self._s.set_paused(queue, True, now))

    def resume(self, queue: str, *, now: datetime | None = None) -> None:
        self._call(self._s.set_paused(queue, False, now))

    def paused(self, queues: Sequence[str] | None = None) -> list[str]:
        """The paused queues (of ``queues``, or all)."""
        return self._call(self._s.paused(queues))

    def jobs_table_bytes(self) -> int:
        """The size of the jobs table's file, in bytes."""
        return self._call(self._s.jobs_table_bytes())

    def statuses(self, ids: Sequence[int]) -> dict[int, str]:
        """The status of each existing job of ``ids`` (what cancel and retry report for the ones they left)."""
        return self._call(self._s.statuses(ids))

    def cancelled_among(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        """Of ``jobs`` (attempts held by ``worker``), the ids cancelled meanwhile."""
        return self._call(self._s.cancelled_among(jobs, worker))

    def purge(
        self,
        *,
        older_than_seconds: float,
        statuses: Sequence[str] = ("done", "failed"),
        queue: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """Delete finished jobs older than the cutoff in batches, each batch its own short transaction."""
        batch = self._s.purge_batch(older_than_seconds, statuses, queue, now or self._call(self._s.database_now()))
        total = 0
        while True:
            deleted = self._call(batch)
            total += deleted
            if deleted < PURGE_BATCH:
                return total

    def migrate(self) -> migrations.MigrationReport:
        with self._connection() as conn:
            conn.commit()
            return migrations.migrate(conn, self.settings.schema)

    def check_schema(self) -> None:
        """Raise :class:`SchemaNotReadyError` unless the schema is migrated to this version."""
        try:
            with self._connection() as conn:
                version = migrations.current_version(conn, self.settings.schema)
        except psycopg.OperationalError as exc:
            raise unavailable(exc, self.settings.dsn) from None
        migrations.check_version(version, self.settings.schema)


# ---------------------------------------------------------------------------------------------- async
class AsyncQueue(_QueueState[AsyncConnectionPool[Any]]):
    """Asynchronous twin of :class:`Queue`: the same methods, awaited. Open with ``await AsyncQueue.open(dsn |
    settings=)``, or wrap your own ``psycopg_pool.AsyncConnectionPool``: ``AsyncQueue(pool, settings)``."""

    def __init__(self, pool: AsyncConnectionPool[Any] | None, settings: Settings, *, owned: bool = False) -> None:
        self.settings = settings
        self._s = Statements(settings)
        self._pool = pool
        self._owned = owned
        self._closed = False

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> Self:
        settings = _settings(dsn, settings)
        if pool is not None:
            return cls(pool, settings)
        dsn = settings.require_dsn()
        await acheck_connect(dsn, connect_timeout)
        own: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn, **pool_options("skiplock-async", max_size, connect_timeout)
        )
        await own.open()
        try:
            await own.wait(timeout=connect_timeout)
        except PoolTimeout as exc:
            await own.close()
            raise unavailable(exc, dsn) from None
        return cls(own, settings, owned=True)

    async def close(self) -> None:
        if self._owned and self._pool is not None:
            await self._pool.close()
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise ConfigError(NOT_CONNECTED)
        try:
            async with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise unavailable(exc, self.settings.dsn) from None

    @asynccontextmanager
    async def _on(self, conn: psycopg.AsyncConnection[Any] | None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The caller's connection (``conn=``), or one of the pool for the time of the call (see Queue._on)."""
        if conn is not None:
            if not isinstance(conn, psycopg.AsyncConnection):
                raise ConfigError(
                    f"conn= of an async call must be a psycopg.AsyncConnection, not {type(conn).__name__}"
                )
            yield conn
            return
        async with self._connection() as own:
            if not may_autocommit(own):
                yield own
                return
            await own.set_autocommit(True)
            try:
                yield own
            finally:
                if _idle(own):
                    await own.set_autocommit(False)

    async def _call(self, call: Call[T], conn: psycopg.AsyncConnection[Any] | None = None) -> T:
        async with self._on(conn) as on:
            return await _aexecute(on, call)

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Add one job (see :meth:`Queue.enqueue`)."""
        insert, find = self._s.enqueue(queue, payload, options)
        inserted = await self._call(insert, conn)
        result = inserted if inserted is not None else await self._call(find, conn)
        if result.duplicate and (replace := self._s.replace_unique(insert.params or {})) is not None:
            await self._call(replace, conn)
        return result

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueManyOptions],
    ) -> EnqueueManyResult:
        """See :meth:`Queue.enqueue_many`."""
        many = self._s.enqueue_many(queue, payloads, options)
        if isinstance(many, CopyJobs):
            async with self._on(conn) as on:
                return await _acopy_jobs(on, many)
        rows = await self._call(many.insert, conn)
        missing = many.missing(rows)
        if missing and (replace := many.replace(missing)) is not None:
            await self._call(replace, conn)
        return many.result(rows, await self._call(many.find(missing), conn) if missing else {})

    async def claim(
        self,
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        return (await self._call(self._s.complete_and_claim((), queue, limit, worker, now, lease_seconds)))[1]

    async def complete_and_claim(
        self,
        done: Sequence[Job],
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
        leases: Mapping[str, float] | None = None,
        rotate: int = 0,
        limited: bool = True,
        after: Job | None = None,
        shares: Sequence[int] | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> tuple[set[int], list[Job]]:
        """See :meth:`Queue.complete_and_claim`: the worker's hot path."""
        call = self._s.complete_and_claim(
            done, queue, limit, worker, now, lease_seconds, leases, rotate, limited, after, shares
        )
        return await self._call(call, conn)

    async def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        return await self._call(self._s.confirm_done(jobs, worker))

    async def complete(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        now: datetime | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> set[int]:
        return await self._call(self._s.complete(jobs, worker, now), conn)

    async def fail(self, failures: Sequence[Failure], *, worker: str, now: datetime | None = None) -> dict[int, str]:
        return await self._call(self._s.fail(failures, worker, now))

    async def snooze(
        self, jobs: Sequence[Job], delays: Sequence[float], *, worker: str, now: datetime | None = None
    ) -> set[int]:
        """Reschedule claimed jobs after ``delays`` seconds without using an attempt (fenced); returns the ids."""
        return await self._call(self._s.snooze(jobs, delays, worker, now))

    async def release(self, jobs: Sequence[Job], *, worker: str, now: datetime | None = None) -> set[int]:
        return await self._call(self._s.release(jobs, worker, now))

    async def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        now: datetime | None = None,
        timeouts: Sequence[float | None] | None = None,
    ) -> set[int]:
        return await self._call(self._s.heartbeat(jobs, worker, leases, now, timeouts))

    async def recover_expired(
        self,
        *,
        queue: str | None = None,
        queues: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        limit: int = 1000,
        now: datetime | None = None,
    ) -> list[Recovered]:
        call = self._s.recover_expired(queues if queues is not None else queue, lease_seconds, limit, now)
        return await self._call(call)

    async def release_orphans(
        self, *, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None = None
    ) -> list[int]:
        return await self._call(self._s.release_orphans(worker, queues, known, now))

    async def stats(
        self, queue: str | None = None, *, lease_seconds: float | None = None, now: datetime | None = None
    ) -> list[QueueStats]:
        return await self._call(self._s.stats(queue, lease_seconds, now))

    async def get(self, job_id: int) -> dict[str, Any] | None:
        return await self._call(self._s.get(job_id))

    async def register_limits(self, limits: Iterable[TaskLimits], *, worker: str) -> list[dict[str, Any]]:
        """See :meth:`Queue.register_limits`."""
        return await self._call(self._s.register_limits(limits, worker))

    async def limits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._call(self._s.limits(now))

    async def next_start(
        self, tasks: Sequence[str], queues: Sequence[str], *, now: datetime | None = None
    ) -> float | None:
        return await self._call(self._s.next_start(tasks, queues, now))

    async def waiting(self, queue: str | None = None, *, now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._call(self._s.waiting(queue, now))

    async def list_failed(self, queue: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        return await self._call(self._s.list_failed(queue, limit))

    async def list_stalled(
        self,
        queue: str | None = None,
        *,
        lease_seconds: float | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """See :meth:`Queue.list_stalled`."""
        return await self._call(self._s.list_stalled(queue, lease_seconds, limit, now))

    async def retry_failed(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        include_cancelled: bool = False,
        now: datetime | None = None,
    ) -> list[int]:
        return await self._call(self._s.retry_failed(ids, queue, now, include_cancelled))

    async def cancel(
        self,
        *,
        ids: Sequence[int] | None = None,
        queue: str | None = None,
        task: str | None = None,
        reason: str = "by operator",
        now: datetime | None = None,
    ) -> list[int]:
        return await self._call(self._s.cancel(ids, queue, reason, now, task))

    async def pause(self, queue: str, *, now: datetime | None = None) -> None:
        await self._call(self._s.set_paused(queue, True, now))

    async def resume(self, queue: str, *, now: datetime | None = None) -> None:
        await self._call(self._s.set_paused(queue, False, now))

    async def paused(self, queues: Sequence[str] | None = None) -> list[str]:
        return await self._call(self._s.paused(queues))

    async def jobs_table_bytes(self) -> int:
        """The size of the jobs table's file, in bytes."""
        return await self._call(self._s.jobs_table_bytes())

    async def statuses(self, ids: Sequence[int]) -> dict[int, str]:
        return await self._call(self._s.statuses(ids))

    async def cancelled_among(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        """Of ``jobs`` (attempts held by ``worker``), the ids cancelled meanwhile."""
        return await self._call(self._s.cancelled_among(jobs, worker))

    async def purge(
        self,
        *,
        older_than_seconds: float,
        statuses: Sequence[str] = ("done", "failed"),
        queue: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """See :meth:`Queue.purge`."""
        cutoff = now if now is not None else await self._call(self._s.database_now())
        batch = self._s.purge_batch(older_than_seconds, statuses, queue, cutoff)
        total = 0
        while True:
            deleted = await self._call(batch)
            total += deleted
            if deleted < PURGE_BATCH:
                return total

    async def migrate(self) -> migrations.MigrationReport:
        async with self._connection() as conn:
            await conn.commit()
            return await migrations.amigrate(conn, self.settings.schema)

    async def check_schema(self) -> None:
        try:
            async with self._connection() as conn:
                version = await migrations.acurrent_version(conn, self.settings.schema)
        except psycopg.OperationalError as exc:
            raise unavailable(exc, self.settings.dsn) from None
        migrations.check_version(version, self.settings.schema)


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
