"""What the web UI reads and does, over one psycopg ``AsyncConnectionPool``: the named statements of
``sql/queries/ui.sql``, and the queue's own statements (retry, cancel, pause) for its actions.

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
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from skiplock.schedule import STALE_SECONDS
from skiplock.settings import Settings
from skiplock.sql import Queries, queries_for
from skiplock.store.call import Call, Result
from skiplock.store.statements import Statements

BATCH = 500
"""Jobs a bulk action changes in one transaction."""
BULK_SECONDS = 0.1
"""A bulk action's request stops starting batches after this long; the same request again (same action key)
continues where it stopped (its detail says ``finished``)."""
SCAN = 10_000
"""Rows of the primary key (or of the failed jobs' index) one page of the job list reads at most."""
DONE_CAP = 100_000
"""Done jobs counted per queue for "done in the last minute" (past it the UI shows the cap and a "+")."""
STATEMENT_TIMEOUT_MS = 5_000
"""A UI statement that runs longer is stopped by the server (nothing it reads is worth more)."""
MAX_GROUPS = 10_000
"""Distinct failure fingerprints the groups page walks at most (past them a group is not listed)."""
MAX_CANARY = 1_000
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
class Page:
    """A page of rows and the cursor of the next one (None: this was the last)."""

    rows: list[dict[str, Any]]
    next: Any = None


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


async def _fetch(
    conn: psycopg.AsyncConnection[Any], query: LiteralString, params: dict[str, Any]
) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def _run(conn: psycopg.AsyncConnection[Any], call: Call[Any]) -> Any:
    """Run one of the queue's statements (``Statements``) on this connection, inside the caller's transaction."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(call.query, call.params)
        rows = await cur.fetchall() if cur.description else []
        return call.read(Result(rows, cur.rowcount))


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Each UI connection: a statement timeout, and no JIT or parallel workers (every UI statement reads a bounded
    part of an index: compiling or forking for it costs more than it runs, as on a 5 M-row table it did)."""
    await _fetch(conn, queries_for("skiplock").ui_session, {"ms": str(STATEMENT_TIMEOUT_MS)})


class UiStore:
    """The UI's data access. ``await UiStore.open(settings)`` makes and owns a small pool; ``close()`` ends it."""

    def __init__(self, pool: AsyncConnectionPool[Any], settings: Settings, *, owned: bool = False) -> None:
        self.pool, self.settings, self._owned = pool, settings, owned
        self.q: Queries = queries_for(settings.schema)
        self.s = Statements(settings)

    @classmethod
    async def open(cls, settings: Settings, *, max_size: int = 4, timeout: float = 10.0) -> UiStore:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.require_dsn(),
            min_size=1,
            max_size=max_size,
            open=False,
            name="skiplock-ui",
            timeout=timeout,
            # no server-side prepared statements: every filter combination gets a plan for its own values
            kwargs={"autocommit": True, "prepare_threshold": None, "application_name": "skiplock-ui"},
            configure=_configure,
        )
        await pool.open(wait=True, timeout=timeout)
        return cls(pool, settings, owned=True)

    async def close(self) -> None:
        if self._owned:
            await self.pool.close()

    async def _read(self, query: LiteralString, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            return await _fetch(conn, query, params)

    # ------------------------------------------------------------------------------------------ reads
    async def queues(self) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            stats = await _fetch(conn, self.q.ui_queue_stats, {"lease_seconds": self.settings.lease_seconds})
            names = [s["queue"] for s in stats]
            done = await _fetch(conn, self.q.ui_done_last_minute, {"queues": names, "cap": DONE_CAP})
        per_minute = {r["queue"]: r["done_last_minute"] for r in done}
        return [s | {"done_last_minute": per_minute.get(s["queue"], 0)} for s in stats]

    async def jobs(self, f: JobFilter, *, before: int | None, limit: int) -> Page:
        """A page of jobs newest first; ``next`` is the id the next page starts below. A page reads at most
        :data:`SCAN` rows: when they hold fewer matches than ``limit``, it is short and ``next`` goes on below them."""
        failed = f.status == "failed" or f.fingerprint is not None
        if f.fingerprint is not None and f.status not in (None, "failed"):
            return Page([], None)  # a group is of failed jobs only
        params = f.params() | {"before": before or MAX_ID, "scan": SCAN, "limit": limit}
        async with self.pool.connection() as conn:
            rows = await _fetch(conn, self.q.ui_jobs_failed_window if failed else self.q.ui_jobs_window, params)
            if len(rows) >= limit:
                return Page(rows, rows[-1]["id"])
            end = await _fetch(conn, self.q.ui_failed_window_end if failed else self.q.ui_window_end, params)
        # the window ended before the page filled: the next page starts below it, unless it reached the first row
        full = bool(end) and end[0]["rows"] >= SCAN
        return Page(rows, end[0]["id"] if full else None)

    async def job(self, job_id: int) -> dict[str, Any]:
        rows = await self._read(self.q.ui_job, {"id": job_id})
        if not rows:
            raise NotFoundError(f"no job {job_id}")
        return rows[0]

    async def estimate(self) -> int:
        table = f'"{self.settings.schema}".jobs'
        rows = await self._read(self.q.ui_table_estimate, {"table": table})
        return int(rows[0]["rows"]) if rows else 0

    async def failure_groups(
        self, *, queue: str | None, task: str | None, after: tuple[int, str] | None, limit: int
    ) -> Page:
        params = {
            "queue": queue,
            "task": task,
            "after_jobs": after[0] if after else None,
            "after_fingerprint": after[1] if after else None,
            "limit": limit,
            "max_groups": MAX_GROUPS,
        }
        rows = await self._read(self.q.ui_failure_groups, params)
        last = rows[-1] if len(rows) >= limit else None
        return Page(rows, (last["jobs"], last["fingerprint"]) if last else None)

    async def failure_group(self, fingerprint: str, *, missing_ok: bool = False) -> dict[str, Any] | None:
        rows = await self._read(self.q.ui_failure_group, {"fingerprint": fingerprint})
        if not rows and not missing_ok:
            raise NotFoundError(f"no failed job has the fingerprint {fingerprint}")
        return rows[0] if rows else None

    async def canary(self, canary_id: int, fingerprint: str) -> dict[str, Any]:
        """A canary of this group (its audit entry) with the status of each of its jobs now."""
        async with self.pool.connection() as conn:
            rows = await _fetch(conn, self.q.ui_audit_get, {"id": canary_id})
            if not rows or rows[0]["action"] != CANARY_ACTION or rows[0]["detail"].get("fingerprint") != fingerprint:
                raise NotFoundError(f"no canary {canary_id} of group {fingerprint}")
            ids = rows[0]["detail"].get("canary", [])
            statuses: dict[int, str] = await _run(conn, self.s.statuses(ids))
        counts = {s: sum(1 for i in ids if statuses.get(i, "gone") == s) for s in ("done", "failed", "cancelled")}
        counts["gone"] = sum(1 for i in ids if i not in statuses)
        counts["running"] = len(ids) - sum(counts.values())
        return rows[0] | {"statuses": statuses, "counts": counts}

    async def schedules(self, *, after: str | None, limit: int) -> Page:
        params = {"after": after or "", "limit": limit, "stale_seconds": STALE_SECONDS}
        rows = await self._read(self.q.ui_schedules, params)
        return Page(rows, rows[-1]["name"] if len(rows) >= limit else None)

    async def limits(self) -> dict[str, list[dict[str, Any]]]:
        async with self.pool.connection() as conn:
            limits = await _run(conn, self.s.limits(None))
            waiting = await _run(conn, self.s.waiting(None, None))
        return {"limits": limits, "waiting": waiting}

    async def workers(self, *, limit: int) -> list[dict[str, Any]]:
        return await self._read(self.q.ui_workers, {"recent": 1000, "limit": limit})

    async def audit(self, *, before: int | None, limit: int) -> Page:
        rows = await self._read(self.q.ui_audit_page, {"before": before or MAX_ID, "limit": limit})
        return Page(rows, rows[-1]["id"] if len(rows) >= limit else None)

    async def audit_entry(self, entry_id: int) -> dict[str, Any]:
        rows = await self._read(self.q.ui_audit_get, {"id": entry_id})
        if not rows:
            raise NotFoundError(f"no audit entry {entry_id}")
        return rows[0]

    # ------------------------------------------------------------------------------------------ actions
    async def _single(
        self,
        conn: psycopg.AsyncConnection[Any],
        audit: dict[str, Any],
        act: Callable[[psycopg.AsyncConnection[Any]], Awaitable[int]],
    ) -> dict[str, Any]:
        """One action in one transaction with its audit row; a repeated key returns the first one's row."""
        async with conn.transaction():
            begun = await _fetch(conn, self.q.ui_audit_begin, audit | {"detail": _json(audit["detail"])})
            if not begun:
                return await self._repeat(conn, audit["action_key"])
            changed = await act(conn)
            rows = await _fetch(
                conn, self.q.ui_audit_progress, {"id": begun[0]["id"], "changed": changed, "detail": "{}"}
            )
        return rows[0] | {"repeated": False}

    async def _repeat(self, conn: psycopg.AsyncConnection[Any], key: str) -> dict[str, Any]:
        rows = await _fetch(conn, self.q.ui_audit_lock, {"action_key": key})
        return rows[0] | {"repeated": True}

    async def _job_status(self, conn: psycopg.AsyncConnection[Any], job_id: int) -> str:
        statuses: dict[int, str] = await _run(conn, self.s.statuses([job_id]))
        if job_id not in statuses:
            raise NotFoundError(f"no job {job_id}")
        return statuses[job_id]

    async def retry_job(self, job_id: int, *, actor: str, key: str) -> dict[str, Any]:
        async def act(conn: psycopg.AsyncConnection[Any]) -> int:
            status = await self._job_status(conn, job_id)
            if status not in ("failed", "cancelled"):
                raise ActionError(f"job {job_id} is {status}: only failed or cancelled jobs can be retried")
            ids = await _run(conn, self.s.retry_failed([job_id], None, None, include_cancelled=True))
            if not ids:
                raise ActionError(f"job {job_id} was not retried: another live job holds its idempotency or unique key")
            return len(ids)

        audit = _audit(actor, "retry", f"job {job_id}", key, {"ids": [job_id]})
        async with self.pool.connection() as conn:
            return await self._single(conn, audit, act)

    async def cancel_job(self, job_id: int, *, actor: str, key: str) -> dict[str, Any]:
        async def act(conn: psycopg.AsyncConnection[Any]) -> int:
            status = await self._job_status(conn, job_id)
            if status not in ("pending", "processing"):
                raise ActionError(f"job {job_id} is {status}: only pending or running jobs can be cancelled")
            return len(await _run(conn, self.s.cancel([job_id], None, f"from the UI by {actor}", None)))

        audit = _audit(actor, "cancel", f"job {job_id}", key, {"ids": [job_id]})
        async with self.pool.connection() as conn:
            return await self._single(conn, audit, act)

    async def set_paused(self, queue: str, paused: bool, *, actor: str, key: str) -> dict[str, Any]:
        async def act(conn: psycopg.AsyncConnection[Any]) -> int:
            await _run(conn, self.s.set_paused(queue, paused, None))
            return 0

        audit = _audit(actor, "pause" if paused else "resume", f"queue {queue}", key, {"queue": queue})
        async with self.pool.connection() as conn:
            return await self._single(conn, audit, act)

    async def retry_canary(self, fingerprint: str, n: int, *, actor: str, key: str) -> dict[str, Any]:
        """Retry the ``n`` oldest failed jobs of a group (the canary); :meth:`retry_rest` retries the others
        once every one of them is done."""
        if not 1 <= n <= MAX_CANARY:
            raise ActionError(f"a canary is 1 to {MAX_CANARY} jobs, not {n}", status=400)

        detail: dict[str, Any] = {"fingerprint": fingerprint, "n": n}
        audit = _audit(actor, CANARY_ACTION, f"group {fingerprint}", key, detail)
        async with self.pool.connection() as conn, conn.transaction():
            begun = await _fetch(conn, self.q.ui_audit_begin, audit | {"detail": _json(detail)})
            if not begun:
                return await self._repeat(conn, key)
            params = {"fingerprint": fingerprint, "after": 0, "upto": MAX_ID, "limit": n}
            ids = [r["id"] for r in await _fetch(conn, self.q.ui_group_ids, params)]
            if not ids:
                raise NotFoundError(f"no failed job has the fingerprint {fingerprint}")
            retried: list[int] = await _run(conn, self.s.retry_failed(ids, None, None))
            if not retried:
                raise ActionError("no job of the canary could be retried (their keys are held by live jobs)")
            newest = (await _fetch(conn, self.q.ui_newest_id, {}))[0]["id"]
            patch = {"canary": retried, "upto": newest}
            progress = {"id": begun[0]["id"], "changed": len(retried), "detail": _json(patch)}
            rows = await _fetch(conn, self.q.ui_audit_progress, progress)
        return rows[0] | {"repeated": False}

    async def retry_rest(self, fingerprint: str, canary_id: int, *, actor: str, key: str) -> dict[str, Any]:
        """Retry the rest of a group whose canary (the audit entry ``canary_id``) fully succeeded."""
        async with self.pool.connection() as conn, conn.transaction():
            canary = await _fetch(conn, self.q.ui_audit_get, {"id": canary_id})
            if not canary or canary[0]["action"] != CANARY_ACTION:
                raise NotFoundError(f"no canary {canary_id}")
            detail = canary[0]["detail"]
            if detail.get("fingerprint") != fingerprint:
                raise ActionError(f"canary {canary_id} is of group {detail.get('fingerprint')}, not {fingerprint}")
            used = detail.get("rest_key")
            if used is not None and used != key:
                raise StaleError(f"canary {canary_id} was used already: the rest of its group was retried")
            if used is None:
                await self._check_canary(conn, canary_id, detail["canary"])
                mark = {"rest_key": key}
                await _fetch(conn, self.q.ui_audit_progress, {"id": canary_id, "changed": 0, "detail": _json(mark)})
        return await self.bulk(
            "retry_group",
            fingerprint,
            actor=actor,
            key=key,
            group=fingerprint,
            upto=int(detail["upto"]),
            extra={"canary_id": canary_id},
        )

    async def _check_canary(self, conn: psycopg.AsyncConnection[Any], canary_id: int, ids: list[int]) -> None:
        statuses: dict[int, str] = await _run(conn, self.s.statuses(ids))
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
    ) -> dict[str, Any]:
        """retry or cancel (``verb`` retry_group / cancel_group / retry_filter / cancel_filter) every job of a
        failure group or of a filter, :data:`BATCH` jobs a transaction, the cursor in the audit row. Batches run
        for :data:`BULK_SECONDS` at most: then the row's detail has ``finished`` false, and a repeat of the call
        with the same ``key`` goes on."""
        async with self.pool.connection() as conn:
            if upto is None:
                upto = (await _fetch(conn, self.q.ui_newest_id, {}))[0]["id"]
            detail: dict[str, Any] = {"after": 0, "upto": upto, "finished": False} | (extra or {})
            if group is not None:
                detail["fingerprint"] = group
            if jobs is not None:
                detail["filter"] = {k: v for k, v in dataclasses.asdict(jobs).items() if v is not None}
            audit = _audit(actor, verb, target, key, detail)
            async with conn.transaction():
                begun = await _fetch(conn, self.q.ui_audit_begin, audit | {"detail": _json(detail)})
            started, first = time.monotonic(), True
            while True:
                async with conn.transaction():
                    row = (await _fetch(conn, self.q.ui_audit_lock, {"action_key": key}))[0]
                    d = row["detail"]
                    if d.get("finished"):  # finished before this request looked: a repeat
                        return row | {"repeated": first and not begun}
                    first = False
                    ids = await self._batch(conn, verb, d, group, jobs)
                    changed = await self._apply(conn, verb, ids, actor) if ids else []
                    patch = {"after": max(ids) if ids else d["after"], "finished": len(ids) < BATCH}
                    progress = {"id": row["id"], "changed": len(changed), "detail": _json(patch)}
                    row = (await _fetch(conn, self.q.ui_audit_progress, progress))[0]
                if patch["finished"] or time.monotonic() - started > BULK_SECONDS:
                    return row | {"repeated": False}

    async def _batch(
        self,
        conn: psycopg.AsyncConnection[Any],
        verb: str,
        d: dict[str, Any],
        group: str | None,
        f: JobFilter | None,
    ) -> list[int]:
        cursor = {"after": d["after"], "upto": d["upto"], "limit": BATCH}
        if group is not None:
            rows = await _fetch(conn, self.q.ui_group_ids, cursor | {"fingerprint": group})
        else:
            assert f is not None
            statuses = ["failed", "cancelled"] if verb.startswith("retry") else ["pending", "processing"]
            rows = await _fetch(conn, self.q.ui_filter_ids, cursor | f.params() | {"statuses": statuses})
        return [r["id"] for r in rows]

    async def _apply(self, conn: psycopg.AsyncConnection[Any], verb: str, ids: Sequence[int], actor: str) -> list[int]:
        reason = f"from the UI by {actor}"
        if verb.startswith("retry"):
            changed: list[int] = await _run(conn, self.s.retry_failed(ids, None, None, include_cancelled=True))
            return changed
        if verb == "cancel_group":
            return [r["id"] for r in await _fetch(conn, self.q.ui_discard_failed, {"ids": list(ids), "reason": reason})]
        cancelled: list[int] = await _run(conn, self.s.cancel(ids, None, reason, None))
        return cancelled


def _audit(actor: str, action: str, target: str, key: str, detail: dict[str, Any]) -> dict[str, Any]:
    return {"actor": actor, "action": action, "target": target, "action_key": key, "detail": detail}
