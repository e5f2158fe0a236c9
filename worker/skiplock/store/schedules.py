"""The schedules table: register an app's schedules, fire the due ones, list, remove and prune them (the timing
and the tick parameters are pure, in :mod:`skiplock.schedule`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from skiplock.schedule import STALE_SECONDS, UNFIREABLE, Fired, Schedule, fire_params, scope_params
from skiplock.store.run import aexecute, execute
from skiplock.store.statements import Statements

log = logging.getLogger(__name__)
PARKED: tuple[type[Exception], ...] = (*UNFIREABLE, psycopg.errors.DataError, psycopg.errors.IntegrityError)
"""What parks a due row: its ticks cannot be computed, or the jobs table refuses its job (a check, a bad value)."""


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
    is its own transaction, or a savepoint of the caller's. A row that cannot be fired (a timing written by hand,
    a cron that never fires again, a job the jobs table refuses) is parked, and the others fire: one bad row never
    stops the round. Database errors of any other kind (a lost connection, a role refused the INSERT) raise."""
    scope = scope_params(names, queues)
    fired: list[Fired] = []
    for row in await aexecute(conn, s.schedule_due(scope)):
        try:
            params, missed = fire_params(row, channel or s.settings.channel)
            async with conn.transaction():
                job_id = await aexecute(conn, s.schedule_fire(params))
        except PARKED as exc:
            reason = f"{type(exc).__name__}: {str(exc).strip() or 'no reason given'}"
            log.warning("schedule %s parked: %s", row["name"], reason, extra={"action": "schedule_parked"})
            await aexecute(conn, s.schedule_park(row["name"], reason))
            continue
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
