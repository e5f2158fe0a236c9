"""skiplock: a job queue inside PostgreSQL, claimed with FOR UPDATE SKIP LOCKED."""

from typing import TYPE_CHECKING

from skiplock.app import App, Task
from skiplock.errors import (
    ConfigError,
    DatabaseUnavailableError,
    EnqueueError,
    LeaseLostError,
    NonRetryableError,
    PayloadError,
    SkiplockError,
    Snooze,
)
from skiplock.job import EnqueueManyResult, EnqueueResult, Job, JobStatus, QueueStats
from skiplock.queue import AsyncQueue, Queue
from skiplock.settings import Settings

if TYPE_CHECKING:
    from skiplock.worker import Worker

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``skiplock.Worker`` on first use: a producer that only enqueues does not import the worker."""
    if name == "Worker":
        from skiplock.worker import Worker

        return Worker
    raise AttributeError(f"module 'skiplock' has no attribute {name!r}")


__all__ = [
    "App",
    "AsyncQueue",
    "ConfigError",
    "DatabaseUnavailableError",
    "EnqueueError",
    "EnqueueManyResult",
    "EnqueueResult",
    "Job",
    "JobStatus",
    "LeaseLostError",
    "NonRetryableError",
    "PayloadError",
    "Queue",
    "QueueStats",
    "Settings",
    "SkiplockError",
    "Snooze",
    "Task",
    "Worker",
    "__version__",
]
