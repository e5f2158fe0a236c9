"""Real PostgreSQL for every test: SKIPLOCK_TEST_DSN, else testcontainers (when Docker answers), else pgserver."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from skiplock import AsyncQueue, Queue, Settings
from skiplock.migrate import migrate
from support.pg import drop_schema, find_postgres


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that runs the CLI in-process configures logging: its handler writes to the stderr pytest captured for
    that test, closed after it. The root logger gets its handlers and level back, so later tests log nowhere stale."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    with find_postgres() as dsn:
        yield dsn


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    """A unique, migrated schema per test, dropped after."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, name)
    yield name
    drop_schema(pg_dsn, name)


@pytest.fixture
def settings(pg_dsn: str, schema: str) -> Settings:
    return Settings.load(
        env={}, dsn=pg_dsn, schema=schema, backoff_base_seconds=1, lease_seconds=30, heartbeat_seconds=5, poll_seconds=1
    )


@pytest.fixture
def queue(settings: Settings) -> Iterator[Queue]:
    with Queue(settings=settings, max_size=8) as q:
        yield q


@pytest.fixture
async def aqueue(settings: Settings) -> AsyncIterator[AsyncQueue]:
    q = await AsyncQueue.open(settings=settings, max_size=8)
    try:
        yield q
    finally:
        await q.close()
