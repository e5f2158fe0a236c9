"""What an enqueue may carry, checked and encoded: the options' types and bounds, the payload as JSON text.

Pure: no I/O. A bad argument raises :class:`EnqueueError` (or :class:`PayloadError`) before anything is sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from skiplock.errors import EnqueueError, PayloadError
from skiplock.job import MAX_PAYLOAD_DEPTH, TIMEOUT_SECONDS_MAX, payload_depth_exceeded
from skiplock.settings import QUEUE_NAME, Settings
from skiplock.unique import UNIQUE_KEY_MAX, states_for, unique_problem

# A \u0000 escape in JSON text, not preceded by an escaped backslash (a literal "\\u0000" is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
TASK_NAME_MAX = 200
"""Longest task name (the database checks it too)."""
IDEMPOTENCY_KEY_MAX = 255
"""Longest idempotency key (the database checks it too)."""
SERIAL_KEY_MAX = 255
"""Longest serial key (the database checks it too)."""
PRIORITY_RANGE = (-32768, 32767)
MAX_ATTEMPTS_LIMIT = 1000
MAX_DELAY_SECONDS = 100 * 365 * 86400
VISIBLE_AT_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(3000, 1, 1, tzinfo=UTC))
"""When a job may become due: from the first, up to (not including) the second (``jobs_visible_at_check``)."""


def timeout_problem(value: Any, name: str = "timeout_seconds") -> str | None:
    """Why ``value`` cannot be a timeout (NaN, infinite, <= 0, not a number, or over ``TIMEOUT_SECONDS_MAX``, a year:
    the database checks it too, ``jobs_timeout_bound_check``), or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= TIMEOUT_SECONDS_MAX:
        return f"{name} must be a number of seconds > 0 and <= {TIMEOUT_SECONDS_MAX} (a year) (got {_shown(value)})"
    return None


class _Visibility(TypedDict, total=False):
    delay: float | timedelta
    run_at: datetime | None
    priority: int | None
    max_attempts: int | None


class _Links(TypedDict, total=False):
    after: Sequence[int] | None
    on_parent_failure: str | None
    workflow_id: str | None


class EnqueueOptions(_Visibility, _Links, total=False):
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


class EnqueueManyOptions(_Visibility, _Links, total=False):
    """Options of ``enqueue_many``: those of one enqueue, with one idempotency key (or unique key) per payload."""

    task: str | None
    idempotency_keys: Sequence[str | None] | None
    unique_keys: Sequence[str] | None
    unique_states: Sequence[str] | None
    unique_conflict: str | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


class TaskEnqueueOptions(_Visibility, _Links, total=False):
    """Options of ``task.enqueue``: those of one enqueue with the queue (the task is the task itself).
    The task's defaults (queue, priority, max_attempts) fill what is not given; explicit options win
    (``timeout_seconds`` is this job's own timeout, over the task's ``timeout_seconds``)."""

    queue: str
    idempotency_key: str | None
    timeout_seconds: float | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


class TaskEnqueueManyOptions(_Visibility, _Links, total=False):
    """Options of ``task.enqueue_many``."""

    queue: str
    idempotency_keys: Sequence[str | None] | None
    serial_key: str | None
    serial_skip_on_retry: bool | None


REGISTERED_OPTIONS = ("priority", "max_attempts", "serial_skip_on_retry")
"""The options a worker registers for each task (``store/tasks.py``): an enqueue by task name (``task=``) that does
not give one of them takes the task's registered default, in the enqueue statement itself."""
ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__optional_keys__)
ENQUEUE_MANY_OPTIONS = frozenset(EnqueueManyOptions.__optional_keys__)


_JSON = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
"""The payload encoder, built once (``json.dumps`` with these options builds one per call)."""


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text, or :class:`PayloadError` (nothing is written)."""
    try:
        text = _encode_one(payload)
    except Exception:  # the full encoder again: it names the problem (circular, NaN, a type JSON has not)
        text = _checked_encode(payload)
    if _has_nul(text):
        raise PayloadError("payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    if payload_depth_exceeded(text):  # a worker must be able to decode what a producer stores
        raise PayloadError(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects")
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise PayloadError(
            f"payload is {size} bytes, over the {max_bytes}-byte limit (max_payload_bytes): "
            "store large data elsewhere and enqueue a reference"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise PayloadError("payload contains text that is not valid Unicode (lone surrogates)") from None
    return text


def _checked_encode(payload: Any) -> str:
    """``_JSON.encode``, its errors as :class:`PayloadError`."""
    try:
        return _JSON.encode(payload)
    except RecursionError:
        raise PayloadError("payload nests too deeply to serialise") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None


def _stateless_encoder() -> Callable[[Any], str]:
    """``_JSON.encode`` without its record of the containers it is inside (so one encoder, built once, serves every
    thread; ``encode`` builds one a call): a circular payload then ends in RecursionError, and :func:`encode_payload`
    asks ``_JSON.encode`` again for the reason. ``_JSON.encode`` itself where there is no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _JSON.encode
    e = _JSON
    strings = json.encoder.encode_basestring_ascii if e.ensure_ascii else json.encoder.encode_basestring
    separators = (e.key_separator, e.item_separator)
    chunks = make(None, e.default, strings, None, *separators, e.sort_keys, e.skipkeys, e.allow_nan)
    return lambda payload: "".join(chunks(payload, 0))


