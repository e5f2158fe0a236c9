"""The one settings object: explicit flag, then ``SKIPLOCK_*`` env, then (DSN only) ``DATABASE_URL``, then default.

The CLI builds it, the worker receives it, and the operator renders a worker's environment with
:meth:`Settings.to_env`, so CLI flags, environment variables, the CRD and the chart share one set of names.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from skiplock.errors import ConfigError

ENV_PREFIX = "SKIPLOCK_"
MAX_BACKOFF_SECONDS = 365 * 86400
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
LogFormat = Literal["plain", "json"]


DEFAULT_RECOVER_CAP_SECONDS = 30.0
CONTROL_CONNECTIONS = 4
"""Control-plane connections of one worker: claims, batched results, heartbeats, lease recovery."""
WORKER_EXTRA_CONNECTIONS = CONTROL_CONNECTIONS + 2
"""Connections a worker may hold besides one per slot: the control pool, LISTEN and the metrics scrape."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    dsn: str | None = field(default=None, repr=False)
    """libpq DSN or URL of the database. No default: flag, ``SKIPLOCK_DSN`` or ``DATABASE_URL``."""

    schema: str = "skiplock"
    """PostgreSQL schema that holds the jobs table (default ``skiplock``); lower-case identifier, quoted in SQL."""

    queue: str = "default"
    """Queue of a single-queue worker and the default of the CLI's enqueue (default ``default``)."""

    queues: tuple[str, ...] = ()
    """Queues one worker serves from one claim statement (default: every queue its app's tasks name, else
    ``queue``). Env and flag take a comma-separated list."""

    app: str | None = None
    """``module:attr`` of a :class:`skiplock.App` whose tasks the worker runs."""

    handler: str | None = None
    """``module:function`` the worker calls for jobs without a task (the catch-all handler)."""

    concurrency: int = 10
    """Jobs in flight at once in one worker process (default 10). A worker holds at most concurrency + 6
    connections: one per slot for ``job.conn``, the control pool (4), LISTEN and the metrics scrape."""

    batch: int = 10
    """Most jobs claimed in one statement (default 10); never more than the free slots, so nothing is hoarded."""

    lease_seconds: float = 60.0
    """How long a claim stays valid without a heartbeat (default 60 s); expired jobs are recovered."""

    heartbeat_seconds: float | None = None
    """How often in-flight jobs renew their lease (default lease / 4; at most lease / 2)."""

    poll_seconds: float = 2.0
    """Polling fallback when no notification arrives (default 2 s); NOTIFY can be lost or coalesced."""

    recover_seconds: float | None = None
    """How often each worker recovers expired leases (default lease / 2, at most 30 s; cheap, SKIP LOCKED)."""

    backoff_base_seconds: float = 5.0
    """First retry delay; attempt n waits base * 2**(n-1) (default 5 s)."""

    backoff_cap_seconds: float = 3600.0
    """Upper bound of one retry delay (default 1 h)."""

    backoff_jitter: float = 1.0
    """Fraction of the delay that is random (default 1.0, full jitter; 0 = none) so failures do not retry in step."""

    max_attempts: int = 5
    """Default attempts of a newly enqueued job (default 5), after which it is ``failed``."""

    shutdown_grace_seconds: float = 30.0
    """On SIGTERM, how long in-flight jobs may run before they are handed back (default 30 s)."""

    retain_done_seconds: float = 7 * 86400.0
    """How long done jobs are kept before the workers' scheduled purge deletes them (default 7 days)."""

    retain_failed_seconds: float = 30 * 86400.0
    """How long failed jobs are kept (default 30 days): long enough to inspect and retry them."""

    retain_cancelled_seconds: float = 7 * 86400.0
    """How long cancelled jobs are kept (default 7 days)."""

    purge_interval_seconds: float = 3600.0
    """How often a worker runs the scheduled purge (default 1 h; one worker of the fleet at a time, under an
    advisory lock). 0 turns it off (``skiplock purge`` still works)."""

    metrics_port: int = 0
    """Port of /metrics, /healthz and /readyz (default 0: off). The operator sets 9464."""

    metrics_host: str = "0.0.0.0"
    """Address the metrics server binds (default all interfaces, as a pod needs)."""

    listen: bool = True
    """Use LISTEN/NOTIFY to wake at once (default on). Turn off behind PgBouncer in transaction mode."""

    max_payload_bytes: int = 256 * 1024
    """Largest JSON payload accepted by enqueue (default 256 KiB); keep payloads small, store blobs elsewhere."""

    log_format: LogFormat = "plain"
    """``plain`` (default) or ``json`` log lines."""

    log_level: str = "INFO"
    """Python logging level name (default INFO)."""

    worker_id: str = ""
    """Identity prefix written to locked_by (default ``host:pid``; the operator uses the pod name).
    Each worker process appends its own random nonce, so a restarted container never shares an identity."""

    def __post_init__(self) -> None:
        if not self.worker_id:
            object.__setattr__(self, "worker_id", f"{socket.gethostname()}:{os.getpid()}")
        if isinstance(self.queues, str):
            object.__setattr__(self, "queues", _split(self.queues))
        else:
            object.__setattr__(self, "queues", tuple(self.queues))
        lease = self.lease_seconds if isinstance(self.lease_seconds, int | float) and self.lease_seconds > 0 else 60.0
        if self.heartbeat_seconds is None:
            object.__setattr__(self, "heartbeat_seconds", lease / 4)
        if self.recover_seconds is None:
            object.__setattr__(self, "recover_seconds", min(DEFAULT_RECOVER_CAP_SECONDS, lease / 2))
        self.validate()

    # ------------------------------------------------------------------ building
    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **flags: Any) -> Settings:
        """Build settings: explicit flags (None means unset), then SKIPLOCK_* env, then DATABASE_URL, then defaults."""
        env = os.environ if env is None else env
        known = {f.name: f for f in fields(cls)}
        unknown = set(flags) - set(known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if flags.get(name) is not None:
                values[name] = _coerce(name, f.type, flags[name])
            elif (raw := env.get(ENV_PREFIX + name.upper())) not in (None, ""):
                values[name] = _coerce(name, f.type, raw)
        if "dsn" not in values and env.get("DATABASE_URL"):
            values["dsn"] = env["DATABASE_URL"]
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_env(self, *, exclude: tuple[str, ...] = ("dsn", "worker_id")) -> dict[str, str]:
        """Environment variables that rebuild these settings in another process (the DSN is left out by default)."""
        out: dict[str, str] = {}
        for f in fields(self):
            if f.name in exclude:
                continue
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            out[ENV_PREFIX + f.name.upper()] = _render(value)
        return out

    @classmethod
    def env_name(cls, name: str) -> str:
        if name not in {f.name for f in fields(cls)}:
            raise ConfigError(f"unknown setting {name!r}")
        return ENV_PREFIX + name.upper()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        problems: list[str] = []
        if not IDENTIFIER.match(self.schema):
            problems.append(
                f"schema {self.schema!r} must match {IDENTIFIER.pattern} (lower-case, at most 40 characters)"
            )
        for q in (self.queue, *self.queues):
            if not isinstance(q, str) or not QUEUE_NAME.match(q):
                problems.append(f"queue {q!r} must match {QUEUE_NAME.pattern}")
        if len(set(self.queues)) != len(self.queues):
            problems.append(f"queues {list(self.queues)} name a queue twice")
        if self.app is not None and not re.match(r"^[\w.]+:[\w.]+$", self.app):
            problems.append(f"app {self.app!r} must look like 'package.module:attribute'")
        for name in ("concurrency", "batch", "max_attempts", "max_payload_bytes"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("lease_seconds", "heartbeat_seconds", "poll_seconds", "recover_seconds", "backoff_base_seconds"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0 (got {getattr(self, name)})")
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            problems.append("backoff_cap_seconds must be >= backoff_base_seconds")
        if self.backoff_cap_seconds > MAX_BACKOFF_SECONDS:
            problems.append(f"backoff_cap_seconds must be at most {MAX_BACKOFF_SECONDS} (one year)")
        if not 0.0 <= self.backoff_jitter <= 1.0:
            problems.append(f"backoff_jitter must be within [0, 1] (got {self.backoff_jitter})")
        for name in ("retain_done_seconds", "retain_failed_seconds", "retain_cancelled_seconds"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0 (got {getattr(self, name)})")
        if not self.purge_interval_seconds >= 0:
            problems.append(f"purge_interval_seconds must be >= 0 (got {self.purge_interval_seconds})")
        if self.shutdown_grace_seconds < 0:
            problems.append("shutdown_grace_seconds must be >= 0")
        assert self.heartbeat_seconds is not None and self.recover_seconds is not None  # set in __post_init__
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            problems.append(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be at most half of lease_seconds "
                f"({self.lease_seconds}) so one late heartbeat does not lose the lease"
            )
        if self.poll_seconds >= self.lease_seconds:
            problems.append("poll_seconds must be below lease_seconds")
        if not 0 <= self.metrics_port <= 65535:
            problems.append(f"metrics_port must be within 0..65535 (got {self.metrics_port})")
        if self.log_format not in get_args(LogFormat):
            problems.append(f"log_format must be one of {get_args(LogFormat)} (got {self.log_format!r})")
        if self.handler is not None and not re.match(r"^[\w.]+:[\w.]+$", self.handler):
            problems.append(f"handler {self.handler!r} must look like 'package.module:function'")
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

    def require_dsn(self) -> str:
        if not self.dsn:
            raise ConfigError("no database given: pass --dsn, or set SKIPLOCK_DSN or DATABASE_URL")
        return self.dsn

    @property
    def channel(self) -> str:
        """NOTIFY channel of this schema (database-wide, so derived from the schema)."""
        return f"{self.schema}_wakeup"

    @property
    def control_channel(self) -> str:
        """NOTIFY channel of worker controls (cancel, pause) for this schema."""
        return f"{self.schema}_control"

    @property
    def masked_dsn(self) -> str:
        return mask_dsn(self.dsn or "")

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "dsn")
        return f"Settings(dsn={self.masked_dsn!r}, {shown})"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _coerce(name: str, annotation: Any, raw: Any) -> Any:
    kind = str(annotation).removesuffix(" | None")
    try:
        if kind.startswith("tuple"):
            return _split(raw) if isinstance(raw, str) else tuple(str(x) for x in raw)
        if "bool" in kind:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")
        if kind == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError("expected an integer")
            return int(raw)
        if kind == "float":
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError("expected a finite number")
            return value
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name} ({ENV_PREFIX}{name.upper()}): cannot use {raw!r}: {exc}") from None


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def mask_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (URL or key=value form)."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return "<unparseable DSN>"
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = re.sub(r"(password=)[^&]*", r"\1***", parts.query, flags=re.IGNORECASE)
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return _KV_PASSWORD.sub(r"\1***", dsn)


def redact(text: str, dsn: str | None) -> str:
    """Remove the DSN's password from any text (error messages quote it sometimes)."""
    if not dsn:
        return text
    secrets: list[str] = []
    if "://" in dsn:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        if password:
            secrets.append(password)
    for match in _KV_PASSWORD.finditer(dsn):
        secrets.append(match.group(2).strip("'"))
    text = text.replace(dsn, mask_dsn(dsn))
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
