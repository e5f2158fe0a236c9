"""Tasks: the registry of job kinds an application defines. Building it needs no database.

An :class:`App` is importable by producers and workers alike. ``@app.task`` registers a sync or async function
taking ``job`` under a stable name (stored in the row's ``task`` column), with defaults that enqueue options
override. A worker started with the app runs every task it registers; a job whose task it does not know is
retried with a clear error, never dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from skiplock.errors import ConfigError
from skiplock.settings import QUEUE_NAME

TASK_NAME_MAX = 200
"""Longest task name (the database checks it too)."""


@dataclass(frozen=True)
class TaskOptions:
    """What a task may carry as defaults. ``None`` means "the worker's or producer's setting"."""

    queue: str = "default"
    priority: int | None = None
    max_attempts: int | None = None
    lease_seconds: float | None = None
    backoff_base_seconds: float | None = None
    backoff_cap_seconds: float | None = None
    backoff_jitter: float | None = None
    non_retryable: tuple[type[BaseException], ...] = ()
    timeout_seconds: float | None = None
    """Longest run of one attempt: an async handler is cancelled, a sync one abandoned, the job retried."""

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.queue, str) or not QUEUE_NAME.match(self.queue):
            problems.append(f"queue {self.queue!r} must match {QUEUE_NAME.pattern}")
        p = self.priority
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or not -32768 <= p <= 32767):
            problems.append(f"priority must be an integer within -32768..32767 (got {self.priority!r})")
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or not 1 <= self.max_attempts <= 1000
        ):
            problems.append(f"max_attempts must be an integer within 1..1000 (got {self.max_attempts!r})")
        for name in ("lease_seconds", "backoff_base_seconds", "backoff_cap_seconds", "timeout_seconds"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value <= 0):
                problems.append(f"{name} must be a number > 0 (got {value!r})")
        if self.backoff_jitter is not None and not 0.0 <= self.backoff_jitter <= 1.0:
            problems.append(f"backoff_jitter must be within [0, 1] (got {self.backoff_jitter!r})")
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.non_retryable):
            problems.append("non_retryable must be a tuple of exception types")
        if problems:
            raise ConfigError("invalid task options: " + "; ".join(problems))


OPTION_NAMES = frozenset(f.name for f in fields(TaskOptions))


@dataclass(frozen=True)
class Task:
    """One registered job kind: a name, a function taking ``job``, and its defaults."""

    name: str
    func: Callable[..., Any]
    is_async: bool
    options: TaskOptions = field(default_factory=TaskOptions)
    app: App | None = field(default=None, compare=False, repr=False)

    @property
    def queue(self) -> str:
        return self.options.queue

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the task calls the function (so tests and other code can still use it directly)."""
        return self.func(*args, **kwargs)


def is_async_callable(func: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - async callable objects
    )


def check_task_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > TASK_NAME_MAX or not name.isprintable():
        raise ConfigError(f"task name {name!r} must be 1..{TASK_NAME_MAX} printable characters")
    return name


class App:
    """A registry of tasks. ``App()`` needs no database; workers and producers import the same object."""

    def __init__(self, name: str = "skiplock") -> None:
        self.name = name
        self._tasks: dict[str, Task] = {}

    def task(self, func: Callable[..., Any] | None = None, *, name: str | None = None, **defaults: Any) -> Any:
        """Register ``func`` (usable as ``@app.task`` or ``@app.task(name=..., queue=..., ...)``).

        ``name`` defaults to ``module.function``. Defaults: ``queue``, ``priority``, ``max_attempts``,
        ``lease_seconds``, ``backoff_base_seconds``, ``backoff_cap_seconds``, ``backoff_jitter``,
        ``non_retryable`` (exception types that fail the job at once) and ``timeout_seconds``. Two tasks under
        one name is an error.
        """
        unknown = set(defaults) - OPTION_NAMES
        if unknown:
            raise ConfigError(f"unknown task option(s): {', '.join(sorted(unknown))} (known: {sorted(OPTION_NAMES)})")
        if "non_retryable" in defaults:
            value = defaults["non_retryable"]
            defaults["non_retryable"] = (value,) if isinstance(value, type) else tuple(value)
        options = TaskOptions(**defaults)

        def register(f: Callable[..., Any]) -> Task:
            if isinstance(f, Task):
                raise ConfigError(f"{f.name!r} is already a task")
            if not callable(f):
                raise ConfigError(f"@app.task needs a function, got {type(f).__name__}")
            task_name = check_task_name(name if name is not None else f"{f.__module__}.{f.__qualname__}")
            return self.register(Task(task_name, f, is_async_callable(f), options, self))

        return register(func) if func is not None else register

    def register(self, task: Task) -> Task:
        if task.name in self._tasks:
            raise ConfigError(f"task {task.name!r} is registered twice in app {self.name!r}")
        self._tasks[task.name] = task
        return task

    def get(self, name: str) -> Task | None:
        return self._tasks.get(name)

    @property
    def tasks(self) -> dict[str, Task]:
        return dict(self._tasks)

    @property
    def queues(self) -> tuple[str, ...]:
        """Every queue the tasks name, in registration order."""
        return tuple(dict.fromkeys(t.queue for t in self._tasks.values()))

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks
