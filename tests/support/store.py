"""The worker's statements (skiplock.store) run on a test's queue pool, sync or async: what the worker calls, with
explicit ``now=`` and ``conn=`` (the tests move time and hold transactions), for tests of the statements themselves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from skiplock import AsyncQueue, Job, Queue
from skiplock.limits import TaskLimits
from skiplock.sql import Queries
from skiplock.store.run import AsyncRunner, Runner
from skiplock.store.statements import Claim, Recovered, Statements


class WorkerCalls:
    """The worker's calls on a sync :class:`Queue`'s pool."""

    def __init__(self, queue: Queue) -> None:
        self.s = Statements(queue.settings)
        self._run = Runner(queue.settings, queue.pool)

    @property
    def queries(self) -> Queries:
        return self.s.q

    def complete_and_claim(
        self,
        done: Sequence[Job],
        queue: str | Sequence[str],
        *,
        limit: int,
        worker: str,
        now: datetime | None = None,
        lease_seconds: float | None = None,
        leases: Mapping[str, float] | None = None,
        rotate: int = 0,
        limited: bool = True,
        after: Job | None = None,
        shares: Sequence[int] | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> tuple[set[int], list[Job]]:
        call = self.s.complete_and_claim(
            done,
            Claim(queue, worker, lease_seconds, leases, limited=limited, rotate=rotate, after=after, shares=shares),
            limit,
            now,
        )
        return self._run(call, conn)

    def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        return self._run(self.s.confirm_done(jobs, worker))

    def snooze(
        self, jobs: Sequence[Job], delays: Sequence[float], *, worker: str, now: datetime | None = None
    ) -> set[int]:
        return self._run(self.s.snooze(jobs, delays, worker, now))

    def release(self, jobs: Sequence[Job], *, worker: str, now: datetime | None = None) -> set[int]:
        return self._run(self.s.release(jobs, worker, now))

    def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        now: datetime | None = None,
        timeouts: Sequence[float | None] | None = None,
    ) -> set[int]:
        return self._run(self.s.heartbeat(jobs, worker, leases, now, timeouts))

    def recover_expired(
        self,
        *,
        queue: str | None = None,
        queues: Sequence[str] | None = None,
        lease_seconds: float | None = None,
        limit: int = 1000,
        now: datetime | None = None,
    ) -> list[Recovered]:
        return self._run(self.s.recover_expired(queues if queues is not None else queue, lease_seconds, limit, now))

    def release_orphans(
        self, *, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None = None
    ) -> list[int]:
        return self._run(self.s.release_orphans(worker, queues, known, now))

    def register_limits(self, limits: Iterable[TaskLimits], *, worker: str) -> list[dict[str, Any]]:
        return self._run(self.s.register_limits(limits, worker))

    def next_start(self, tasks: Sequence[str], queues: Sequence[str], *, now: datetime | None = None) -> float | None:
        return self._run(self.s.next_start(tasks, queues, now))

    def jobs_table_bytes(self) -> int:
        return self._run(self.s.jobs_table_bytes())

    def cancelled_among(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        return self._run(self.s.cancelled_among(jobs, worker))


class AsyncWorkerCalls:
    """The few worker calls the async tests make, on an :class:`AsyncQueue`'s pool."""

    def __init__(self, queue: AsyncQueue) -> None:
        self.s = Statements(queue.settings)
        self._run = AsyncRunner(queue.settings, queue.pool)

    async def complete_and_claim(
        self, done: Sequence[Job], queue: str | Sequence[str], *, limit: int, worker: str, now: datetime | None = None
    ) -> tuple[set[int], list[Job]]:
        return await self._run(self.s.complete_and_claim(done, Claim(queue, worker), limit, now))

    async def heartbeat(self, jobs: Sequence[Job], *, worker: str, leases: Sequence[float] | None = None) -> set[int]:
        return await self._run(self.s.heartbeat(jobs, worker, leases, None))

    async def release(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        return await self._run(self.s.release(jobs, worker, None))
