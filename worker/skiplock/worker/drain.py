"""Drain requests: the operator asks the workers of a pod it is about to remove to stop claiming.

Before it lowers a worker Deployment's replicas, the operator ranks the pods by the jobs they hold, writes a
row per chosen pod into ``{schema}.drains`` and notifies the control channel. Each worker looks at its pod's row
when it rechecks its paused queues (that notification, else every few polls): nothing is added to a claim. A
drained worker hands back the jobs it prefetched, claims nothing more, and finishes the jobs it runs; the
operator lowers the replicas once the pod holds nothing (or after ``scaling.scaleInDrainSeconds``). A request
withdrawn (the backlog grew again) lets it claim again.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg_pool import PoolTimeout

from skiplock.store.worker import ClaimStore

log = logging.getLogger(__name__)


def drain_key(worker_id: str) -> str:
    """The pod a worker id names: its first part (the default ``host:pid`` starts with the host name, which in
    Kubernetes is the pod's name, cut to 63 characters; the operator writes requests under that name)."""
    return worker_id.split(":", 1)[0]


async def requested(store: ClaimStore, worker_id: str) -> bool | None:
    """Whether this worker's pod is asked to drain; None when the database could not say (nothing changes). Not
    through the store's retried calls: their bookkeeping belongs to the claims (a lost reply is judged by it)."""
    try:
        return await store.drain_requested(drain_key(worker_id))
    except (psycopg.Error, PoolTimeout, OSError) as exc:
        log.debug("drain request not read (%s)", type(exc).__name__, extra={"action": "drain_unknown"})
        return None


def report(draining: bool, worker_id: str) -> None:
    if draining:
        log.info(
            "drain requested by the operator: no more claims; running jobs finish",
            extra={"action": "drain_started", "worker": drain_key(worker_id)},
        )
    else:
        log.info("drain request withdrawn: claiming again", extra={"action": "drain_withdrawn"})
