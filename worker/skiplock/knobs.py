"""The knob table: every worker setting declared once, with what each surface needs.

:class:`~skiplock.settings.Settings` validates its bounds, choices and patterns from this table; the
``skiplock`` command builds its flags from it; the environment names, the generated configuration reference
and the JobQueue CRD field names come from it. Unit tests fail when ``Settings``, the CLI or the CRD schema
drift away from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "SKIPLOCK_"
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
IMPORT_SPEC = re.compile(r"^[\w.]+:[\w.]+$")
MAX_BACKOFF_SECONDS = 365 * 86400
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Knob:
    """One setting: its name (the ``Settings`` field), type, default and everything derived from it.

    ``flag`` is the option of ``skiplock worker`` (``common`` ones are accepted by every subcommand), ``crd``
    the dotted path under ``JobQueue.spec``; either is ``None`` where that surface does not carry the knob.
    ``min``/``max`` bound what a worker accepts (``min_exclusive``: strictly above ``min``); the CRD may be
    narrower, never wider.
    """

    name: str
    type: type
    default: Any
    help: str
    flag: str | None = None
    crd: str | None = None
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    choices: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    shape: str = ""
    common: bool = False
    secret: bool = False
    duration: bool = False
    """The flag also takes a duration with a unit (``90s``, ``15m``, ``12h``, ``7d``, ``2w``)."""

    @property
    def env(self) -> str:
        """The environment variable (``SKIPLOCK_<NAME>``)."""
        return ENV_PREFIX + self.name.upper()

    @property
    def bounds(self) -> str:
        """The accepted range in words, e.g. ``> 0``, ``>= 1``, ``0..65535``; empty when unbounded."""
        low = None if self.min is None else f"{_num(self.min)}"
        if low is not None and self.max is not None and not self.min_exclusive:
            return f"{low}..{_num(self.max)}"
        parts = []
        if low is not None:
            parts.append(("> " if self.min_exclusive else ">= ") + low)
        if self.max is not None:
            parts.append(f"<= {_num(self.max)}")
        return ", ".join(parts)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable for this knob, or ``None`` (``None`` values are not checked)."""
        if value is None:
            return None
        if isinstance(value, tuple):
            return next((p for item in value if (p := self.problem(item)) is not None), None)
        if self.pattern is not None and (not isinstance(value, str) or not self.pattern.match(value)):
            return f"{self.name} {value!r} must {self.shape or 'match ' + self.pattern.pattern}"
        if self.choices and str(value).upper() not in {c.upper() for c in self.choices}:
            return f"{self.name} must be one of {', '.join(self.choices)} (got {value!r})"
        if self.min is None and self.max is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            return f"{self.name} must be a finite number (got {value!r})"
        low_ok = self.min is None or (value > self.min if self.min_exclusive else value >= self.min)
        if low_ok and (self.max is None or value <= self.max):
            return None
        if self.min is not None and self.max is not None and not self.min_exclusive:
            return f"{self.name} must be within {self.bounds} (got {value})"
        if not low_ok:
            return f"{self.name} must be {'>' if self.min_exclusive else '>='} {_num(self.min)} (got {value})"
        return f"{self.name} must be at most {_num(self.max)} (got {value})"


def _num(x: float | None) -> str:
    return "" if x is None else (str(int(x)) if float(x).is_integer() else str(x))


