"""``spec.paused`` to the queues table: pause every served queue while it is true, resume them once when it
turns false. ``status.paused`` remembers what the operator applied, so a queue paused by ``skiplock pause`` is
never resumed behind the user's back. Run by the autoscaler at each poll (idempotent: only rows that disagree
are written)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from skiplock import QueueStats
from skiplock_operator import status
from skiplock_operator.database import DatabaseProblem
from skiplock_operator.runtime import Condition, Key, Runtime, write_status
from skiplock_operator.spec import JobQueueSpec

Pause = tuple[dict[str, Any], Condition | None]
"""What the pause sync adds to a status write: fields (paused, pausedQueues) and the QueuesActive condition."""


async def sync(
    rt: Runtime,
    key: Key,
    body: Mapping[str, Any],
    spec: JobQueueSpec,
    dsn: str,
    stats: dict[str, QueueStats],
    logger: logging.Logger | Any,
) -> tuple[dict[str, QueueStats], Pause]:
    """Returns the stats as they now stand, the status fields and the QueuesActive condition."""
    queues = spec.served_queues
    held = [q for q in queues if stats[q].paused]
    applied = bool((body.get("status") or {}).get("paused"))
    todo = [q for q in queues if q not in held] if spec.paused else held if applied else []
    if todo:
        try:
            await rt.databases.set_paused(key, dsn, spec.schema, todo, spec.paused)
        except DatabaseProblem as exc:
            rt.metrics.errors.labels("database").inc()
            logger.warning(f"spec.paused={spec.paused} not applied to the database ({exc.reason})")
            why = f"spec.paused={str(spec.paused).lower()} is not applied yet: {exc}"
            return stats, ({}, (status.QUEUES_ACTIVE, False, exc.reason, why))
        await write_status(rt, key, fields={"paused": spec.paused})  # remembered before anything else
        verb = "paused" if spec.paused else "resumed"
        logger.info(f"queue(s) {', '.join(todo)} {verb} in the database (spec.paused={spec.paused})")
        held = list(queues) if spec.paused else []
        stats = {q: dataclasses.replace(row, paused=q in held) for q, row in stats.items()}
    fields = {"paused": spec.paused, "pausedQueues": held}
    listed = ", ".join(held)
    if spec.paused:
        message = f"spec.paused is true: {listed} paused in the database; running jobs finish, nothing new is claimed"
        return stats, (fields, (status.QUEUES_ACTIVE, False, status.PAUSED, message))
    if held:
        message = (
            f"{listed} paused in the database by `skiplock pause`: spec.paused is false, so the operator leaves "
            "them paused (`skiplock resume QUEUE`)"
        )
        return stats, (fields, (status.QUEUES_ACTIVE, False, status.PAUSED_BY_COMMAND, message))
    return stats, (fields, (status.QUEUES_ACTIVE, True, status.CLAIMING, "workers claim from every served queue"))
