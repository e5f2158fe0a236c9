"""Results, dependencies and durable steps: the statements of ``sql/queries/workflows.sql`` and their parameters.
Pure, no I/O, like :mod:`skiplock.store.statements` (``skiplock.store.run`` runs each :class:`Call`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from skiplock.errors import EnqueueError, JobFailedError, PayloadError, ResultError
from skiplock.job import EnqueueResult, Job
from skiplock.sql import Queries
from skiplock.store.call import Call, Result
from skiplock.store.validation import _shown, encode_payload

LINK_OPTIONS = ("after", "on_parent_failure", "workflow_id")
"""Enqueue options that link a job into a workflow (handled here, not by the insert statements)."""
PARENT_FAILURE = ("cancel", "run")
MAX_PARENTS = 10_000
FINAL = frozenset({"done", "failed", "cancelled"})


@dataclass(frozen=True)
class Links:
    """Where new jobs go in a DAG: their parents (existing job ids), what a parent's failure does to them, their
    workflow."""

    parents: tuple[int, ...] = ()
    run_on_parent_failure: bool = False
    workflow_id: str | None = None


def split_links(options: Mapping[str, Any]) -> tuple[Links | None, dict[str, Any]]:
    """The link options of an enqueue, validated (None: a plain job), and the other options."""
    if options.keys().isdisjoint(LINK_OPTIONS):  # the usual call: a plain job
        return None, dict(options)
    rest = {k: v for k, v in options.items() if k not in LINK_OPTIONS}
    after, failure, workflow = (options.get(k) for k in LINK_OPTIONS)
    if after is None and failure is None and workflow is None:
        return None, rest
    if isinstance(after, int | str | bytes) or (after is not None and not isinstance(after, Sequence)):
        raise EnqueueError(f"after must be a list of job ids (got {_shown(after)})")
    parents = tuple(
        dict.fromkeys(int(p) if isinstance(p, int) and not isinstance(p, bool) else -1 for p in after or ())
    )
    if any(p < 1 for p in parents):
        raise EnqueueError(f"after must hold positive job ids (got {_shown(list(after or ()))})")
    if len(parents) > MAX_PARENTS:
        raise EnqueueError(f"after may name at most {MAX_PARENTS} parents (got {len(parents)})")
    if failure is not None and failure not in PARENT_FAILURE:
        raise EnqueueError(f"on_parent_failure must be 'cancel' or 'run' (got {_shown(failure)})")
    if workflow is not None:
        try:
            workflow = str(uuid.UUID(str(workflow)))
        except ValueError:
            raise EnqueueError(f"workflow_id must be a UUID (got {_shown(workflow)})") from None
    if parents and any(rest.get(k) is not None for k in ("unique_key", "unique_keys", "unique_states")):
        raise EnqueueError("a job with parents (after=) cannot be unique: give it an idempotency key instead")
    return Links(parents, failure == "run", workflow), rest


def _check_found(links: Links, found: Iterable[int]) -> None:
    present = set(found)
    missing = [p for p in links.parents if p not in present]
    if missing:
        shown = ", ".join(map(str, missing[:10]))
        raise EnqueueError(f"after= names job(s) that do not exist: {shown} (nothing was enqueued)")


def lock_parents(q: Queries, links: Links) -> Call[None]:
    """Lock the parents before the children are inserted; :class:`EnqueueError` naming those that do not exist."""
    return Call(
        q.job_lock_parents, {"parents": list(links.parents)}, lambda r: _check_found(links, (x["id"] for x in r.rows))
    )


def check_not_own_parent(result: EnqueueResult, links: Links) -> None:
    """The only cycle an enqueue can name: its idempotency key found an existing job that is among its parents."""
    if result.duplicate and result.id in links.parents:
        raise EnqueueError(
            f"after= names job {result.id}, which is the job this enqueue's idempotency key found: a job cannot wait "
            "for itself (a cycle)"
        )


def link(q: Queries, children: Sequence[int], links: Links) -> Call[None]:
    """Make ``children`` (inserted in this transaction, after :func:`lock_parents`) wait for their parents."""
    if not links.parents:
        return Call(q.job_set_workflow, {"ids": list(children), "workflow": links.workflow_id}, lambda r: None)
    params = {
        "children": list(children),
        "parents": list(links.parents),
        "run": links.run_on_parent_failure,
        "workflow": links.workflow_id,
    }

    return Call(q.job_link, params, lambda r: _check_found(links, r.rows[0]["found"]))


def encode_result(value: Any, max_bytes: int) -> str | None:
    """A handler's return value as JSON text for the ``result`` column (None: it returned None, nothing stored), or
    :class:`ResultError`."""
    return _encode_returned(value, max_bytes, "the task's return value cannot be stored")


def encode_step(value: Any, max_bytes: int, name: str) -> str | None:
    """A step's return value as JSON text (None stays NULL), or :class:`ResultError` (nothing is stored: the attempt
    fails, and the next one runs the step again)."""
    return _encode_returned(value, max_bytes, f"step {name!r}: its return value cannot be stored")


def _encode_returned(value: Any, max_bytes: int, refusal: str) -> str | None:
    if value is None:
        return None
    try:
        return encode_payload(value, max_bytes)
    except PayloadError as exc:
        message = str(exc).replace("payload", "return value", 1)
        raise ResultError(f"{refusal}: {message}") from None


def complete_results(
    q: Queries, done: Sequence[tuple[Job, str]], worker: str, now: datetime | None = None
) -> Call[set[int]]:
    """Mark jobs done with their results, fenced; the ids completed."""
    params = {
        "ids": [j.id for j, _ in done],
        "attempts": [j.attempts for j, _ in done],
        "results": [r for _, r in done],
        "worker": worker,
        "now": now,
    }
    return Call(q.job_complete_results, params, lambda r: {row["id"] for row in r.rows})


def complete_one_result(q: Queries, job: Job, worker: str, result: str) -> Call[bool]:
    params = {"id": job.id, "attempts": job.attempts, "worker": worker, "result": result}
    return Call(q.job_complete_one_result, params, lambda r: bool(r.rows))


def await_job(q: Queries, job_id: int) -> Call[bool]:
    """Ask for a notification when ``job_id`` ends (False: final already, or asked before)."""
    return Call(q.job_await, {"id": job_id}, lambda r: bool(r.rows))


def outcome(q: Queries, job_id: int) -> Call[dict[str, Any] | None]:
    return Call(q.job_outcome, {"id": job_id}, lambda r: r.rows[0] if r.rows else None)


def parent_results(q: Queries, job_id: int) -> Call[dict[int, Any]]:
    """The results of a job's parents (those not purged), by parent id."""
    return Call(q.job_parent_results, {"id": job_id}, lambda r: {row["id"]: row["result"] for row in r.rows})


