"""The UI against a real PostgreSQL: an app per test over the test's schema, with or without a token."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql
from starlette.testclient import TestClient

from skiplock import Queue, Settings
from skiplock.ui import UiConfig, create_app

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def make_client(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**config: Any) -> TestClient:
        client = TestClient(create_app(settings, UiConfig(**config)), follow_redirects=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    """The UI with a token named ``ops``."""
    return make_client(token=TOKEN, token_name="ops")


@pytest.fixture
def readonly(make_client: Callable[..., TestClient]) -> TestClient:
    """The UI without any token: read-only."""
    return make_client()


def execute_in(pg_dsn: str, schema: str, statement: str, params: Sequence[Any] = ()) -> None:
    """One statement on its own autocommit connection, ``{}`` in it the schema's quoted name (a test's setup: a
    state the API cannot make, a job ended as a worker would end it)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(schema)), params)


def add_failed(pg_dsn: str, schema: str, errors: list[str], *, task: str = "send", queue: str = "default") -> list[int]:
    """Failed jobs with these errors, set the way a worker's failure sets them (last_error: the trigger stores
    their fingerprint)."""
    s = sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, payload, status, attempts, max_attempts) "
                "SELECT %s, %s, jsonb_build_object('n', n), 'failed', 3, 3 FROM generate_series(1, %s) AS n "
                "RETURNING id"
            ).format(s),
            (queue, task, len(errors)),
        ).fetchall()
        ids = [r[0] for r in rows]
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs AS j SET last_error = e.error, "
                "errors = jsonb_build_array(jsonb_build_object('attempt', 3, 'at', now(), 'error', e.error, "
                "'worker', 'w1')) FROM unnest(%s::bigint[], %s::text[]) AS e(id, error) WHERE j.id = e.id"
            ).format(s),
            (ids, errors),
        )
    return ids


def statuses(queue: Queue, ids: list[int]) -> dict[int, str]:
    return queue.statuses(ids)


def audit_rows(pg_dsn: str, schema: str) -> list[dict[str, Any]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT * FROM {}.ui_audit ORDER BY id").format(sql.Identifier(schema)))
        return cur.fetchall()
