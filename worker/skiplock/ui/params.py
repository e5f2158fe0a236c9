"""Query and form parameters checked, with a clear 400 for anything malformed (nothing is read or changed)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from skiplock.store.ui import JobFilter

STATUSES = ("waiting", "pending", "processing", "done", "failed", "cancelled")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_TEXT = 200
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")


class BadRequest(Exception):
    """Malformed input: answered with 400 and this message."""


def job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"job id must be an integer, not {text[:40]!r}") from None
    if not 1 <= value < 2**63:
        raise BadRequest(f"job id {value} is out of range")
    return value


def fingerprint(text: str) -> str:
    if not _FINGERPRINT.match(text):
        raise BadRequest(f"a failure group's fingerprint is 16 hex digits, not {text[:40]!r}")
    return text


def name(value: str | None, what: str, *, required: bool = False) -> str | None:
    if value is None or value == "":
        if required:
            raise BadRequest(f"{what} is required")
        return None
    if len(value) > 200 or "\x00" in value:
        raise BadRequest(f"{what} must be 1 to 200 characters without NUL")
    return value


def integer(value: str | None, what: str, *, default: int | None = None, low: int = 1, high: int = 2**63 - 1) -> int:
    if value is None or value == "":
        if default is None:
            raise BadRequest(f"{what} is required")
        return default
    try:
        n = int(value)
    except ValueError:
        raise BadRequest(f"{what} must be an integer, not {value[:40]!r}") from None
    if not low <= n <= high:
        raise BadRequest(f"{what} must be between {low} and {high}, not {n}")
    return n


def optional_int(value: str | None, what: str) -> int | None:
    return None if value in (None, "") else integer(value, what)


def limit(params: Mapping[str, Any]) -> int:
    return integer(params.get("limit"), "limit", default=DEFAULT_LIMIT, high=MAX_LIMIT)


def timestamp(value: str | None, what: str) -> datetime | None:
    if value in (None, ""):
        return None
    assert value is not None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{what} must be an ISO 8601 time like 2026-01-31T12:00:00Z, not {value[:40]!r}") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def job_filter(params: Mapping[str, Any]) -> JobFilter:
    """The job list's filters: queue, task, status, q (text in the error), since/until (created), group."""
    unknown = set(params) - {"queue", "task", "status", "q", "since", "until", "group", "before", "limit"}
    if unknown:
        raise BadRequest(f"unknown filter {sorted(unknown)[0]!r}")
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise BadRequest(f"status must be one of {', '.join(STATUSES)}, not {str(status)[:40]!r}")
    text = params.get("q") or None
    if text is not None and len(text) > MAX_TEXT:
        raise BadRequest(f"the text to find is at most {MAX_TEXT} characters")
    since, until = timestamp(params.get("since"), "since"), timestamp(params.get("until"), "until")
    if since and until and since >= until:
        raise BadRequest("since must be before until")
    group = params.get("group") or None
    return JobFilter(
        queue=name(params.get("queue"), "queue"),
        task=name(params.get("task"), "task"),
        status=status,
        text=text,
        since=since,
        until=until,
        fingerprint=fingerprint(group) if group else None,
    )


def group_cursor(value: str | None) -> tuple[int, str] | None:
    """The failure groups' keyset cursor, ``<jobs>-<fingerprint>``."""
    if value in (None, ""):
        return None
    assert value is not None
    jobs, _, fp = value.partition("-")
    return integer(jobs, "after", low=0), fingerprint(fp)


def worker_cursor(value: str | None) -> tuple[int, str] | None:
    """The workers' keyset cursor, ``<0|1>:<worker>`` (0: holding jobs, 1: finished one recently)."""
    if value in (None, ""):
        return None
    assert value is not None
    idle, sep, worker = value.partition(":")
    if idle not in ("0", "1") or not sep or not worker:
        raise BadRequest(f"after must be a workers page's cursor like 0:worker-name, not {value[:40]!r}")
    return int(idle), worker
