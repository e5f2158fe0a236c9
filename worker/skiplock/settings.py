"""The one settings object. ``Settings(...)`` takes its values from the arguments only; reading the environment
is the explicit step :meth:`Settings.from_env` (flag, then ``SKIPLOCK_*`` env, then, for the DSN only,
``DATABASE_URL``, then default).

Every field is a knob of :mod:`skiplock.knobs` (its help, bounds, flag, env name and CRD field live there);
the operator renders a worker's environment with :meth:`Settings.to_env`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from skiplock.duration import is_duration_setting, parse_duration
from skiplock.errors import ConfigError
from skiplock.knobs import BY_NAME, ENV_PREFIX, IDENTIFIER, MAX_BACKOFF_SECONDS, QUEUE_NAME, knob_problems

__all__ = ["ENV_PREFIX", "IDENTIFIER", "MAX_BACKOFF_SECONDS", "QUEUE_NAME", "Settings", "mask_dsn", "redact"]
LogFormat = Literal["plain", "json"]


DEFAULT_RECOVER_CAP_SECONDS = 30.0
CONTROL_CONNECTIONS = 4
"""Control-plane connections of one worker: claims, batched results, heartbeats, lease recovery."""
SPARE_HANDLER_CONNECTIONS = 1
"""Connections of the handler pool beyond one per slot: a handler holding ``job.conn`` whose ``job.step`` or
``job.parent_results`` needs a connection of its own gets it there (opened only when every other one is in use)."""
WORKER_EXTRA_CONNECTIONS = CONTROL_CONNECTIONS + SPARE_HANDLER_CONNECTIONS + 2
"""Connections a worker may hold besides one per slot: the control pool, the handler pool's spare, LISTEN and the
metrics scrape."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Worker and producer settings; each field is documented once, in :data:`skiplock.knobs.KNOBS`."""

    dsn: str | None = field(default=None, repr=False)
    schema: str = "skiplock"
    queue: str = "default"
    queues: tuple[str, ...] = ()
    app: str | None = None
    handler: str | None = None
    concurrency: int = 10
    batch: int = 200
    prefetch: int = 400
    lease_seconds: float = 60.0
    heartbeat_seconds: float | None = None
    poll_seconds: float = 2.0
    recover_seconds: float | None = None
    backoff_base_seconds: float = 5.0
    backoff_cap_seconds: float = 3600.0
    backoff_jitter: float = 1.0
    max_attempts: int = 5
    shutdown_grace_seconds: float = 30.0
    retain_done_seconds: float = 7 * 86400.0
    retain_failed_seconds: float = 30 * 86400.0
    retain_cancelled_seconds: float = 7 * 86400.0
    purge_interval_seconds: float = 3600.0
    metrics_port: int = 0
    metrics_host: str = "0.0.0.0"
    queue_metrics_seconds: float = 15.0
    listen: bool = True
    event_loop: str = "auto"
    max_payload_bytes: int = 256 * 1024
    log_format: LogFormat = "plain"
    log_level: str = "INFO"
    worker_id: str = ""

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
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: Any) -> Settings:
        """Read the environment, explicitly: flags given here (None means unset), then ``SKIPLOCK_*`` env, then
        ``DATABASE_URL`` (DSN only), then defaults. ``env`` defaults to ``os.environ``."""
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

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **flags: Any) -> Settings:
        """Deprecated name of :meth:`from_env` (kept for existing callers; new code calls ``from_env``)."""
        return cls.from_env(env, **flags)

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
        if name not in BY_NAME:
            raise ConfigError(f"unknown setting {name!r}")
        return BY_NAME[name].env

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Bounds, choices and patterns from the knob table, then the rules that relate two settings."""
        problems = knob_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if len(set(self.queues)) != len(self.queues):
            problems.append(f"queues {list(self.queues)} name a queue twice")
        if self.dsn and not _parses_as_conninfo(self.dsn):
            # libpq's parse error quotes the DSN (`missing "=" after "<value>"`), a password among it: name the
            # setting only, never the value or that error
            problems.append(
                "the DSN is malformed (setting dsn: --dsn, --dsn-file, SKIPLOCK_DSN or DATABASE_URL; its value is not "
                "shown): expected a URI such as postgresql://user@host:5432/db, or key=value pairs"
            )
        if problems:  # the rules below compare numbers: only once each is valid on its own
            raise ConfigError("invalid settings: " + "; ".join(problems))
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            problems.append("backoff_cap_seconds must be >= backoff_base_seconds")
        assert self.heartbeat_seconds is not None and self.recover_seconds is not None  # set in __post_init__
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            problems.append(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be at most half of lease_seconds "
                f"({self.lease_seconds}) so one late heartbeat does not lose the lease"
            )
        if self.poll_seconds >= self.lease_seconds:
            problems.append("poll_seconds must be below lease_seconds")
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

    def require_dsn(self) -> str:
        if not self.dsn:
            raise ConfigError(
                "no database given: pass a DSN (dsn=, --dsn or --dsn-file), or set SKIPLOCK_DSN or DATABASE_URL "
                "(read by the skiplock command and Settings.from_env)"
            )
        return self.dsn

    @property
    def channel(self) -> str:
        """NOTIFY channel of this schema (database-wide, so derived from the schema)."""
        return f"{self.schema}_wakeup"

    @property
    def done_channel(self) -> str:
        """NOTIFY channel on which a job someone waits for (``EnqueueResult.wait``) announces its end."""
        return f"{self.schema}_done"

    @property
    def masked_dsn(self) -> str:
        return mask_dsn(self.dsn or "")

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "dsn")
        return f"Settings(dsn={self.masked_dsn!r}, {shown})"


def _parses_as_conninfo(dsn: str) -> bool:
    """Whether libpq can parse ``dsn`` (a pure parse: nothing is resolved or connected)."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except ProgrammingError:
        return False
    return True


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
            try:
                value = float(raw)
            except ValueError:  # a duration with a unit: 90s, 15m, 7d
                if not (isinstance(raw, str) and is_duration_setting(name)):
                    raise
                value = parse_duration(raw)
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
