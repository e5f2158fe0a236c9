"""The task registry: each task's queue and enqueue defaults as the workers that run it register them (pure).

A worker registers its app's tasks at start (``task_register``, the latest registration wins); ``skiplock enqueue
--task`` and :meth:`Queue.task_defaults <skiplock.Queue.task_defaults>` read them (``task_find``), so a job
enqueued by name goes to the task's queue with its defaults, without importing the task's code. ``Queue.enqueue``
and ``enqueue_many`` with ``task=`` read the defaults inside their statement (the ``*_by_name`` statements of
``queries/tasks.sql``): the options given win, then the registered ones, then the producer's.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TaskDefaults:
    """A registered task: its queue and the enqueue defaults it declares (``None``: the producer's setting)."""

    name: str
    queue: str
    priority: int | None = None
    max_attempts: int | None = None
    serial_skip_on_retry: bool | None = None
    app: str = ""
    registered_by: str = ""

    def options(self) -> dict[str, Any]:
        """The enqueue options it sets (explicit ones given to an enqueue win over these)."""
        given = {
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "serial_skip_on_retry": self.serial_skip_on_retry,
        }
        return {k: v for k, v in given.items() if v is not None}


class _Options(Protocol):
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def serial_skip_on_retry(self) -> bool | None: ...


class _Task(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def options(self) -> _Options: ...


def defaults_of(task: _Task) -> TaskDefaults:
    """What a task of an app registers."""
    o = task.options
    return TaskDefaults(task.name, o.queue, o.priority, o.max_attempts, o.serial_skip_on_retry)


def register_params(tasks: Iterable[TaskDefaults], app: str, worker: str) -> dict[str, Any]:
    """Parameters of ``task_register``: one entry per task, sorted by name."""
    rows = sorted(tasks, key=lambda t: t.name)
    return {
        "names": [t.name for t in rows],
        "queues": [t.queue for t in rows],
        "priorities": [t.priority for t in rows],
        "max_attempts": [t.max_attempts for t in rows],
        "serial_skip_on_retry": [t.serial_skip_on_retry for t in rows],
        "app": app,
        "worker": worker,
    }


def defaults_from_row(row: Mapping[str, Any]) -> TaskDefaults:
    return TaskDefaults(
        row["name"], row["queue"], row["priority"], row["max_attempts"], row["serial_skip_on_retry"], row["app"],
        row["registered_by"],
    )  # fmt: skip


def suggest(name: str, known: Iterable[str]) -> str | None:
    """The registered name closest to a misspelt ``name`` (None: nothing close)."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None
