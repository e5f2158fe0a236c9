"""The seed's literal worker loop (its PHP ``Worker::run``), in Python, as the benchmark's baseline.

Claim up to 10 jobs with the seed's claim statement, run each, mark each done with its own UPDATE (autocommit,
as PDO does), and sleep 1 s when nothing was claimed. Runs until SIGTERM; prints ``ready`` once connected.

    python bench/seed_baseline.py --dsn ... --schema bench_x --queue bench [--handler noop|write]

``--style tuned``: the seed's claim with LIMIT 100, then one UPDATE for the whole batch (two statements per 100 jobs).

``--style ceiling`` is the ceiling of a no-op drain on the machine: a tuned loop of plain SQL on skiplock's own table
and claim order (priority, due time, id; skiplock's claim index), no fencing, claims of 200, one completion statement
per batch sent in one pipeline with the next claim (one round trip per batch), woken by skiplock's NOTIFY when idle.
``--style honest`` is the honest ceiling: the same loop (claims of 200, the previous batch's completion by ``id = ANY``
pipelined with the next claim, prepared statements, LISTEN when idle) on the design source's own table, exactly as it
writes it (``HONEST_SCHEMA``: its columns and its three partial indexes, nothing of skiplock's), with its claim
statement (``ORDER BY visible_at``) and its completion.
``--style txloop`` is the ceiling of a transactional drain: the same claims, then per job one transaction holding the
handler's INSERT and the job's completion (BEGIN, INSERT, UPDATE, COMMIT).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql


def claim_statement(order_by: str, returning: str, lease: str = "") -> str:
    """The design source's claim (its LIMIT a parameter, ``{schema}`` left to fill), in the order and with the columns
    given: the seed's worker loop, the honest ceiling and the own-table ceiling differ only there (``lease``: what the
    own-table ceiling also sets)."""
    return f"""
WITH picked AS (
    SELECT id FROM {{schema}}.jobs
    WHERE queue = %(queue)s AND status = 'pending' AND visible_at <= now()
    ORDER BY {order_by}
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {{schema}}.jobs j
SET status = 'processing', attempts = j.attempts + 1, locked_by = %(name)s, locked_at = now(), updated_at = now(){lease}
FROM picked
WHERE j.id = picked.id
RETURNING {returning}
"""


# The seed's worker loop (its PHP ``Worker::claim``).
SEED_CLAIM = claim_statement("visible_at, id", "j.id, j.payload, j.attempts, j.max_attempts")
SEED_FINISH = "UPDATE {schema}.jobs SET status = %(s)s, updated_at = now() WHERE id = %(id)s AND status = 'processing'"
EFFECT = "INSERT INTO {schema}.bench_effects (job_id, attempt) VALUES (%(id)s, %(attempts)s)"
TUNED_FINISH = """
UPDATE {schema}.jobs SET status = 'done', updated_at = now()
WHERE id = ANY(%(ids)s) AND status = 'processing' AND locked_by = %(name)s
"""

# The ceiling's claim: the same statement in skiplock's claim order, without the task columns a worker needs. It sets
# the lease deadline as skiplock's claim does: left unset, every claim added an entry whose key did not change to
# jobs_lease_deadline_idx (all NULLs), and PostgreSQL's bottom-up deletion of such entries made the loop pay a cost
# skiplock's claim never pays (bench/HISTORY.md).
CEILING_CLAIM = claim_statement(
    "priority DESC, visible_at, id",
    "j.id, j.payload::text, j.attempts",
    ",\n    lease_expires_at = now() + interval '30 seconds'",
)
CEILING_FINISH = "UPDATE {schema}.jobs SET status = 'done', updated_at = now() WHERE id = ANY(%(ids)s)"
CEILING_FINISH_ONE = "UPDATE {schema}.jobs SET status = 'done', updated_at = now() WHERE id = %(id)s"

# The design source's table and indexes, exactly as it writes them (schema-qualified): the honest ceiling's table.
HONEST_SCHEMA = """
CREATE TABLE {schema}.jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL DEFAULT 'default',
    payload     jsonb       NOT NULL,
    status      text        NOT NULL DEFAULT 'pending',
    attempts    int         NOT NULL DEFAULT 0,
    max_attempts int        NOT NULL DEFAULT 5,
    visible_at  timestamptz NOT NULL DEFAULT now(),
    locked_by   text,
    locked_at   timestamptz,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, visible_at) WHERE status = 'pending';
