"""The worker core on its seams, against a real PostgreSQL: tasks, several queues, unknown tasks, embedding, the
testing helper, and the defects fixed with the rebuild (each test fails on the previous worker)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from skiplock import Settings
from skiplock.app import App
from skiplock.testing import enqueued, run_jobs
from skiplock.worker import APPLICATION_NAME, Worker
from support.http import status_of
from support.pg import await_for, wait_for
from support.store import WorkerCalls

TESTS = Path(__file__).resolve().parents[1]


def insert(dsn: str, schema: str, queue: str, payloads: list[Any], task: str | None = None, **cols: Any) -> list[int]:
    """Jobs written with plain SQL (as any producer may), optionally naming a task."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, task, max_attempts) '
            "SELECT %s, p, %s, %s FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS a(p, n) ORDER BY n "
            "RETURNING id",
            (queue, task, cols.get("max_attempts", 5), json.dumps(payloads)),
        ).fetchall()
    return [r[0] for r in rows]


def statuses(dsn: str, schema: str, ids: list[int]) -> dict[int, tuple[str, int, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f'SELECT id, status, attempts, last_error FROM "{schema}".jobs WHERE id = ANY(%s)', (ids,)
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def fast(settings: Settings, **kw: Any) -> Settings:
    return settings.replace(**{"poll_seconds": 0.2, "backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.1, **kw})


# ---------------------------------------------------------------------------------------------- tasks
async def test_sync_and_async_tasks_of_one_app_and_a_catch_all_handler_run_in_one_worker(settings, pg_dsn, schema):
    app = App()
    seen: dict[str, list[int]] = {"sync": [], "async": [], "default": []}

    @app.task(name="t.sync", queue="default")
    def sync_task(job):
        assert threading.current_thread().name.startswith("skiplock-handler")
        seen["sync"].append(job.payload["n"])

    @app.task(name="t.async", queue="default")
    async def async_task(job):
        seen["async"].append(job.payload["n"])

    def default(job):
        assert job.task is None
        seen["default"].append(job.payload["n"])

    insert(pg_dsn, schema, "default", [{"n": i} for i in range(5)], task="t.sync")
    insert(pg_dsn, schema, "default", [{"n": i} for i in range(5)], task="t.async")
    insert(pg_dsn, schema, "default", [{"n": i} for i in range(3)])
    async with Worker(app, settings=fast(settings), handler=default):
        await await_for(
            lambda: len(seen["sync"]) == 5 and len(seen["async"]) == 5 and len(seen["default"]) == 3,
            timeout=20,
            what="every job run by its task",
        )
    assert sorted(seen["sync"]) == sorted(seen["async"]) == list(range(5))


async def test_an_unknown_task_is_retried_with_a_clear_error_counted_and_failed_when_attempts_are_spent(
    settings, pg_dsn, schema
):
    app = App()

    @app.task(name="known")
    def known(job):
        pass

    [job_id] = insert(pg_dsn, schema, "default", [{}], task="nosuch.task", max_attempts=3)
    worker = Worker(app, settings=fast(settings))
    async with worker:
        await await_for(
            lambda: statuses(pg_dsn, schema, [job_id])[job_id][0] == "failed", timeout=20, what="unknown task failed"
        )
    _, attempts, error = statuses(pg_dsn, schema, [job_id])[job_id]
    assert attempts == 3
    assert error == "UnknownTaskError: no task 'nosuch.task' registered in this worker"
    labels = {"queue": "default", "outcome": "unknown_task"}
    assert worker.registry.get_sample_value("skiplock_jobs_finished_total", labels) == 3
    assert (
        worker.registry.get_sample_value("skiplock_jobs_failed_total", {"queue": "default", "reason": "unknown_task"})
        == 1
    )


async def test_task_options_non_retryable_and_backoff_apply(settings, pg_dsn, schema):
    app = App()

    class Permanent(Exception):
        pass

    @app.task(name="strict", non_retryable=Permanent, backoff_base_seconds=0.01, backoff_cap_seconds=0.01)
    def strict(job):
        raise Permanent("bad input") if job.payload["permanent"] else RuntimeError("flaky")

    permanent, flaky = (insert(pg_dsn, schema, "default", [{"permanent": p}], task="strict")[0] for p in (True, False))
    async with Worker(app, settings=fast(settings)):
        await await_for(
            lambda: all(s[0] == "failed" for s in statuses(pg_dsn, schema, [permanent, flaky]).values()),
            timeout=20,
            what="both failed",
        )
    rows = statuses(pg_dsn, schema, [permanent, flaky])
    assert rows[permanent][1] == 1 and rows[permanent][2] == "Permanent: bad input"
    assert rows[flaky][1] == 5, "retried until max_attempts with the task's short backoff"


# ---------------------------------------------------------------------------------------------- queues
async def test_one_worker_serves_several_queues_and_a_busy_one_does_not_starve_a_quiet_one(settings, pg_dsn, schema):
    order: list[str] = []

    def handler(job):
        order.append(job.queue)
        time.sleep(0.002)

    insert(pg_dsn, schema, "busy", [{} for _ in range(400)])  # older: the busy backlog is ahead in visible_at
    time.sleep(0.05)
    insert(pg_dsn, schema, "quiet", [{} for _ in range(3)])
    s = fast(settings, queues=("busy", "quiet"), concurrency=2, batch=2)
    async with Worker(settings=s, handler=handler):
        await await_for(lambda: order.count("quiet") == 3, timeout=30, what="the quiet queue's jobs")
        position = max(i for i, q in enumerate(order) if q == "quiet")
    assert position < 20, f"the quiet queue waited behind {position} busy jobs"


# ---------------------------------------------------------------------------------------------- embedding
def test_a_worker_started_in_a_thread_is_ready_runs_jobs_and_stops_from_another_thread(settings, pg_dsn, schema):
    ran: list[int] = []
    worker = Worker(settings=fast(settings), handler=lambda job: ran.append(job.id))
    worker.start()
    try:
        assert worker.ready
        ids = insert(pg_dsn, schema, "default", [{} for _ in range(5)])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, 'default')", (settings.channel,))
        wait_for(lambda: sorted(ran) == ids, timeout=15, what="jobs run by the embedded worker")
    finally:
        stopper = threading.Thread(target=worker.stop)  # stop from a thread that is neither the caller nor the loop
        stopper.start()
        stopper.join(30)
    assert not stopper.is_alive() and worker.exit_code == 0 and not worker.ready


def test_start_raises_the_startup_error_of_a_wrong_dsn(settings):
    worker = Worker(settings=settings.replace(dsn="postgresql://nobody@127.0.0.1:1/none"), handler=lambda job: None)
    with pytest.raises(Exception, match="database unavailable"):
        worker.start(timeout=30)


async def test_request_stop_from_another_thread_drains_an_asyncio_worker(settings):
    worker = Worker(settings=fast(settings), handler=lambda job: None)
    task = asyncio.create_task(worker.run())
    await worker.wait_ready(timeout=20)
    threading.Thread(target=worker.request_stop).start()
    assert await asyncio.wait_for(task, 30) == 0


# ---------------------------------------------------------------------------------------------- skiplock.testing
def test_run_jobs_runs_due_jobs_inline_and_reports_them(settings, pg_dsn, schema):
    app = App()
    effects: list[int] = []

    @app.task(name="send", queue="mail")
    def send(job):
        if job.payload.get("fail"):
            raise RuntimeError("smtp down")
        effects.append(job.payload["n"])

    ok = insert(pg_dsn, schema, "mail", [{"n": 1}, {"n": 2}], task="send")
    bad = insert(pg_dsn, schema, "mail", [{"fail": True}], task="send", max_attempts=1)
    unknown = insert(pg_dsn, schema, "mail", [{}], task="gone", max_attempts=1)
    assert [j["id"] for j in enqueued(settings=settings, task="send")] == ok + bad
    report = run_jobs(app, settings=settings, timeout=30)
    assert sorted(report.done) == ok and sorted(report.failed) == bad + unknown and report.unknown == unknown
    assert sorted(effects) == [1, 2] and not report.timed_out
    assert enqueued(settings=settings, task="send") == []
    assert len(enqueued(settings=settings, status="done")) == 2


def test_enqueued_with_conn_reads_inside_that_transaction(settings, pg_dsn, schema):
    with psycopg.connect(pg_dsn) as conn:  # a transaction left open: its insert is not committed
        row = conn.execute(f'INSERT INTO "{schema}".jobs (queue, payload) VALUES (%s, %s) RETURNING id', ("q", "{}"))
        job_id = row.fetchall()[0][0]
        assert [j["id"] for j in enqueued(settings=settings, conn=conn)] == [job_id]
        assert enqueued(settings=settings) == [], "not committed: another connection sees nothing"
        conn.rollback()


def test_run_jobs_stops_at_its_bound(settings, pg_dsn, schema):
    app = App()

    @app.task(name="again", queue="loop")
    def again(job):  # enqueues another job forever
        job.conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload, task) VALUES (%s, %s, %s)', ("loop", "{}", "again")
        )

    insert(pg_dsn, schema, "loop", [{}], task="again")
    report = run_jobs(app, settings=settings.replace(concurrency=1, batch=1), max_jobs=5, timeout=30)
    assert 5 <= len(report.done) <= 7


def test_claimed_jobs_carry_utc_timestamps_while_job_conn_keeps_the_server_time_zone(settings, pg_dsn, schema):
    """The control connections work in UTC (a claim's timestamps load without conversion); the handler's own
    connection is left as the DSN sets it up."""
    app = App()
    seen: list[tuple[Any, Any, str]] = []

    @app.task(name="stamp", queue="tz")
    def stamp(job):
        zone = job.conn.execute("SHOW TimeZone").fetchone()[0]
        seen.append((job.created_at, job.visible_at, zone))

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        before = conn.execute("SELECT now()").fetchone()[0]
    insert(pg_dsn, schema, "tz", [{}], task="stamp")
    elsewhere = make_conninfo(pg_dsn, options="-c TimeZone=America/New_York")
    report = run_jobs(app, settings=settings.replace(dsn=elsewhere), timeout=30)
    assert len(report.done) == 1 and len(seen) == 1
    created, visible, zone = seen[0]
    assert created.tzinfo is UTC and visible.tzinfo is UTC, "UTC datetimes, not the session's zone"
    assert abs((created - before).total_seconds()) < 60, "the same instant as stored"
    assert zone == "America/New_York", "job.conn keeps the time zone the DSN asks for"


# ---------------------------------------------------------------------------------------------- defects
def test_lease_deadline_is_stored_and_judges_recovery_and_stalled(queue, pg_dsn, schema):
    [short] = queue.enqueue_many("q", [{}])
    [long] = queue.enqueue_many("q", [{}])
    [a] = queue.claim("q", limit=1, worker="w20", lease_seconds=20)
    [b] = queue.claim("q", limit=1, worker="w600", lease_seconds=600)
    assert {a.id, b.id} == {short, long}
    with psycopg.connect(pg_dsn) as conn:
        later = conn.execute("SELECT now() + interval '30 seconds'").fetchone()[0]
    [stats] = queue.stats("q", lease_seconds=5, now=later)
    assert stats.stalled == 1, "only the 20 s lease is past its deadline, whatever the observer's lease"
    assert [r.id for r in WorkerCalls(queue).recover_expired(queue="q", lease_seconds=5, now=later)] == [a.id]


def test_setting_only_the_lease_frees_a_killed_workers_jobs_within_about_two_leases(settings, pg_dsn, schema):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update({"SKIPLOCK_DSN": pg_dsn, "SKIPLOCK_SCHEMA": schema, "PYTHONPATH": str(TESTS)})
    cmd = [sys.executable, "-m", "skiplock", "worker", "--queue", "k", "--lease", "4"]
    [job_id] = insert(pg_dsn, schema, "k", [{"seconds": 60}])
    victim = subprocess.Popen([*cmd, "--handler", "support.handlers:sleepy"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: statuses(pg_dsn, schema, [job_id])[job_id][0] == "processing", timeout=20, what="claimed")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed = time.monotonic()
        rescuer = subprocess.Popen([*cmd, "--handler", "support.handlers:noop"], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            wait_for(lambda: statuses(pg_dsn, schema, [job_id])[job_id][0] == "done", timeout=30, what="rescued")
            took = time.monotonic() - killed
        finally:
            rescuer.send_signal(signal.SIGTERM)
            assert rescuer.wait(30) == 0, rescuer.stderr.read() if rescuer.stderr else ""
    finally:
        if victim.poll() is None:
            victim.kill()
    assert took < 2 * 4 + 4, f"the job was free again {took:.1f}s after the kill (lease 4 s)"


async def test_pick_up_after_every_worker_connection_is_terminated_stays_within_the_poll(settings, pg_dsn, schema):
    started: dict[int, float] = {}
    s = settings.replace(poll_seconds=1.0, lease_seconds=20)

    async def handler(job):
        started[job.id] = time.monotonic()

    async with Worker(settings=s, handler=handler) as worker:
        await await_for(lambda: worker.listener is not None and worker.listener.connected, timeout=15, what="listen")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (APPLICATION_NAME,),
            )
        await asyncio.sleep(0.5)
        enqueued_at = time.monotonic()
        ids = insert(pg_dsn, schema, "default", [{}, {}])
        await await_for(lambda: all(i in started for i in ids), timeout=20, what="jobs after the failover")
    late = max(started[i] - enqueued_at for i in ids)
    assert late < s.poll_seconds + 2.0, f"picked up {late:.1f}s after enqueue with a {s.poll_seconds}s poll"


async def test_heartbeats_and_a_mid_drain_stop_report_no_false_lease_loss(settings, pg_dsn, schema, caplog):
    caplog.set_level(logging.WARNING, logger="skiplock")
    s = fast(settings, lease_seconds=3.0, heartbeat_seconds=0.2, concurrency=8, batch=8)  # beats while jobs finish

    async def handler(job):
        await asyncio.sleep(0.001)

    insert(pg_dsn, schema, "default", [{} for _ in range(1500)])
    worker = Worker(settings=s, handler=handler)
    async with worker:
        await await_for(
            lambda: (worker.registry.get_sample_value("skiplock_jobs_claimed_total", {"queue": "default"}) or 0) > 1200,
            timeout=60,
            what="most jobs claimed",
        )
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == []
    assert (
        worker.registry.get_sample_value("skiplock_jobs_finished_total", {"queue": "default", "outcome": "lease_lost"})
        == 0
    )


def test_a_busy_metrics_port_exits_2_at_once_with_a_clear_message(settings, pg_dsn, schema):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")} | {"PYTHONPATH": str(TESTS)}
        done = subprocess.run(
            [sys.executable, "-m", "skiplock", "worker", "--dsn", pg_dsn, "--schema", schema, "--handler",
             "support.handlers:noop", "--metrics-port", str(port)],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"cannot serve metrics on 0.0.0.0:{port}" in done.stderr


async def test_jobs_leased_to_this_worker_but_unknown_to_it_are_handed_back_without_burning_an_attempt(
    settings, pg_dsn, schema, aqueue
):
    ran: list[int] = []
    worker = Worker(settings=fast(settings), handler=lambda job: ran.append(job.id))
    async with worker:
        await aqueue.enqueue("elsewhere", {})  # not served: must not be touched
        [job_id] = insert(pg_dsn, schema, "default", [{}])
        # A claim that committed while its reply was lost: the rows name this worker, the worker never saw them.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{schema}".jobs SET status = %s, attempts = 1, locked_by = %s, locked_at = now(), '
                "lease_expires_at = now() + interval '1 hour' WHERE id = %s",
                ("processing", worker.identity, job_id),
            )
        assert worker._claimer is not None
        worker._claimer._orphans_possible = True  # what a failed claim call sets
        worker._wakeup.wake()
        await await_for(lambda: job_id in ran, timeout=15, what="orphan handed back and run")
    status, attempts, _ = statuses(pg_dsn, schema, [job_id])[job_id]
    assert (status, attempts) == ("done", 1), "handed back without burning the attempt, then run once"


async def test_an_async_handler_checks_out_job_conn_only_when_it_uses_it(settings, pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".effects (job_id bigint)')

    async def handler(job):
        if job.payload["write"]:
            await job.conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s)', (job.id,))

    ids = insert(pg_dsn, schema, "default", [{"write": i % 8 == 0} for i in range(40)])
    worker = Worker(settings=fast(settings, concurrency=8, batch=8), handler=handler)
    async with worker:
        await await_for(
            lambda: all(s[0] == "done" for s in statuses(pg_dsn, schema, ids).values()), timeout=30, what="all done"
        )
        assert worker._executors is not None and worker._executors._tasks is not None
        checkouts = worker._executors._tasks.pool.get_stats().get("requests_num", 0)
    with psycopg.connect(pg_dsn) as conn:
        written = sorted(r[0] for r in conn.execute(f'SELECT job_id FROM "{schema}".effects'))
    assert written == ids[::8]
    assert checkouts == 5, f"{checkouts} job.conn checkouts for 5 writing jobs (35 never touched it)"


async def test_a_payload_no_decoder_can_read_fails_alone_and_the_worker_goes_on(settings, pg_dsn, schema):
    ran: list[int] = []
    deep = "[" * 3000 + "]" * 3000  # stored by a producer writing plain SQL
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        good1 = conn.execute(f'INSERT INTO "{schema}".jobs (payload) VALUES (%s) RETURNING id', ("{}",)).fetchone()[0]
        bad = conn.execute(f'INSERT INTO "{schema}".jobs (payload) VALUES (%s) RETURNING id', (deep,)).fetchone()[0]
        good2 = conn.execute(f'INSERT INTO "{schema}".jobs (payload) VALUES (%s) RETURNING id', ("{}",)).fetchone()[0]
    async with Worker(settings=fast(settings), handler=lambda job: ran.append(job.id)):
        await await_for(lambda: sorted(ran) == [good1, good2], timeout=15, what="the good jobs of the batch")
        await await_for(
            lambda: statuses(pg_dsn, schema, [bad])[bad][0] == "failed", timeout=15, what="the bad job failed"
        )
    _, attempts, error = statuses(pg_dsn, schema, [bad])[bad]
    assert attempts == 1 and error and error.startswith("PayloadError: payload cannot be decoded")


async def test_a_notify_flood_costs_a_bounded_number_of_claims_and_jobs_still_start(settings, pg_dsn, schema):
    ran: list[int] = []
    worker = Worker(
        settings=settings.replace(poll_seconds=30, lease_seconds=120), handler=lambda job: ran.append(job.id)
    )
    async with worker:
        await await_for(lambda: worker.listener is not None and worker.listener.connected, timeout=15, what="listen")
        assert worker._claimer is not None
        before = worker._claimer.claims
        started = time.monotonic()

        def flood() -> None:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                for _ in range(40):
                    conn.execute("SELECT pg_notify(%s, 'default') FROM generate_series(1, 500)", (settings.channel,))

        await asyncio.to_thread(flood)  # 20,000 notifications: each transaction folds into one notification
        await asyncio.sleep(0.3)
        claims = worker._claimer.claims - before
        elapsed = time.monotonic() - started
        ids = insert(pg_dsn, schema, "default", [{}])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, 'default')", (settings.channel,))
        await await_for(lambda: ran == ids, timeout=10, what="a real job after the flood")
    assert claims <= elapsed / 0.1 + 4, f"{claims} claims in {elapsed:.1f}s of notifications"


async def test_a_worker_exports_only_the_queues_it_serves(settings, aqueue):
    for i in range(30):
        await aqueue.enqueue(f"other-{i}", {})
    worker = Worker(settings=fast(settings, queues=("a", "b")), handler=lambda job: None)
    async with worker:
        await asyncio.sleep(0.3)
    queues = {s.labels["queue"] for m in worker.registry.collect() for s in m.samples if "queue" in s.labels}
    assert queues == {"a", "b"}


async def test_the_metrics_server_answers_404_for_unknown_paths(settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = Worker(settings=fast(settings, metrics_port=port, metrics_host="127.0.0.1"), handler=lambda job: None)
    async with worker:
        urls = {p: f"http://127.0.0.1:{port}{p}" for p in ("/metrics", "/healthz", "/nosuch", "/")}
        codes = {p: await asyncio.to_thread(status_of, url) for p, url in urls.items()}
    assert codes == {"/metrics": 200, "/healthz": 200, "/nosuch": 404, "/": 404}


@pytest.mark.parametrize(("mode", "listens"), [("transaction", False), ("session", True)])
async def test_behind_pgbouncer_the_listener_proves_itself_and_reports_what_it_can_do(settings, pg_dsn, mode, listens):
    from support.bouncer import run_pgbouncer

    ran: list[int] = []
    with run_pgbouncer(pg_dsn, mode, pool_size=20) as bouncer:
        s = fast(settings, dsn=bouncer, concurrency=1, batch=1)
        worker = Worker(settings=s, handler=lambda job: ran.append(job.id))
        async with worker:
            await await_for(
                lambda: worker.listener is not None and (worker.listener.connected or worker.listener.unsupported),
                timeout=20,
                what="the listener's self-probe",
            )
            [job_id] = insert(pg_dsn, worker.settings.schema, "default", [{}])
            await await_for(lambda: ran == [job_id], timeout=15, what="a job run (by NOTIFY or by the poll)")
            connected = worker.registry.get_sample_value("skiplock_listener_connected")
            enabled = worker.registry.get_sample_value("skiplock_listener_enabled")
    assert (connected, enabled) == ((1.0, 1.0) if listens else (0.0, 0.0))


def test_enqueue_refuses_a_payload_nested_deeper_than_a_worker_decodes(queue):
    from skiplock.errors import PayloadError
    from skiplock.job import MAX_PAYLOAD_DEPTH

    deep: list = []
    for _ in range(MAX_PAYLOAD_DEPTH):
        deep = [deep]
    with pytest.raises(PayloadError, match=f"deeper than {MAX_PAYLOAD_DEPTH}"):
        queue.enqueue("q", deep)
    assert queue.enqueue("q", deep[0]).id > 0, "exactly the limit is accepted"
    assert queue.enqueue("q", {"text": "[" * 5000}).id > 0, "brackets inside strings do not count"


# ---------------------------------------------------------------------------------------------- review findings
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_writes_in_a_job_conn_transaction_block_roll_back_when_the_lease_is_lost(settings, pg_dsn, schema, kind):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".effects (job_id bigint)')
    inside, release = threading.Event(), threading.Event()
    sql = f'INSERT INTO "{schema}".effects VALUES (%s)'

    def steal(job_id: int) -> None:  # another party takes the lease while the handler runs
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".jobs SET locked_by = %s WHERE id = %s', ("thief", job_id))

    def sync_handler(job):
        with job.conn.transaction():
            job.conn.execute(sql, (job.id,))
        inside.set()
        release.wait(20)

    async def async_handler(job):
        async with job.conn.transaction():
            await job.conn.execute(sql, (job.id,))
        inside.set()
        await asyncio.to_thread(release.wait, 20)

    [job_id] = insert(pg_dsn, schema, "default", [{}])
    handler = sync_handler if kind == "sync" else async_handler
    worker = Worker(settings=fast(settings), handler=handler)
    async with worker:
        await asyncio.to_thread(inside.wait, 20)
        steal(job_id)
        release.set()
        await await_for(
            lambda: worker.registry.get_sample_value(
                "skiplock_jobs_finished_total", {"queue": "default", "outcome": "lease_lost"}
            ),
            timeout=15,
            what="the completion refused",
        )
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".effects').fetchone() == (0,), "fenced: rolled back"


async def test_a_claim_whose_first_reply_was_lost_has_its_jobs_handed_back_and_run(
    settings, pg_dsn, schema, monkeypatch
):
    from skiplock.store.worker import PgWorkerStore

    real = PgWorkerStore._claim
    lost: list[int] = []

    async def lose_first_reply(self, call):
        done, jobs = await real(self, call)
        if jobs and not lost:
            lost.extend(j.id for j in jobs)
            raise psycopg.OperationalError("server closed the connection unexpectedly")  # committed, reply lost
        return done, jobs

    monkeypatch.setattr(PgWorkerStore, "_claim", lose_first_reply)
    ran: list[int] = []
    [job_id] = insert(pg_dsn, schema, "default", [{}], max_attempts=1)
    async with Worker(settings=fast(settings), handler=lambda job: ran.append(job.id)):
        await await_for(lambda: ran == [job_id], timeout=15, what="the orphaned job handed back and run")
        await await_for(lambda: statuses(pg_dsn, schema, [job_id])[job_id][0] == "done", timeout=15, what="done")
    assert lost == [job_id] and statuses(pg_dsn, schema, [job_id])[job_id][1] == 1, "one attempt, not burnt"


async def test_cancelling_run_hands_running_jobs_back_without_burning_an_attempt(settings, pg_dsn, schema):
    started: list[int] = []

    async def handler(job):
        started.append(job.id)
        await asyncio.sleep(60)

    ids = insert(pg_dsn, schema, "default", [{}, {}])
    worker = Worker(settings=fast(settings), handler=handler)
    task = asyncio.create_task(worker.run())
    await await_for(lambda: len(started) == 2, timeout=15, what="both jobs running")
    task.cancel()  # what a framework's lifespan or Ctrl-C does
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert {s[:2] for s in statuses(pg_dsn, schema, ids).values()} == {("pending", 0)}


async def test_a_single_slot_worker_alternates_between_its_queues(settings, pg_dsn, schema):
    order: list[str] = []
    insert(pg_dsn, schema, "a", [{} for _ in range(6)])  # older backlog
    time.sleep(0.05)
    insert(pg_dsn, schema, "b", [{} for _ in range(6)])
    s = fast(settings, queues=("a", "b"), concurrency=1, batch=1)
    async with Worker(settings=s, handler=lambda job: order.append(job.queue)):
        await await_for(lambda: len(order) == 12, timeout=30, what="every job")
    assert order[:6].count("b") == 3, f"one slot, two queues: turns alternate ({''.join(order)})"


async def test_a_long_job_with_short_heartbeats_logs_no_lease_loss_and_a_stolen_one_does(
    settings, pg_dsn, schema, caplog
):
    caplog.set_level(logging.WARNING, logger="skiplock")

    async def handler(job):
        await asyncio.sleep(job.payload["seconds"])

    s = fast(settings, lease_seconds=2.0, heartbeat_seconds=0.2)
    healthy, stolen = insert(pg_dsn, schema, "default", [{"seconds": 1.2}, {"seconds": 1.5}])
    async with Worker(settings=s, handler=handler):
        await await_for(lambda: statuses(pg_dsn, schema, [stolen])[stolen][0] == "processing", timeout=10, what="run")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".jobs SET locked_by = %s WHERE id = %s', ("thief", stolen))
        await await_for(lambda: statuses(pg_dsn, schema, [healthy])[healthy][0] == "done", timeout=15, what="done")
    warned = {r.__dict__.get("job_id") for r in caplog.records if "heartbeat found the lease lost" in r.getMessage()}
    assert warned == {stolen}


async def test_a_failing_callback_does_not_stop_the_worker(settings, pg_dsn, schema):
    ran: list[int] = []

    def broken(job, outcome):
        raise RuntimeError("observer bug")

    worker = Worker(settings=fast(settings), handler=lambda job: ran.append(job.id), observe=broken)
    ids = insert(pg_dsn, schema, "default", [{} for _ in range(5)])
    async with worker:
        await await_for(lambda: all(s[0] == "done" for s in statuses(pg_dsn, schema, ids).values()), timeout=15,
                        what="every job done despite the observer")  # fmt: skip
    assert sorted(ran) == ids


def test_stop_on_a_worker_never_started_returns_at_once(settings):
    worker = Worker(settings=settings, handler=lambda job: None)
    assert worker.stop(timeout=1) is None and not worker.ready
