"""Flow control on the worker's side: register the app's task limits at start (the claim statements enforce them),
and tell the claimer how long to wait when only rate-limited jobs are due (so it neither spins nor waits a whole
poll interval past the next allowed start)."""

from __future__ import annotations

import logging

from skiplock.app import App
from skiplock.limits import TaskLimits, changed
from skiplock.store.worker import ClaimStore, WorkerStore

log = logging.getLogger(__name__)


async def register_limits(store: WorkerStore, app: App, identity: str) -> tuple[TaskLimits, ...]:
    """Register every task's limits (a task without limits drops an older registration); returns the limited ones.
    The latest registration wins: replacing another worker's different limits is logged."""
    limits = [t.limits for t in app]
    rows = await store.register_limits(limits, worker=identity)
    if rows is None:
        log.error(
            "task limits not registered: the limits registered before (if any) stay in force",
            extra={"action": "limits_not_registered"},
        )
    for row in rows or ():
        if changed(row):
            log.warning(
                "task %s: limits replaced (concurrency %s -> %s, rate %s/%ss -> %s/%ss; were registered by %s)",
                row["task"], row["was_concurrency"], row["concurrency"], row["was_rate"], row["was_period"],
                row["rate"], row["period"], row["was_registered_by"],
                extra={"action": "limits_replaced", "task": row["task"]},
            )  # fmt: skip
    return tuple(x for x in limits if x.limited)


async def next_start(store: ClaimStore, rate_limited: tuple[str, ...], queues: tuple[str, ...]) -> float | None:
    """Seconds until a rate limit lets a due job of ``rate_limited`` start (None: none is waiting on a rate)."""
    if not rate_limited:
        return None
    return await store.next_start(rate_limited, queues)
