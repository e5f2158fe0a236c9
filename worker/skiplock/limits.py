"""Per-task limits enforced cluster-wide: ``global_concurrency`` (at most N running) and ``rate_limit`` (at most N
starts per period, written ``"100/m"``). Pure: parsing and the registration parameters; the claim statements
enforce them with slot rows in the database, and each worker registers its tasks' limits at start."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from skiplock.errors import ConfigError

MAX_CONCURRENCY = 1000
"""Largest ``global_concurrency`` (one slot row each; the database checks it too)."""
MAX_RATE = 10000
"""Largest count of a ``rate_limit`` (one slot row each; the database checks it too)."""
UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(?P<count>\d+)\s*/\s*(?P<every>\d+)?\s*(?P<unit>[smhd])\s*$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` starts in any window of ``period_seconds``."""

    count: int
    period_seconds: float

    def __str__(self) -> str:
        return f"{self.count}/{self.period_seconds:g}s"


def parse_rate_limit(text: Any) -> RateLimit:
    """``"100/m"``, ``"5/s"``, ``"1000/h"``, ``"10/d"``, or with a multiple: ``"3/10s"``, ``"50/15m"``;
    anything else is a :class:`ConfigError`."""
    m = _RATE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(
            f"rate_limit {text!r} must look like '100/m': a count, '/', an optional multiple and a unit "
            "(s, m, h or d), e.g. '5/s', '1000/h', '3/10s'"
        )
    count, every = int(m["count"]), int(m["every"] or 1)
    if not 1 <= count <= MAX_RATE:
        raise ConfigError(f"rate_limit {text!r}: the count must be within 1..{MAX_RATE}")
    if every < 1:
        raise ConfigError(f"rate_limit {text!r}: the period must be at least 1{m['unit']}")
    return RateLimit(count, every * UNIT_SECONDS[m["unit"]])


def concurrency_problem(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CONCURRENCY:
        return f"global_concurrency must be an integer within 1..{MAX_CONCURRENCY} (got {value!r})"
    return None


@dataclass(frozen=True, slots=True)
class TaskLimits:
    """The limits one task registers (``None``: none of that kind)."""

    task: str
    global_concurrency: int | None = None
    rate: RateLimit | None = None

    @property
    def limited(self) -> bool:
        return self.global_concurrency is not None or self.rate is not None


def register_params(limits: Iterable[TaskLimits], worker: str) -> dict[str, Any]:
    """Parameters of ``task_limits_register``: one entry per task of the app, sorted (concurrent registrations
    lock rows in one order); a task without limits removes its registration."""
    rows = sorted(limits, key=lambda x: x.task)
    return {
        "tasks": [x.task for x in rows],
        "concurrency": [x.global_concurrency for x in rows],
        "rate": [x.rate.count if x.rate else None for x in rows],
        "period": [x.rate.period_seconds if x.rate else None for x in rows],
        "worker": worker,
    }


def changed(row: Mapping[str, Any]) -> bool:
    """Whether a registration replaced different limits that another worker had registered."""
    was = (row["was_concurrency"], row["was_rate"], row["was_period"])
    now = (row["concurrency"], row["rate"], row["period"])
    return row["was_present"] and was != now