KNOBS: tuple[Knob, ...] = (
    Knob("dsn", str, None, "libpq DSN or URL of the database (else DATABASE_URL). Prefer the environment or "
         "--dsn-file: a --dsn flag shows in the process list.", flag="--dsn", common=True, secret=True),
    Knob("schema", str, "skiplock", "PostgreSQL schema of the jobs table (lower-case identifier, quoted in SQL).",
         flag="--schema", crd="schema", pattern=IDENTIFIER, common=True,
         shape=f"match {IDENTIFIER.pattern} (lower-case, at most 40 characters)"),
    Knob("queue", str, "default", "Queue of a single-queue worker, and the default queue of `skiplock enqueue`.",
         flag="--queue", crd="queue", pattern=QUEUE_NAME),
    Knob("queues", tuple, (), "Queues one worker serves, comma-separated (default: every queue its app's tasks "
         "name, else `queue`).", flag="--queues", crd="queues", pattern=QUEUE_NAME),
    Knob("app", str, None, "`module:attr` of the skiplock.App whose tasks the worker runs.",
         flag="--app", crd="app", pattern=IMPORT_SPEC, shape="look like 'package.module:attribute'"),
    Knob("handler", str, None, "`module:function` called for jobs without a task (the catch-all handler).",
         flag="--handler", crd="handler", pattern=IMPORT_SPEC, shape="look like 'package.module:function'"),
    Knob("concurrency", int, 10, "Jobs in flight at once in one worker process; it holds at most concurrency + 7 "
         "connections.", flag="--concurrency", crd="concurrency", min=1),
    Knob("batch", int, 200, "Most jobs claimed by one statement (never more than the free slots plus the "
         "prefetch buffer's room).", flag="--batch", crd="batch", min=1),
    Knob("prefetch", int, 400, "Most claimed jobs one worker holds waiting for a slot (0: claim only for free "
         "slots); it also holds no more than it starts in 1/20 of a lease, so slow jobs are barely prefetched.",
         flag="--prefetch", crd="prefetch", min=0),
    Knob("lease_seconds", float, 60.0, "How long a claim stays valid without a heartbeat; expired jobs are "
         "recovered.", flag="--lease", crd="leaseSeconds", min=0, min_exclusive=True),
    Knob("heartbeat_seconds", float, None, "How often in-flight jobs renew their lease (default lease / 4; at "
         "most lease / 2).", flag="--heartbeat", crd="heartbeatSeconds", min=0, min_exclusive=True),
    Knob("poll_seconds", float, 2.0, "Polling fallback when no notification arrives (below the lease).",
         flag="--poll", crd="pollSeconds", min=0, min_exclusive=True),
    Knob("recover_seconds", float, None, "How often each worker recovers expired leases (default lease / 2, at "
         "most 30 s).", flag="--recover", crd="recoverSeconds", min=0, min_exclusive=True),
    Knob("backoff_base_seconds", float, 5.0, "First retry delay; attempt n waits base * 2^(n-1).",
         flag="--backoff-base", crd="backoff.baseSeconds", min=0, min_exclusive=True),
    Knob("backoff_cap_seconds", float, 3600.0, "Upper bound of one retry delay (at least the base).",
         flag="--backoff-cap", crd="backoff.capSeconds", min=0, min_exclusive=True, max=MAX_BACKOFF_SECONDS),
    Knob("backoff_jitter", float, 1.0, "Fraction of the retry delay that is random (1 = full jitter, 0 = none).",
         flag="--backoff-jitter", crd="backoff.jitter", min=0, max=1),
    Knob("max_attempts", int, 5, "Attempts of a job enqueued without its own limit, after which it is failed.",
         crd="maxAttempts", min=1, max=1000),
    Knob("shutdown_grace_seconds", float, 30.0, "On SIGTERM, how long in-flight jobs may run before they are "
         "handed back.", flag="--grace", crd="shutdownGraceSeconds", min=0),
    Knob("retain_done_seconds", float, 7 * 86400.0, "How long done jobs are kept before the scheduled purge "
         "deletes them (the flag takes 7d, 12h, ...).", flag="--retain-done", crd="retention.doneSeconds", min=0,
         min_exclusive=True, duration=True),
    Knob("retain_failed_seconds", float, 30 * 86400.0, "How long failed jobs are kept (long enough to inspect and "
         "retry them).", flag="--retain-failed", crd="retention.failedSeconds", min=0, min_exclusive=True,
         duration=True),
    Knob("retain_cancelled_seconds", float, 7 * 86400.0, "How long cancelled jobs are kept.",
         flag="--retain-cancelled", crd="retention.cancelledSeconds", min=0, min_exclusive=True, duration=True),
    Knob("purge_interval_seconds", float, 3600.0, "How often a worker runs the scheduled purge (one worker of the "
         "fleet at a time, under the schema's purge lock); 0 turns it off (`skiplock purge` still works). In a "
         "JobQueue the operator runs the purge at this interval and its workers never do.",
         flag="--purge-interval", crd="retention.purgeIntervalSeconds", min=0, duration=True),
    Knob("metrics_port", int, 0, "Port of /metrics, /healthz and /readyz (0 = off; the operator sets 9464).",
         flag="--metrics-port", min=0, max=65535),
    Knob("metrics_host", str, "0.0.0.0", "Address the metrics server binds (all interfaces, as a pod needs).",
         flag="--metrics-host"),
    Knob("queue_metrics_seconds", float, 15.0, "How often a worker refreshes the queue gauges of the queues it "
         "serves (skiplock_queue_jobs, skiplock_queue_oldest_ready_age_seconds) by one bounded query in the "
         "background; a scrape reads the last values. 0 turns them off.", flag="--queue-metrics", min=0,
         duration=True),
    Knob("listen", bool, True, "Wake at once by LISTEN/NOTIFY; --no-listen polls only (PgBouncer in transaction "
         "mode).", flag="--no-listen", crd="listen"),
    Knob("event_loop", str, "auto", "The worker's event loop: auto (uvloop where it is installed, else asyncio's), "
         "uvloop, or asyncio (the standard library's, for a handler library that needs it).", flag="--event-loop",
         crd="eventLoop", choices=("auto", "uvloop", "asyncio")),
    Knob("max_payload_bytes", int, 256 * 1024, "Largest JSON payload enqueue accepts, in bytes.", min=1),
    Knob("log_format", str, "plain", "Log line format.", flag="--log-format", crd="logFormat",
         choices=("plain", "json"), common=True),
    Knob("log_level", str, "INFO", "Python logging level.", flag="--log-level", crd="logLevel",
         choices=LOG_LEVELS, common=True),
    Knob("worker_id", str, "", "Identity prefix written to locked_by (default host:pid; the operator uses the "
         "pod name). Each process appends its own nonce."),
)  # fmt: skip

