"""Tasks: the registry of job kinds an application defines. Building it needs no database.

An :class:`App` is importable by producers and workers alike. ``@app.task`` registers a sync or async function
taking ``job`` under a stable name (stored in the row's ``task`` column), with defaults that enqueue options
override. A worker started with the app runs every task it registers; a job whose task it does not know is
retried with a clear error, never dropped.

A producer enqueues through the task: ``send_receipt.enqueue(payload, ...)`` (or ``await ....aenqueue``), after
binding the app to a database once (``app.connect(dsn=...)`` / ``await app.aconnect(...)``), or inside its own
transaction with ``conn=`` (no binding needed).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Unpack

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock.errors import ConfigError, EnqueueError
from skiplock.job import EnqueueManyResult, EnqueueResult
from skiplock.knobs import knob
from skiplock.limits import TaskLimits, concurrency_problem, parse_rate_limit
from skiplock.metrics import count_duplicates
from skiplock.queue import (
    TASK_NAME_MAX,
    AsyncQueue,
    Queue,
    TaskEnqueueManyOptions,
    TaskEnqueueOptions,
    task_name_problem,
)
from skiplock.schedule import Schedule, Timing, timing_problem
from skiplock.settings import QUEUE_NAME, Settings
from skiplock.store.validation import timeout_problem
from skiplock.unique import states_for, unique_key, unique_problem

__all__ = ["TASK_NAME_MAX", "App", "Task", "TaskOptions"]

if TYPE_CHECKING:
    from skiplock.workflows import Signature


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
    cron: str | None = None
    """Run periodically: a cron expression (5 fields, or 6 with seconds first), in ``timezone``."""
    every: float | None = None
    """Run periodically every this many seconds (ticks at multiples of it since the Unix epoch)."""
    timezone: str | None = None
    """The time zone of ``cron`` (an IANA name; default UTC)."""
    unique_for: float | None = None
    """Unique within periods of this many seconds (aligned to the Unix epoch)."""
    unique_by: str | tuple[str, ...] | None = None
    """Unique by the whole payload (``"payload"``) or by some payload keys; None: by the task alone."""
    unique_states: tuple[str, ...] | None = None
    """The statuses in which a job holds its unique key (default pending and processing, plus done with
    ``unique_for``)."""
    unique_conflict: str | None = None
    """On a duplicate: ``"skip"`` (default: return the existing job) or ``"replace"`` (a pending holder takes the
    new payload, priority and run time)."""
    global_concurrency: int | None = None
    """At most this many jobs of the task run at once across every worker (registered in the database)."""
    rate_limit: str | None = None
    """At most this many starts per period across every worker, written ``"100/m"`` (also s, h, d; ``"3/10s"``)."""
    serial_skip_on_retry: bool | None = None
    """Default of the enqueue option: later jobs of a serial key may run while one of this task waits for a retry."""

    def __post_init__(self) -> None:
        problems = []
        if problem := self.periodic_problem():
            problems.append(problem)
        if problem := unique_problem(self.unique_for, self.unique_by, self.unique_states, self.unique_conflict):
            problems.append(problem)
        if problem := concurrency_problem(self.global_concurrency):
            problems.append(problem)
        if self.rate_limit is not None:
            try:
                parse_rate_limit(self.rate_limit)
            except ConfigError as exc:
                problems.append(str(exc))
        if self.serial_skip_on_retry is not None and not isinstance(self.serial_skip_on_retry, bool):
            problems.append(f"serial_skip_on_retry must be True or False (got {self.serial_skip_on_retry!r})")
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
        for name in ("lease_seconds", "backoff_base_seconds", "backoff_cap_seconds"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value <= 0):
                problems.append(f"{name} must be a number > 0 (got {value!r})")
        if self.timeout_seconds is not None and (problem := timeout_problem(self.timeout_seconds)):
            problems.append(problem)  # the bound a job's own timeout has: a worker arms a timer with it
        if self.backoff_jitter is not None and not 0.0 <= self.backoff_jitter <= 1.0:
            problems.append(f"backoff_jitter must be within [0, 1] (got {self.backoff_jitter!r})")
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.non_retryable):
            problems.append("non_retryable must be a tuple of exception types")
        if problems:
            raise ConfigError("invalid task options: " + "; ".join(problems))

    def periodic_problem(self) -> str | None:
        if self.cron is None and self.every is None:
            return "timezone needs cron" if self.timezone is not None else None
        return timing_problem(self.cron, self.every, self.timezone or "UTC")

    @property
    def timing(self) -> Timing | None:
        """When the task runs by itself (None: only when enqueued)."""
        if self.cron is None and self.every is None:
            return None
        return Timing(self.cron, self.every, self.timezone or "UTC")

    @property
    def unique(self) -> bool:
        return self.unique_for is not None or self.unique_by is not None


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

    @property
    def limits(self) -> TaskLimits:
        """The cluster-wide limits of this task (global concurrency, rate), as workers register them."""
        rate = self.options.rate_limit
        return TaskLimits(self.name, self.options.global_concurrency, parse_rate_limit(rate) if rate else None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the task calls the function (so tests and other code can still use it directly)."""
        return self.func(*args, **kwargs)

    # producer side
    def s(self, payload: Any, **options: Unpack[TaskEnqueueOptions]) -> Signature:
        """This task with a payload and enqueue options, for a workflow (:mod:`skiplock.workflows`; Celery's
        ``.s()``): nothing is enqueued until the workflow is."""
        from skiplock.workflows import Signature

        return Signature(self, payload, dict(options))

    def enqueue(
        self, payload: Any, *, conn: psycopg.Connection[Any] | None = None, **options: Unpack[TaskEnqueueOptions]
    ) -> EnqueueResult:
        """Enqueue one job of this task: its defaults (queue, priority, max_attempts) apply, explicit options win.
        With ``conn=`` the job is inserted in your transaction (it exists only if you commit)."""
        queue, merged = self.enqueue_options(options)
        q = self._app().queue_for(conn)
        result = q.enqueue(queue, payload, conn=conn, **_code_defaults(merged, q), **self.unique_options([payload]))
        return count_duplicates(self.name, result)

    async def aenqueue(
        self,
        payload: Any,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[TaskEnqueueOptions],
    ) -> EnqueueResult:
        """The async twin of :meth:`enqueue` (``conn`` is a ``psycopg.AsyncConnection``)."""
        queue, merged = self.enqueue_options(options)
        unique = self.unique_options([payload])
        q = self._app().aqueue_for(conn)
        return count_duplicates(
            self.name, await q.enqueue(queue, payload, conn=conn, **_code_defaults(merged, q), **unique)
        )

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[TaskEnqueueManyOptions],
    ) -> EnqueueManyResult:
        """Enqueue many jobs of this task in one transaction (see :meth:`Queue.enqueue_many`)."""
        queue, merged = self.enqueue_options(options)
        payloads, unique = self.unique_many(payloads)
        q = self._app().queue_for(conn)
        return count_duplicates(
            self.name, q.enqueue_many(queue, payloads, conn=conn, **_code_defaults(merged, q), **unique)
        )

    async def aenqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[TaskEnqueueManyOptions],
    ) -> EnqueueManyResult:
        queue, merged = self.enqueue_options(options)
        payloads, unique = self.unique_many(payloads)
        q = self._app().aqueue_for(conn)
        return count_duplicates(
            self.name, await q.enqueue_many(queue, payloads, conn=conn, **_code_defaults(merged, q), **unique)
        )

    def unique_options(self, payloads: list[Any]) -> dict[str, Any]:
        """The unique options of enqueueing ``payloads`` (none for a task that is not unique)."""
        o = self.options
        if not o.unique:
            return {}
        now = time.time()
        try:
            keys = [unique_key(self.name, p, unique_by=o.unique_by, unique_for=o.unique_for, now=now) for p in payloads]
        except (ValueError, TypeError) as exc:
            raise EnqueueError(f"task {self.name!r}: {exc}") from None
        out: dict[str, Any] = {"unique_states": states_for(o.unique_for, o.unique_states)}
        out |= {"unique_key": keys[0]} if len(payloads) == 1 else {"unique_keys": keys}
        return out | ({"unique_conflict": o.unique_conflict} if o.unique_conflict else {})

    def unique_many(self, payloads: Iterable[Any]) -> tuple[Iterable[Any], dict[str, Any]]:
        if not self.options.unique:
            return payloads, {}
        given = list(payloads)
        unique = self.unique_options(given)
        if "unique_key" in unique:
            unique["unique_keys"] = [unique.pop("unique_key")]
        return given, unique

    @property
    def schedule(self) -> Schedule | None:
        """The task's schedule as stored in the database (None: not periodic)."""
        timing = self.options.timing
        if timing is None:
            return None
        app = self._app()
        priority, attempts = self.options.priority, self.options.max_attempts
        return Schedule(self.name, app.name, self.queue, timing, 0 if priority is None else priority, attempts or 5)

    def enqueue_options(self, options: Mapping[str, Any]) -> tuple[str, Any]:
        """The queue and the options of one enqueue of this task: defaults first, explicit options (not None) win."""
        if "task" in options:
            raise EnqueueError(f"task.enqueue takes no task= option: {self.name!r} is the task")
        explicit: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        queue: str = explicit.pop("queue", self.options.queue)
        defaults = {
            "priority": self.options.priority,
            "max_attempts": self.options.max_attempts,
            "serial_skip_on_retry": self.options.serial_skip_on_retry,
        }
        merged = {k: v for k, v in defaults.items() if v is not None} | explicit
        return queue, merged | {"task": self.name}

    def _app(self) -> App:
        if self.app is None:
            raise ConfigError(f"task {self.name!r} belongs to no App: register it with @app.task")
        return self.app


def _code_defaults(merged: dict[str, Any], q: Queue | AsyncQueue) -> dict[str, Any]:
    """A task object's enqueue knows its defaults from the code: every option the registry could fill is given (the
    producer's defaults where the task declares none), so it takes the plain statements (COPY for batches), never the
    by-name ones that look the registry up."""
    return {"priority": 0, "max_attempts": q.settings.max_attempts, "serial_skip_on_retry": False} | merged


def is_async_callable(func: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - async callable objects
    )


def check_task_name(name: str) -> str:
    if problem := task_name_problem(name):
        raise ConfigError(problem)
    return name


class App:
    """A registry of tasks. ``App()`` needs no database; workers and producers import the same object.

    ``schema`` is the PostgreSQL schema of the jobs table (default ``skiplock``); settings given to
    :meth:`connect` must name the same one.
    """

    def __init__(self, name: str = "skiplock", *, schema: str | None = None) -> None:
        if schema is not None and (problem := knob("schema").problem(schema)):
            raise ConfigError(problem)
        self.name = name
        self.schema = schema
        self._tasks: dict[str, Task] = {}
        self._queue: Queue | None = None
        self._aqueue: AsyncQueue | None = None

    def task(self, func: Callable[..., Any] | None = None, *, name: str | None = None, **defaults: Any) -> Any:
        """Register ``func`` (usable as ``@app.task`` or ``@app.task(name=..., queue=..., ...)``).

        ``name`` defaults to ``module.function``. Defaults: ``queue``, ``priority``, ``max_attempts``,
        ``lease_seconds``, ``backoff_base_seconds``, ``backoff_cap_seconds``, ``backoff_jitter``,
        ``non_retryable`` (exception types that fail the job at once), ``timeout_seconds``, and the cluster-wide
        ``global_concurrency`` (at most N running) and ``rate_limit`` (``"100/m"``: at most N starts per period),
        plus ``serial_skip_on_retry`` (see the serial key enqueue option). Periodic: ``cron`` or ``every`` (and
        ``timezone``). Unique: ``unique_for``, ``unique_by``, ``unique_states``, ``unique_conflict``. Two tasks
        under one name is an error.
        """
        unknown = set(defaults) - OPTION_NAMES
        if unknown:
            raise ConfigError(f"unknown task option(s): {', '.join(sorted(unknown))} (known: {sorted(OPTION_NAMES)})")
        if "non_retryable" in defaults:
            value = defaults["non_retryable"]
            defaults["non_retryable"] = (value,) if isinstance(value, type) else tuple(value)
        for name_ in ("unique_by", "unique_states"):  # lists become tuples (the options are frozen)
            value = defaults.get(name_)
            if isinstance(value, list):
                defaults[name_] = tuple(value)
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
    def schedules(self) -> list[Schedule]:
        """The schedules of this app's periodic tasks (``cron=`` or ``every=``)."""
        return [s for s in (t.schedule for t in self._tasks.values()) if s is not None]

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

    # binding to a database (producers)
    def settings_for(self, dsn: str | None = None, settings: Settings | None = None) -> Settings:
        """Settings of this app's producer: from the arguments only (``Settings.from_env()`` reads the env)."""
        if settings is None:
            return Settings(dsn=dsn, schema=self.schema or "skiplock")
        if self.schema is not None and settings.schema != self.schema:
            raise ConfigError(f"settings name schema {settings.schema!r}, but app {self.name!r} uses {self.schema!r}")
        return settings if dsn is None else settings.replace(dsn=dsn)

    def connect(
        self,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        pool: ConnectionPool[Any] | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> Queue:
        """Bind the app to a database for sync enqueues (``task.enqueue``); returns the :class:`Queue` it uses.
        ``app.close()`` (or closing that queue) unbinds it."""
        if self._queue is not None and not self._queue.closed:
            raise ConfigError(f"app {self.name!r} is already connected: close() it first")
        s = self.settings_for(dsn, settings)
        self._queue = Queue(settings=s, pool=pool, max_size=max_size, connect_timeout=connect_timeout)
        return self._queue

    async def aconnect(
        self,
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        max_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> AsyncQueue:
        """Bind the app to a database for async enqueues (``await task.aenqueue``); ``await app.aclose()`` unbinds."""
        if self._aqueue is not None and not self._aqueue.closed:
            raise ConfigError(f"app {self.name!r} is already connected (async): aclose() it first")
        s = self.settings_for(dsn, settings)
        self._aqueue = await AsyncQueue.open(settings=s, pool=pool, max_size=max_size, connect_timeout=connect_timeout)
        return self._aqueue

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    async def aclose(self) -> None:
        if self._aqueue is not None:
            await self._aqueue.close()
            self._aqueue = None

    def queue_for(self, conn: psycopg.Connection[Any] | None) -> Queue:
        """The bound queue; with ``conn`` and no binding, a pool-less one that runs on ``conn``."""
        if self._queue is not None and not self._queue.closed:
            return self._queue
        if conn is not None:
            return Queue.detached(self.settings_for())
        raise ConfigError(self._not_connected("app.connect(dsn=...)"))

    def aqueue_for(self, conn: psycopg.AsyncConnection[Any] | None) -> AsyncQueue:
        if self._aqueue is not None and not self._aqueue.closed:
            return self._aqueue
        if conn is not None:
            return AsyncQueue.detached(self.settings_for())
        raise ConfigError(self._not_connected("await app.aconnect(dsn=...)"))

    def _not_connected(self, how: str) -> str:
        return f"app {self.name!r} is not connected to a database: call {how} once, or pass conn= (your transaction)"

    def task_named(self, name: str) -> Task:
        """The task registered under ``name``, or :class:`EnqueueError` naming the tasks there are."""
        task = self._tasks.get(name)
        if task is None:
            known = ", ".join(sorted(self._tasks)[:20]) or "none"
            raise EnqueueError(task_name_problem(name) or f"no task {name!r} in app {self.name!r} (tasks: {known})")
        return task

    def enqueue(
        self,
        name: str,
        payload: Any,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[TaskEnqueueOptions],
    ) -> EnqueueResult:
        """Enqueue a job of the task registered under ``name`` (an unknown name is an :class:`EnqueueError`)."""
        return self.task_named(name).enqueue(payload, conn=conn, **options)

    async def aenqueue(
        self,
        name: str,
        payload: Any,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[TaskEnqueueOptions],
    ) -> EnqueueResult:
        return await self.task_named(name).aenqueue(payload, conn=conn, **options)
