"""The shop's web application. Each request that enqueues work does it in the request's own transaction.

    DATABASE_URL=postgresql://... uvicorn examples.app.main:api

An order, its items and its two jobs (the receipt e-mail, the partner webhook) commit together or not at all:
no receipt for an order that was rolled back, and no order whose receipt was forgotten.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from typing import Annotated

import psycopg
from fastapi import FastAPI, HTTPException, Query, Request
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, Field

from examples.app.db import dsn, q
from examples.app.tasks import daily_report, notify_webhook, send_receipt


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    pool = ConnectionPool(dsn(), min_size=1, max_size=10, open=False)
    pool.open(wait=True, timeout=10)
    api.state.pool = pool
    try:
        yield
    finally:
        pool.close()


def pool_of(request: Request) -> ConnectionPool:
    return request.app.state.pool  # type: ignore[no-any-return]


api = FastAPI(title="shop", lifespan=lifespan)


class Item(BaseModel):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0, le=1000)


class OrderIn(BaseModel):
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)
    items: list[Item] = Field(min_length=1, max_length=100)


class OrderOut(BaseModel):
    id: int
    total_cents: int
    jobs: list[int]


@api.post("/orders", status_code=201)
def create_order(order: OrderIn, request: Request) -> OrderOut:
    # The pool's connection() is one transaction: it commits when the block ends, and rolls back on an exception.
    try:
        with pool_of(request).connection() as conn:
            row = conn.execute(q("INSERT INTO {schema}.orders (email) VALUES (%s) RETURNING id"), (order.email,))
            order_id = row.fetchone()[0]  # type: ignore[index]
            receipt = send_receipt.enqueue({"order_id": order_id}, conn=conn)
            webhook = notify_webhook.enqueue(
                {"event": "order.created", "order_id": order_id},
                conn=conn,
                idempotency_key=f"order-{order_id}-created",
            )
            for item in order.items:
                conn.execute(
                    q("INSERT INTO {schema}.order_items (order_id, sku, quantity) VALUES (%s, %s, %s)"),
                    (order_id, item.sku, item.quantity),
                )
            total = conn.execute(
                q(
                    "UPDATE {schema}.orders o SET total_cents = (SELECT sum(i.quantity * p.price_cents)"
                    " FROM {schema}.order_items i JOIN {schema}.products p USING (sku) WHERE i.order_id = o.id)"
                    " WHERE o.id = %s RETURNING total_cents"
                ),
                (order_id,),
            ).fetchone()
    except psycopg.errors.ForeignKeyViolation:
        # An unknown product: the order and both jobs were rolled back with the transaction.
        raise HTTPException(status_code=422, detail="unknown product") from None
    return OrderOut(id=order_id, total_cents=total[0] if total else 0, jobs=[receipt.id, webhook.id])


@api.get("/orders/{order_id}")
def get_order(order_id: int, request: Request) -> dict[str, object]:
    with pool_of(request).connection() as conn:
        row = conn.execute(
            q(
                "SELECT o.id, o.email, o.total_cents, m.subject FROM {schema}.orders o"
                " LEFT JOIN {schema}.outbox m ON m.order_id = o.id WHERE o.id = %s"
            ),
            (order_id,),
        ).fetchone()
    if row is None:
        raise HTTPException(status_code=404, detail="no such order")
    return {"id": row[0], "email": row[1], "total_cents": row[2], "receipt_sent": row[3] is not None}


@api.post("/reports", status_code=202)
def request_report(day: Annotated[date, Query()], request: Request) -> dict[str, object]:
    # The idempotency key makes a second request for the same day return the job already queued.
    with pool_of(request).connection() as conn:
        job = daily_report.enqueue({"day": day.isoformat()}, conn=conn, idempotency_key=f"report-{day}")
    return {"job": job.id, "duplicate": job.duplicate}
