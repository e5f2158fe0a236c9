"""What every seam of one worker shares (:class:`Scope`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from skiplock.limits import TaskLimits
from skiplock.settings import Settings
from skiplock.store.worker import WorkerStore


@dataclass(frozen=True)
class Scope:
    """What every seam of one worker shares: its data access, settings, identity, the queues it serves and
    the leases of tasks that set their own."""

    store: WorkerStore
    settings: Settings
    identity: str
    queues: tuple[str, ...]
    lease_overrides: dict[str, float] = field(default_factory=dict)
    limits: tuple[TaskLimits, ...] = ()  # the limited tasks of its app (flow control), as registered at start
