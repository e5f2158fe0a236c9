"""The statements and their parameters: each method of :class:`Statements` turns one intent into a :class:`Call`
(the named query, its parameters, and how its rows become the result). Pure, no I/O: ``skiplock.store.run`` runs
a ``Call`` on a connection, sync or async, so every caller sends the same SQL with the same parameters.
"""

from __future__ import annotations

import functools
import json
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from skiplock.backoff import backoff_seconds
from skiplock.errors import EnqueueError, NonRetryableError, format_error, format_traceback
from skiplock.job import CLAIM_ROW, EnqueueManyResult, EnqueueResult, Job, QueueStats, decode_payload, job_from_claim
from skiplock.limits import TaskLimits, register_params
from skiplock.settings import Settings
from skiplock.sql import Queries, queries_for
from skiplock.store.call import Call, Result
from skiplock.store.copy import CopyJobs, copies_defaults, reserved
from skiplock.store.tasks import TaskDefaults, defaults_from_row
from skiplock.store.tasks import register_params as task_register_params
from skiplock.store.validation import (
    _shown,
    check_queue_name,
    default_params,
    enqueue_many_params,
    enqueue_params,
)

T = TypeVar("T")
FlowCursor = tuple[int, datetime]
"""Where the operator's previous flow read stopped: the highest job id, the database's clock."""
HISTORY_ERROR_CHARS = 1000
"""Longest error text of one entry of a job's error history (``errors``: the last 20 failed attempts)."""
PURGE_BATCH = 5000
"""Rows of each status one purge batch deletes (one statement, one short transaction)."""
PURGE_STATUSES = ("done", "failed", "cancelled")
WAITING_REASONS = ("serial_key", "concurrency", "rate")
"""Why a due job waits (queue_waiting): an earlier or running job of its serial key, a global concurrency limit,
a rate limit."""


def _names(queues: str | Sequence[str]) -> list[str]:
    return [queues] if isinstance(queues, str) else list(queues)


