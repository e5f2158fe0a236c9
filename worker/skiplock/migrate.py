"""Apply the packaged migrations, each in its own transaction under a lock of the migrations table (safe from many
pods at once).

The lock is ``LOCK TABLE schema_migrations IN SHARE ROW EXCLUSIVE MODE``: it conflicts with itself, not with the
version checks' reads, and needs the UPDATE, DELETE or TRUNCATE privilege on the table, which only the schema's owner
has. An advisory key (as before) could be taken by any role of the database and held, keeping every migration, and
so a JobQueue's workers, waiting.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from skiplock.errors import SchemaNotReadyError
from skiplock.sql import Migration, migrations, queries_for, render

log = logging.getLogger(__name__)


_RACED = (errors.UniqueViolation, errors.DuplicateSchema, errors.DuplicateTable)
"""What a create-if-missing raises when another process created the same object at the same moment."""
_TRIES = 3


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
    _bootstrap(conn, schema)
    with conn.transaction():  # a transaction of its own: the connection is left idle, autocommit or not
        versions = conn.execute(q.schema_versions).fetchall()
    applied: list[str] = []
    for m in _pending(migrations(), {r[0] for r in versions}):
        with conn.transaction():
            conn.execute(q.schema_lock)
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
    await _abootstrap(conn, schema)
    async with conn.transaction():
        versions = await (await conn.execute(q.schema_versions)).fetchall()
    applied: list[str] = []
    for m in _pending(migrations(), {r[0] for r in versions}):
        async with conn.transaction():
            await conn.execute(q.schema_lock)
            done = {r[0] for r in await (await conn.execute(q.schema_versions)).fetchall()}
            if m.version in done:
                continue
            await conn.execute(render(m.text, schema))
            await conn.execute(q.schema_record, {"version": m.version, "name": m.name})
            applied.append(m.name)
    if applied:
        log.info("migrated", extra={"action": "migrated", "schema": schema, "applied": applied})
    return MigrationReport(schema, tuple(applied), latest_version())


def _pending(every: tuple[Migration, ...], done: set[int]) -> list[Migration]:
    """The migrations not applied yet (each is checked again under the lock): an up-to-date schema takes no lock,
    so a role that may read it but not lock it (a worker's) finds nothing to do."""
    return [m for m in every if m.version not in done]


def _bootstrap(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the schema and the migrations table when missing, each try its own transaction: two processes
    creating them at the same moment is a race one of them loses, and looks again."""
    for attempt in range(_TRIES):
        try:
            with conn.transaction():
                _prepare(conn, schema)
            return
        except _RACED:
            if attempt == _TRIES - 1:
                raise


async def _abootstrap(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    for attempt in range(_TRIES):
        try:
            async with conn.transaction():
                await _aprepare(conn, schema)
            return
        except _RACED:
            if attempt == _TRIES - 1:
                raise


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
