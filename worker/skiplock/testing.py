"""Helpers for your own test suite: run an app's due jobs inline against a real database, and look at what was
enqueued, without starting a worker process.

```python
from skiplock.testing import enqueued, run_jobs

def test_checkout_sends_a_receipt(settings):
    checkout(order_id=42)                                  # your code enqueues a job
    [job] = enqueued(settings=settings, task="shop.tasks.send_receipt")
    assert job["payload"] == {"order": 42}
    report = run_jobs(app, settings=settings)              # runs it (and anything it enqueues) now
    assert report.done == [job["id"]] and not report.failed
```

``run_jobs`` uses the real worker (fenced completion, retries with backoff, unknown tasks), so what passes here
behaves the same in production. It stops when no job of the app's queues is due and none runs, or at the
bounds (``max_jobs`` run, ``timeout`` seconds), whichever comes first.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from skiplock.app import App
from skiplock.errors import ConfigError
from skiplock.job import Job, Outcome
from skiplock.settings import Settings
from skiplock.store.run import execute
from skiplock.store.statements import Statements
from skiplock.worker import Worker, loops


@dataclass
class RunReport:
    """Job ids by what their last attempt in this run did."""

    done: list[int] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    """Jobs whose task the app does not register (retried or failed as a worker would)."""
    snoozed: list[int] = field(default_factory=list)
    """Jobs whose handler raised Snooze (due again later: not run again in this call unless due)."""
    cancelled: list[int] = field(default_factory=list)
    """Jobs cancelled while they ran (their result was refused and their job.conn writes rolled back)."""
    lease_lost: list[int] = field(default_factory=list)
    """Jobs whose result was refused because their lease was lost (recovered by another worker meanwhile)."""
    timed_out: bool = False

    @property
    def ran(self) -> int:
        return len(self.done) + len(self.retried) + len(self.failed)


def _settings(settings: Settings | None, dsn: str | None) -> Settings:
    if settings is None and dsn is None:
        raise ConfigError("pass settings= or dsn=")
    return settings if settings is not None else Settings(dsn=dsn)


def run_jobs(
    app: App,
    *,
    settings: Settings | None = None,
    dsn: str | None = None,
    queues: tuple[str, ...] | None = None,
    handler: Callable[..., Any] | None = None,
    max_jobs: int = 10_000,
    timeout: float = 30.0,
) -> RunReport:
    """Run every due job of ``app`` on its queues (or ``queues``) until none is due; see the module docs.

    Safe to call from sync tests and from inside a running event loop (it runs the worker in a thread then)."""
    s = _settings(settings, dsn)
    s = s.replace(listen=False, metrics_port=0, poll_seconds=min(s.poll_seconds, 0.05), queues=queues or s.queues)
    last: dict[int, tuple[Job, Outcome]] = {}
    ran = 0

    def observe(job: Job, outcome: Outcome) -> None:
        nonlocal ran
        last[job.id] = (job, outcome)
        ran += 1
        if ran == max_jobs:  # the jobs still running finish; the claimed ones not started are handed back
            worker.request_stop()

    worker = Worker(app, settings=s, handler=handler, observe=observe)
    timed_out = False

    async def main() -> None:
        nonlocal timed_out
        task = asyncio.create_task(worker.run(until_idle=True))
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            timed_out = True
            worker.request_stop()
            await task

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loops.run(main(), s.event_loop)
    else:  # called from async code: do not block its loop's thread with a nested loop
        errors: list[BaseException] = []

        def in_thread() -> None:
            try:
                loops.run(main(), s.event_loop)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=in_thread, daemon=True)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
    report = RunReport(timed_out=timed_out)
    for job_id, (job, outcome) in last.items():
        name: str = outcome
        if outcome in ("unknown_task", "timed_out"):  # retried, or failed once its attempts are spent
            if outcome == "unknown_task":
                report.unknown.append(job_id)
            name = "failed" if job.attempts >= job.max_attempts else "retried"
        getattr(report, name).append(job_id)
    return report


def enqueued(
    *,
    settings: Settings | None = None,
    dsn: str | None = None,
    task: str | None = None,
    queue: str | None = None,
    status: str | None = "pending",
    conn: psycopg.Connection[Any] | None = None,
) -> list[dict[str, Any]]:
    """The jobs enqueued (oldest first), filtered by task, queue and status (``None``: any status). With ``conn``,
    read inside that connection's transaction (jobs enqueued in it and not yet committed included)."""
    s = settings if settings is not None else (Settings(dsn=dsn) if dsn else Settings())
    call = Statements(s).list_enqueued(task, queue, status)
    if conn is not None:
        return execute(conn, call)
    with psycopg.connect(_settings(settings, dsn).require_dsn(), autocommit=True) as own:
        return execute(own, call)
