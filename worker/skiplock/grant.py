"""Least-privilege roles for one schema: producer (enqueue), worker (claim and finish), operator (stats, migrate).

The roles must exist (create them with ``CREATE ROLE ... LOGIN PASSWORD ...``; passwords never pass through
skiplock). :func:`grant_sql` builds the statements (every name quoted with ``psycopg.sql.Identifier``) and
:func:`apply_grants` runs them in one transaction. Run it again after each ``skiplock migrate``: it converges
(each role's table privileges are revoked, then granted exactly), so a re-run is also how a role loses a right.

- producer: ``USAGE`` on the schema, ``SELECT, INSERT`` on ``jobs`` (enqueue with idempotency keys reads the
  live job back), ``USAGE`` on the schema's sequences, ``SELECT`` on ``schema_migrations`` (the version check).
  No ``UPDATE``: a producer cannot claim, finish or cancel.
- worker: ``USAGE`` on the schema, ``SELECT`` plus ``UPDATE`` of the lease columns only (claim, heartbeat,
  complete, fail, release, lease recovery), ``SELECT`` on ``schema_migrations``. No ``INSERT``, no ``DELETE``,
  no DDL, and the payload, queue, priority and key of a job cannot be changed.
- operator: owns the schema and its tables, so it can migrate (forward migrations alter the jobs table, which
  only its owner may do), read stats, retry, cancel and purge. It needs no ``CREATE`` on the database: migrate
  creates the schema only when it is missing. Changing an owner needs a superuser, or a role that is a member
  of both the current owner and the operator role.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from skiplock.errors import ConfigError
from skiplock.migrate import check_version, current_version

LEASE_COLUMNS = ("status", "attempts", "visible_at", "locked_by", "locked_at", "last_error", "updated_at")
"""The columns the worker role may update: the lease and outcome of a job, never its content."""


def grant_sql(
    schema: str,
    producer: str | None = None,
    worker: str | None = None,
    operator: str | None = None,
) -> list[sql.Composed]:
    """The statements that give each named role exactly its privileges on ``schema`` (None: leave it alone)."""
    if producer is None and worker is None and operator is None:
        raise ConfigError("grant: name at least one role (producer, worker or operator)")
    for label, role in (("producer", producer), ("worker", worker), ("operator", operator)):
        if role is not None and (not isinstance(role, str) or not role or "\x00" in role or len(role) > 63):
            raise ConfigError(f"grant: {label} role {role!r} is not a valid role name (1..63 characters)")
    if operator is not None and operator in (producer, worker):
        raise ConfigError("grant: the operator owns the schema, so it cannot also be the producer or the worker role")
    if operator is not None and schema == "public":
        raise ConfigError("grant: will not hand the shared 'public' schema to the operator; keep skiplock in its own")

    s = sql.Identifier(schema)
    jobs = sql.Identifier(schema, "jobs")
    versions = sql.Identifier(schema, "schema_migrations")
    out: list[sql.Composed] = []
    if operator is not None:
        op = sql.Identifier(operator)
        out += [
            sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(s, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(jobs, op),  # its identity sequence follows
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(versions, op),
        ]
    out.append(sql.SQL("REVOKE ALL ON {}, {} FROM PUBLIC").format(jobs, versions))
    members = [sql.Identifier(r) for r in dict.fromkeys(r for r in (producer, worker) if r is not None)]
    for member in members:  # converge: start from nothing, then grant exactly
        out += [
            sql.SQL("REVOKE ALL ON {}, {} FROM {}").format(jobs, versions, member),
            sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(s, member),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, member),
            sql.SQL("GRANT SELECT ON {} TO {}").format(versions, member),
        ]
    if producer is not None:
        p = sql.Identifier(producer)
        out += [
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(jobs, p),
            sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(s, p),
        ]
    if worker is not None:
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in LEASE_COLUMNS)
        out += [
            sql.SQL("GRANT SELECT ON {} TO {}").format(jobs, sql.Identifier(worker)),
            sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(columns, jobs, sql.Identifier(worker)),
        ]
    return out


def apply_grants(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    producer: str | None = None,
    worker: str | None = None,
    operator: str | None = None,
) -> list[str]:
    """Run :func:`grant_sql` in one transaction; returns the statements as text (for ``--dry-run`` style output).

    Raises :class:`ConfigError` when a role does not exist or the connected role may not grant, and
    :class:`SchemaNotReadyError` when the schema is not migrated. ``conn`` must not be inside a transaction.
    """
    names = [r for r in (producer, worker, operator) if r is not None]
    with conn.transaction():
        statements = grant_sql(schema, producer, worker, operator)
        found = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (names,))}
        missing = [r for r in names if r not in found]
        if missing:
            raise ConfigError(
                f"grant: role(s) {', '.join(map(repr, missing))} do not exist: create them first "
                "(CREATE ROLE name LOGIN PASSWORD ...)"
            )
        check_version(current_version(conn, schema), schema)
        for statement in statements:
            try:
                conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege as exc:
                raise ConfigError(
                    f"grant: {str(exc).strip()}: run it as a superuser, or as a role that owns the schema and is "
                    "a member of the operator role"
                ) from None
    return [statement.as_string(conn) for statement in statements]
