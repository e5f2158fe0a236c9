"""What every seam of one worker shares (:class:`Scope`). Each seam is given its own narrow view of the data access
(a Protocol in its module that :class:`skiplock.store.worker.PgWorkerStore` satisfies) beside it."""

from __future__ import annotations

from dataclasses import dataclass, field

from skiplock.limits import TaskLimits
from skiplock.settings import Settings


@dataclass(frozen=True)
class Scope:
    """What every seam of one worker shares: its settings, identity, the queues it serves, the leases of tasks that
    set their own and the limited tasks of its app."""

    settings: Settings
    identity: str
    queues: tuple[str, ...]
    lease_overrides: dict[str, float] = field(default_factory=dict)
    limits: tuple[TaskLimits, ...] = ()  # the limited tasks of its app (flow control), as registered at start

    def lease_for(self, task: str | None) -> float:
        """The lease of a job of ``task``: its task's own, else the worker's."""
        lease = self.settings.lease_seconds
        return self.lease_overrides.get(task, lease) if task else lease