BY_NAME: Mapping[str, Knob] = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    return BY_NAME[name]


def knob_crd_fields() -> dict[str, Knob]:
    """CRD field path under ``JobQueue.spec`` (dotted for nested fields, e.g. ``backoff.baseSeconds``) -> knob."""
    return {k.crd: k for k in KNOBS if k.crd is not None}


OPENAPI_TYPES: Mapping[type, str] = {int: "integer", float: "number", bool: "boolean", str: "string", tuple: "array"}


def crd_field_problems(k: Knob, field: Mapping[str, Any]) -> list[str]:
    """How a CRD field's OpenAPI schema disagrees with its knob: type, default, bounds, enum, pattern.

    The CRD may be narrower than the worker (a smaller maximum), never wider. A knob whose default is ``None``
    (derived) must have no CRD default. Pure: the operator's tests and the chart's can check their copy with it.
    """
    where = f"spec.{k.crd}"
    problems = []
    if field.get("type") != OPENAPI_TYPES[k.type]:
        problems.append(f"{where} is of type {field.get('type')!r}, the knob {k.name} is {OPENAPI_TYPES[k.type]!r}")
    if "default" in field and field["default"] != k.default:
        problems.append(f"{where} defaults to {field['default']!r}, the worker to {k.default!r}")
    if k.min is not None:
        low = field.get("minimum")
        if low is None or not (low > k.min if k.min_exclusive else low >= k.min):
            problems.append(f"{where} minimum {low} allows values the worker refuses ({k.name} {k.bounds})")
    if k.max is not None and (field.get("maximum") is None or field["maximum"] > k.max):
        problems.append(f"{where} maximum {field.get('maximum')} allows values the worker refuses ({k.bounds})")
    enum = field.get("enum")
    if k.choices and (not enum or not set(enum) <= set(k.choices)):
        problems.append(f"{where} enum {enum} is not within the worker's choices {list(k.choices)}")
    if k.pattern is not None:
        node = field.get("items", {}) if k.type is tuple else field
        if node.get("pattern") != k.pattern.pattern:
            problems.append(f"{where} pattern {node.get('pattern')!r} is not the worker's {k.pattern.pattern!r}")
    return problems