@functools.lru_cache(maxsize=64)
def text_array(names: tuple[str, ...]) -> str:
    """``names`` as a text[] literal (cast in the statement): a claimer sends the same queues with every claim, and
    psycopg's list dumper costs more than the statement's own use of them."""
    quoted = ['"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in names]
    return "{" + ",".join(quoted) + "}"


@dataclass(frozen=True)
class Claim:
    """What a claim asks for besides its size and the jobs it completes: the queues (round-robin from the one after
    ``rotate``, at most ``shares[i]`` of queue ``i``, by default ``per_queue_limit(limit, queues)`` of each), the
    claimer's identity, lease (None: the settings') and per-task lease overrides; ``limited=False``: the claimer
    knows no task limits, so it leaves jobs of limited tasks alone and skips the slot bookkeeping (the cheaper
    variant); ``after``: only jobs of its priority that come after it in claim order (one queue; the index scan
    starts there)."""

    queues: str | Sequence[str]
    worker: str
    lease_seconds: float | None = None
    leases: Mapping[str, float] | None = None
    limited: bool = True
    rotate: int = 0
    after: Job | None = None
    shares: Sequence[int] | None = None


def per_queue_limit(limit: int, queues: int) -> int:
    """Most candidates one claim takes (and locks) per queue: the claim locks about ``limit`` rows in all."""
    return max(1, -(-limit // max(1, queues)))


def fence_params(jobs: Sequence[Job], worker: str, now: datetime | None) -> dict[str, Any]:
    """The attempts a fenced statement writes: ids and attempts as array literals (``{1,2,3}``, cast in the
    statement), as for the claim (see :func:`complete_and_claim_params`): psycopg's list dumper searches each
    element's text with a regular expression."""
    return {
        "ids": "{" + ",".join([str(j.id) for j in jobs]) + "}",
        "attempts": "{" + ",".join([str(j.attempts) for j in jobs]) + "}",
        "worker": worker,
        "now": now,
    }


def fence_one_params(job: Job, worker: str) -> dict[str, Any]:
    """Parameters of ``job_complete_one``: one job's attempt, fenced by primary key."""
    return {"id": job.id, "attempts": job.attempts, "worker": worker}


def heartbeat_params(
    jobs: Sequence[Job],
    worker: str,
    leases: Sequence[float],
    now: datetime | None,
    timeouts: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """``timeouts``: each job's timeout (None: none), past which its lease is no longer renewed."""
    if len(leases) != len(jobs):
        raise ValueError(f"{len(leases)} leases for {len(jobs)} jobs")
    limits = [None] * len(jobs) if timeouts is None else [None if t is None else float(t) for t in timeouts]
    return fence_params(jobs, worker, now) | {"leases": [float(x) for x in leases], "timeouts": limits}


def complete_and_claim_params(
    done: Sequence[Job], claim: Claim, limit: int, now: datetime | None, *, lease_seconds: float
) -> dict[str, Any]:
    """Parameters of ``job_complete_and_claim`` (claim alone: no ``done``). The ids and attempts of the finished jobs
    go as array literals (``{1,2,3}``, cast in the statement): psycopg's list dumper costs more per element than
    the claim's own bookkeeping of a job."""
    names = _names(claim.queues)
    shares = claim.shares
    if shares is None:
        shares = [per_queue_limit(limit, len(names))] * len(names)
    elif len(shares) != len(names) or min(shares, default=1) < 1:
        raise ValueError(f"shares must give each of the {len(names)} queues at least 1 job, got {list(shares)}")
    return {
        "queues": text_array(tuple(names)),
        "limit": limit,
        "per_queue": "{" + ",".join([str(int(n)) for n in shares]) + "}",
        "rotate": claim.rotate % max(1, len(names)),
        "worker": claim.worker,
        "now": now,
        "lease_seconds": float(lease_seconds),
        "leases": json.dumps(dict(claim.leases)) if claim.leases else None,
        "ids": "{" + ",".join([str(j.id) for j in done]) + "}",
        "attempts": "{" + ",".join([str(j.attempts) for j in done]) + "}",
    }


def recover_params(
    queues: str | Sequence[str] | None, lease_seconds: float, limit: int, now: datetime | None
) -> dict[str, Any]:
    names = None if queues is None else _names(queues)
    return {"queues": names, "lease_seconds": lease_seconds, "limit": limit, "now": now}


def completed_and_claimed(rows: list[tuple[Any, ...]]) -> tuple[set[int], list[Job]]:
    """The ids completed and the jobs claimed (in claim order: priority, then due time, then id), from the rows
    of ``job_complete_and_claim`` as tuples (``completed``, then ``CLAIM_ROW``; an UPDATE returns its rows in no
    particular order): a claimed job's ``completed`` is NULL, and one more row carries the completed ids as an
    array. Tuples, not dicts: this runs for every claimed job."""
    completed: set[int] = set()
    claimed: list[tuple[Any, ...]] = []
    for r in rows:
        if r[0] is None:
            claimed.append(r)
        else:
            completed.update(r[0])
    # two stable sorts with keys in C (no Python call a row): due time and id, then priority, highest first
    claimed.sort(key=_BY_DUE)
    claimed.sort(key=_BY_PRIORITY, reverse=True)  # reverse keeps equal keys in their order
    return completed, [job_from_claim(r) for r in claimed]


_BY_DUE = operator.itemgetter(1 + CLAIM_ROW.index("visible_at"), 1)  # 1 + : ``completed`` comes first
_BY_PRIORITY = operator.itemgetter(1 + CLAIM_ROW.index("priority"))


@dataclass(frozen=True)
class Failure:
    """One failed attempt, ready to record: its error text, retry delay and whether to retry at all."""

    job: Job
    error: str
    delay_seconds: float
    retry: bool
    traceback: str | None = None
    """Where the error was raised (``format_traceback``), kept in the error history; None: not raised."""

    @classmethod
    def from_exception(cls, job: Job, exc: BaseException, settings: Settings) -> Failure:
        retry = not isinstance(exc, NonRetryableError)
        delay = backoff_seconds(
            job.attempts,
            base=settings.backoff_base_seconds,
            cap=settings.backoff_cap_seconds,
            jitter=settings.backoff_jitter,
        )
        return cls(job, format_error(exc), delay, retry, format_traceback(exc))

    @property
    def final(self) -> bool:
        return not self.retry or self.job.attempts >= self.job.max_attempts


def fail_params(failures: Sequence[Failure], worker: str, now: datetime | None) -> dict[str, Any]:
    return {
        "ids": [f.job.id for f in failures],
        "attempts": [f.job.attempts for f in failures],
        "errors": [f.error for f in failures],
        "tracebacks": [f.traceback for f in failures],
        "delays": [f.delay_seconds for f in failures],
        "retry": [f.retry for f in failures],
        "worker": worker,
        "now": now,
        "history_chars": HISTORY_ERROR_CHARS,
    }


@dataclass(frozen=True)
class Recovered:
    id: int
    queue: str
    status: str
    attempts: int


PAYLOAD_PREVIEW_CHARS = 200
"""How much of a payload that cannot be decoded a fetched job keeps (``payload_text``)."""


def with_payload(row: dict[str, Any]) -> dict[str, Any]:
    """A fetched job whose payload came as text: decoded; or, when Python cannot read it (nested thousands of levels
    deep), ``payload`` None with ``payload_error`` (the reason and the size) and the start of its text."""
    payload, error = decode_payload(row["payload"])
    if error is None:
        return {**row, "payload": payload}
    text = row["payload"]
    return {
        **row,
        "payload": None,
        "payload_error": f"{error} ({len(text):,} characters)",
        "payload_text": text[:PAYLOAD_PREVIEW_CHARS],
    }


def stats_from_row(row: dict[str, Any]) -> QueueStats:
    return QueueStats(**row)


@dataclass(frozen=True)
class PurgePolicy:
    """What a purge deletes: the finished jobs of each status older than that status's age in seconds (None: none
    of that status), of one queue or of all."""

    done_seconds: float | None = None
    failed_seconds: float | None = None
    cancelled_seconds: float | None = None
    queue: str | None = None

    @classmethod
    def retention(cls, settings: Settings) -> PurgePolicy:
        """The scheduled retention: each status kept for its own time (``retain_*_seconds``)."""
        return cls(settings.retain_done_seconds, settings.retain_failed_seconds, settings.retain_cancelled_seconds)

    @classmethod
    def older_than(cls, seconds: float, statuses: Sequence[str], queue: str | None = None) -> PurgePolicy:
        """``skiplock purge``: the jobs of ``statuses`` older than ``seconds``."""
        bad = set(statuses) - set(PURGE_STATUSES)
        if bad or not statuses:
            raise ValueError(f"purge only removes done, failed and cancelled jobs, not {sorted(bad) or 'nothing'}")
        if not seconds >= 0:
            raise ValueError("older_than must be >= 0")
        ages = {f"{status}_seconds": float(seconds) for status in statuses}
        return cls(**ages, queue=None if queue is None else check_queue_name(queue))


def purge_params(policy: PurgePolicy, limit: int, now: datetime | None) -> dict[str, Any]:
    """Parameters of ``job_purge``: each status's age (NULL: none of it), the queue, the batch size."""
    ages = (policy.done_seconds, policy.failed_seconds, policy.cancelled_seconds)
    out: dict[str, Any] = {
        f"{status}_seconds": None if age is None else float(age)
        for status, age in zip(PURGE_STATUSES, ages, strict=True)
    }
    return out | {"queue": policy.queue, "limit": limit, "now": now}


def _require_selection(ids: Sequence[int] | None, queue: str | None) -> None:
    if ids is None and queue is None:
        raise ValueError("name the jobs: give ids, a queue, or both")


def selection_params(ids: Sequence[int] | None, queue: str | None, now: datetime | None) -> dict[str, Any]:
    _require_selection(ids, queue)
    return {"ids": list(ids) if ids is not None else None, "queue": queue, "now": now}


def _ids(r: Result) -> list[int]:
    return [row["id"] for row in r.rows]


def _id_set(r: Result) -> set[int]:
    return {row["id"] for row in r.rows}


def _as_bytes(query: str) -> str | bytes:
    """A statement's text as the bytes psycopg sends, when it is ASCII (the same bytes in any client encoding): psycopg
    then neither encodes nor hashes it again on every call."""
    return query.encode("ascii") if query.isascii() else query


def _enqueued(r: Result) -> EnqueueResult | None:
    """The row of ``job_enqueue`` (any variant; tuples: id, duplicate, notified), or None."""
    return EnqueueResult(r.rows[0][0], r.rows[0][1]) if r.rows else None


def replace_call(query: Any, params: dict[str, Any], keys: list[str], encoded: list[str]) -> Call[list[int]]:
    """``job_replace_unique`` for ``keys`` with these payloads (already encoded), the enqueue's other options."""
    return Call(query, params | {"keys": keys, "payloads": "[" + ",".join(encoded) + "]"}, _ids)


def _rows(r: Result) -> list[dict[str, Any]]:
    return r.rows


def _found(r: Result) -> EnqueueResult:
    return EnqueueResult(r.rows[0]["id"], duplicate=True)


@dataclass(frozen=True)
class ManyEnqueue:
    """One ``enqueue_many``: the insert, then (only when some payload was a duplicate) the look-up of the jobs
    holding their keys, and the per-payload result."""

    insert: Call[list[dict[str, Any]]]
    keys: list[str | None]
    """The key of each payload given (None: no key), in order."""
    find_query: Any
    params: dict[str, Any]
    replace_query: Any = None

    def missing(self, rows: list[dict[str, Any]]) -> list[str]:
        """The keys of the payloads that inserted nothing (held by another job)."""
        if self.params["keys"] is None or len(rows) == len(self.keys):
            return []  # no keys, or every payload inserted its job
        got = {r["key"] for r in rows}
        return sorted({k for k in self.keys if k is not None and k not in got})

    def replace(self, keys: list[str]) -> Call[list[int]] | None:
        """With ``unique_conflict="replace"``: the update of the pending jobs holding ``keys`` (else None)."""
        if not self.params.get("replace"):
            return None
        by_key = dict(zip(self.params["keys"], self.params["encoded"], strict=True))
        return replace_call(self.replace_query, self.params, keys, [by_key[k] for k in keys])

    def find(self, keys: list[str]) -> Call[dict[str, int]]:
        params = {"queue": self.params["queue"], "keys": keys}
        return Call(self.find_query, params, lambda r: {x["key"]: x["id"] for x in r.rows})

    def result(self, rows: list[dict[str, Any]], found: dict[str, int]) -> EnqueueManyResult:
        """Per payload, its job: the new one (in payload order, ids ascending), or the one holding its key."""
        if self.params["keys"] is None:
            return EnqueueManyResult([r["id"] for r in rows])  # no keys: one new job per payload
        new = [r["id"] for r in rows if not r.get("duplicate")]
        by_key = {r["key"]: r for r in rows if r["key"] is not None}
        keyless = iter(r["id"] for r in rows if r["key"] is None)
        seen: set[str] = set()
        out: list[EnqueueResult] = []
        for key in self.keys:
            if key is None:
                out.append(EnqueueResult(next(keyless)))
                continue
            row = by_key.get(key)
            if row is not None and key not in seen:
                out.append(EnqueueResult(row["id"], duplicate=bool(row.get("duplicate"))))
            elif row is not None:
                out.append(EnqueueResult(row["id"], duplicate=True))
            elif key in found:
                out.append(EnqueueResult(found[key], duplicate=True))
            else:
                raise EnqueueError(f"the job holding key {_shown(key)} vanished meanwhile (purged): enqueue it again")
            seen.add(key)
        return EnqueueManyResult(new, out)


class Statements:
    """The calls behind every method of :class:`Queue` and :class:`AsyncQueue`: pure, no I/O, shared by both."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.q: Queries = queries_for(settings.schema)
        self._defaults = default_params(settings)
        self._enqueue = _as_bytes(self.q.job_insert_usual)

    def enqueue(
        self, queue: str, payload: Any, options: Mapping[str, Any], trace_context: Mapping[str, str] | None = None
    ) -> Call[EnqueueResult | None]:
        """The insert (it returns nothing when a concurrent insert with the same key committed after its snapshot:
        then :meth:`enqueued` finds that job). ``trace_context``: the enqueue's span, written with the job (the
        ``traced`` variant of the statement; ``skiplock.tracing``)."""
        params = enqueue_params(self.settings, queue, payload, options, self._defaults)
        if not options and trace_context is None:  # the usual call
            return Call(self._enqueue, params, _enqueued, tuples=True)
        by_name = params.get("by_name", False)
        unique = params.get("unique_key") is not None
        q = self.q
        if trace_context is not None:
            params["trace_context"] = json.dumps(trace_context)
            if unique:
                insert = q.job_enqueue_unique_by_name_traced if by_name else q.job_enqueue_unique_traced
            else:
                insert = q.job_enqueue_by_name_traced if by_name else q.job_enqueue_traced
        elif unique:
            insert = q.job_enqueue_unique_by_name if by_name else q.job_enqueue_unique
        else:
            insert = q.job_enqueue_by_name if by_name else q.job_enqueue
        return Call(insert, params, _enqueued, tuples=True)

    def enqueued(self, insert: Call[EnqueueResult | None]) -> Call[EnqueueResult]:
        """The look-up of the job holding the key of an :meth:`enqueue` whose insert returned nothing."""
        params = insert.params or {}
        find = self.q.job_find_by_unique_key if params.get("unique_key") is not None else self.q.job_find_by_key
        return Call(find, params, _found)

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        options: Mapping[str, Any],
        trace_context: Mapping[str, str] | None = None,
    ) -> ManyEnqueue | CopyJobs:
        """Without keys (idempotency or unique), a COPY of the jobs; with keys, one INSERT that skips the taken.
        ``trace_context``: as for :meth:`enqueue`, the same for every job of the batch."""
        params = enqueue_many_params(self.settings, queue, payloads, options)
        if "values" in params:
            reserve = Call(self.q.job_reserve_ids, params | {"n": len(params["values"])}, reserved)
            if trace_context is not None:
                return CopyJobs(reserve, self.q.job_copy_many_traced, params, trace_context=dict(trace_context))
            if copies_defaults(params):
                return CopyJobs(reserve, self.q.job_copy_many_plain, params, plain=True)
            return CopyJobs(reserve, self.q.job_copy_many, params)
        unique, q = "unique_states" in params, self.q
        if trace_context is not None:
            params["trace_context"] = json.dumps(trace_context)
            if params.get("by_name"):
                query = q.job_enqueue_many_unique_by_name_traced if unique else q.job_enqueue_many_by_name_traced
            else:
                query = q.job_enqueue_many_unique_traced if unique else q.job_enqueue_many_traced
        elif params.get("by_name"):
            query = q.job_enqueue_many_unique_by_name if unique else q.job_enqueue_many_by_name
        else:
            query = q.job_enqueue_many_unique if unique else q.job_enqueue_many
        find = q.job_find_by_unique_keys if unique else q.job_find_by_keys
        return ManyEnqueue(Call(query, params, _rows), params["payload_keys"], find, params, self._replace(params))

    def replace_unique(self, params: dict[str, Any]) -> Call[list[int]] | None:
        """After a unique enqueue found its key taken: with ``unique_conflict="replace"``, the update of the
        pending holder (else None)."""
        if not params.get("replace"):
            return None
        return replace_call(self._replace(params), params, [params["unique_key"]], [params["payload"]])

    def _replace(self, params: Mapping[str, Any]) -> Any:
        return self.q.job_replace_unique_by_name if params.get("by_name") else self.q.job_replace_unique

    def complete_and_claim(
        self, done: Sequence[Job], claim: Claim, limit: int, now: datetime | None
    ) -> Call[tuple[set[int], list[Job]]]:
        """Complete ``done`` and claim up to ``limit`` jobs (see :class:`Claim`), in the variant of
        ``job_complete_and_claim`` the claim needs."""
        lease = self.settings.lease_seconds if claim.lease_seconds is None else claim.lease_seconds
        params = complete_and_claim_params(done, claim, limit, now, lease_seconds=lease)
        queues, after, limited = claim.queues, claim.after, claim.limited
        one = isinstance(queues, str) or len(queues) == 1
        if after is not None:
            if not one or after.visible_at is None:
                raise ValueError("after= needs one queue and a claimed job (with its visible_at)")
            params |= {"after_priority": after.priority, "after_at": after.visible_at, "after_id": after.id}
            query = (
                self.q.job_complete_and_claim_one_after
                if limited
                else self.q.job_complete_and_claim_unlimited_one_after
            )
        elif limited:
            query = self.q.job_complete_and_claim_one if one else self.q.job_complete_and_claim
        else:
            query = self.q.job_complete_and_claim_unlimited_one if one else self.q.job_complete_and_claim_unlimited
        return Call(query, params, lambda r: completed_and_claimed(r.rows), tuples=True, binary=True)

    def confirm_done(self, jobs: Sequence[Job], worker: str) -> Call[set[int]]:
        return Call(self.q.job_confirm_done, fence_params(jobs, worker, None), _id_set)

    def complete(self, jobs: Sequence[Job], worker: str, now: datetime | None) -> Call[set[int]]:
        return Call(self.q.job_complete, fence_params(jobs, worker, now), _id_set)

    def fail(self, failures: Sequence[Failure], worker: str, now: datetime | None) -> Call[dict[int, str]]:
        return Call(
            self.q.job_fail, fail_params(failures, worker, now), lambda r: {x["id"]: x["status"] for x in r.rows}
        )

    def release(self, jobs: Sequence[Job], worker: str, now: datetime | None) -> Call[set[int]]:
        return Call(self.q.job_release, fence_params(jobs, worker, now), _id_set)

    def heartbeat(
        self,
        jobs: Sequence[Job],
        worker: str,
        leases: Sequence[float] | None,
        now: datetime | None,
        timeouts: Sequence[float | None] | None = None,
    ) -> Call[set[int]]:
        """Renew each job's lease (default the settings'), never past its timeout; reads back the ids still held
        (the query says which are lost)."""
        lease = [self.settings.lease_seconds] * len(jobs) if leases is None else leases
        ids = {j.id for j in jobs}
        params = heartbeat_params(jobs, worker, lease, now, timeouts)
        return Call(self.q.job_heartbeat, params, lambda r: ids - _id_set(r))

    def recover_expired(
        self, queues: str | Sequence[str] | None, lease_seconds: float | None, limit: int, now: datetime | None
    ) -> Call[list[Recovered]]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = recover_params(queues, lease, limit, now)
        return Call(self.q.job_recover_expired, params, lambda r: [Recovered(**x) for x in r.rows])

    def release_orphans(
        self, worker: str, queues: Sequence[str], known: Sequence[int], now: datetime | None
    ) -> Call[list[int]]:
        params = {"worker": worker, "queues": list(queues), "known": list(known), "now": now}
        return Call(self.q.job_release_orphans, params, _ids)

    def fail_unique_blocked(self, queues: str | Sequence[str]) -> Call[list[int]]:
        """Fail the pending jobs of ``queues`` that break ``jobs_unique_idx`` when claimed (rows stored outside
        ``jobs_unique_states_check``): a claim that hit it stops no queue."""
        return Call(self.q.job_fail_unique_blocked, {"queues": _names(queues)}, _ids)

    def stats(self, queue: str | None, lease_seconds: float | None, now: datetime | None) -> Call[list[QueueStats]]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = {"queue": queue, "lease_seconds": lease, "now": now}
        return Call(self.q.queue_stats, params, lambda r: [stats_from_row(x) for x in r.rows])

    def get(self, job_id: int) -> Call[dict[str, Any] | None]:
        return Call(self.q.job_get, {"id": job_id}, lambda r: with_payload(r.rows[0]) if r.rows else None)

    def list_enqueued(self, task: str | None, queue: str | None, status: str | None) -> Call[list[dict[str, Any]]]:
        return Call(self.q.job_list_enqueued, {"task": task, "queue": queue, "status": status}, lambda r: r.rows)

    def list_failed(self, queue: str | None, limit: int) -> Call[list[dict[str, Any]]]:
        return Call(self.q.job_list_failed, {"queue": queue, "limit": limit}, lambda r: r.rows)

    def list_stalled(
        self, queue: str | None, lease_seconds: float | None, limit: int, now: datetime | None
    ) -> Call[list[dict[str, Any]]]:
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        params = {"queue": queue, "lease_seconds": lease, "limit": limit, "now": now}
        return Call(self.q.job_list_stalled, params, lambda r: r.rows)

    def retry_failed(
        self, ids: Sequence[int] | None, queue: str | None, now: datetime | None, include_cancelled: bool = False
    ) -> Call[list[int]]:
        statuses = ["failed", "cancelled"] if include_cancelled else ["failed"]
        params = selection_params(ids, queue, now) | {"statuses": statuses, "channel": self.settings.channel}
        return Call(self.q.job_retry_failed, params, _ids)

    def cancel(
        self,
        ids: Sequence[int] | None,
        queue: str | None,
        reason: str,
        now: datetime | None,
        task: str | None = None,
    ) -> Call[list[int]]:
        params = selection_params(ids, queue, now) | {
            "task": task,
            "reason": reason,
        }
        return Call(self.q.job_cancel, params, _ids)

    def snooze(self, jobs: Sequence[Job], delays: Sequence[float], worker: str, now: datetime | None) -> Call[set[int]]:
        if len(delays) != len(jobs):
            raise ValueError(f"{len(delays)} delays for {len(jobs)} jobs")
        params = fence_params(jobs, worker, now) | {"delays": [float(d) for d in delays]}
        return Call(self.q.job_snooze, params, _id_set)

    def cancelled_among(self, jobs: Sequence[Job], worker: str) -> Call[set[int]]:
        return Call(self.q.job_cancelled_among, fence_params(jobs, worker, None), _id_set)

    def set_paused(self, queue: str, paused: bool, now: datetime | None) -> Call[None]:
        params = {
            "queue": check_queue_name(queue),
            "paused": paused,
            "now": now,
            "channel": self.settings.channel,
        }
        return Call(self.q.queue_set_paused, params, lambda r: None)

    def control_channel(self) -> Call[str]:
        """The schema's control channel (cancel, pause, drain): a random name only the schema's roles can read."""
        return Call(self.q.control_channel_read, None, lambda r: str(r.rows[0]["name"]))

    def paused(self, queues: Sequence[str] | None) -> Call[list[str]]:
        params = {"queues": list(queues) if queues is not None else None}
        return Call(self.q.queue_paused, params, lambda r: [x["queue"] for x in r.rows])

    def jobs_table_bytes(self) -> Call[int]:
        table = f'"{self.settings.schema}".jobs'
        return Call(self.q.jobs_table_bytes, {"table": table}, lambda r: int(r.rows[0]["bytes"]))

    def statuses(self, ids: Sequence[int]) -> Call[dict[int, str]]:
        return Call(self.q.job_get_many, {"ids": list(ids)}, lambda r: {x["id"]: x["status"] for x in r.rows})

    def register_limits(self, limits: Iterable[TaskLimits], worker: str) -> Call[list[dict[str, Any]]]:
        return Call(self.q.task_limits_register, register_params(limits, worker), lambda r: r.rows)

    def register_tasks(self, tasks: Iterable[TaskDefaults], app: str, worker: str) -> Call[list[str]]:
        params = task_register_params(tasks, app, worker)
        return Call(self.q.task_register, params, lambda r: [x["name"] for x in r.rows])

    def task_defaults(self, name: str) -> Call[TaskDefaults | None]:
        return Call(self.q.task_find, {"name": name}, lambda r: defaults_from_row(r.rows[0]) if r.rows else None)

    def done_recently(self, queue: str | None, seconds: float, cap: int) -> Call[dict[str, int]]:
        params = {"queue": queue, "seconds": seconds, "cap": cap}
        return Call(self.q.queue_done_recently, params, lambda r: {x["queue"]: x["done"] for x in r.rows})

    def task_names(self) -> Call[list[str]]:
        return Call(self.q.task_names, None, lambda r: [x["name"] for x in r.rows])

    def limits(self, now: datetime | None, *, after: str = "", limit: int | None = None) -> Call[list[dict[str, Any]]]:
        """Task limits by name after ``after``, at most ``limit`` of them (None: all)."""
        return Call(self.q.task_limits_list, {"now": now, "after": after, "limit": limit}, lambda r: r.rows)

    def next_start(self, tasks: Sequence[str], queues: Sequence[str], now: datetime | None) -> Call[float | None]:
        params = {"tasks": list(tasks), "queues": list(queues), "now": now}
        return Call(self.q.task_limits_next_start, params, lambda r: r.rows[0]["due_in_seconds"] if r.rows else None)

    def waiting(
        self, queue: str | None, now: datetime | None, *, after: str = "", limit: int | None = None
    ) -> Call[list[dict[str, Any]]]:
        """Held-back jobs per queue (by name after ``after``, at most ``limit`` queues; None: all) and reason."""
        params = {"queue": queue, "now": now, "after": after, "limit": limit}
        return Call(self.q.queue_waiting, params, lambda r: r.rows)

    def purge_lock(self, *, wait: bool) -> Call[bool]:
        """The schema's purge lock for the current transaction: waited for (``wait``), or taken only if free."""
        query = self.q.retention_xact_lock if wait else self.q.retention_try_xact_lock
        return Call(query, {}, lambda r: bool(r.rows[0]["locked"]))

    def purge(self, policy: PurgePolicy, limit: int, now: datetime | None) -> Call[Counter[str]]:
        """One batch of a purge (run after :meth:`purge_lock`, in its transaction): the rows deleted by status."""
        return Call(self.q.job_purge, purge_params(policy, limit, now), lambda r: Counter(x["status"] for x in r.rows))

    def complete_one(self, job: Job, worker: str) -> Call[bool]:
        """Mark one job done in the handler's own transaction (fenced by primary key): False when the lease was
        lost."""
        return Call(self.q.job_complete_one, fence_one_params(job, worker), lambda r: bool(r.rows))

    def queue_next_due(self, queues: Sequence[str]) -> Call[float | None]:
        """Seconds until the first delayed job of ``queues`` becomes visible (None: none waits)."""

        def read(r: Result) -> float | None:
            value = r.rows[0]["due_in_seconds"] if r.rows else None
            return None if value is None else max(0.0, float(value))

        return Call(self.q.queue_next_due, {"queues": list(queues), "now": None}, read)

    def queue_flow(self, queues: Sequence[str], cursor: FlowCursor | None) -> Call[tuple[int, int, FlowCursor]]:
        """The operator's wait-time target: jobs of ``queues`` enqueued ready and jobs done since ``cursor`` (None:
        count nothing, only start), and the next cursor (the highest job id, the database's clock)."""
        params = {
            "queues": list(queues),
            "after_id": cursor[0] if cursor else None,
            "since": cursor[1] if cursor else None,
        }

        def read(r: Result) -> tuple[int, int, FlowCursor]:
            row = r.rows[0]  # an aggregate: always one row
            return int(row["arrived"]), int(row["done"]), (int(row["last_id"]), row["now"])

        return Call(self.q.queue_flow, params, read)

    def queue_due_soon(
        self, queues: Sequence[str], horizon: float, stale_seconds: float
    ) -> Call[tuple[int, float | None]]:
        """Delayed jobs of ``queues`` and live schedules on them (seen within ``stale_seconds``) due within
        ``horizon`` seconds, and the seconds until the first of either (None: none waits)."""
        params = {"queues": list(queues), "horizon": horizon, "stale_seconds": stale_seconds}

        def read(r: Result) -> tuple[int, float | None]:
            row = r.rows[0]
            return int(row["due_soon"]), None if row["next_due_in"] is None else float(row["next_due_in"])

        return Call(self.q.queue_due_soon, params, read)

    def server_connection_limits(self) -> Call[tuple[int, int] | None]:
        """The server's max_connections and reserved connections."""

        def read(r: Result) -> tuple[int, int] | None:
            return (int(r.rows[0]["max_connections"]), int(r.rows[0]["reserved_connections"])) if r.rows else None

        return Call(self.q.server_connection_limits, None, read)

    def statement_timeout(self, milliseconds: int) -> Call[None]:
        return Call(self.q.session_statement_timeout, {"ms": str(milliseconds)}, lambda r: None)

    def session(self, name: str) -> Call[None]:
        """A session command of ``sql/queries`` (``session_control``, ``session_forget_plans``,
        ``session_generic_plans``, ``session_reset_plans``): no parameters, no rows."""
        if not name.startswith("session_"):
            raise ValueError(f"{name!r} is not a session command")
        return Call(getattr(self.q, name), None, lambda r: None)

    def roles_existing(self, names: Sequence[str]) -> Call[set[str]]:
        return Call(self.q.roles_existing, {"names": list(names)}, lambda r: {x["rolname"] for x in r.rows})

    def command(self, statement: Any) -> Call[None]:
        """One composed command without parameters or rows (``skiplock grant``'s GRANT and ALTER statements)."""
        return Call(statement, None, lambda r: None)

    # ---------------------------------------------------------------------------------- drain requests
    def drain_requested(self, pod: str) -> Call[bool]:
        """Whether the operator asked the workers of ``pod`` to stop claiming."""
        return Call(self.q.drain_requested, {"worker": pod}, lambda r: bool(r.rows and r.rows[0]["exists"]))

    def drain_set(self, pods: Sequence[str], draining: bool, reason: str = "") -> Call[None]:
        """Ask the workers of ``pods`` to stop claiming (or withdraw it); tells them on the control channel."""
        params = {
            "workers": list(pods),
            "reason": reason,
            "now": None,
        }
        return Call(self.q.drain_request if draining else self.q.drain_cancel, params, lambda r: None)

    def drain_list(self) -> Call[set[str]]:
        return Call(self.q.drain_list, None, lambda r: {str(x["worker"]) for x in r.rows})

    def drain_holdings(self, queues: Sequence[str]) -> Call[dict[str, tuple[int, float]]]:
        """Per pod: the jobs of ``queues`` it holds and the seconds since the oldest was claimed."""
        return Call(
            self.q.drain_holdings,
            {"queues": list(queues), "now": None},
            lambda r: {str(x["worker"]): (int(x["jobs"]), float(x["oldest_seconds"] or 0.0)) for x in r.rows},
        )

    def status_counts(self) -> Call[dict[str, int]]:
        """Jobs by status (every job of the schema)."""
        return Call(self.q.job_status_counts, None, lambda r: {x["status"]: int(x["n"]) for x in r.rows})

    def demo(self, name: str, params: dict[str, Any] | None = None) -> Call[list[dict[str, Any]]]:
        """A statement of the demo (``demo_*``: reset its schema, its receipts table)."""
        if not name.startswith("demo_"):
            raise ValueError(f"{name!r} is not a demo statement")
        return Call(getattr(self.q, name), params, _rows)

    # ---------------------------------------------------------------------------------- schedules
    def schedule_now(self) -> Call[datetime]:
        return Call(self.q.schedule_now, None, lambda r: r.rows[0]["now"])

    def schedule_register(self, params: dict[str, Any]) -> Call[None]:
        return Call(self.q.schedule_register, params, lambda r: None)

    def schedule_due(self, scope: dict[str, Any]) -> Call[list[dict[str, Any]]]:
        return Call(self.q.schedule_due, scope, _rows)

    def schedule_fire(self, params: dict[str, Any]) -> Call[int | None]:
        """Enqueue one tick's job; its id, or None when the tick was taken meanwhile."""
        return Call(self.q.schedule_fire, params, lambda r: r.rows[0]["id"] if r.rows else None)

    def schedule_park(self, name: str, reason: str) -> Call[None]:
        """Stop firing ``name`` (until its app registers it again), saying why."""
        return Call(self.q.schedule_park, {"name": name, "reason": reason[:1000]}, lambda r: None)

    def schedule_next_due(self, scope: dict[str, Any]) -> Call[float | None]:
        def read(r: Result) -> float | None:
            seconds = r.rows[0]["seconds"] if r.rows else None
            return None if seconds is None else max(0.0, float(seconds))

        return Call(self.q.schedule_next_due, scope, read)

    def schedule_list(self, stale_seconds: float) -> Call[list[dict[str, Any]]]:
        return Call(self.q.schedule_list, {"stale_seconds": stale_seconds}, _rows)

    def schedule_delete(self, names: Sequence[str]) -> Call[set[str]]:
        return Call(self.q.schedule_delete, {"names": list(names)}, lambda r: {x["name"] for x in r.rows})

    def schedule_prune(self, app: str, keep: Sequence[str]) -> Call[list[str]]:
        return Call(self.q.schedule_prune, {"app": app, "names": list(keep)}, lambda r: [x["name"] for x in r.rows])
