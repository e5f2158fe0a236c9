"""A fan-in of 1,000 jobs into one callback under worker SIGKILLs and terminated backends: the callback commits
exactly once, after every parent is done, and no job is left waiting (the fault tooling of test_faults.py)."""

from __future__ import annotations

import random
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from skiplock import Queue, Settings
from support.chaos import (
    FAULT_HANDLERS,
    FAULT_WORKER,
    Fleet,
    PrivatePostgres,
    all_terminal,
    read_executions,
    setup_schema,
    terminate_worker_backends,
)
from support.pg import wait_for

from .conftest import SUMMARY

PARENTS = 1_000
WORKER = FAULT_WORKER
HANDLERS = FAULT_HANDLERS


def done_at_least(dsn: str, schema: str, n: int) -> Callable[[], bool]:
    def check() -> bool:
        with psycopg.connect(dsn) as conn:
            query = sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'").format(sql.Identifier(schema, "jobs"))
            row = conn.execute(query).fetchone()
        return row is not None and row[0] >= n

    return check


def test_fan_in_of_1000_under_kills_and_terminated_backends(chaos_pg: PrivatePostgres, tmp_path: Path) -> None:
    rng = random.Random(39)
    schema = f"fanin_{uuid.uuid4().hex[:10]}"
    setup_schema(chaos_pg.dsn, schema)
    settings = Settings.load(env={}, dsn=chaos_pg.dsn, schema=schema, max_attempts=12)
    payloads = [
        {"kind": "flaky", "fail_times": 1, "sleep": 0.05} if i % 10 == 0 else {"kind": "instant", "sleep": 0.05}
        for i in range(PARENTS)
    ]
    with Queue(settings=settings, max_size=2) as queue:
        parents = list(queue.enqueue_many("fanin", payloads))
        callback = queue.enqueue("fanin", {"kind": "instant"}, after=parents).id
    faults = {"kill": 0, "terminate": 0}
    argv = (sys.executable, "-m", "skiplock", "worker")
    with Fleet(chaos_pg.dsn, schema, "fanin", tmp_path, HANDLERS, argv=argv, **WORKER) as fleet:
        wait_for(done_at_least(chaos_pg.dsn, schema, 50), timeout=60, interval=0.05, what="the fleet at work")
        for fault in ["terminate", "kill", "terminate", "kill", "terminate", "kill"]:
            time.sleep(0.3 * rng.uniform(0.6, 1.4))  # pacing the faults, not waiting for a result
            if fault == "kill":
                fleet.kill_random(rng)
                faults["kill"] += 1
            else:
                faults["terminate"] += terminate_worker_backends(chaos_pg.dsn)
        last_fault = time.time()
        wait_for(all_terminal(chaos_pg.dsn, schema), timeout=180, interval=0.2, what="every job final")
    jobs, effects = sql.Identifier(schema, "jobs"), sql.Identifier(schema, "effects")
    with psycopg.connect(chaos_pg.dsn) as conn:
        statuses = dict(
            conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(jobs)).fetchall()
        )
        committed = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(effects), [callback])
        callback_effects = committed.fetchone()
    runs = read_executions(tmp_path)
    last_parent_end = max(e.at for e in runs if e.job_id != callback and e.tag == "E" and e.outcome == "ok")
    callback_starts = [e.at for e in runs if e.job_id == callback and e.tag == "S"]
    SUMMARY.append(
        f"[fan-in {PARENTS}] statuses {statuses}; callback effects committed {callback_effects}; callback started "
        f"{len(callback_starts)}x, first {min(callback_starts, default=0) - last_parent_end:+.3f}s after the last "
        f"parent's handler returned, {min(callback_starts, default=0) - last_fault:.1f}s after the last fault; faults "
        f"{faults} (terminated connections); worker restarts {fleet.restarts}"
    )
    assert statuses == {"done": PARENTS + 1}, "every parent and the callback done, none stranded waiting"
    assert callback_effects == (1,), "the callback committed exactly once"
    assert callback_starts and min(callback_starts) > last_parent_end, "the callback started after every parent"
    assert faults["kill"] == 3 and fleet.restarts >= 3 and faults["terminate"] > 0
    assert last_fault < min(callback_starts), "the faults hit the fan-in while parents still ran"
