"""Waiting for a job's result: LISTEN on the schema's ``_done`` channel, mark the job as awaited (so the trigger that
ends it notifies), then read it; re-read only when its own notification arrives. No polling loop."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from skiplock.settings import Settings
from skiplock.sql import Queries
from skiplock.store import links
from skiplock.store.run import aexecute, execute


def _remaining(deadline: float | None, job_id: int, timeout: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"job {job_id} did not end within {timeout:g}s")
    return left


def wait(conn: psycopg.Connection[Any], settings: Settings, q: Queries, job_id: int, timeout: float | None) -> Any:
    """On a connection of its own (left as it was found): the job's result, :class:`JobFailedError`, or
    :class:`TimeoutError`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    channel = sql.Identifier(settings.done_channel)
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        conn.execute(sql.SQL("LISTEN {}").format(channel))
        try:
            execute(conn, links.await_job(q, job_id))
            mine = str(job_id)
            while True:
                final, value = links.settled(execute(conn, links.outcome(q, job_id)), job_id)
                if final:
                    return value
                while not any(
                    n.payload == mine
                    for n in conn.notifies(timeout=_remaining(deadline, job_id, timeout), stop_after=1)
                ):
                    _remaining(deadline, job_id, timeout)
        finally:
            conn.execute(sql.SQL("UNLISTEN {}").format(channel))
    finally:
        conn.autocommit = autocommit


async def await_result(
    conn: psycopg.AsyncConnection[Any], settings: Settings, q: Queries, job_id: int, timeout: float | None
) -> Any:
    """The async twin of :func:`wait`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    channel = sql.Identifier(settings.done_channel)
    autocommit = conn.autocommit
    await conn.set_autocommit(True)
    try:
        await conn.execute(sql.SQL("LISTEN {}").format(channel))
        try:
            await aexecute(conn, links.await_job(q, job_id))
            mine = str(job_id)
            while True:
                final, value = links.settled(await aexecute(conn, links.outcome(q, job_id)), job_id)
                if final:
                    return value
                while True:
                    got = [n async for n in conn.notifies(timeout=_remaining(deadline, job_id, timeout), stop_after=1)]
                    if any(n.payload == mine for n in got):
                        break
                    _remaining(deadline, job_id, timeout)
        finally:
            await conn.execute(sql.SQL("UNLISTEN {}").format(channel))
    finally:
        await conn.set_autocommit(autocommit)