CREATE INDEX jobs_recover_idx ON {schema}.jobs (locked_at) WHERE status = 'processing';
CREATE INDEX jobs_done_idx ON {schema}.jobs (updated_at) WHERE status IN ('done', 'failed');
"""
# The design source's claim (its LIMIT made a parameter) and its completion, for a batch by ``id = ANY``.
HONEST_CLAIM = claim_statement("visible_at", "j.id, j.queue, j.payload, j.attempts")
HONEST_FINISH = "UPDATE {schema}.jobs SET status = 'done', updated_at = now() WHERE id = ANY(%(ids)s)"

# The seed's index, plus ``id`` so its ORDER BY (visible_at, id) is served without sorting every pending row.
SEED_INDEX = (
    "CREATE INDEX IF NOT EXISTS jobs_seed_claim_idx ON {schema}.jobs (queue, visible_at, id) WHERE status = 'pending'"
)


def ceiling(
    conn: psycopg.Connection[Any],
    schema: str,
    queue: str,
    batch: int,
    channel: str,
    stop: Any,
    honest: bool = False,
    record: Path | None = None,
) -> None:
    """Claim ``batch``; complete the previous batch in the same pipeline (one round trip); LISTEN when idle.
    ``record``: append ``job_id enqueue_ts start_ts`` per claimed job to a file there (pick-up latency; the payload
    carries the enqueue time as ``t``)."""
    out = (record / f"starts-{os.getpid()}.txt").open("a", buffering=1) if record else None
    statements = (HONEST_CLAIM, HONEST_FINISH) if honest else (CEILING_CLAIM, CEILING_FINISH)
    claim, finish = (q.format(schema=schema) for q in statements)
    name = f"{socket.gethostname()}:{os.getpid()}"
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    print("ready", flush=True)
    ids: list[int] = []
    while not stop():
        with conn.pipeline():
            if ids:
                conn.execute(finish, {"ids": ids}, prepare=True)
            cur = conn.execute(claim, {"queue": queue, "batch": batch, "name": name}, prepare=True)
        rows = cur.fetchall()
        if out is not None:
            started = time.time()
            out.writelines(f"{row[0]} {row[2]['t']!r} {started!r}\n" for row in rows)
        ids = [row[0] for row in rows]
        if not ids:
            for _ in conn.notifies(timeout=1.0, stop_after=1):
                pass


def txloop(conn: psycopg.Connection[Any], schema: str, queue: str, batch: int, channel: str, stop: Any) -> None:
    """Claim ``batch``; then per job one transaction: the handler's INSERT and the completion."""
    claim, finish, effect = (q.format(schema=schema) for q in (CEILING_CLAIM, CEILING_FINISH_ONE, EFFECT))
    name = f"{socket.gethostname()}:{os.getpid()}"
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    print("ready", flush=True)
    while not stop():
        jobs = conn.execute(claim, {"queue": queue, "batch": batch, "name": name}, prepare=True).fetchall()
        if not jobs:
            for _ in conn.notifies(timeout=1.0, stop_after=1):
                pass
        for job_id, _payload, attempts in jobs:
            with conn.transaction():
                conn.execute(effect, {"id": job_id, "attempts": attempts}, prepare=True)
                conn.execute(finish, {"id": job_id}, prepare=True)


def run(
    dsn: str,
    schema: str,
    queue: str,
    handler: str,
    batch: int,
    poll_seconds: float,
    style: str,
    record: Path | None = None,
) -> None:
    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    quoted = '"' + schema + '"'
    claim, finish, effect, tuned = (q.format(schema=quoted) for q in (SEED_CLAIM, SEED_FINISH, EFFECT, TUNED_FINISH))
    name = f"{socket.gethostname()}:{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True, application_name="seed-baseline") as conn:
        if style == "honest":
            return ceiling(conn, quoted, queue, batch, f"{schema}_wakeup", lambda: stop, honest=True, record=record)
        if style in ("ceiling", "txloop"):
            loop = ceiling if style == "ceiling" else txloop
            return loop(conn, quoted, queue, batch, f"{schema}_wakeup", lambda: stop)
        print("ready", flush=True)
        while not stop:
            jobs = conn.execute(claim, {"queue": queue, "batch": batch, "name": name}).fetchall()
            if not jobs:
                time.sleep(poll_seconds)
                continue
            if style == "tuned":
                conn.execute(tuned, {"ids": [job[0] for job in jobs], "name": name})
                continue
            for job_id, _payload, attempts, _max_attempts in jobs:
                if handler == "write":  # the seed calls the handler outside any transaction
                    conn.execute(effect, {"id": job_id, "attempts": attempts})
                conn.execute(finish, {"s": "done", "id": job_id})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--queue", default="bench")
    p.add_argument("--handler", choices=["noop", "write"], default="noop")
    p.add_argument("--style", choices=["seed", "tuned", "ceiling", "honest", "txloop"], default="seed")
    p.add_argument("--batch", type=int, help="jobs per claim (default 10; tuned 100; ceiling, honest, txloop 200)")
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--record", type=Path, help="honest: record each job's pick-up time in this directory (latency)")
    a = p.parse_args(argv)
    batch = a.batch or {"tuned": 100, "ceiling": 200, "honest": 200, "txloop": 200}.get(a.style, 10)
    run(a.dsn, a.schema, a.queue, a.handler, batch, a.poll, a.style, a.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
