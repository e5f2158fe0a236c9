"""Pick-up after a reconnect, once the faults are over: the sequence of issue 42 (SIGKILLed and restarted workers,
terminated backends, a PostgreSQL restart, a worker SIGSTOPped past its lease), then, once idle, every client
backend terminated and jobs enqueued one at a time through the CLI. Each must start, and end, within the poll
interval plus a second of the listeners being back.

It failed before: every worker's pools held dead connections, and psycopg_pool tried them one after another with a
growing pause (1 s, 2 s, 4 s), so each job waited about 7 s with ``--poll 1`` (see ``skiplock.worker.pools``)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from skiplock import Settings
from support.chaos import (
    FAULT_HANDLERS,
    FAULT_WORKER,
    TESTS,
    Fleet,
    Invariant,
    PrivatePostgres,
    Producer,
    all_terminal,
    read_executions,
    setup_schema,
    terminate_worker_backends,
)
from support.pg import wait_for

from .test_faults import report

POLL = 1.0
WORKER = FAULT_WORKER | {"lease_seconds": 4.0, "heartbeat_seconds": 1.0, "poll_seconds": POLL}
HANDLERS = FAULT_HANDLERS
MIX = {"instant": 10, "slow": 2, "delayed": 2, "flaky": 3}
STOPPED_SECONDS = 6.0  # past the lease: its jobs are recovered elsewhere while it sleeps
PROBES = 3
IDLE_CHECK_PAUSE = 2.5  # longer than the pools' idle check (pools.IDLE_CHECK_SECONDS): connections are checked


def cli_enqueue(dsn: str, schema: str, key: str) -> tuple[int, float]:
    """Enqueue one instant job with ``skiplock enqueue``; returns its id and when it was enqueued (its row's
    ``created_at``: the server runs on this machine, so its clock is this test's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env.update({"SKIPLOCK_DSN": dsn, "SKIPLOCK_SCHEMA": schema, "SKIPLOCK_QUEUE": "chaos", "PYTHONPATH": str(TESTS)})
    payload = f'{{"kind": "instant", "key": "{key}"}}'
    out = subprocess.run(
        [sys.executable, "-m", "skiplock", "enqueue", "--payload", payload],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job_id = int(out.stdout.strip())
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT extract(epoch FROM created_at) FROM {} WHERE id = %s").format(
                sql.Identifier(schema, "jobs")
            ),
            (job_id,),
        ).fetchone()
    assert row is not None
    return job_id, float(row[0])


def listeners_up(fleet: Fleet, before: dict[str, int]) -> bool:
    """Every live worker logged "listener connected" once more than it had in ``before``: its own line, or the
    outage filter's "database back after N s; listener connected" when its return ended an outage."""
    return all(p.output().count("listener connected") > before.get(p.name, 0) for p in fleet.live())


def test_pick_up_after_the_faults_and_a_termination_of_every_backend_stays_within_the_poll(
    chaos_pg: PrivatePostgres, tmp_path: Path
) -> None:
    rng = random.Random(42)
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    setup_schema(chaos_pg.dsn, schema)
    settings = Settings.load(env={}, dsn=chaos_pg.dsn, schema=schema, max_attempts=12)
    producer = Producer(settings, "chaos", rng, 12)
    enqueued_at: dict[int, float] = {}
    with Fleet(chaos_pg.dsn, schema, "chaos", tmp_path, HANDLERS, **WORKER) as fleet:
        wait_for(lambda: listeners_up(fleet, {}), timeout=30, interval=0.1, what="every worker listening")
        producer.start(per_tick=6, tick=0.2, mix=MIX)
        # the faults, over about 20 s, while jobs flow
        time.sleep(2.0)
        fleet.kill_random(rng)
        time.sleep(1.5)
        terminate_worker_backends(chaos_pg.dsn)
        time.sleep(1.5)
        chaos_pg.restart("fast")
        time.sleep(2.0)
        stopped = fleet.live()[0]
        stopped.popen.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.0)
            fleet.kill_random(random.Random(stopped.pid))  # maybe the stopped one: it is restarted then
            time.sleep(1.5)
            terminate_worker_backends(chaos_pg.dsn)
            time.sleep(STOPPED_SECONDS - 3.5)
        finally:
            if stopped.alive:
                stopped.popen.send_signal(signal.SIGCONT)
        time.sleep(2.0)
        producer.stop()
        wait_for(all_terminal(chaos_pg.dsn, schema), timeout=60, interval=0.2, what="every job terminal")
        wait_for(lambda: listeners_up(fleet, {}), timeout=30, interval=0.1, what="every worker listening")
        # idle; then every client backend is terminated, and jobs come one at a time once the listeners are back
        time.sleep(IDLE_CHECK_PAUSE)
        before = {p.name: p.output().count("listener connected") for p in fleet.live()}
        terminated = terminate_worker_backends(chaos_pg.dsn)
        wait_for(lambda: listeners_up(fleet, before), timeout=15, interval=0.05, what="every listener back")
        for n in range(PROBES):
            key = f"probe-{n}"
            job_id, enqueued_at[job_id] = cli_enqueue(chaos_pg.dsn, schema, key)
            wait_for(all_terminal(chaos_pg.dsn, schema), timeout=30, interval=0.05, what=f"{key} done")
            time.sleep(IDLE_CHECK_PAUSE)  # the next probe meets connections idle long enough to be checked
    runs = read_executions(tmp_path)
    starts = {e.job_id: e.at for e in runs if e.tag == "S" and e.job_id in enqueued_at}
    ends = {e.job_id: e.at for e in runs if e.tag == "E" and e.job_id in enqueued_at}
    lines = []
    late = []
    for job_id, enqueued in enqueued_at.items():
        start = starts.get(job_id, float("inf")) - enqueued
        end = ends.get(job_id, float("inf")) - enqueued
        lines.append(f"job {job_id}: started {start:.2f}s, ended {end:.2f}s after its enqueue")
        if end > POLL + 1.0:
            late.append(job_id)
    report(
        "pick-up after reconnect",
        [
            Invariant(
                f"after {terminated} backends terminated, each job picked up and done within poll + 1 s",
                not late,
                "; ".join(lines),
            )
        ],
    )
