"""The shop's background work, one ``App`` for producers (the web app) and workers alike.

Run the worker from the repository root:

    skiplock worker --app examples.app.tasks:app

It serves every queue the tasks name (``emails``, ``reports``, ``webhooks``); ``--queues emails`` narrows it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from datetime import date

from examples.app.db import SKIPLOCK_SCHEMA, q
from skiplock import App, Job, NonRetryableError

app = App(schema=SKIPLOCK_SCHEMA)


class WebhookRejected(NonRetryableError):
    """The receiver answered with a 4xx that retrying cannot fix."""


@app.task(name="shop.send_receipt", queue="emails", max_attempts=5)
def send_receipt(job: Job) -> None:
    """Write the receipt into the mail outbox. Through ``job.conn``: it commits with the job, exactly once."""
    order_id = job.payload["order_id"]
    order = job.conn.execute(q("SELECT email, total_cents FROM {schema}.orders WHERE id = %s"), (order_id,)).fetchone()
    if order is None:
        raise NonRetryableError(f"order {order_id} does not exist")
    email, total_cents = order
    job.conn.execute(
        q(
            "INSERT INTO {schema}.outbox (order_id, recipient, subject, body) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (order_id) DO NOTHING"
        ),
        (order_id, email, f"Your order #{order_id}", f"Thank you! Total: {total_cents / 100:.2f} EUR"),
    )


@app.task(name="shop.daily_report", queue="reports", max_attempts=3, lease_seconds=300)
def daily_report(job: Job) -> None:
    """Compute one day's totals (re-running it overwrites the same row)."""
    day = date.fromisoformat(job.payload["day"])
    job.conn.execute(
        q(
            "INSERT INTO {schema}.daily_reports (day, orders, total_cents)"
            " SELECT %(day)s, count(*), coalesce(sum(total_cents), 0) FROM {schema}.orders"
            " WHERE created_at >= %(day)s::date AND created_at < %(day)s::date + 1"
            " ON CONFLICT (day) DO UPDATE SET orders = excluded.orders, total_cents = excluded.total_cents,"
            " computed_at = now()"
        ),
        {"day": day},
    )


@app.task(name="shop.notify_webhook", queue="webhooks", max_attempts=8, backoff_base_seconds=5, backoff_jitter=0.5)
def notify_webhook(job: Job) -> None:
    """POST the event to the partner's endpoint (``SHOP_WEBHOOK_URL``).

    The call cannot join the job's transaction, and a job can run more than once (a crash after the call,
    before the completion), so the request carries an idempotency key that is the same on every attempt:
    the receiver drops a key it has already seen. 5xx and network errors retry with backoff; 4xx fail for good.
    """
    url = os.environ.get("SHOP_WEBHOOK_URL")
    if not url:
        raise NonRetryableError("SHOP_WEBHOOK_URL is not set")
    body = json.dumps(job.payload).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": job.idempotency_key or f"job-{job.id}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500 and exc.code not in (408, 429):
            raise WebhookRejected(f"{url} answered {exc.code}") from None
        raise  # 5xx, 408, 429: retried with backoff
