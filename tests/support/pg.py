"""Find a real PostgreSQL for the tests (never a mock), and small helpers around it."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

T = TypeVar("T")


def _docker_answers() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(0.5)
                s.connect(host[len("unix://") :])
        elif host.startswith("tcp://"):
            parts = urlsplit(host)
            with socket.create_connection((parts.hostname or "localhost", parts.port or 2375), timeout=0.5):
                pass
        else:
            return False
    except OSError:
        return False
    return True


def _connects(dsn: str) -> bool:
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


@contextlib.contextmanager
def find_postgres() -> Iterator[str]:
    dsn = os.environ.get("SKIPLOCK_TEST_DSN")
    if dsn:
        if not _connects(dsn):
            pytest.fail("SKIPLOCK_TEST_DSN is set but does not connect")
        yield dsn
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()
        return
    try:
        import pgserver
    except ImportError:
        pytest.fail(
            "no PostgreSQL: set SKIPLOCK_TEST_DSN, start Docker, or install pgserver (pip install -e '.[test]')"
        )
    srv = pgserver.get_server(tempfile.mkdtemp(prefix="skiplock-pg-"), cleanup_mode="delete")
    try:
        yield srv.get_uri()
    finally:
        srv.cleanup()


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def migrate_to(conn: psycopg.Connection[Any], schema: str, version: int) -> None:
    """Create ``schema`` with the packaged migrations up to ``version`` applied, as an older skiplock left it."""
    from skiplock.sql import migrations, queries_for, render

    q = queries_for(schema)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(q.schema_migrations_create)
    for m in migrations():
        if m.version <= version:
            with conn.transaction():
                conn.execute(render(m.text, schema))
                conn.execute(q.schema_record, {"version": m.version, "name": m.name})


def wait_for(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {result!r})")
        time.sleep(interval)


async def await_for(
    check: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> T:
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {result!r})")
        await asyncio.sleep(interval)
