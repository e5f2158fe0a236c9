"""What the web UI reads and does: :class:`UiStatements` (the named queries of ``sql/queries/ui.sql`` as
``Call`` objects, pure like :class:`~skiplock.store.statements.Statements`) and
:class:`UiStore`, which runs them and the queue's own statements (retry, cancel, pause) with the store's
:class:`~skiplock.store.run.AsyncRunner`.

Every read is bounded (a keyset page, a window of the primary key, a capped count). Every action writes an audit
row under an idempotency key in the same transaction as its change: a second submission with the same key
changes nothing more. A bulk action (a failure group, a filter) runs one transaction per batch of
:data:`BATCH` jobs, its keyset cursor kept in its audit row, so a repeat continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from skiplock.schedule import STALE_SECONDS
from skiplock.settings import Settings
from skiplock.sql import Queries, queries_for
from skiplock.store.call import Call, Result
from skiplock.store.run import AsyncRunner, aexecute
from skiplock.store.statements import Statements

BATCH = 500
"""Jobs a bulk action changes in one transaction."""
BULK_SECONDS = 0.1
"""A bulk action's request stops starting batches after this long; the same request again (same action key)
continues where it stopped (its detail says ``finished``)."""
SCAN = 10_000
"""Rows of the primary key (or of the failed jobs' index) one page of the job list reads at most."""
BULK_SCAN = 2_000
"""Jobs of the statuses it changes one batch of a bulk action by filter reads at most (with its changes, one batch
stays well within a request's time; bench/ui.py)."""
DONE_CAP = 100_000
"""Done jobs counted per queue for "done in the last minute" (past it the UI shows the cap and a "+")."""
STATEMENT_TIMEOUT_MS = 5_000
"""A UI statement that runs longer is stopped by the server (nothing it reads is worth more)."""
MAX_GROUPS = 10_000
RELATIVES_SHOWN = 50
"""Parents and children a job page lists (a callback of a large fan-in has thousands)."""
"""Distinct failure fingerprints the groups page walks at most (past them a group is not listed)."""
MAX_CANARY = 1_000
RECENT_DONE = 1_000
"""The workers page also lists the workers that finished one of this many newest done or failed jobs."""
MAX_ID = 2**63 - 1
CANARY_ACTION = "retry_group_canary"


class ActionError(Exception):
    """An action or a read refused: ``status`` is the HTTP status the UI answers with (nothing was changed)."""

    status = 409

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class NotFoundError(ActionError):
    status = 404


class StaleError(ActionError):
    status = 410


@dataclass(frozen=True)
class JobFilter:
    """The job list's filters (None: any). ``text`` is matched in the last error, case-insensitively."""

    queue: str | None = None
    task: str | None = None
    status: str | None = None
    text: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    fingerprint: str | None = None

    def params(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["text"] = None if self.text is None else "%" + _escape_like(self.text) + "%"
        return out


@dataclass(frozen=True)
class Batch:
    """One transaction's jobs of a bulk action, the keyset cursor after them, and whether none is left."""

    ids: list[int]
    after: int
    finished: bool


@dataclass(frozen=True)
class Page:
    """A page of rows and the cursor of the next one (None: this was the last)."""

    rows: list[dict[str, Any]]
    next: Any = None


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


def _rows(r: Result) -> list[dict[str, Any]]:
    return r.rows


def _row(r: Result) -> dict[str, Any] | None:
    return r.rows[0] if r.rows else None


def _ids(r: Result) -> list[int]:
    return [x["id"] for x in r.rows]


class UiStatements:
    """The UI's statements: each method turns one read or one step of an action into a :class:`Call`. Pure."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.q: Queries = queries_for(settings.schema)

    def session(self, statement_timeout_ms: int) -> Call[None]:
        return Call(self.q.ui_session, {"ms": str(statement_timeout_ms)}, lambda r: None)

    def queue_stats(self, *, after: str, limit: int) -> Call[list[dict[str, Any]]]:
        params = {"lease_seconds": self.settings.lease_seconds, "after": after, "limit": limit}
        return Call(self.q.ui_queue_stats, params, _rows)

    def done_last_minute(self, queues: Sequence[str], cap: int) -> Call[dict[str, int]]:
        params = {"queues": list(queues), "cap": cap}
        return Call(self.q.ui_done_last_minute, params, lambda r: {x["queue"]: x["done_last_minute"] for x in r.rows})

    def jobs_window(
        self, f: JobFilter, *, failed: bool, before: int, scan: int, limit: int
    ) -> Call[list[dict[str, Any]]]:
        query = self.q.ui_jobs_failed_window if failed else self.q.ui_jobs_window
        return Call(query, f.params() | {"before": before, "scan": scan, "limit": limit}, _rows)

    def window_end(self, f: JobFilter, *, failed: bool, before: int, scan: int) -> Call[tuple[int | None, int]]:
        """The lowest id of the window of ``scan`` rows below ``before``, and how many rows it has."""
        query = self.q.ui_failed_window_end if failed else self.q.ui_window_end
        params = f.params() | {"before": before, "scan": scan}
        return Call(query, params, lambda r: (r.rows[0]["id"], r.rows[0]["rows"]) if r.rows else (None, 0))

    def job(self, job_id: int) -> Call[dict[str, Any] | None]:
        return Call(self.q.ui_job, {"id": job_id}, _row)

    def job_relatives(self, job_id: int, limit: int) -> Call[list[dict[str, Any]]]:
        return Call(self.q.ui_job_relatives, {"id": job_id, "limit": limit}, _rows)

    def table_estimate(self) -> Call[int]:
        table = f'"{self.settings.schema}".jobs'
        return Call(self.q.ui_table_estimate, {"table": table}, lambda r: int(r.rows[0]["rows"]) if r.rows else 0)

    def failure_groups(
        self, *, queue: str | None, task: str | None, after: tuple[int, str] | None, limit: int, max_groups: int
    ) -> Call[list[dict[str, Any]]]:
        params = {
            "queue": queue,
            "task": task,
            "after_jobs": after[0] if after else None,
            "after_fingerprint": after[1] if after else None,
            "limit": limit,
            "max_groups": max_groups,
        }
        return Call(self.q.ui_failure_groups, params, _rows)

    def failure_group(self, fingerprint: str) -> Call[dict[str, Any] | None]:
        return Call(self.q.ui_failure_group, {"fingerprint": fingerprint}, _row)

    def group_ids(self, fingerprint: str, *, after: int, upto: int, limit: int) -> Call[list[int]]:
        params = {"fingerprint": fingerprint, "after": after, "upto": upto, "limit": limit}
        return Call(self.q.ui_group_ids, params, _ids)

    def filter_batch(self, f: JobFilter, *, retry: bool, after: int, upto: int, scan: int, limit: int) -> Call[Batch]:
        """The next batch of a bulk action by filter, from a window of at most ``scan`` jobs it could change."""
        params = f.params() | {"retry": retry, "after": after, "upto": upto, "scan": scan, "limit": limit}
        return Call(
            self.q.ui_filter_batch,
            params,
            lambda r: Batch(list(r.rows[0]["ids"]), r.rows[0]["after"], r.rows[0]["finished"]),
        )

    def newest_id(self) -> Call[int]:
        return Call(self.q.ui_newest_id, None, lambda r: int(r.rows[0]["id"]))

    def discard_failed(self, ids: Sequence[int], reason: str) -> Call[list[int]]:
        return Call(self.q.ui_discard_failed, {"ids": list(ids), "reason": reason}, _ids)

    def workers(self, *, recent: int, after: tuple[int, str] | None, limit: int) -> Call[list[dict[str, Any]]]:
        params = {
            "recent": recent,
            "after_idle": after[0] if after else None,
            "after_worker": after[1] if after else None,
            "limit": limit,
        }
        return Call(self.q.ui_workers, params, _rows)

    def schedules(self, *, after: str, limit: int) -> Call[list[dict[str, Any]]]:
        params = {"after": after, "limit": limit, "stale_seconds": STALE_SECONDS}
        return Call(self.q.ui_schedules, params, _rows)

    def audit_page(self, *, before: int, limit: int) -> Call[list[dict[str, Any]]]:
        return Call(self.q.ui_audit_page, {"before": before, "limit": limit}, _rows)

    def audit_begin(self, entry: dict[str, Any]) -> Call[dict[str, Any] | None]:
        """Record an action under its key; None when the key was used already."""
        return Call(self.q.ui_audit_begin, entry | {"detail": _json(entry["detail"])}, _row)

    def audit_lock(self, key: str) -> Call[dict[str, Any]]:
        return Call(self.q.ui_audit_lock, {"action_key": key}, lambda r: r.rows[0])

    def audit_get(self, entry_id: int) -> Call[dict[str, Any] | None]:
        return Call(self.q.ui_audit_get, {"id": entry_id}, _row)

    def audit_progress(self, entry_id: int, changed: int, detail: dict[str, Any]) -> Call[dict[str, Any]]:
        params = {"id": entry_id, "changed": changed, "detail": _json(detail)}
        return Call(self.q.ui_audit_progress, params, lambda r: r.rows[0])


class UiStore:
    """The UI's data access. ``await UiStore.open(settings)`` makes and owns a small pool; ``close()`` ends it."""

    def __init__(self, run: AsyncRunner) -> None:
        self.run, self.settings = run, run.settings
        self.s = Statements(self.settings)
        self.u = UiStatements(self.settings)

    @classmethod
    async def open(cls, settings: Settings, *, max_size: int = 4, timeout: float = 10.0) -> UiStore:
        session = UiStatements(settings).session(STATEMENT_TIMEOUT_MS)

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            """Each UI connection: a statement timeout, and no JIT or parallel workers (every UI statement reads a
            bounded part of an index: compiling or forking for it costs more than it runs)."""
            await aexecute(conn, session)

        run = await AsyncRunner.connect(
            settings,
            name="skiplock-ui",
            max_size=max_size,
            connect_timeout=timeout,
            # no server-side prepared statements: every filter combination gets a plan for its own values
            connection={"prepare_threshold": None, "application_name": "skiplock-ui"},
            configure=configure,
        )
        return cls(run)

    async def close(self) -> None:
        await self.run.close()

    # ------------------------------------------------------------------------------------------ reads
    async def queues(self, *, after: str | None = None, limit: int = 500) -> Page:
        """A page of queues by name after ``after``; ``next`` is the last one's name when the page is full."""
        async with self.run.connection() as conn:
            stats = await aexecute(conn, self.u.queue_stats(after=after or "", limit=limit))
            per_minute = await aexecute(conn, self.u.done_last_minute([s["queue"] for s in stats], DONE_CAP))
        rows = [s | {"done_last_minute": per_minute.get(s["queue"], 0)} for s in stats]
        return Page(rows, rows[-1]["queue"] if len(rows) >= limit else None)

    async def jobs(self, f: JobFilter, *, before: int | None, limit: int) -> Page:
        """A page of jobs newest first; ``next`` is the id the next page starts below. A page reads at most
        :data:`SCAN` rows: when they hold fewer matches than ``limit``, it is short and ``next`` goes on below them."""
        failed = f.status == "failed" or f.fingerprint is not None
        if f.fingerprint is not None and f.status not in (None, "failed"):
            return Page([], None)  # a group is of failed jobs only
        below = before or MAX_ID
        async with self.run.connection() as conn:
            rows = await aexecute(conn, self.u.jobs_window(f, failed=failed, before=below, scan=SCAN, limit=limit))
            if len(rows) >= limit:
                return Page(rows, rows[-1]["id"])
            lowest, seen = await aexecute(conn, self.u.window_end(f, failed=failed, before=below, scan=SCAN))
        # the window ended before the page filled: the next page starts below it, unless it reached the first row
        return Page(rows, lowest if seen >= SCAN else None)

    async def job(self, job_id: int) -> dict[str, Any]:
        row = await self.run(self.u.job(job_id))
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        relatives = await self.run(self.u.job_relatives(job_id, RELATIVES_SHOWN))
        for kind in ("parent", "child"):
            row["parents" if kind == "parent" else "children"] = [r for r in relatives if r["kind"] == kind]
        return row

    async def estimate(self) -> int:
        return await self.run(self.u.table_estimate())

    async def failure_groups(
        self, *, queue: str | None, task: str | None, after: tuple[int, str] | None, limit: int
    ) -> Page:
        call = self.u.failure_groups(queue=queue, task=task, after=after, limit=limit, max_groups=MAX_GROUPS)
        rows = await self.run(call)
        last = rows[-1] if len(rows) >= limit else None
        return Page(rows, (last["jobs"], last["fingerprint"]) if last else None)

    async def failure_group(self, fingerprint: str, *, missing_ok: bool = False) -> dict[str, Any] | None:
        row = await self.run(self.u.failure_group(fingerprint))
        if row is None and not missing_ok:
            raise NotFoundError(f"no failed job has the fingerprint {fingerprint}")
        return row

    async def canary(self, canary_id: int, fingerprint: str) -> dict[str, Any]:
        """A canary of this group (its audit entry) with the status of each of its jobs now."""
        async with self.run.connection() as conn:
            row = await aexecute(conn, self.u.audit_get(canary_id))
            if row is None or row["action"] != CANARY_ACTION or row["detail"].get("fingerprint") != fingerprint:
                raise NotFoundError(f"no canary {canary_id} of group {fingerprint}")
            ids = row["detail"].get("canary", [])
            statuses = await aexecute(conn, self.s.statuses(ids))
        counts = {s: sum(1 for i in ids if statuses.get(i, "gone") == s) for s in ("done", "failed", "cancelled")}
        counts["gone"] = sum(1 for i in ids if i not in statuses)
        counts["running"] = len(ids) - sum(counts.values())
        return row | {"statuses": statuses, "counts": counts}

    async def schedules(self, *, after: str | None, limit: int) -> Page:
        rows = await self.run(self.u.schedules(after=after or "", limit=limit))
        return Page(rows, rows[-1]["name"] if len(rows) >= limit else None)

    async def limits(self, *, after: str | None = None, limit: int = 500) -> Page:
        """A page of task limits by task name after ``after`` (``next``: the last one's name when full)."""
        rows = await self.run(self.s.limits(None, after=after or "", limit=limit))
        return Page(rows, rows[-1]["task"] if len(rows) >= limit else None)

    async def waiting(self, *, after: str | None = None, limit: int = 500) -> Page:
        """A page of the queues with jobs held back by flow control, by name after ``after``."""
        rows = await self.run(self.s.waiting(None, None, after=after or "", limit=limit))
        return Page(rows, rows[-1]["queue"] if len(rows) >= limit else None)

    async def workers(self, *, after: tuple[int, str] | None = None, limit: int = 500) -> Page:
        """A page of workers: those holding jobs first, by name; ``next`` is ``(idle, name)`` of the last one."""
        rows = await self.run(self.u.workers(recent=RECENT_DONE, after=after, limit=limit))
        last = rows[-1] if len(rows) >= limit else None
        return Page(
            [{k: v for k, v in r.items() if k != "idle"} for r in rows],
            (last["idle"], last["worker"]) if last else None,
        )

    async def audit(self, *, before: int | None, limit: int) -> Page:
        rows = await self.run(self.u.audit_page(before=before or MAX_ID, limit=limit))
        return Page(rows, rows[-1]["id"] if len(rows) >= limit else None)

    async def audit_entry(self, entry_id: int) -> dict[str, Any]:
        row = await self.run(self.u.audit_get(entry_id))
        if row is None:
            raise NotFoundError(f"no audit entry {entry_id}")
        return row

    # ------------------------------------------------------------------------------------------ actions
    async def _single(
        self,
        conn: psycopg.AsyncConnection[Any],
        audit: dict[str, Any],
        act: Callable[[psycopg.AsyncConnection[Any]], Awaitable[int]],
    ) -> dict[str, Any]:
        """One action in one transaction with its audit row; a repeated key returns the first one's row."""
        async with conn.transaction():
            begun = await aexecute(conn, self.u.audit_begin(audit))
            if begun is None:
                return await self._repeat(conn, audit["action_key"])
            changed = await act(conn)
            row = await aexecute(conn, self.u.audit_progress(begun["id"], changed, {}))
        return row | {"repeated": False}

    async def _repeat(self, conn: psycopg.AsyncConnection[Any], key: str) -> dict[str, Any]:
        return await aexecute(conn, self.u.audit_lock(key)) | {"repeated": True}

    async def _job_status(self, conn: psycopg.AsyncConnection[Any], job_id: int) -> str:
        statuses = await aexecute(conn, self.s.statuses([job_id]))
        if job_id not in statuses:
            raise NotFoundError(f"no job {job_id}")
        return statuses[job_id]

    async def retry_job(self, job_id: int, *, actor: str, key: str) -> dict[str, Any]:
        async def act(conn: psycopg.AsyncConnection[Any]) -> int:
            status = await self._job_status(conn, job_id)
            if status not in ("failed", "cancelled"):
                raise ActionError(f"job {job_id} is {status}: only failed or cancelled jobs can be retried")
            ids = await aexecute(conn, self.s.retry_failed([job_id], None, None, include_cancelled=True))
            if not ids:
                raise ActionError(f"job {job_id} was not retried: another live job holds its idempotency or unique key")
            return len(ids)

        audit = _audit(actor, "retry", f"job {job_id}", key, {"ids": [job_id]})
        async with self.run.connection() as conn:
            return await self._single(conn, audit, act)

    async def cancel_job(self, job_id: int, *, actor: str, key: str) -> dict[str, Any]:
        async def act(conn: psycopg.AsyncConnection[Any]) -> int:
            status = await self._job_status(conn, job_id)
            if status not in ("waiting", "pending", "processing"):
                raise ActionError(f"job {job_id} is {status}: only waiting, pending or running jobs can be cancelled")
            cancelled = await aexecute(conn, self.s.cancel([job_id], None, f"from the UI by {actor}", None))
            return len(cancelled)

        audit = _audit(actor, "cancel", f"job {job_id}", key, {"ids": [job_id]})
        async with self.run.connection() as conn:
            return await self._single(conn, audit, act)

    async def set_paused(self, queue: str, paused: bool, *, actor: str, key: str) -> dict[str, Any]:
        async def act(conn: psycopg.AsyncConnection[Any]) -> int:
            await aexecute(conn, self.s.set_paused(queue, paused, None))
            return 0

        audit = _audit(actor, "pause" if paused else "resume", f"queue {queue}", key, {"queue": queue})
        async with self.run.connection() as conn:
            return await self._single(conn, audit, act)

    async def retry_canary(self, fingerprint: str, n: int, *, actor: str, key: str) -> dict[str, Any]:
        """Retry the ``n`` oldest failed jobs of a group (the canary); :meth:`retry_rest` retries the others
        once every one of them is done."""
        if not 1 <= n <= MAX_CANARY:
            raise ActionError(f"a canary is 1 to {MAX_CANARY} jobs, not {n}", status=400)

        detail: dict[str, Any] = {"fingerprint": fingerprint, "n": n}
        audit = _audit(actor, CANARY_ACTION, f"group {fingerprint}", key, detail)
        async with self.run.connection() as conn, conn.transaction():
            begun = await aexecute(conn, self.u.audit_begin(audit))
            if begun is None:
                return await self._repeat(conn, key)
            ids = await aexecute(conn, self.u.group_ids(fingerprint, after=0, upto=MAX_ID, limit=n))
            if not ids:
                raise NotFoundError(f"no failed job has the fingerprint {fingerprint}")
            retried = await aexecute(conn, self.s.retry_failed(ids, None, None))
            if not retried:
                raise ActionError("no job of the canary could be retried (their keys are held by live jobs)")
            newest = await aexecute(conn, self.u.newest_id())
            row = await aexecute(
                conn, self.u.audit_progress(begun["id"], len(retried), {"canary": retried, "upto": newest})
            )
        return row | {"repeated": False}

    async def retry_rest(self, fingerprint: str, canary_id: int, *, actor: str, key: str) -> dict[str, Any]:
        """Retry the rest of a group whose canary (the audit entry ``canary_id``) fully succeeded."""
        async with self.run.connection() as conn, conn.transaction():
            canary = await aexecute(conn, self.u.audit_get(canary_id))
            if canary is None or canary["action"] != CANARY_ACTION:
                raise NotFoundError(f"no canary {canary_id}")
            detail = canary["detail"]
            if detail.get("fingerprint") != fingerprint:
                raise ActionError(f"canary {canary_id} is of group {detail.get('fingerprint')}, not {fingerprint}")
            used = detail.get("rest_key")
            if used is not None and used != key:
                raise StaleError(f"canary {canary_id} was used already: the rest of its group was retried")
            if used is None:
                await self._check_canary(conn, canary_id, detail["canary"])
                await aexecute(conn, self.u.audit_progress(canary_id, 0, {"rest_key": key}))
        return await self.bulk(
            "retry_group",
            fingerprint,
            actor=actor,
            key=key,
            group=fingerprint,
            upto=int(detail["upto"]),
            extra={"canary_id": canary_id},
            empty_ok=True,
        )

    async def _check_canary(self, conn: psycopg.AsyncConnection[Any], canary_id: int, ids: list[int]) -> None:
        statuses = await aexecute(conn, self.s.statuses(ids))
        gone = [i for i in ids if i not in statuses]
        if gone:
            raise StaleError(f"canary {canary_id} is stale: its jobs {gone} no longer exist; start a new canary")
        bad = sorted(i for i, s in statuses.items() if s in ("failed", "cancelled"))
        if bad:
            raise ActionError(
                f"canary {canary_id} failed: jobs {bad} did not succeed; the rest is not retried "
                "(fix the cause, then start a new canary)"
            )
        running = sorted(i for i, s in statuses.items() if s != "done")
        if running:
            raise ActionError(f"canary {canary_id} has not finished: jobs {running} are still pending or running")

    async def bulk(
        self,
        verb: str,
        target: str,
        *,
        actor: str,
        key: str,
        group: str | None = None,
        jobs: JobFilter | None = None,
        upto: int | None = None,
        extra: dict[str, Any] | None = None,
        empty_ok: bool = False,
    ) -> dict[str, Any]:
        """retry or cancel (``verb`` retry_group / cancel_group / retry_filter / cancel_filter) every job of a
        failure group or of a filter, :data:`BATCH` jobs a transaction, the cursor in the audit row. Batches run
        for :data:`BULK_SECONDS` at most: then the row's detail has ``finished`` false, and a repeat of the call
        with the same ``key`` goes on. A group no failed job has is a :class:`NotFoundError` (nothing recorded),
        unless ``empty_ok`` (the rest of a canary may be empty)."""
        async with self.run.connection() as conn:
            if upto is None:
                upto = await aexecute(conn, self.u.newest_id())
            detail: dict[str, Any] = {"after": 0, "upto": upto, "finished": False} | (extra or {})
            if group is not None:
                detail["fingerprint"] = group
            if jobs is not None:
                detail["filter"] = {k: v for k, v in dataclasses.asdict(jobs).items() if v is not None}
            async with conn.transaction():
                begun = await aexecute(conn, self.u.audit_begin(_audit(actor, verb, target, key, detail)))
                probe = self.u.group_ids(group, after=0, upto=upto, limit=1) if group is not None else None
                if begun is not None and probe is not None and not empty_ok and not await aexecute(conn, probe):
                    raise NotFoundError(f"no failed job has the fingerprint {group}")
            started, first = time.monotonic(), True
            while True:
                async with conn.transaction():
                    row = await aexecute(conn, self.u.audit_lock(key))
                    d = row["detail"]
                    if d.get("finished"):  # finished before this request looked: a repeat
                        return row | {"repeated": first and begun is None}
                    first = False
                    batch = await self._batch(conn, verb, d, group, jobs)
                    changed = await self._apply(conn, verb, batch.ids, actor) if batch.ids else []
                    patch = {"after": batch.after, "finished": batch.finished}
                    row = await aexecute(conn, self.u.audit_progress(row["id"], len(changed), patch))
                if patch["finished"] or time.monotonic() - started > BULK_SECONDS:
                    return row | {"repeated": False}

    async def _batch(
        self, conn: psycopg.AsyncConnection[Any], verb: str, d: dict[str, Any], group: str | None, f: JobFilter | None
    ) -> Batch:
        """The next batch of a bulk action's jobs after its cursor."""
        if group is not None:
            ids = await aexecute(conn, self.u.group_ids(group, after=d["after"], upto=d["upto"], limit=BATCH))
            return Batch(ids, max(ids) if ids else d["after"], len(ids) < BATCH)
        assert f is not None
        call = self.u.filter_batch(
            f, retry=verb.startswith("retry"), after=d["after"], upto=d["upto"], scan=BULK_SCAN, limit=BATCH
        )
        return await aexecute(conn, call)

    async def _apply(self, conn: psycopg.AsyncConnection[Any], verb: str, ids: Sequence[int], actor: str) -> list[int]:
        reason = f"from the UI by {actor}"
        if verb.startswith("retry"):
            return await aexecute(conn, self.s.retry_failed(ids, None, None, include_cancelled=True))
        if verb == "cancel_group":
            return await aexecute(conn, self.u.discard_failed(ids, reason))
        return await aexecute(conn, self.s.cancel(ids, None, reason, None))


def _audit(actor: str, action: str, target: str, key: str, detail: dict[str, Any]) -> dict[str, Any]:
    return {"actor": actor, "action": action, "target": target, "action_key": key, "detail": detail}