def relatives(q: Queries, job_id: int) -> Call[dict[str, Any]]:
    """A job's parents, children (id and status) and steps (name and result)."""

    def read(r: Result) -> dict[str, Any]:
        out: dict[str, Any] = {"parents": [], "children": [], "steps": {}}
        for row in r.rows:
            kind = row["kind"]
            if kind.startswith("step:"):
                out["steps"][kind[5:]] = row["result"]
            else:
                out["parents" if kind == "parent" else "children"].append({"id": row["id"], "status": row["status"]})
        return out

    return Call(q.job_relatives, {"id": job_id}, read)


def step_get(q: Queries, job_id: int, name: str) -> Call[tuple[bool, Any]]:
    """(stored?, value) of one step."""
    return Call(
        q.job_step_get, {"id": job_id, "name": name}, lambda r: (True, r.rows[0]["result"]) if r.rows else (False, None)
    )


def step_put(q: Queries, job_id: int, name: str, encoded: str | None) -> Call[Any]:
    """Store a step's result; the value stored (an earlier attempt's, if one stored it first)."""
    return Call(q.job_step_put, {"id": job_id, "name": name, "result": encoded}, lambda r: r.rows[0]["result"])


def workflow_ids(q: Queries, workflow: str) -> Call[list[int]]:
    try:
        wid = str(uuid.UUID(str(workflow)))
    except ValueError:
        raise ValueError(f"workflow id must be a UUID (got {_shown(workflow)})") from None
    return Call(q.job_workflow_ids, {"workflow": wid}, lambda r: [row["id"] for row in r.rows])


def settled(row: dict[str, Any] | None, job_id: int) -> tuple[bool, Any]:
    """(final?, result) of a waited-for job, or :class:`JobFailedError` when it ended failed or cancelled (or is
    gone)."""
    if row is None:
        raise JobFailedError(job_id, "missing", "the job no longer exists (purged, or never committed)")
    if row["status"] == "done":
        return True, row["result"]
    if row["status"] in FINAL:
        raise JobFailedError(job_id, row["status"], row["last_error"])
    return False, None
