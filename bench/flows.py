"""Workflow cases (issue 39): a fan-out of N jobs into one callback, and a chain of N links, drained by W workers.

``fan_out``: N children and a callback ``after`` all of them, committed in one transaction, ``rounds`` times in turn;
per round, the time from the last child done (its completing transaction's clock) to the callback's start (its
handler's clock, stored as its result): the release and the wake-up, not the drain. ``chain``: N jobs, each after the
one before, committed in one transaction; jobs/s from the commit to the last one done (one job ready at a time: each
link pays a completion, a release, a NOTIFY and a claim)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import meter
from psycopg import sql
from scenario import QUEUE, BenchError, Config, connect, drop_schemas, new_schema, queue_for, running, start_skiplock
from scenario import wait_ready as _wait_ready


def _wait_done(cfg: Config, schema: str, job_id: int, timeout: float) -> Any:
    """Poll (every 20 ms) until the job is done; its result."""
    query = sql.SQL("SELECT status, result FROM {}.jobs WHERE id = %s").format(sql.Identifier(schema))
    deadline = time.monotonic() + timeout
    with connect(cfg) as mon:
        while True:
            row = mon.execute(query, [job_id]).fetchone()
            if row is not None and row[0] in ("done", "failed", "cancelled"):
                if row[0] != "done":
                    raise BenchError(f"job {job_id} ended {row[0]}")
                return row[1]
            if time.monotonic() > deadline:
                raise BenchError(f"job {job_id} not done within {timeout:.0f}s")
            time.sleep(0.02)


def fan_out(cfg: Config, *, children: int, rounds: int) -> dict[str, Any]:
    schema = new_schema(cfg, "fanout")
    logdir = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    procs = start_skiplock(cfg, schema, "flowstep", logdir, concurrency=cfg.concurrency)
    latencies, drains = [], []
    ident = sql.Identifier(schema)
    with running(procs), queue_for(cfg, schema) as q:
        _wait_ready(procs)
        for _ in range(rounds):
            with connect(cfg, autocommit=False) as conn:
                ids = list(q.enqueue_many(QUEUE, [{}] * children, conn=conn))
                callback = q.enqueue(QUEUE, {"stamp": True}, after=ids, conn=conn).id
                t_commit = time.time()
                conn.commit()
            started = float(_wait_done(cfg, schema, callback, cfg.drain_timeout))
            with connect(cfg) as mon:
                row = mon.execute(
                    sql.SQL(
                        "SELECT extract(epoch FROM max(updated_at))::float8 FROM {}.jobs WHERE id = ANY(%s)"
                    ).format(ident),
                    [ids],
                ).fetchone()
            assert row is not None
            latencies.append((started - float(row[0])) * 1000)
            drains.append(children / (float(row[0]) - t_commit))
    drop_schemas(cfg, schema)
    return {
        "jobs": children,
        "rounds": rounds,
        "jobs_per_s": meter.median(drains),
        "callback_p50_ms": meter.percentile(latencies, 50),
        "callback_p99_ms": meter.percentile(latencies, 99),
        "callback_ms": latencies,
    }


def chain(cfg: Config, *, links: int) -> dict[str, Any]:
    schema = new_schema(cfg, "chain")
    logdir = Path(tempfile.mkdtemp(prefix="bench-chain-"))
    procs = start_skiplock(cfg, schema, "flowstep", logdir, concurrency=cfg.concurrency)
    with running(procs), queue_for(cfg, schema) as q:
        _wait_ready(procs)
        with connect(cfg, autocommit=False) as conn:
            last = q.enqueue(QUEUE, {}, conn=conn).id
            for _ in range(links - 1):
                last = q.enqueue(QUEUE, {}, after=[last], conn=conn).id
            t_commit = time.time()
            conn.commit()
        _wait_done(cfg, schema, last, cfg.drain_timeout)
        with connect(cfg) as mon:
            row = mon.execute(
                sql.SQL("SELECT extract(epoch FROM updated_at)::float8 FROM {}.jobs WHERE id = %s").format(
                    sql.Identifier(schema)
                ),
                [last],
            ).fetchone()
    assert row is not None
    seconds = float(row[0]) - t_commit
    drop_schemas(cfg, schema)
    return {"jobs": links, "seconds": seconds, "jobs_per_s": links / seconds}
