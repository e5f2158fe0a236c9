"""What the CLI and the demo print: text tables and one job's fields (pure: rows in, text out)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from skiplock.job import QueueStats


def stats(rows: Sequence[QueueStats]) -> str:
    """``skiplock stats``: one line a queue."""
    head = ("queue", "ready", "delayed", "processing", "stalled", "failed", "oldest_ready_s", "next_due",
            "avg_attempts_done", "paused")  # fmt: skip
    body = [
        (r.queue, r.ready, r.delayed, r.processing, r.stalled, r.failed, round(r.oldest_ready_age_seconds, 1),
         r.next_due.isoformat(timespec="seconds") if r.next_due else "-",
         "-" if r.avg_attempts_done is None else f"{r.avg_attempts_done:.2f}", "yes" if r.paused else "no")
        for r in rows
    ]  # fmt: skip
    return table(head, body) if body else "no pending, processing or failed jobs"


def done_recently(done: Mapping[str, int], cap: int) -> str:
    """``skiplock stats``' positive confirmation: the jobs done in the last hour (counted up to ``cap``)."""
    total = sum(done.values())
    if not total:
        return "no job done in the last hour (is a worker running? one job and its errors: skiplock show ID)"
    more = "+" if total >= cap else ""
    by_queue = ", ".join(f"{q} {n:,}" for q, n in sorted(done.items()))
    return f"done in the last hour: {total:,}{more} ({by_queue})"


def schedules(rows: Sequence[Mapping[str, Any]]) -> str:
    """``skiplock schedules``: one line a periodic task, times in UTC."""
    body = []
    for r in rows:
        when = r["cron"] or f"every {r['every_seconds']:g}s"
        if r["cron"] and r["timezone"] != "UTC":
            when += f" ({r['timezone']})"
        nxt = "stale: not fired" if r["stale"] else utc(r["next_run_at"])
        if r.get("parked"):  # the reason in full: skiplock schedules --json
            nxt = "parked: not fired (" + r["parked"][:60] + ")"
        body.append((r["name"], r["queue"], when, nxt, utc(r["last_run_at"]) if r["last_run_at"] else "-"))
    return table(("name", "queue", "when", "next_run_utc", "last_run_utc"), body)


def utc(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds")


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A text table: numeric columns right-aligned, text columns left-aligned."""
    numeric = [
        all(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in rows) for i in range(len(head))
    ]
    cells = [list(map(str, head))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = [
        "  ".join((c.rjust(w) if num else c.ljust(w)) for c, w, num in zip(r, widths, numeric, strict=True)).rstrip()
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def job(row: dict[str, Any]) -> str:
    """``skiplock show``: one field a line, then the error history, oldest first."""
    keys = ("id", "queue", "task", "status", "priority", "attempts", "max_attempts", "timeout_seconds",
            "visible_at", "locked_by", "locked_at", "lease_expires_at", "idempotency_key", "created_at",
            "updated_at", "last_error", "workflow_id", "waiting_on")  # fmt: skip
    width = max(map(len, keys))
    lines = [f"{k.ljust(width)}  {show_value(row.get(k))}" for k in keys]
    if error := row.get("payload_error"):  # nested too deep for Python to read: the reason and its start only
        lines.append(f"{'payload'.ljust(width)}  {error}; it begins: {row.get('payload_text')}...")
    else:
        lines.append(f"{'payload'.ljust(width)}  {json.dumps(row.get('payload'), ensure_ascii=False)}")
    lines.append(f"{'result'.ljust(width)}  {json.dumps(row.get('result'), ensure_ascii=False)}")
    for kind in ("parents", "children"):
        relatives = row.get(kind) or []
        shown = ", ".join(f"{r['id']} ({r['status'] or 'purged'})" for r in relatives)
        lines.append(f"{kind.ljust(width)}  {shown or '-'}")
    steps = row.get("steps") or {}
    lines.append(f"steps ({len(steps)}):" if steps else "steps: none")
    lines.extend(f"  {name}: {json.dumps(value, ensure_ascii=False)}" for name, value in steps.items())
    errors = row.get("errors") or []
    lines.append(f"errors ({len(errors)}, oldest first):" if errors else "errors: none")
    for e in errors:
        attempt = f"attempt {e.get('attempt')}/{row.get('max_attempts')}"
        lines.append(f"  {attempt} at {_instant(e.get('at'))} on {e.get('worker') or '-'}: {e.get('error')}")
        if tb := e.get("traceback"):
            lines.extend("      " + x for x in str(tb).splitlines())
    return "\n".join(lines)


def _instant(text: Any) -> str:
    """An error history's time (ISO text from the JSON), to the second like the job's own timestamps."""
    try:
        return datetime.fromisoformat(str(text)).isoformat(timespec="seconds")
    except ValueError:
        return str(text)


def show_value(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return str(value).replace("\n", " ")
