"""skiplock: a job queue inside PostgreSQL, claimed with FOR UPDATE SKIP LOCKED."""

from skiplock.app import App, Task
from skiplock.errors import (
    ConfigError,
    DatabaseUnavailableError,
    EnqueueError,
    LeaseLostError,
    NonRetryableError,
    PayloadError,
    SkiplockError,
)
from skiplock.job import EnqueueResult, Job, JobStatus, QueueStats
from skiplock.queue import AsyncQueue, Queue
from skiplock.settings import Settings

# Worker: exported here by the integrator once the embeddable worker lands (from skiplock.worker import Worker).

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncQueue",
    "ConfigError",
    "DatabaseUnavailableError",
    "EnqueueError",
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
    "Task",
    "__version__",
]
