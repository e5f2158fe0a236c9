"""Workflows: build a DAG of jobs in one call and one transaction, as Celery's canvas does (``docs/workflows.md``).

```python
from skiplock.workflows import chain, chord, group

run = chain(fetch.s({"url": u}), parse.s({}), store.s({})).enqueue()      # each after the one before
run = group(resize.s({"size": s}) for s in (64, 128, 256)).enqueue()     # independent, one workflow id
run = chord([part.s({"n": n}) for n in range(10)], total.s({})).enqueue()  # total runs once every part is final
run.wait(timeout=60)                                                      # the last job's result
```

Every job is inserted in one transaction (yours with ``conn=``), tagged with the run's workflow id
(``skiplock cancel --workflow ID``). A job reads what its parents returned from ``job.parent_results``. A job of a
chain runs only once its parent is done, and is cancelled when that parent fails; a chord's callback runs once every
member is final, whatever they ended as (``on_parent_failure="run"``), and sees the results of those that are done.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import psycopg

from skiplock.job import EnqueueResult

if TYPE_CHECKING:
    from skiplock.app import Task

__all__ = ["Canvas", "Chain", "Chord", "Group", "Signature", "WorkflowRun", "chain", "chord", "group"]


class _Enqueues:
    """``enqueue()`` / ``aenqueue()`` of every canvas piece: the whole DAG in one transaction (yours with ``conn=``)."""

    def enqueue(self, conn: psycopg.Connection[Any] | None = None) -> WorkflowRun:
        return _enqueue(cast("Canvas", self), conn)

    async def aenqueue(self, conn: psycopg.AsyncConnection[Any] | None = None) -> WorkflowRun:
        return await _aenqueue(cast("Canvas", self), conn)


@dataclass(frozen=True)
class Signature(_Enqueues):
    """One job to enqueue: a task, its payload and enqueue options (``task.s(payload, **options)``)."""

    task: Task
    payload: Any
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Group(_Enqueues):
    """Jobs that run independently (Celery's ``group``): each waits only for what the group itself follows."""

    members: tuple[Canvas, ...]


@dataclass(frozen=True)
class Chain(_Enqueues):
    """Jobs that run one after the other (Celery's ``chain``): each after every last job of the step before."""

    steps: tuple[Canvas, ...]


@dataclass(frozen=True)
class Chord(_Enqueues):
    """A group and a callback that runs once every member is final, done or not (Celery's ``chord``)."""

    header: Group
    callback: Signature


Canvas = Signature | Group | Chain | Chord


def chain(*steps: Canvas) -> Chain:
    if not steps:
        raise ValueError("chain() needs at least one step")
    return Chain(tuple(steps))


def group(*members: Canvas | Iterable[Canvas]) -> Group:
    """``group(a, b, c)`` or ``group(generator_of_signatures)``."""
    flat: list[Canvas] = []
    for m in members:
        flat.extend([m] if isinstance(m, Signature | Group | Chain | Chord) else m)
    if not flat:
        raise ValueError("group() needs at least one member")
    return Group(tuple(flat))


def chord(header: Group | Iterable[Canvas], callback: Signature) -> Chord:
    return Chord(header if isinstance(header, Group) else group(header), callback)


@dataclass(frozen=True)
class WorkflowRun:
    """An enqueued workflow: its id, every job in enqueue order, and its last jobs (those nothing follows)."""

    id: str
    jobs: list[EnqueueResult]
    last: list[EnqueueResult]

    def wait(self, timeout: float | None = None) -> Any:
        """The result of the last job (a list, in order, when several jobs end the workflow); ``JobFailedError``
        if one of them failed or was cancelled; ``TimeoutError`` when they have not all ended within ``timeout``
        seconds (one bound for the whole wait, not one per job)."""
        deadline = _deadline(timeout)
        values = [r.wait(timeout=_left(deadline)) for r in self.last]
        return values[0] if len(values) == 1 else values

    async def wait_async(self, timeout: float | None = None) -> Any:
        deadline = _deadline(timeout)
        values = [await r.wait_async(timeout=_left(deadline)) for r in self.last]
        return values[0] if len(values) == 1 else values


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


@dataclass(frozen=True)
class _Job:
    """One job of the plan: a signature, its parents (positions in the plan), how it takes a parent's failure."""

    sig: Signature
    parents: tuple[int, ...]
    run_on_parent_failure: bool


def _plan(node: Canvas, parents: tuple[int, ...], out: list[_Job], run: bool = False) -> tuple[int, ...]:
    """Append ``node``'s jobs to ``out`` (after ``parents``); the positions of its last jobs."""
    match node:
        case Signature():
            out.append(_Job(node, parents, run))
            return (len(out) - 1,)
        case Group():
            return tuple(i for m in node.members for i in _plan(m, parents, out))
        case Chain():
            for step in node.steps:
                parents = _plan(step, parents, out)
            return parents
        case Chord():
            return _plan(node.callback, _plan(node.header, parents, out), out, run=True)
    raise TypeError(f"not a workflow step: {node!r}")


def _options(job: _Job, enqueued: list[EnqueueResult], workflow: str) -> dict[str, Any]:
    options = dict(job.sig.options) | {"workflow_id": workflow}
    if job.parents:
        options |= {"after": [enqueued[p].id for p in job.parents]}
        options |= {"on_parent_failure": "run"} if job.run_on_parent_failure else {}
    return options


def _atomic(c: psycopg.Connection[Any], given: psycopg.Connection[Any] | None) -> AbstractContextManager[Any]:
    """Your transaction (``conn=`` not in autocommit: it may still roll the workflow back), else one of its own."""
    return nullcontext() if given is not None and not c.autocommit else c.transaction()


def _aatomic(
    c: psycopg.AsyncConnection[Any], given: psycopg.AsyncConnection[Any] | None
) -> AbstractAsyncContextManager[Any]:
    return nullcontext() if given is not None and not c.autocommit else c.transaction()


def _enqueue(node: Canvas, conn: psycopg.Connection[Any] | None) -> WorkflowRun:
    plan: list[_Job] = []
    last = _plan(node, (), plan)
    workflow = str(uuid.uuid4())
    queue = plan[0].sig.task._app().queue_for(conn)
    results: list[EnqueueResult] = []
    with queue.pool.connection() if conn is None else nullcontext(conn) as c, _atomic(c, conn):
        for job in plan:
            results.append(job.sig.task.enqueue(job.sig.payload, conn=c, **_options(job, results, workflow)))
    bound = [r.bound(queue) for r in results]
    return WorkflowRun(workflow, bound, [bound[i] for i in last])


async def _aenqueue(node: Canvas, conn: psycopg.AsyncConnection[Any] | None) -> WorkflowRun:
    plan: list[_Job] = []
    last = _plan(node, (), plan)
    workflow = str(uuid.uuid4())
    queue = plan[0].sig.task._app().aqueue_for(conn)
    results: list[EnqueueResult] = []
    async with queue.pool.connection() if conn is None else nullcontext(conn) as c, _aatomic(c, conn):
        for job in plan:
            results.append(await job.sig.task.aenqueue(job.sig.payload, conn=c, **_options(job, results, workflow)))
    bound = [r.bound(queue) for r in results]
    return WorkflowRun(workflow, bound, [bound[i] for i in last])
