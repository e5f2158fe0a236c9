"""Poison jobs (a handler that kills its worker) and interrupted work: bounded attempts, the fleet survives,
rescues are counted; a drain hands jobs back even when the database has just dropped the worker's connections."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from skiplock import Queue, Settings
from support.chaos import (
    POISON_EXIT,
    Fleet,
    Invariant,
    PrivatePostgres,
    read_executions,
    setup_schema,
    terminate_worker_backends,
)
from support.pg import wait_for

from .test_faults import report

POISON_WORKER = {
    "lease_seconds": 2,
    "heartbeat_seconds": 0.5,
    "poll_seconds": 0.3,
    "recover_seconds": 0.3,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.2,
    "concurrency": 3,
    "batch": 1,
}


def _metric(body: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_a_poison_job_fails_after_max_attempts_with_an_expired_lease_and_the_fleet_keeps_running(
    chaos_pg: PrivatePostgres, tmp_path: Path
) -> None:
    schema = f"poison_{uuid.uuid4().hex[:10]}"
    setup_schema(chaos_pg.dsn, schema)
    settings = Settings.load(env={}, dsn=chaos_pg.dsn, schema=schema)
    handlers = ["support.chaos:work", "support.chaos:awork", "support.chaos:work"]
    with (
        Queue(settings=settings, max_size=2) as q,
        Fleet(chaos_pg.dsn, schema, "p", tmp_path, handlers, metrics=True, **POISON_WORKER) as fleet,
    ):
        poison = q.enqueue("p", {"kind": "poison", "key": "poison"}, max_attempts=3).id
        normal = q.enqueue_many("p", [{"kind": "instant", "key": f"n{i}"} for i in range(30)], max_attempts=10)
        started = time.monotonic()
        wait_for(lambda: q.get(poison)["status"] == "failed", timeout=90, interval=0.1, what="the poison job failed")
        took = time.monotonic() - started
        row = q.get(poison)
        # The fleet still works: fresh jobs finish, and no worker dies any more.
        exits_before = sum(fleet.exits.values())
        later = q.enqueue_many("p", [{"kind": "instant", "key": f"l{i}"} for i in range(20)])
        wanted = set(normal) | set(later)
        wait_for(
            lambda: all(q.get(i)["status"] == "done" for i in wanted), timeout=60, interval=0.2, what="others done"
        )
        wait_for(lambda: len(fleet.live()) == len(handlers), timeout=30, what="every worker back up")
        bodies: list[str] = []
        for proc in fleet.live():
            try:
                bodies.append(proc.scrape())
            except OSError:
                bodies.append("")
        exits = dict(fleet.exits)
        died_later = sum(fleet.exits.values()) - exits_before
    poison_runs = [e for e in read_executions(tmp_path) if e.tag == "S" and e.job_id == poison]
    recovered_failed = sum(_metric(b, "skiplock_jobs_recovered_total", status="failed") for b in bodies)
    recovered_all = sum(_metric(b, "skiplock_jobs_recovered_total") for b in bodies)
    report(
        "poison",
        [
            Invariant(
                "poison job failed after max_attempts with an expired lease",
                row["status"] == "failed"
                and row["attempts"] == 3
                and "lease expired" in (row["last_error"] or "")
                and len(poison_runs) == 3,
                f"status {row['status']}, attempts {row['attempts']}/3, {len(poison_runs)} executions, "
                f"{took:.1f}s to fail, last_error {row['last_error']!r}",
            ),
            Invariant(
                "the fleet keeps running",
                exits.get(POISON_EXIT, 0) == 3 and set(exits) <= {POISON_EXIT} and died_later == 0,
                f"worker exits {exits} (each restarted), {len(wanted)} other jobs done, {died_later} exits after",
            ),
            Invariant(
                "rescues counted in metrics",
                recovered_failed >= 1,
                f"surviving workers count {recovered_all:.0f} rescued job(s), {recovered_failed:.0f} of them to "
                f"failed (the counters of killed workers died with them; 3 rescues of the poison job happened)",
            ),
        ],
    )


def test_a_drain_right_after_the_connections_were_dropped_still_hands_the_job_back(
    chaos_pg: PrivatePostgres, tmp_path: Path
) -> None:
    schema = f"drain_{uuid.uuid4().hex[:10]}"
    setup_schema(chaos_pg.dsn, schema)
    settings = Settings.load(env={}, dsn=chaos_pg.dsn, schema=schema)
    quiet = {"lease_seconds": 20, "heartbeat_seconds": 5, "poll_seconds": 5, "recover_seconds": 10}
    with (
        Queue(settings=settings, max_size=2) as q,
        Fleet(
            chaos_pg.dsn, schema, "d", tmp_path, ["support.chaos:work"], shutdown_grace_seconds=0.2, **quiet
        ) as fleet,
    ):
        job = q.enqueue("d", {"kind": "slow", "sleep": 30, "key": "held"}).id
        # The handler has written its effect and sleeps inside its transaction: only then drop the connections
        # (a connection dropped before the handler used it fails that attempt, which is not what this tests).
        wait_for(lambda: _in_handler_transaction(chaos_pg.dsn), timeout=30, what="the handler mid-transaction")
        assert terminate_worker_backends(chaos_pg.dsn) >= 1
        proc, code = fleet.drain(0)
        assert code == 0, proc.output()
        fleet.held.add(0)  # keep it down: nothing may claim the job again before we look
        row = q.get(job)
    assert (row["status"], row["attempts"]) == ("pending", 0), proc.output()[-2000:]


def _in_handler_transaction(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skiplock-worker' "
            "AND state = 'idle in transaction' AND query LIKE 'INSERT INTO%%effects%%'"
        ).fetchone()
    return bool(row and row[0])
