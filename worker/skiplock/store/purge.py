"""The one purge: old done, failed and cancelled jobs deleted in batches, each batch a short transaction that first
takes the schema's purge lock (the ``purge`` row of the ``locks`` table, ``FOR UPDATE``: only the owner may lock it,
so no other role can hold it to stop the purges). So two purges never delete at once, whoever runs them: the workers'
scheduled retention, the operator's, and ``skiplock purge`` / ``Queue.purge``. A scheduled round skips a batch whose
lock is taken (``wait=False``: someone else is purging); an explicit purge waits for its turn."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg

from skiplock.store.run import aexecute, execute
from skiplock.store.statements import PurgePolicy, Statements


def purge_batch(
    conn: psycopg.Connection[Any],
    s: Statements,
    policy: PurgePolicy,
    limit: int,
    *,
    wait: bool,
    now: datetime | None = None,
) -> Counter[str] | None:
    """One batch in a transaction of its own: the rows deleted by status, or None when the lock was taken."""
    with conn.transaction():
        if not execute(conn, s.purge_lock(wait=wait)):
            return None
        return execute(conn, s.purge(policy, limit, now))


async def apurge_batch(
    conn: psycopg.AsyncConnection[Any],
    s: Statements,
    policy: PurgePolicy,
    limit: int,
    *,
    wait: bool,
    now: datetime | None = None,
) -> Counter[str] | None:
    """See :func:`purge_batch`."""
    async with conn.transaction():
        if not await aexecute(conn, s.purge_lock(wait=wait)):
            return None
        return await aexecute(conn, s.purge(policy, limit, now))


def more_left(batch: Mapping[str, int] | None, limit: int) -> bool:
    """Whether a purge goes on after ``batch``: it was not refused the lock, and some status filled its share."""
    return batch is not None and bool(batch) and max(batch.values()) >= limit