_encode_one = _stateless_encoder()


def batch_encoder() -> Callable[[Any], str]:
    """``_JSON.encode`` for a batch of payloads: CPython's C encoder built once with ``_JSON``'s options, where
    ``encode`` builds one for every payload (ADR 0007); ``_JSON.encode`` itself where
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


def default_params(settings: Settings) -> dict[str, Any]:
    """The parameters of an enqueue that gives no option, but its queue (and its payload): every option at its
    default."""
    return {
        "queue": None,
        "task": None,
        "priority": 0,
        "max_attempts": settings.max_attempts,
        "delay": 0.0,
        "run_at": None,
        "channel": settings.channel,
        "timeout_seconds": None,
        "serial_key": None,
        "serial_skip_on_retry": False,
    }


def _common_params(settings: Settings, queue: str, options: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """Validated parameters shared by one and many enqueues; :class:`EnqueueError` names what is wrong."""
    if not options:  # the usual call: every option at its default, so only the queue's name to check
        return default_params(settings) | {"queue": check_queue_name(queue)}
    unknown = set(options) - known
    if unknown:
        raise EnqueueError(
            f"unknown enqueue option(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})"
        )
    check_queue_name(queue)
    task = options.get("task")
    if task is not None and (problem := task_name_problem(task)):
        raise EnqueueError(problem)
    # By task name, an option not given is left None: the *_by_name statement reads the task's registered default.
    by_name = task is not None and any(options.get(k) is None for k in REGISTERED_OPTIONS)
    priority = options.get("priority")
    priority = 0 if priority is None and not by_name else priority
    low, high = PRIORITY_RANGE
    if priority is not None and (not _is_int(priority) or not low <= priority <= high):
        raise EnqueueError(f"priority must be an integer within {low}..{high} (got {_shown(priority)})")
    attempts = options.get("max_attempts")
    attempts = settings.max_attempts if attempts is None and not by_name else attempts
    if attempts is not None and (not _is_int(attempts) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT):
        raise EnqueueError(f"max_attempts must be an integer within 1..{MAX_ATTEMPTS_LIMIT} (got {_shown(attempts)})")
    delay = options.get("delay", 0)
    delay = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= MAX_DELAY_SECONDS:
        raise EnqueueError(
            f"delay must be a finite number of seconds within 0..{MAX_DELAY_SECONDS} (got {_shown(delay)})"
        )
    run_at = options.get("run_at")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.tzinfo is None:
            raise EnqueueError(f"run_at must be a timezone-aware datetime (got {_shown(run_at)})")
        first, until = VISIBLE_AT_RANGE
        if not first <= run_at < until - timedelta(seconds=delay):
            raise EnqueueError(
                f"run_at (plus delay) must fall within {first:%Y-%m-%d} .. {until:%Y-%m-%d} (got {_shown(run_at)})"
            )
    t = options.get("timeout_seconds")
    if t is not None and (problem := timeout_problem(t)):
        raise EnqueueError(problem)
    return (
        {
            "queue": queue,
            "task": task,
            "priority": priority,
            "max_attempts": attempts,
            "delay": float(delay),
            "run_at": run_at,
            "channel": settings.channel,
            "timeout_seconds": None if t is None else float(t),
        }
        | serial_params(options)
        | (_by_name(settings, options) if by_name else {})
    )


def _by_name(settings: Settings, options: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters the ``*_by_name`` statements add: the producer's default attempts (when neither the enqueue nor
    the registry gives them), and ``serial_skip_on_retry`` left None when not given."""
    skip = options.get("serial_skip_on_retry")
    return {"by_name": True, "max_attempts_default": settings.max_attempts, "serial_skip_on_retry": skip}


def enqueue_params(
    settings: Settings, queue: str, payload: Any, options: Mapping[str, Any], defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Parameters of ``job_enqueue`` (``job_enqueue_unique`` with a unique key), or :class:`EnqueueError`.
    ``defaults``: :func:`default_params` of ``settings``, built once by the caller (the usual call, no option, copies
    it)."""
    if not options and defaults is not None:
        params = defaults.copy()
        params["queue"] = check_queue_name(queue)
        params["idempotency_key"] = None
        params["payload"] = encode_payload(payload, settings.max_payload_bytes)
        return params
    params = _common_params(settings, queue, options, ENQUEUE_OPTIONS)
    key = params["idempotency_key"] = check_idempotency_key(options.get("idempotency_key"))
    params["payload"] = encode_payload(payload, settings.max_payload_bytes)
    if not options:
        return params
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
    # A COPY (it encodes the payloads as it writes them: see CopyJobs), unless by name: that is an INSERT reading
    # the registry.
    if values and not keyed and not uniques and not params.get("by_name"):
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
    # One JSON array of already-encoded payloads: no per-element array escaping (cheaper than jsonb[]: ADR 0007).
    return params | {
        "payloads": "[" + ",".join(encoded) + "]",
        "keys": keys if keyed else None,
        "payload_keys": keys,
        "encoded": encoded,
    }
