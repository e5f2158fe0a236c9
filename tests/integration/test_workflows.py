"""Results, dependencies (after=), waiting for a result, against a real PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from skiplock import AsyncQueue, Job, Queue
from skiplock.app import App
from skiplock.errors import EnqueueError, JobFailedError, NonRetryableError
from skiplock.settings import Settings
from skiplock.testing import run_jobs
from support.pg import wait_for


def status(queue: Queue, job_id: int) -> str:
    row = queue.get(job_id)
    assert row is not None
    return str(row["status"])


def flow_app(log: list[tuple[str, Any]]) -> App:
    app = App("flow")

    @app.task(queue="flow", name="flow.add")
    def add(job: Job) -> dict[str, int]:
        log.append(("add", job.id))
        return {"sum": job.payload["a"] + job.payload["b"]}

    @app.task(queue="flow", name="flow.boom", max_attempts=1)
    def boom(job: Job) -> None:
        log.append(("boom", job.id))
        raise NonRetryableError("boom")

    @app.task(queue="flow", name="flow.collect")
    def collect(job: Job) -> Any:
        log.append(("collect", job.id))
        return sorted(str(k) for k in job.parent_results)

    @app.task(queue="flow", name="flow.unstorable")
    def unstorable(job: Job) -> object:
        return object()

    @app.task(queue="flow", name="flow.in_tx")
    def in_tx(job: Job) -> str:
        assert job.conn is not None
        job.conn.execute("SELECT 1")
        return "written in the handler's transaction"

    return app


def test_result_is_stored_with_done(settings: Settings, queue: Queue) -> None:
    log: list[tuple[str, Any]] = []
    app = flow_app(log)
    plain = queue.enqueue("flow", {"a": 1, "b": 2}, task="flow.add")
    in_tx = queue.enqueue("flow", {}, task="flow.in_tx")
    report = run_jobs(app, settings=settings)
    assert sorted(report.done) == sorted([plain.id, in_tx.id])
    assert queue.get(plain.id)["result"] == {"sum": 3}  # type: ignore[index]
    assert queue.get(in_tx.id)["result"] == "written in the handler's transaction"  # type: ignore[index]


def test_unstorable_result_fails_the_attempt(settings: Settings, queue: Queue) -> None:
    app = flow_app([])
    job = queue.enqueue("flow", {}, task="flow.unstorable", max_attempts=1)
    report = run_jobs(app, settings=settings)
    assert report.failed == [job.id]
    row = queue.get(job.id)
    assert row is not None and row["result"] is None
    assert row["last_error"].startswith("ResultError: the task's return value cannot be stored")


def test_child_waits_for_every_parent_and_sees_their_results(settings: Settings, queue: Queue) -> None:
    log: list[tuple[str, Any]] = []
    app = flow_app(log)
    a = queue.enqueue("flow", {"a": 1, "b": 2}, task="flow.add")
    b = queue.enqueue("flow", {"a": 3, "b": 4}, task="flow.add")
    child = queue.enqueue("flow", {}, task="flow.collect", after=[a.id, b.id])
    assert status(queue, child.id) == "waiting"
    [stats] = queue.stats("flow")
    assert (stats.ready, stats.waiting) == (2, 1)  # the waiting child is no backlog
    run_jobs(app, settings=settings)
    assert [name for name, _ in log] == ["add", "add", "collect"]
    assert child.wait(timeout=5) == sorted([str(a.id), str(b.id)])
    assert queue.relatives(child.id)["parents"] == [{"id": a.id, "status": "done"}, {"id": b.id, "status": "done"}]
    assert queue.relatives(a.id)["children"] == [{"id": child.id, "status": "done"}]


def test_failed_parent_cancels_children_naming_it_unless_they_run_on_failure(settings: Settings, queue: Queue) -> None:
    log: list[tuple[str, Any]] = []
    app = flow_app(log)
    bad = queue.enqueue("flow", {}, task="flow.boom")
    cancelled = queue.enqueue("flow", {}, task="flow.collect", after=[bad.id])
    grandchild = queue.enqueue("flow", {}, task="flow.collect", after=[cancelled.id])
    runs = queue.enqueue("flow", {}, task="flow.collect", after=[bad.id], on_parent_failure="run")
    report = run_jobs(app, settings=settings)
    assert sorted(report.done) == [runs.id]
    for job_id, parent in ((cancelled.id, bad.id), (grandchild.id, cancelled.id)):
        row = queue.get(job_id)
        assert row is not None and row["status"] == "cancelled"
        assert row["last_error"] == f"ParentFailed: parent job {parent} ended " + (
            "failed" if parent == bad.id else "cancelled"
        )
    with pytest.raises(JobFailedError) as caught:
        cancelled.wait(timeout=5)
    assert caught.value.status == "cancelled" and str(bad.id) in str(caught.value)


def test_child_of_finished_parents_is_judged_at_once(settings: Settings, queue: Queue) -> None:
    app = flow_app([])
    ok = queue.enqueue("flow", {"a": 1, "b": 1}, task="flow.add")
    bad = queue.enqueue("flow", {}, task="flow.boom")
    run_jobs(app, settings=settings)
    ready = queue.enqueue("flow", {}, task="flow.collect", after=[ok.id])
    doomed = queue.enqueue("flow", {}, task="flow.collect", after=[ok.id, bad.id])
    assert status(queue, ready.id) == "pending"
    row = queue.get(doomed.id)
    assert row is not None and row["status"] == "cancelled"
    assert row["last_error"] == f"ParentFailed: parent job {bad.id} ended failed"


def test_unknown_parent_is_an_enqueue_error_and_nothing_is_written(settings: Settings, queue: Queue) -> None:
    parent = queue.enqueue("flow", {"a": 1, "b": 1}, task="flow.add")
    with pytest.raises(EnqueueError, match="do not exist: 999999"):
        queue.enqueue("flow", {}, task="flow.collect", after=[parent.id, 999999])
    with pytest.raises(EnqueueError, match="do not exist"):
        queue.enqueue_many("flow", [{}, {}], task="flow.collect", after=[999999])
    with psycopg.connect(settings.require_dsn()) as conn:
        with pytest.raises(EnqueueError):  # in the caller's transaction: rolled back to before the enqueue
            queue.enqueue("flow", {}, after=[999999], conn=conn)
        conn.execute(f'SELECT 1 FROM "{settings.schema}".jobs')  # the transaction is still usable
    assert [j.id for j in queue.claim("flow", limit=1, worker="w")] == [parent.id]
    assert queue.relatives(parent.id) == {"parents": [], "children": [], "steps": {}}
    keyed = queue.enqueue("flow", {}, idempotency_key="k1")
    with pytest.raises(EnqueueError, match="cannot wait for itself"):  # the key finds a parent: a cycle
        queue.enqueue("flow", {}, idempotency_key="k1", after=[keyed.id])
    with pytest.raises(EnqueueError, match="cannot be unique"):
        queue.enqueue("flow", {}, after=[parent.id], unique_key="k")
    with pytest.raises(EnqueueError, match="list of job ids"):
        queue.enqueue("flow", {}, after=parent.id)  # type: ignore[typeddict-item]


def test_enqueue_many_after(settings: Settings, queue: Queue) -> None:
    log: list[tuple[str, Any]] = []
    app = flow_app(log)
    parent = queue.enqueue("flow", {"a": 1, "b": 1}, task="flow.add")
    children = queue.enqueue_many("flow", [{}, {}, {}], task="flow.collect", after=[parent.id])
    assert {status(queue, c) for c in children} == {"waiting"}
    run_jobs(app, settings=settings)
    assert [name for name, _ in log] == ["add", "collect", "collect", "collect"]


def test_purging_a_finished_parent_neither_strands_nor_releases_a_child(settings: Settings, queue: Queue) -> None:
    app = flow_app([])
    first = queue.enqueue("flow", {"a": 1, "b": 1}, task="flow.add")
    run_jobs(app, settings=settings)
    second = queue.enqueue("flow", {"a": 2, "b": 2}, task="flow.add", delay=3600)
    child = queue.enqueue("flow", {}, task="flow.collect", after=[first.id, second.id])
    assert queue.purge(older_than_seconds=0) == 1  # the finished parent is gone
    assert status(queue, child.id) == "waiting"
    with queue.pool.connection() as conn:  # the second parent ends (as a worker would: one UPDATE)
        conn.execute(f"UPDATE \"{settings.schema}\".jobs SET status = 'done' WHERE id = %s", (second.id,))
    assert status(queue, child.id) == "pending"


def test_deleting_an_unfinished_parent_cancels_its_children(settings: Settings, queue: Queue) -> None:
    parent = queue.enqueue("flow", {})
    child = queue.enqueue("flow", {}, after=[parent.id])
    with queue.pool.connection() as conn:
        conn.execute(f'DELETE FROM "{settings.schema}".jobs WHERE id = %s', (parent.id,))
    row = queue.get(child.id)
    assert row is not None and row["status"] == "cancelled"
    assert queue.relatives(child.id)["parents"] == []


def test_cancel_a_waiting_child(settings: Settings, queue: Queue) -> None:
    parent = queue.enqueue("flow", {})
    child = queue.enqueue("flow", {}, after=[parent.id])
    assert queue.cancel(ids=[child.id]) == [child.id]
    assert status(queue, child.id) == "cancelled"


def test_wait_returns_the_result_raises_on_failure_and_times_out(settings: Settings, queue: Queue) -> None:
    app = flow_app([])
    ok = queue.enqueue("flow", {"a": 20, "b": 22}, task="flow.add")
    bad = queue.enqueue("flow", {}, task="flow.boom")
    with pytest.raises(TimeoutError):
        ok.wait(timeout=0.2)
    runner = threading.Thread(target=run_jobs, args=(app,), kwargs={"settings": settings})
    runner.start()
    try:
        assert ok.wait(timeout=30) == {"sum": 42}  # woken by the NOTIFY of the trigger that ended it
        with pytest.raises(JobFailedError) as caught:
            bad.wait(timeout=30)
    finally:
        runner.join()
    assert caught.value.status == "failed" and caught.value.last_error == "NonRetryableError: boom"
    assert queue.wait(ok.id, timeout=1) == {"sum": 42}  # final already: no wait


async def test_async_wait(settings: Settings, aqueue: AsyncQueue) -> None:
    app = flow_app([])
    job = await aqueue.enqueue("flow", {"a": 1, "b": 2}, task="flow.add")
    with pytest.raises(TimeoutError):
        await job.wait_async(timeout=0.2)
    run_jobs(app, settings=settings)
    assert await job.wait_async(timeout=5) == {"sum": 3}
    with pytest.raises(TypeError, match="wait_async"):
        job.wait()


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env |= {"SKIPLOCK_DSN": settings.require_dsn(), "SKIPLOCK_SCHEMA": settings.schema}
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_cli_enqueue_after_show_and_cancel_workflow(settings: Settings, queue: Queue) -> None:
    app = flow_app([])
    a = queue.enqueue("flow", {"a": 1, "b": 2}, task="flow.add")
    b = queue.enqueue("flow", {"a": 1, "b": 1}, task="flow.add", delay=3600)
    out = cli(settings, "enqueue", "--queue", "flow", "--task", "flow.collect", "--payload", "{}",
              "--after", str(a.id), "--after", str(b.id))  # fmt: skip
    assert out.returncode == 0, out.stderr
    child = int(out.stdout.split()[0])
    run_jobs(app, settings=settings)
    shown = cli(settings, "show", str(child), "--json")
    assert shown.returncode == 0, shown.stderr
    row = json.loads(shown.stdout)
    assert row["status"] == "waiting" and row["waiting_on"] == 1
    assert row["parents"] == [{"id": a.id, "status": "done"}, {"id": b.id, "status": "pending"}]
    text = cli(settings, "show", str(a.id)).stdout
    assert '{"sum": 3}' in text and f"{child} (waiting)" in text
    bad = cli(settings, "enqueue", "--queue", "flow", "--payload", "{}", "--after", "999999")
    assert bad.returncode != 0 and "do not exist: 999999" in bad.stderr

    flow = uuid.uuid4()
    first = queue.enqueue("flow", {}, workflow_id=str(flow))
    second = queue.enqueue("flow", {}, after=[first.id], workflow_id=str(flow))
    out = cli(settings, "cancel", "--workflow", str(flow))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cancelled 2 job(s)")
    assert status(queue, first.id) == status(queue, second.id) == "cancelled"
    assert cli(settings, "cancel", "--workflow", str(flow)).returncode == 1  # nothing left to cancel


def steps_app(calls: list[Any]) -> App:
    app = App("steps")
    fast = {"backoff_base_seconds": 0.01, "backoff_cap_seconds": 0.01}

    def call_psp(order: int) -> dict[str, str]:
        calls.append(order)
        return {"receipt": f"r-{order}"}

    @app.task(queue="steps", name="steps.charge", **fast)  # type: ignore[arg-type]
    def charge(job: Job) -> Any:
        receipt = job.step("call_psp", call_psp, job.payload["order"])
        assert job.conn is not None
        job.conn.execute("SELECT 1")  # the job's own transaction: rolled back below, the step is not
        if job.attempts == 1:
            raise RuntimeError("crashed after charging")
        return receipt

    @app.task(queue="steps", name="steps.acharge", **fast)  # type: ignore[arg-type]
    async def acharge(job: Job) -> Any:
        async def call(order: int) -> dict[str, str]:
            return call_psp(order)

        receipt = await job.step_async("call_psp", call, job.payload["order"])
        if job.attempts == 1:
            raise RuntimeError("crashed after charging")
        return receipt

    return app


@pytest.mark.parametrize("task", ["steps.charge", "steps.acharge"])
def test_a_step_runs_once_and_a_retry_gets_its_stored_value(settings: Settings, queue: Queue, task: str) -> None:
    calls: list[Any] = []
    app = steps_app(calls)
    job = queue.enqueue("steps", {"order": 42}, task=task)
    wait_for(lambda: run_jobs(app, settings=settings) and status(queue, job.id) == "done", timeout=30, what="retried")
    row = queue.get(job.id)
    assert row is not None and row["attempts"] == 2
    assert calls == [42], "the second attempt got the stored value without calling the step again"
    assert row["result"] == {"receipt": "r-42"}
    assert queue.relatives(job.id)["steps"] == {"call_psp": {"receipt": "r-42"}}
    shown = cli(settings, "show", str(job.id)).stdout
    assert 'call_psp: {"receipt": "r-42"}' in shown
    assert queue.purge(older_than_seconds=0) == 1
    with queue.pool.connection() as conn:  # the steps went with their job
        left = conn.execute(f'SELECT count(*) FROM "{settings.schema}".job_steps').fetchone()
    assert left == (0,)


def test_step_and_parent_results_need_a_worker() -> None:
    job = Job(1, "q", {}, 1, 1)
    with pytest.raises(RuntimeError, match="needs a job run by a skiplock worker"):
        job.step("x", lambda: 1)
    with pytest.raises(RuntimeError, match="needs a job run by a skiplock worker"):
        _ = job.parent_results


def canvas_app(log: list[tuple[str, Any]]) -> App:
    app = App("canvas")

    @app.task(queue="canvas", name="canvas.add")
    def add(job: Job) -> int:
        log.append(("add", job.payload["n"]))
        return int(job.payload["n"]) + sum(v for v in job.parent_results.values() if isinstance(v, int))

    @app.task(queue="canvas", name="canvas.boom", max_attempts=1)
    def boom(job: Job) -> None:
        log.append(("boom", job.id))
        raise NonRetryableError("member failed")

    @app.task(queue="canvas", name="canvas.total")
    def total(job: Job) -> dict[str, Any]:
        results = job.parent_results
        log.append(("total", len(results)))
        return {"members": len(results), "sum": sum(v for v in results.values() if isinstance(v, int))}

    return app


def test_chain_group_and_chord(settings: Settings, queue: Queue) -> None:
    from skiplock.workflows import chain, chord, group

    log: list[tuple[str, Any]] = []
    app = canvas_app(log)
    app.connect(settings=settings)
    try:
        add, boom, total = (app.task_named(f"canvas.{n}") for n in ("add", "boom", "total"))
        linked = chain(add.s({"n": 1}), add.s({"n": 10}), add.s({"n": 100})).enqueue()
        fanned = group(add.s({"n": n}) for n in range(3)).enqueue()
        joined = chord([add.s({"n": 1}), add.s({"n": 2}), boom.s({})], total.s({})).enqueue()
        assert len(linked.jobs) == 3 and len(fanned.last) == 3 and len(joined.jobs) == 4
        assert {status(queue, r.id) for r in linked.jobs[1:]} == {"waiting"}
        run_jobs(app, settings=settings)
        assert linked.wait(timeout=5) == 111  # each step adds its parent's result
        assert fanned.wait(timeout=5) == [0, 1, 2]
        assert joined.wait(timeout=5) == {"members": 3, "sum": 3}  # ran although a member failed
        assert [n for kind, n in log if kind == "total"] == [3]
        assert set(queue.workflow_jobs(linked.id)) == set()  # all ended
        assert queue.get(linked.jobs[0].id)["workflow_id"] == uuid.UUID(linked.id)  # type: ignore[index]
    finally:
        app.close()


def test_a_workflow_is_one_transaction_and_cancels_as_one(settings: Settings, queue: Queue) -> None:
    from skiplock.workflows import chain, chord

    app = canvas_app([])
    add, total = app.task_named("canvas.add"), app.task_named("canvas.total")
    app.connect(settings=settings)
    try:
        with psycopg.connect(settings.require_dsn()) as conn:
            run = chain(add.s({"n": 1}), add.s({"n": 2})).enqueue(conn=conn)
            conn.rollback()
        assert queue.get(run.jobs[0].id) is None and queue.get(run.jobs[1].id) is None
        run = chord([add.s({"n": 1}), add.s({"n": 2})], total.s({})).enqueue()
        assert sorted(queue.cancel_workflow(run.id)) == sorted(r.id for r in run.jobs)
        assert {status(queue, r.id) for r in run.jobs} == {"cancelled"}
        with pytest.raises(JobFailedError):
            run.wait(timeout=5)
    finally:
        app.close()


def test_a_workflows_wait_has_one_bound_for_all_its_last_jobs(settings: Settings, queue: Queue) -> None:
    """Three last jobs that end 0.6 s apart, each within a second of the one before: ``wait(timeout=1)`` gives up
    at one second, it does not wait up to a second for each job in turn (which returned after 1.8 s)."""
    from skiplock.workflows import group

    app = canvas_app([])
    add = app.task_named("canvas.add")
    app.connect(settings=settings)
    try:
        run = group(add.s({"n": n}) for n in range(3)).enqueue()
        jobs = sorted(queue.claim("canvas", limit=3, worker="w"), key=lambda j: j.id)
        assert [j.id for j in jobs] == sorted(r.id for r in run.last)

        def finish() -> None:
            for job in jobs:
                time.sleep(0.6)
                queue.complete([job], worker="w")

        finisher = threading.Thread(target=finish)
        finisher.start()
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                run.wait(timeout=1.0)
            assert time.monotonic() - started < 1.5
        finally:
            finisher.join()
        assert run.wait(timeout=1.0) == [None, None, None]  # all ended now
    finally:
        app.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_after_job_conn_needs_no_second_slot_of_the_pool(settings: Settings, queue: Queue, kind: str) -> None:
    """With concurrency 1 the handler pool had one connection: a handler holding ``job.conn`` whose step then asked
    the same pool for another waited the pool's 30 s and failed. The pool keeps one connection spare for them."""
    app = App("spare")

    @app.task(queue="spare", name="spare.sync", max_attempts=1)
    def sync_task(job: Job) -> Any:
        job.conn.execute("SELECT 1")
        return job.step("s", lambda: 7) + len(job.parent_results)

    @app.task(queue="spare", name="spare.async", max_attempts=1)
    async def async_task(job: Job) -> Any:
        await job.conn.execute("SELECT 1")
        return await job.step_async("s", lambda: 7) + len(await job.parent_results_async())

    job = queue.enqueue("spare", {}, task=f"spare.{kind}")
    started = time.monotonic()
    run_jobs(app, settings=dataclasses.replace(settings, concurrency=1))
    row = queue.get(job.id)
    assert row is not None and (row["status"], row["result"]) == ("done", 7), row
    assert time.monotonic() - started < 20, "a step waited for the pool"
