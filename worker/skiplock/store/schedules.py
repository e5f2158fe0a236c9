"""The schedules table: register an app's schedules, fire the due ones, list, remove and prune them (the timing
and the tick parameters are pure, in :mod:`skiplock.schedule`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from skiplock.schedule import STALE_SECONDS, Fired, Schedule, fire_params, scope_params
from skiplock.store.run import aexecute, execute
from skiplock.store.statements import Statements

log = logging.getLogger(__name__)


async def register(conn: psycopg.AsyncConnection[Any], s: Statements, schedules: Sequence[Schedule]) -> None:
    """Register (or refresh) ``schedules``: one short transaction."""
    async with conn.transaction():
        now = await aexecute(conn, s.schedule_now())
        for schedule in schedules:
            await aexecute(conn, s.schedule_register(schedule.register_params(now)))


def register_sync(conn: psycopg.Connection[Any], s: Statements, schedules: Sequence[Schedule]) -> None:
    with conn.transaction():
        now = execute(conn, s.schedule_now())
        for schedule in schedules:
            execute(conn, s.schedule_register(schedule.register_params(now)))


async def fire_due(
    conn: psycopg.AsyncConnection[Any],
    s: Statements,
    *,
    names: Iterable[str] | None = None,
    queues: Sequence[str] | None = None,
    channel: str | None = None,
) -> tuple[list[Fired], float | None]:
    """Fire every due schedule (of ``names`` / ``queues``, or all); returns what was fired and the seconds until
    the next one is due (None: no schedule). ``channel``: the wake-up channel (default the schema's). Each tick
    is its own statement (autocommit), or all of them one transaction when the caller opened one."""
    scope = scope_params(names, queues)
    fired: list[Fired] = []
    for row in await aexecute(conn, s.schedule_due(scope)):
        try:
            params, missed = fire_params(row, channel or s.settings.channel)
        except (ValueError, StopIteration) as exc:  # a row written by hand, or a cron that never fires again
            log.warning("schedule %s cannot be fired: %s", row["name"], exc, extra={"action": "schedule_invalid"})
            continue
        job_id = await aexecute(conn, s.schedule_fire(params))
        fired.append(Fired(row["name"], row["task"], params["tick"], job_id, missed if job_id else 0))
    return fired, await aexecute(conn, s.schedule_next_due(scope))


def list_schedules(conn: psycopg.Connection[Any], s: Statements) -> list[dict[str, Any]]:
    return execute(conn, s.schedule_list(STALE_SECONDS))


def remove(conn: psycopg.Connection[Any], s: Statements, names: Sequence[str]) -> set[str]:
    """Remove the schedules ``names``; returns those that existed."""
    return execute(conn, s.schedule_delete(names))


def prune(conn: psycopg.Connection[Any], s: Statements, app: str, keep: Sequence[str]) -> list[str]:
    """Remove the schedules of ``app`` other than ``keep``; returns their names."""
    return execute(conn, s.schedule_prune(app, keep))


class ScheduleSession:
    """Register and fire on one connection (a worker's scheduler borrows a control connection for a round)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], s: Statements) -> None:
        self._conn, self._s = conn, s

    async def register(self, schedules: Sequence[Schedule]) -> None:
        await register(self._conn, self._s, schedules)

    async def fire_due(self, names: Iterable[str] | None = None) -> tuple[list[Fired], float | None]:
        return await fire_due(self._conn, self._s, names=names)
