"""What the operator tells: queue gauges at zero replicas, Events for errors and modes, short log lines."""

from __future__ import annotations

import asyncio
import json
import statistics
from typing import Any

from skiplock import AsyncQueue
from skiplock.store.statements import Failure
from support.pg import await_for

from .conftest import NAMESPACE, CapturedLog, Cluster, jobqueue_spec, metric
from .test_conditions import is_status


def jobs(metrics: Any, jobqueue: str, queue: str, state: str) -> float | None:
    return metric(metrics, "skiplock_queue_jobs", namespace=NAMESPACE, jobqueue=jobqueue, queue=queue, state=state)


async def test_queue_gauges_exist_at_zero_replicas_and_go_with_the_jobqueue(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: Any
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    spec = {**jobqueue_spec("mail", schema, maxReplicas=0), "app": "shop.tasks:app", "queues": ["mail", "sms"]}
    del spec["handler"]
    await aqueue.enqueue_many("mail", [{"n": i} for i in range(3)])
    later = await aqueue.enqueue("sms", {"n": 1}, delay=3600)
    await aqueue.enqueue("mail", {"after": later.id}, after=[later.id])  # waiting on its parent: no backlog
    failed = await aqueue.enqueue("sms", {"n": 2}, max_attempts=1)
    [job] = await aqueue.claim("sms", limit=1, worker="t")
    assert job.id == failed.id
    await aqueue.fail([Failure(job, "boom", 0.0, retry=False)], worker="t")
    await cluster.create_jobqueue("notify", spec)

    await await_for(lambda: jobs(operator, "notify", "mail", "ready") == 3, what="mail ready=3")
    await await_for(lambda: cluster.replicas("notify") == 0, what="maxReplicas 0: no worker runs")
    assert jobs(operator, "notify", "sms", "delayed") == 1
    assert jobs(operator, "notify", "sms", "failed") == 1
    assert jobs(operator, "notify", "mail", "stalled") == 0
    assert jobs(operator, "notify", "mail", "waiting") == 1 and jobs(operator, "notify", "mail", "ready") == 3
    age = metric(
        operator, "skiplock_queue_oldest_ready_age_seconds", namespace=NAMESPACE, jobqueue="notify", queue="mail"
    )
    assert age is not None and age >= 0
    assert metric(operator, "skiplock_operator_database_up", namespace=NAMESPACE, jobqueue="notify") == 1
    env = {
        e["name"]: e.get("value")
        for e in cluster.deployment("notify")["spec"]["template"]["spec"]["containers"][0]["env"]
    }  # type: ignore[index]
    assert env["SKIPLOCK_APP"] == "shop.tasks:app" and env["SKIPLOCK_QUEUES"] == "mail,sms"
    assert "SKIPLOCK_HANDLER" not in env and float(env["SKIPLOCK_HEARTBEAT_SECONDS"]) == 15.0  # lease / 4

    await cluster.patch_jobqueue("notify", {"spec": {"queues": ["mail"]}})
    await await_for(lambda: jobs(operator, "notify", "sms", "failed") is None, what="sms series gone")
    await cluster.delete_jobqueue("notify")
    await await_for(lambda: cluster.jobqueue("notify") is None, what="JobQueue gone")
    await await_for(lambda: jobs(operator, "notify", "mail", "ready") is None, what="series gone with the JobQueue")
    assert metric(operator, "skiplock_operator_database_up", namespace=NAMESPACE, jobqueue="notify") is None


async def test_every_error_condition_posts_a_warning_event(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.create_jobqueue("nosecret", jobqueue_spec("nosecret", schema))
    await cluster.create_jobqueue("bad", jobqueue_spec("bad", schema, minReplicas=3, maxReplicas=1))
    await cluster.create_jobqueue(
        "nohandler", {k: v for k, v in jobqueue_spec("nohandler", schema).items() if k != "handler"}
    )
    expected = {("nosecret", "SecretNotFound"), ("bad", "InvalidSpec"), ("nohandler", "InvalidSpec")}

    def warnings() -> set[tuple[str, str]]:
        return {
            (e["involvedObject"]["name"], e["reason"])
            for e in cluster.events()
            if e.get("type") == "Warning" and e.get("involvedObject")
        }

    await await_for(lambda: expected <= warnings(), what=f"Warnings {expected}")
    assert "spec.handler or spec.app is required" in cluster.condition("nohandler", "Ready")["message"]  # type: ignore[index]


async def test_manual_replicas_turn_autoscaling_off_with_a_condition_and_an_event(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("man", jobqueue_spec("man", schema))
    await await_for(lambda: cluster.replicas("man") == 0, what="autoscaled to zero")
    await cluster.patch_jobqueue("man", {"spec": {"replicas": 2}})  # what kubectl scale does (specReplicasPath)
    await await_for(lambda: cluster.replicas("man") == 2, what="manual replicas applied")
    await await_for(
        lambda: is_status(cluster, "man", "ScalingActive", "False", "ManualReplicas"), what="ManualReplicas"
    )
    await await_for(
        lambda: any(e.get("reason") == "ManualReplicas" and e.get("type") == "Normal" for e in cluster.events()),
        what="a Normal ManualReplicas Event",
    )
    await aqueue.enqueue_many("man", [{"n": i} for i in range(40)])
    await await_for(
        lambda: (cluster.jobqueue("man") or {}).get("status", {}).get("backlog", {}).get("ready") == 40, what="polled"
    )
    assert cluster.replicas("man") == 2, "the autoscaler overrode manual replicas"
    await cluster.patch_deployment("man-worker", {"spec": {"replicas": 5}})
    await await_for(lambda: cluster.replicas("man") == 2, what="spec.replicas wins over a hand edit")

    await cluster.patch_jobqueue("man", {"spec": {"replicas": None}})
    await await_for(lambda: cluster.replicas("man") == 4, what="autoscaling back: ceil(40 / 10)")
    await await_for(lambda: is_status(cluster, "man", "ScalingActive", "True"), what="ScalingActive again")


async def test_log_lines_are_short_single_events(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object, captured_log: CapturedLog
) -> None:
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("logs", jobqueue_spec("logs", schema))
    await aqueue.enqueue_many("logs", [{"n": i} for i in range(25)])
    await await_for(lambda: cluster.replicas("logs") == 3, what="scaled up")
    await cluster.create_jobqueue("logs-bad", jobqueue_spec("logs-bad", schema, minReplicas=3, maxReplicas=1))
    await await_for(lambda: is_status(cluster, "logs-bad", "Ready", "False"), what="invalid")
    await cluster.delete_jobqueue("logs")
    await await_for(lambda: cluster.jobqueue("logs") is None, what="deleted")

    ours = ("kopf", "skiplock")  # the emulator's own access log (aiohttp) is not the operator's
    lines = [line for line in captured_log.lines if json.loads(line)["logger"].startswith(ours)]
    assert len(lines) >= 5, lines
    for line in lines:
        assert "\n" not in line
        doc = json.loads(line)
        assert "settings" not in doc and "OperatorSettings" not in line, line[:300]
    sizes = sorted(len(line.encode()) for line in lines)
    median = statistics.median(sizes)
    print(f"{len(lines)} lines, median {median} bytes, max {sizes[-1]} bytes")
    assert sizes[-1] < 1024, max(lines, key=len)[:400]
    assert median < 300, f"median log line is {median} bytes"


async def test_the_connection_budget_defaults_from_max_connections(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    import psycopg

    from skiplock_operator.database import budget_from_limits
    from skiplock_operator.scaling import connections_per_replica

    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int"
        ).fetchone()
    assert row is not None
    concurrency = 30
    cap = budget_from_limits(*row) // connections_per_replica(concurrency)
    assert 0 < cap < 20, f"this test wants a server where the default budget caps below 20 (got {cap})"
    await cluster.apply_secret("db", pg_dsn)
    spec = {**jobqueue_spec("cap", schema, maxReplicas=20), "concurrency": concurrency}
    await cluster.create_jobqueue("cap", spec)
    await aqueue.enqueue_many("cap", [{"n": i} for i in range(400)])
    await await_for(lambda: cluster.replicas("cap") == cap, what=f"{cap} replicas (the default budget)")
    await await_for(
        lambda: is_status(cluster, "cap", "ScalingActive", "True", "ConnectionBudgetLimited"),
        what="ConnectionBudgetLimited",
    )
    shown = (cluster.jobqueue("cap") or {})["status"]["connectionBudget"]
    own = budget_from_limits(*row) - shown["connections"]  # the operator's own connections to the server
    assert 1 <= own <= 2 and shown["maxReplicas"] == cap, shown  # its query connection, and its listener
    assert f"max_connections {row[0]} minus {row[1]} reserved" in shown["source"], shown
    message = (cluster.condition("cap", "ScalingActive") or {})["message"]
    assert f"capped at {cap}" in message and "connectionBudget 0: 80 %" in message, message


async def test_the_connection_cap_is_per_database_server_across_jobqueues(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: object
) -> None:
    """Two autoscaled JobQueues, one manual spec.replicas and one huge connectionBudget on one server: together
    their workers never get more connections than the server's share (issue 37 item 10)."""
    import psycopg

    from skiplock_operator.database import budget_from_limits
    from skiplock_operator.scaling import connections_per_replica

    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int"
        ).fetchone()
    assert row is not None
    concurrency, share = 20, budget_from_limits(*row)
    per = connections_per_replica(concurrency)
    assert 2 <= share // per < 10, f"this test wants a server whose share holds 2..9 replicas (got {share // per})"
    await cluster.apply_secret("db", pg_dsn)
    names = ("cap-a", "cap-b", "cap-manual", "cap-budget")
    for name in names:
        spec = {**jobqueue_spec(name, schema, maxReplicas=20), "concurrency": concurrency}
        if name == "cap-manual":
            spec["replicas"] = 20
        if name == "cap-budget":
            spec["scaling"] = {**spec["scaling"], "connectionBudget": 100_000}
        await cluster.create_jobqueue(name, spec)
        await aqueue.enqueue_many(name, [{"n": i} for i in range(400)])

    def total() -> int:
        return sum(cluster.replicas(n) or 0 for n in names)

    await await_for(lambda: all(cluster.replicas(n) is not None for n in names), what="four Deployments")
    await await_for(lambda: total() > 0, what="some replicas")
    for _ in range(10):  # a few polls: it stays within the share
        await asyncio.sleep(0.5)
        assert total() * per <= share, {n: cluster.replicas(n) for n in names}
    assert (cluster.replicas("cap-manual") or 0) < 20 and (cluster.replicas("cap-budget") or 0) < 20
