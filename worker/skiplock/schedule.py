"""Periodic tasks: timing (cron or every N seconds, in a time zone), registration and firing of ticks.

Schedules live in the database (the ``schedules`` table), one row per periodic task with its next due time.
Workers register their app's schedules at start and every hour; ``skiplock schedules sync`` does it at deploy
(the statements are in :mod:`skiplock.store.schedules`). Whoever finds a schedule due (a worker, or the
operator, which cannot import application code) fires it with one statement: a compare-and-set of
``next_run_at`` plus the job INSERT, whose unique key (schedule and tick time) is a second guard. So each tick
is enqueued once however many workers and operator replicas run.

Late ticks (after downtime): only the last missed tick runs, the earlier ones are skipped (and counted).
A schedule nobody registered for ``max(7 days, 3 periods)`` is stale: it is not fired any more (a task removed
from the app stops firing by itself; ``skiplock schedules sync --prune`` removes it at once).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from skiplock.unique import UNIQUE_STATES

log = logging.getLogger(__name__)
STALE_SECONDS = 7 * 86400.0
"""A schedule not registered for max(this, 3 periods) is stale: not fired, shown as stale."""
REGISTER_EVERY_SECONDS = 3600.0
"""How often a running worker registers its schedules again (so they never go stale while it runs)."""
MAX_WAIT_SECONDS = 30.0
"""Longest sleep of a firer between two looks (new or changed schedules are seen within it)."""
MISSED_COUNT_LIMIT = 10_000
"""Missed ticks are counted up to this many (then the count stops there)."""
WALK_STEPS = 100
"""Most cron steps taken to count the missed ticks of one late row; beyond them the rest is estimated from the gaps
walked, so a row late by years costs no more than one a little late."""
EVERY_SECONDS_MAX = 315_360_000.0
"""Longest ``every`` (ten years), as the schedules table bounds it (so a tick time always fits)."""
UNFIREABLE: tuple[type[Exception], ...] = (ValueError, StopIteration, OverflowError, CronSimError)
"""What computing a stored row's ticks may raise when the row cannot be fired (a bad zone or cron, a date out of
range): the row is parked, never the round stopped."""


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: a cron expression (5 fields, or 6 with seconds first) in a time zone, or every N
    seconds (ticks at multiples of N since the Unix epoch, whatever the zone)."""

    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if problem := timing_problem(self.cron, self.every, self.timezone):
            raise ValueError(problem)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, at: datetime) -> datetime:
        """The first tick strictly after ``at`` (an aware datetime), in UTC."""
        if self.every is not None:
            step = _micros(self.every)
            return _from_micros((_epoch_micros(at) // step + 1) * step)
        assert self.cron is not None
        return next(CronSim(self.cron, at.astimezone(self.zone))).astimezone(UTC)

    def last_at_or_before(self, at: datetime) -> datetime:
        """The last tick at or before ``at``, in UTC."""
        if self.every is not None:
            step = _micros(self.every)
            return _from_micros(_epoch_micros(at) // step * step)
        assert self.cron is not None
        probe = at.astimezone(self.zone) + timedelta(microseconds=1)
        return next(CronSim(self.cron, probe, reverse=True)).astimezone(UTC)

    def ticks_between(self, after: datetime, before: datetime, limit: int = MISSED_COUNT_LIMIT) -> int:
        """How many ticks fall strictly between ``after`` and ``before`` (at most ``limit``): exact for ``every``
        and for up to :data:`WALK_STEPS` cron ticks, estimated from the average gap of those beyond."""
        if before <= after:
            return 0
        if self.every is not None:
            step = _micros(self.every)
            first = _epoch_micros(after) // step + 1
            last = -(-_epoch_micros(before) // step) - 1
            return max(0, min(limit, last - first + 1))
        start = tick = self.next_after(after)
        count = 0
        while tick < before and count < min(limit, WALK_STEPS):
            count, tick = count + 1, self.next_after(tick)
        if tick >= before or count >= limit:
            return count
        gap = (tick - start) / count  # the walk stopped short: the ticks left, at the pace walked so far
        return min(limit, count + math.ceil((before - tick) / gap))  # tick, tick + gap, ... strictly before

    def period_seconds(self, at: datetime) -> float:
        """About one period: the longest of the next few gaps between ticks (a month for a monthly cron)."""
        if self.every is not None:
            return self.every
        ticks = [self.next_after(at)]
        for _ in range(4):
            ticks.append(self.next_after(ticks[-1]))
        return max((b - a).total_seconds() for a, b in itertools.pairwise(ticks))


def timing_problem(cron: Any, every: Any, timezone: Any) -> str | None:
    """Why this timing is wrong, or None."""
    if cron is not None and every is not None:
        return "give cron or every, not both"
    if every is not None and (
        not isinstance(every, int | float)
        or isinstance(every, bool)
        or not math.isfinite(every)
        or not 0.001 <= every <= EVERY_SECONDS_MAX
    ):
        return f"every must be a number of seconds from 0.001 to {EVERY_SECONDS_MAX:.0f} (ten years) (got {every!r})"
    if not isinstance(timezone, str) or not timezone:
        return f"timezone must be an IANA zone name such as 'Europe/Berlin' (got {timezone!r})"
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown timezone {timezone!r} (an IANA zone name such as 'Europe/Berlin' or 'UTC')"
    if cron is not None:
        if not isinstance(cron, str) or len(cron.split()) not in (5, 6):
            return f"cron must be 5 fields (minute hour day month weekday), or 6 with seconds first (got {cron!r})"
        try:
            next(CronSim(cron, datetime(2000, 1, 1, tzinfo=zone)))
        except (CronSimError, StopIteration) as exc:
            return f"invalid cron {cron!r}: {exc or 'it never fires'}"
    return None


def _micros(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


def _epoch_micros(at: datetime) -> int:
    delta = at.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


@dataclass(frozen=True)
class Schedule:
    """One periodic task as stored: its name (the task's), app, queue, timing and job defaults."""

    name: str
    app: str
    queue: str
    timing: Timing
    priority: int = 0
    max_attempts: int = 5

    def register_params(self, now: datetime) -> dict[str, Any]:
        t = self.timing
        return {
            "name": self.name,
            "app": self.app,
            "queue": self.queue,
            "task": self.name,
            "cron": t.cron,
            "every_seconds": t.every,
            "timezone": t.timezone,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "next_run_at": t.next_after(now),
            "period_seconds": t.period_seconds(now),
            "stale_seconds": STALE_SECONDS,
        }


@dataclass(frozen=True)
class Fired:
    """One due schedule handled: the job enqueued (None: another firer had it), the tick, ticks skipped."""

    name: str
    task: str
    tick: datetime
    job_id: int | None
    missed: int


def tick_payload(name: str, tick: datetime) -> str:
    return json.dumps({"schedule": name, "scheduled_at": tick.isoformat()})


def tick_key(name: str, tick: datetime) -> str:
    """The unique key of a tick's job: the schedule and the tick time (the second guard of exactly once)."""
    return f"schedule:{name}@{tick.isoformat()}"


def fire_params(row: dict[str, Any], channel: str) -> tuple[dict[str, Any], int]:
    """The parameters of ``schedule_fire`` for one due row (late: its last missed tick), and the ticks skipped."""
    timing = Timing(row["cron"], row["every_seconds"], row["timezone"])
    now, expected = row["now"], row["next_run_at"]
    tick = max(expected, timing.last_at_or_before(now))
    params = {
        "name": row["name"],
        "expected": expected,
        "tick": tick,
        "following": timing.next_after(max(tick, now)),
        "payload": tick_payload(row["name"], tick),
        "unique_key": tick_key(row["name"], tick),
        "unique_states": list(UNIQUE_STATES),
        "channel": channel,
    }
    # Late: the stored tick and those between it and the one fired are skipped (the documented policy).
    return params, 1 + timing.ticks_between(expected, tick) if tick > expected else 0


def _names(names: Iterable[str] | None) -> list[str] | None:
    return None if names is None else list(names)


def scope_params(
    names: Iterable[str] | None, queues: Sequence[str] | None, skip: Iterable[str] = ()
) -> dict[str, Any]:
    """Which schedules a round reads: of ``names`` / ``queues`` (None: all), but none of ``skip`` (rows a firer has
    set aside: left out in the query, so they never take the places of others under its LIMIT)."""
    return {
        "names": _names(names),
        "queues": None if queues is None else list(queues),
        "skip": sorted(skip),
        "stale_seconds": STALE_SECONDS,
    }


def wait_seconds(next_due: float | None) -> float:
    """How long a firer sleeps: until the next schedule is due, at most :data:`MAX_WAIT_SECONDS`."""
    return MAX_WAIT_SECONDS if next_due is None else min(MAX_WAIT_SECONDS, max(0.01, next_due))
