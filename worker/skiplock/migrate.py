"""Apply the packaged migrations, each in its own transaction under an advisory lock (safe from many pods at once)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from skiplock.errors import SchemaNotReadyError
from skiplock.sql import Migration, migrations, queries_for, render

log = logging.getLogger(__name__)


def lock_key(schema: str) -> int:
    """A stable signed 64-bit advisory-lock key for one schema."""
    digest = hashlib.blake2b(f"skiplock.migrate:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class MigrationReport:
    schema: str
    applied: tuple[str, ...]
    version: int


def latest_version() -> int:
    return migrations()[-1].version


def migrate(conn: psycopg.Connection[Any], schema: str) -> MigrationReport:
    """Bring ``schema`` up to the latest version. ``conn`` must not be in a transaction; it is left idle."""
    q = queries_for(schema)
    applied: list[str] = []
    for m in migrations():
        with conn.transaction():
            conn.execute(q.schema_lock, {"key": lock_key(schema)})
            _prepare(conn, schema)
            done = {r[0] for r in conn.execute(q.schema_versions).fetchall()}
            if m.version in done:
                continue
            _apply(conn, schema, m)
            applied.append(m.name)
    if applied:
        log.info("migrated", extra={"action": "migrated", "schema": schema, "applied": applied})
    return MigrationReport(schema, tuple(applied), latest_version())


async def amigrate(conn: psycopg.AsyncConnection[Any], schema: str) -> MigrationReport:
    """Async twin of :func:`migrate` (the operator runs it before any worker starts)."""
    q = queries_for(schema)
    applied: list[str] = []
    for m in migrations():
        async with conn.transaction():
            await conn.execute(q.schema_lock, {"key": lock_key(schema)})
            await _aprepare(conn, schema)
            done = {r[0] for r in await (await conn.execute(q.schema_versions)).fetchall()}
            if m.version in done:
                continue
            await conn.execute(render(m.text, schema))
            await conn.execute(q.schema_record, {"version": m.version, "name": m.name})
            applied.append(m.name)
    if applied:
        log.info("migrated", extra={"action": "migrated", "schema": schema, "applied": applied})
    return MigrationReport(schema, tuple(applied), latest_version())


def _prepare(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the schema and the migrations table only when missing: a role that owns an existing schema can
    migrate without CREATE on the database."""
    q = queries_for(schema)
    if not conn.execute(q.schema_exists, {"schema": schema}).fetchone()[0]:  # type: ignore[index]
        conn.execute(q.schema_create)
    if not conn.execute(q.schema_present, {"schema": schema}).fetchone()[0]:  # type: ignore[index]
        conn.execute(q.schema_migrations_create)


async def _aprepare(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    q = queries_for(schema)
    if not (await (await conn.execute(q.schema_exists, {"schema": schema})).fetchone())[0]:  # type: ignore[index]
        await conn.execute(q.schema_create)
    present = await (await conn.execute(q.schema_present, {"schema": schema})).fetchone()
    if not present[0]:  # type: ignore[index]
        await conn.execute(q.schema_migrations_create)


def _apply(conn: psycopg.Connection[Any], schema: str, m: Migration) -> None:
    q = queries_for(schema)
    conn.execute(render(m.text, schema))
    conn.execute(q.schema_record, {"version": m.version, "name": m.name})


def current_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """Highest applied version, 0 when the schema was never migrated."""
    q = queries_for(schema)
    row = conn.execute(q.schema_present, {"schema": schema}).fetchone()
    if not row or not row[0]:
        return 0
    versions = [r[0] for r in conn.execute(q.schema_versions).fetchall()]
    return max(versions, default=0)


async def acurrent_version(conn: psycopg.AsyncConnection[Any], schema: str) -> int:
    q = queries_for(schema)
    row = await (await conn.execute(q.schema_present, {"schema": schema})).fetchone()
    if not row or not row[0]:
        return 0
    versions = [r[0] for r in await (await conn.execute(q.schema_versions)).fetchall()]
    return max(versions, default=0)


def check_version(found: int, schema: str) -> None:
    if found < latest_version():
        raise SchemaNotReadyError(
            f"schema {schema!r} is at version {found}, this skiplock needs {latest_version()}: run 'skiplock migrate'"
        )
