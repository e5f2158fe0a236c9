"""The example shop end to end: FastAPI's TestClient, the tasks run through skiplock.testing, a real PostgreSQL.

These use the task API (``task.enqueue(payload, conn=conn)``) and ``skiplock.testing.run_jobs`` / ``enqueued``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import date
from pathlib import Path

import jsonschema
import psycopg
import pytest
import yaml
from fastapi.testclient import TestClient
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from support.pg import wait_for

ROOT = Path(__file__).resolve().parents[2]


def place_order(shop, items=(("mug", 2), ("sticker", 1))):
    with TestClient(shop.main.api) as client:
        return client.post(
            "/orders", json={"email": "ada@example.com", "items": [{"sku": s, "quantity": n} for s, n in items]}
        )


def test_an_order_commits_with_its_receipt_and_webhook_jobs(shop, testing):
    response = place_order(shop)
    assert response.status_code == 201, response.text
    order = response.json()
    assert order["total_cents"] == 2 * 1200 + 300

    [receipt] = testing.enqueued(settings=shop.settings, task="shop.send_receipt")
    [webhook] = testing.enqueued(settings=shop.settings, task="shop.notify_webhook")
    assert receipt["payload"] == {"order_id": order["id"]} and receipt["queue"] == "emails"
    assert webhook["payload"] == {"event": "order.created", "order_id": order["id"]}
    assert webhook["queue"] == "webhooks" and webhook["idempotency_key"] == f"order-{order['id']}-created"
    assert sorted(order["jobs"]) == sorted([receipt["id"], webhook["id"]])


def test_an_order_that_rolls_back_enqueues_nothing(shop, testing):
    response = place_order(shop, items=(("mug", 1), ("no-such-product", 1)))
    assert response.status_code == 422 and response.json()["detail"] == "unknown product"
    assert testing.enqueued(settings=shop.settings, status="pending") == []
    assert shop.one(f'SELECT count(*) FROM "{shop.shop_schema}".orders') == (0,)


def test_the_jobs_send_one_receipt_and_call_the_webhook_with_its_key(shop, receiver, testing):
    order = place_order(shop).json()
    report = testing.run_jobs(shop.tasks.app, settings=shop.settings)
    assert sorted(report.done) == sorted(order["jobs"]) and not (report.retried or report.failed or report.unknown)

    assert shop.one(f'SELECT recipient, subject FROM "{shop.shop_schema}".outbox WHERE order_id = %s', order["id"]) == (
        "ada@example.com",
        f"Your order #{order['id']}",
    )
    assert receiver.requests == [
        {
            "path": "/hooks/orders",
            "key": f"order-{order['id']}-created",
            "body": {"event": "order.created", "order_id": order["id"]},
        }
    ]
    with TestClient(shop.main.api) as client:
        assert client.get(f"/orders/{order['id']}").json()["receipt_sent"] is True
    assert testing.enqueued(settings=shop.settings) == [], "nothing is left pending"


def test_a_webhook_5xx_is_retried_with_the_same_idempotency_key(shop, receiver, testing):
    receiver.statuses = [503]
    order = place_order(shop).json()
    [webhook] = testing.enqueued(settings=shop.settings, task="shop.notify_webhook")

    first = testing.run_jobs(shop.tasks.app, settings=shop.settings, queues=("webhooks",))
    assert first.retried == [webhook["id"]] and first.done == []
    # The retry waits for its backoff (2.5 to 5 s: the task jitters half of it): move it to now instead of sleeping.
    with psycopg.connect(shop.dsn) as conn:
        conn.execute(f'UPDATE "{shop.skiplock_schema}".jobs SET visible_at = now() WHERE id = %s', (webhook["id"],))
    second = testing.run_jobs(shop.tasks.app, settings=shop.settings, queues=("webhooks",))
    assert second.done == [webhook["id"]]
    assert [r["key"] for r in receiver.requests] == [f"order-{order['id']}-created"] * 2


def test_a_webhook_4xx_fails_the_job_for_good(shop, receiver, testing):
    receiver.statuses = [400]
    place_order(shop)
    [webhook] = testing.enqueued(settings=shop.settings, task="shop.notify_webhook")
    report = testing.run_jobs(shop.tasks.app, settings=shop.settings, queues=("webhooks",))
    assert report.failed == [webhook["id"]]
    [failed] = testing.enqueued(settings=shop.settings, task="shop.notify_webhook", status="failed")
    assert failed["id"] == webhook["id"] and failed["attempts"] == 1, "a 4xx is not retried"
    [last_error] = shop.one(f'SELECT last_error FROM "{shop.skiplock_schema}".jobs WHERE id = %s', webhook["id"])
    assert "answered 400" in last_error


def test_a_report_request_is_idempotent_per_day_and_computes_the_totals(shop, receiver, testing):
    place_order(shop)
    place_order(shop, items=(("tee", 1),))
    today = date.today().isoformat()
    with TestClient(shop.main.api) as client:
        first = client.post("/reports", params={"day": today})
        again = client.post("/reports", params={"day": today})
    assert first.status_code == 202 and first.json()["duplicate"] is False
    assert again.json() == {"job": first.json()["job"], "duplicate": True}
    assert len(testing.enqueued(settings=shop.settings, task="shop.daily_report")) == 1

    report = testing.run_jobs(shop.tasks.app, settings=shop.settings, queues=("reports",))
    assert report.done == [first.json()["job"]]
    row = shop.one(f'SELECT orders, total_cents FROM "{shop.shop_schema}".daily_reports WHERE day = %s', today)
    assert row == (2, 2 * 1200 + 300 + 2500)


def run_worker_until_delivered(shop, receiver, order_id: int, env: dict[str, str], *options: str) -> str:
    """`skiplock [OPTIONS] worker --app examples.app.tasks:app` run from the repository root until the order's receipt
    is in the outbox and the webhook was called, then stopped (SIGTERM): it exits 0; returns its log."""
    skiplock = str(Path(sys.executable).with_name("skiplock"))
    worker = subprocess.Popen(
        [skiplock, *options, "worker", "--app", "examples.app.tasks:app", "--poll", "0.5"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                shop.one(f'SELECT 1 FROM "{shop.shop_schema}".outbox WHERE order_id = %s', order_id)
                and receiver.requests
            ),
            timeout=30,
            what="the worker to send the receipt and call the webhook",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
        print(out)  # the worker's log, shown when the test fails
    assert worker.returncode == 0, out
    return out


def test_the_documented_worker_command_runs_the_app_from_the_repository_root(shop, receiver, pg_dsn, testing):
    """`skiplock worker --app examples.app.tasks:app`, as typed in the docs, from the repository root."""
    order = place_order(shop).json()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env.update(SKIPLOCK_DSN=pg_dsn, SKIPLOCK_SCHEMA=shop.skiplock_schema, SHOP_SCHEMA=shop.shop_schema)
    run_worker_until_delivered(shop, receiver, order["id"], env)
    assert testing.enqueued(settings=shop.settings) == []


def test_the_kubernetes_manifest_and_helm_values_fit_the_crd(shop_modules):
    crd = yaml.safe_load((ROOT / "crds/jobqueues.skiplock.io.yaml").read_text(encoding="utf-8"))
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    manifest = yaml.safe_load((ROOT / "examples/app/k8s/jobqueue.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((ROOT / "examples/app/k8s/values.yaml").read_text(encoding="utf-8"))
    for spec in (manifest["spec"], values["jobQueue"]["spec"]):
        jsonschema.validate(spec, spec_schema)
        assert spec["app"] == "examples.app.tasks:app"
        assert sorted(spec["queues"]) == sorted(shop_modules.tasks.app.queues), "it serves every queue of the app"
    secrets = {
        d["metadata"]["name"]: d["stringData"]["dsn"]
        for d in yaml.safe_load_all((ROOT / "examples/app/k8s/secret.yaml").read_text(encoding="utf-8"))
    }
    for spec in (manifest["spec"], values["jobQueue"]["spec"]):
        workers, operator = secrets[spec["dsnSecretRef"]["name"]], secrets[spec["operatorDsnSecretRef"]["name"]]
        users = conninfo_to_dict(workers)["user"], conninfo_to_dict(operator)["user"]
        assert users == ("shop_worker", "shop_owner"), "the workers' role is not the owner the operator uses"


def test_each_process_runs_as_its_own_role_as_the_readme_says(shop, receiver, pg_dsn, testing, monkeypatch):
    """The README's least-privilege run: the owner migrates and grants, the web app and the worker connect as roles
    with only their rights, and an order goes through to its receipt and webhook."""
    readme = (ROOT / "examples/app/README.md").read_text(encoding="utf-8")
    assert "grant --producer shop_api --worker shop_worker" in readme
    assert "python -m examples.app.db --api-role shop_api --worker-role shop_worker" in readme
    suffix = os.urandom(4).hex()  # roles are cluster-wide: names of this run only
    api, worker_role = f"shop_api_{suffix}", f"shop_worker_{suffix}"
    dsns = {role: make_conninfo(pg_dsn, user=role, password=f"pw-{suffix}") for role in (api, worker_role)}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for role in (api, worker_role):
            conn.execute(
                psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    psycopg.sql.Identifier(role), psycopg.sql.Literal(f"pw-{suffix}")
                )
            )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env.update(SKIPLOCK_SCHEMA=shop.skiplock_schema, SHOP_SCHEMA=shop.shop_schema)
    skiplock = str(Path(sys.executable).with_name("skiplock"))
    try:
        granted = subprocess.run(
            [skiplock, "--dsn", pg_dsn, "grant", "--producer", api, "--worker", worker_role],
            env=env, cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert granted.returncode == 0, granted.stderr
        tables = subprocess.run(
            [sys.executable, "-m", "examples.app.db", "--api-role", api, "--worker-role", worker_role],
            env=env | {"DATABASE_URL": pg_dsn}, cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert tables.returncode == 0 and f"rights granted to {api}, {worker_role}" in tables.stdout, tables

        monkeypatch.setenv("DATABASE_URL", dsns[api])
        order = place_order(shop)
        assert order.status_code == 201, order.text
        order_id = order.json()["id"]
        worker_env = env | {"SHOP_WEBHOOK_URL": receiver.url}
        out = run_worker_until_delivered(shop, receiver, order_id, worker_env, "--dsn", dsns[worker_role])
        assert "permission denied" not in out, out
        with psycopg.connect(dsns[api]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'SELECT payload FROM "{shop.skiplock_schema}".jobs')  # a producer reads no payloads
        with psycopg.connect(dsns[worker_role]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'DELETE FROM "{shop.shop_schema}".orders')  # the worker cannot touch the orders
        assert testing.enqueued(settings=shop.settings) == []
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for role in (api, worker_role):
                conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(role)))
                conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))