@dataclass(frozen=True)
class CrdField:
    """What the JobQueue CRD says about a knob besides its type and pattern (those are the knob's): the field's
    description, its bounds (narrower than the worker's, never wider), the default where it differs from the
    worker's (``NO_DEFAULT``: none), the enum where narrower, and extra OpenAPI keys. ``tools/gen-crd-knobs.py``
    writes the CRD's worker-setting properties from this; the operator parses ``spec`` with it."""

    help: str
    min: float | None = None
    max: float | None = None
    default: Any = None
    """``None``: the knob's default (if it has one)."""
    choices: tuple[str, ...] = ()
    """Narrower than the knob's choices; empty: the knob's."""
    max_length: int | None = None
    items_help: str = ""
    """Array knobs: the description of one item."""
    extra: Mapping[str, Any] = field(default_factory=dict)


NO_DEFAULT = object()
"""A CRD field without a default although the worker has one (``queue``: a JobQueue sets queue or queues)."""

CRD_FIELDS: Mapping[str, CrdField] = {
    "schema": CrdField(
        "PostgreSQL schema of the jobs table; the operator migrates it before any worker starts.",
    ),
    "queue": CrdField(
        "Queue name the workers claim from (the `queue` column of the jobs table). Set queue or queues (or "
        "both: queue is then the default queue of the worker's enqueue).",
        max_length=128,
        default=NO_DEFAULT,
    ),
    "queues": CrdField(
        "Queues one worker serves from one claim statement; the operator scales on their summed backlog. Each"
        " name follows the rules of queue; no name twice.",
        items_help="A queue name (the `queue` column of the jobs table).",
        max_length=128,
        extra={"minItems": 1, "maxItems": 64, "x-kubernetes-list-type": "set"},
    ),
    "app": CrdField(
        "Python `module:attr` of a skiplock App whose tasks the workers run (jobs carry the task name); it "
        "must be importable in the image. Set app, handler, or both.",
        max_length=256,
    ),
    "handler": CrdField(
        "Python `module:function` the worker calls for each job without a task (the catch-all); it must be "
        "importable in the image. Set app, handler, or both: with both, task jobs go to the app's tasks and "
        "the rest to the handler.",
        max_length=256,
    ),
    "concurrency": CrdField(
        "Jobs in flight at once in one worker pod (its pool holds a few more connections).",
        min=1,
        max=1000,
    ),
    "batch": CrdField(
        "Most jobs one claim statement takes (never more than the free slots plus the prefetch buffer's room).",
        min=1,
        max=1000,
    ),
    "prefetch": CrdField(
        "Most claimed jobs one worker pod holds waiting for a slot (0 claims only for free slots); never more"
        " than it starts in 1/20 of a lease.",
        min=0,
        max=10000,
    ),
    "lease_seconds": CrdField(
        "How long a claim stays valid without a heartbeat; expired jobs are recovered.",
        min=1,
        max=86400,
    ),
    "heartbeat_seconds": CrdField(
        "How often in-flight jobs renew their lease; at most leaseSeconds / 2. Unset: leaseSeconds / 4, so it"
        " follows the lease.",
        min=0.01,
        max=43200,
    ),
    "poll_seconds": CrdField(
        "Worker polling fallback when no NOTIFY arrives; below leaseSeconds.",
        min=0.01,
        max=3600,
    ),
    "recover_seconds": CrdField(
        "How often each worker recovers expired leases of its queues. Unset: min(30, leaseSeconds / 2), so it"
        " follows the lease.",
        min=0.01,
        max=86400,
    ),
    "backoff_base_seconds": CrdField(
        "Delay before the first retry.",
        min=0.01,
        max=86400,
    ),
    "backoff_cap_seconds": CrdField(
        "Upper bound of one retry delay.",
        min=0.01,
        max=604800,
    ),
    "backoff_jitter": CrdField(
        "Fraction of the delay that is random (1 = full jitter, 0 = none).",
        min=0,
        max=1,
    ),
    "max_attempts": CrdField(
        "Default attempts of a job enqueued without its own limit, after which it is failed.",
        min=1,
        max=1000,
    ),
    "shutdown_grace_seconds": CrdField(
        "On SIGTERM (scale-down, rollout), how long in-flight jobs may finish before they are handed back; "
        "the pod's terminationGracePeriodSeconds is this plus 10.",
        min=0,
        max=86400,
    ),
    "retain_done_seconds": CrdField(
        "How long done jobs are kept (default 7 days).",
        min=60,
        max=315360000,
    ),
    "retain_failed_seconds": CrdField(
        "How long failed jobs are kept, to inspect and retry them (default 30 days).",
        min=60,
        max=315360000,
    ),
    "retain_cancelled_seconds": CrdField(
        "How long cancelled jobs are kept (default 7 days).",
        min=60,
        max=315360000,
    ),
    "purge_interval_seconds": CrdField(
        "How often the operator purges (0 turns the scheduled purge off; `skiplock purge` still works).",
        min=0,
        max=604800,
    ),
    "listen": CrdField(
        "Use LISTEN/NOTIFY (workers wake at once; the operator scales from zero at once). Turn off behind "
        "PgBouncer in transaction mode.",
    ),
    "event_loop": CrdField(
        "The workers' event loop. auto is uvloop where the image has it (skiplock's image does), else "
        "asyncio's; asyncio is the standard library's, for a handler library that needs it.",
    ),
    "log_format": CrdField(
        "Worker log lines, plain or json.",
        default="json",
    ),
    "log_level": CrdField(
        "Worker log level.",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    ),
}
"""Knob name -> its JobQueue CRD field; exactly the knobs with a ``crd`` path (a unit test checks it)."""


