"""``enqueue_many`` without keys: reserve the ids, then COPY the rows, in one transaction (:class:`CopyJobs`,
:func:`copy_jobs`, :func:`acopy_jobs`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from skiplock.job import EnqueueManyResult
from skiplock.store.call import Call, Result
from skiplock.store.run import aexecute, execute, outside_transaction
from skiplock.store.validation import encode_payloads

_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: Any) -> str:
    """``value`` as one field of COPY's text format (NULL is ``\\N``)."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).translate(_COPY_ESCAPES)


def reserved(r: Result) -> tuple[list[int], datetime]:
    return r.rows[0]["ids"], r.rows[0]["visible_at"]


COLUMN_DEFAULTS = {"task": None, "priority": 0, "max_attempts": 5, "serial_key": None, "serial_skip_on_retry": False}
"""The jobs table's defaults (the migrations') of the options an ``enqueue_many`` writes."""


def copies_defaults(params: Mapping[str, Any]) -> bool:
    """Whether the jobs of an ``enqueue_many`` keep every column default: their COPY then writes only id, payload and
    queue (``job_copy_many_plain``), which PostgreSQL reads faster than all nine
    columns (docs/adr/0007-one-data-access-layer.md)."""
    return due_now(params) and all(params[k] == v for k, v in COLUMN_DEFAULTS.items())


def due_now(params: Mapping[str, Any]) -> bool:
    """Whether enqueued jobs are due at the transaction's start (no ``run_at``, no delay): the column's ``now()``."""
    return params["run_at"] is None and not params["delay"]


COPY_CHUNK = 125
"""Payloads encoded and written to a COPY at a time: PostgreSQL reads one chunk while the next is encoded."""


@dataclass
class CopyJobs:
    """One ``enqueue_many`` without keys: reserve the ids (``job_reserve_ids``, which also wakes the workers at
    commit when the jobs are due now), then COPY the rows with them (``job_copy_many``), in one transaction.

    The payloads are encoded chunk by chunk as the COPY goes, so the server stores one chunk while the client
    encodes the next; a bad payload then fails the COPY, and with it the transaction the call opened. In a
    transaction that is not the call's own, :meth:`encode_all` checks them all before anything is sent."""

    reserve: Call[tuple[list[int], datetime]]
    query: Any
    params: dict[str, Any]
    plain: bool = False  # every option is the column's default: the query is job_copy_many_plain (id, payload, queue)
    trace_context: dict[str, str] | None = None  # a traced enqueue's span (job_copy_many_traced: one more column)
    encoded: list[str] | None = None

    def encode_all(self) -> None:
        """Encode (and so check) every payload now: a bad one raises :class:`PayloadError`, nothing sent."""
        if self.encoded is None:
            self.encoded = encode_payloads(self.params["values"], self.params["max_bytes"])

    def chunks(self, ids: list[int], visible_at: datetime | str) -> Iterator[str]:
        """The COPY text of the jobs, :data:`COPY_CHUNK` rows at a time: per payload, in order, its id and JSON text,
        then the options of all. JSON text escapes every control character, so only its backslashes need escaping
        here."""
        p = self.params
        if due_now(p):
            visible_at = "now"  # the transaction's start, as now(): the same value, and 3x cheaper to parse
        options: tuple[Any, ...] = (p["queue"],)
        if not self.plain:
            options += (
                p["task"],
                p["priority"],
                p["max_attempts"],
                visible_at,
                p["serial_key"],
                p["serial_skip_on_retry"],
            )
        if self.trace_context is not None:
            options += (json.dumps(self.trace_context),)
        tail = "\t".join([copy_text(v) for v in options])
        values, limit = p["values"], p["max_bytes"]
        for start in range(0, len(values), COPY_CHUNK):
            end = start + COPY_CHUNK
            texts = self.encoded[start:end] if self.encoded is not None else encode_payloads(values[start:end], limit)
            escaped = [t.replace("\\", "\\\\") for t in texts]
            yield "".join([f"{i}\t{t}\t{tail}\n" for i, t in zip(ids[start:end], escaped, strict=True)])


def copy_jobs(conn: psycopg.Connection[Any], copy: CopyJobs) -> EnqueueManyResult:
    """Reserve the ids, then COPY the jobs: in the connection's transaction (the caller's, or the pool's), or in
    one of their own on an autocommit connection. Nothing is visible, and no worker woken, before it commits."""
    own = outside_transaction(conn)
    if not own:
        copy.encode_all()  # a bad payload must not fail the caller's transaction
    with conn.transaction() if own else nullcontext():
        ids, visible_at = execute(conn, copy.reserve)
        with conn.cursor() as cur, cur.copy(copy.query) as writer:
            for text in copy.chunks(ids, visible_at):
                writer.write(text)
    return EnqueueManyResult(ids)


async def acopy_jobs(conn: psycopg.AsyncConnection[Any], copy: CopyJobs) -> EnqueueManyResult:
    own = outside_transaction(conn)
    if not own:
        copy.encode_all()
    async with conn.transaction() if own else nullcontext():
        ids, visible_at = await aexecute(conn, copy.reserve)
        async with conn.cursor() as cur, cur.copy(copy.query) as writer:
            for text in copy.chunks(ids, visible_at):
                await writer.write(text)
    return EnqueueManyResult(ids)
