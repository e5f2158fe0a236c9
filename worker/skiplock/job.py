"""The Job a handler receives, the status words, and row mapping (no I/O)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

JobStatus = Literal["pending", "processing", "done", "failed"]
STATUSES: tuple[JobStatus, ...] = ("pending", "processing", "done", "failed")

CLAIM_COLUMNS = (
    "id",
    "queue",
    "payload",
    "attempts",
    "max_attempts",
    "priority",
    "created_at",
    "visible_at",
    "idempotency_key",
    "task",
)


class LazyConnection:
    """``job.conn`` of a sync handler: checked out of the worker's pool on first use only, so a handler that
    never touches it costs no pool checkout and its completion can join a batch."""

    __slots__ = ("_acquire", "conn", "failed")

    def __init__(self, acquire: Callable[[], Any]) -> None:
        self._acquire = acquire
        self.conn: Any = None
        self.failed: BaseException | None = None  # a failed checkout, even if the handler swallowed it

    def get(self) -> Any:
        if self.conn is None:
            try:
                self.conn = self._acquire()
            except BaseException as exc:
                self.failed = exc
                raise
        return self.conn


@dataclass(frozen=True)
class Job:
    """One claimed attempt of a job.

    ``conn`` is a database connection whose open transaction also marks the job done: write through it and
    your writes commit atomically with completion, or roll back when the lease was lost (fenced completion).
    It is ``None`` outside a worker.
    """

    id: int
    queue: str
    payload: Any
    attempts: int
    max_attempts: int
    priority: int = 0
    created_at: datetime | None = None
    visible_at: datetime | None = None
    idempotency_key: str | None = None
    task: str | None = None
    """The job's task name (``None``: the queue's default handler)."""
    _conn: Any = field(default=None, compare=False, repr=False)

    @property
    def conn(self) -> Any:
        c = self._conn
        return c.get() if type(c) is LazyConnection else c

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts

    def with_conn(self, conn: Any) -> Job:
        job = copy.copy(self)  # a shallow copy: several times cheaper than dataclasses.replace, once per job
        object.__setattr__(job, "_conn", conn)
        return job


def job_from_row(row: dict[str, Any]) -> Job:
    return Job(**{name: row[name] for name in CLAIM_COLUMNS if name in row})


@dataclass(frozen=True)
class EnqueueResult:
    """What enqueue did: the job id, and whether an existing job with the same idempotency key was found."""

    id: int
    duplicate: bool = False

    def __int__(self) -> int:
        return self.id


@dataclass(frozen=True)
class QueueStats:
    """Health of one queue (the seed's overview): computed from partial indexes only."""

    queue: str
    ready: int
    delayed: int
    processing: int
    stalled: int
    failed: int
    oldest_ready_age_seconds: float

    @property
    def backlog(self) -> int:
        return self.ready
