"""skiplock: a job queue inside PostgreSQL, claimed with FOR UPDATE SKIP LOCKED."""

from skiplock.errors import (
    ConfigError,
    DatabaseUnavailableError,
    LeaseLostError,
    NonRetryableError,
    PayloadError,
    SkiplockError,
    Snooze,
)
from skiplock.job import EnqueueResult, Job, JobStatus, QueueStats
from skiplock.queue import AsyncQueue, Queue
from skiplock.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "AsyncQueue",
    "ConfigError",
    "DatabaseUnavailableError",
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
    "__version__",
]