def crd_default(k: Knob) -> Any:
    """The CRD's default of knob ``k`` (``None``: the field has none)."""
    spec = CRD_FIELDS[k.name]
    if spec.default is NO_DEFAULT:
        return None
    if spec.default is not None:
        return spec.default
    return None if k.default in (None, ()) else k.default


def crd_choices(k: Knob) -> tuple[str, ...]:
    return CRD_FIELDS[k.name].choices or k.choices


def crd_bounds(k: Knob) -> tuple[float | None, float | None]:
    spec = CRD_FIELDS[k.name]
    return spec.min, spec.max


def _plain(x: Any) -> Any:
    return int(x) if isinstance(x, float) and x.is_integer() else x


def crd_node(k: Knob) -> dict[str, Any]:
    """The OpenAPI v3 schema of knob ``k``'s CRD field, as the CRD holds it (key order included)."""
    spec = CRD_FIELDS[k.name]
    node: dict[str, Any] = {"type": OPENAPI_TYPES[k.type], "description": spec.help}
    if k.type is tuple:
        item: dict[str, Any] = {"type": "string", "description": spec.items_help}
        if k.pattern is not None:
            item["pattern"] = k.pattern.pattern
        if spec.max_length is not None:
            item["maxLength"] = spec.max_length
        node.update(spec.extra)
        node["items"] = item
        return node
    if k.pattern is not None:
        node["pattern"] = k.pattern.pattern
    if spec.max_length is not None:
        node["maxLength"] = spec.max_length
    if spec.min is not None:
        node["minimum"] = _plain(spec.min)
    if spec.max is not None:
        node["maximum"] = _plain(spec.max)
    if crd_choices(k):
        node["enum"] = list(crd_choices(k))
    node.update(spec.extra)
    default = crd_default(k)
    if default is not None:
        node["default"] = _plain(default)
    return node


def knob_flags() -> dict[str, Knob]:
    """CLI flag -> knob."""
    return {k.flag: k for k in KNOBS if k.flag is not None}


def knob_problems(values: Mapping[str, Any]) -> list[str]:
    """Every bound, choice or pattern that ``values`` (setting name -> value) breaks, in table order."""
    return [p for k in KNOBS if k.name in values and (p := k.problem(values[k.name])) is not None]
