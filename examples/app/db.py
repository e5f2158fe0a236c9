"""The shop's database settings, its tables, and its two roles' rights. Read from the environment once, at import:

- ``DATABASE_URL``: the PostgreSQL DSN of the process (the web app's own role; the table owner's to create tables);
- ``SHOP_SCHEMA``: the schema of the shop's own tables (default ``shop``);
- ``SKIPLOCK_SCHEMA``: the schema of skiplock's jobs table (default ``skiplock``), for producers and workers alike.
"""

from __future__ import annotations

import argparse
import os
from importlib.resources import files
from typing import LiteralString

import psycopg
from psycopg import sql

SHOP_SCHEMA = os.environ.get("SHOP_SCHEMA", "shop")
SKIPLOCK_SCHEMA = os.environ.get("SKIPLOCK_SCHEMA", "skiplock")


def dsn() -> str:
    try:
        return os.environ["DATABASE_URL"]
    except KeyError:
        raise RuntimeError("set DATABASE_URL to the shop's PostgreSQL DSN") from None


def q(text: LiteralString) -> sql.Composed:
    """A statement on the shop's tables: ``{schema}`` becomes the quoted schema name; values stay parameters."""
    return sql.SQL(text).format(schema=sql.Identifier(SHOP_SCHEMA))


def create_tables(conn: psycopg.Connection) -> None:
    """Create the shop's tables and a few products (idempotent)."""
    text = files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")
    conn.execute(sql.SQL(text).format(schema=sql.Identifier(SHOP_SCHEMA)))  # type: ignore[arg-type]


# What each role needs of the shop's tables, no more: the web app places and reads orders and enqueues (skiplock grant
# --producer gives it the jobs table); the worker's tasks read orders and write the outbox and the reports.
API_RIGHTS = {"products": "SELECT", "orders": "SELECT, INSERT, UPDATE", "order_items": "SELECT, INSERT",
              "outbox": "SELECT"}  # fmt: skip
WORKER_RIGHTS = {"orders": "SELECT", "outbox": "SELECT, INSERT", "daily_reports": "SELECT, INSERT, UPDATE"}


def grant_tables(conn: psycopg.Connection, *, api: str | None, worker: str | None) -> None:
    """Give the web app's role and the worker's role their rights on the shop's tables (the roles must exist)."""
    for role, rights in ((api, API_RIGHTS), (worker, WORKER_RIGHTS)):
        if role is None:
            continue
        who = sql.Identifier(role)
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {role}").format(schema=sql.Identifier(SHOP_SCHEMA), role=who)
        )
        for table, privileges in rights.items():
            conn.execute(
                sql.SQL("GRANT {privileges} ON {schema}.{table} TO {role}").format(
                    privileges=sql.SQL(privileges),  # one of the constants above, never input
                    schema=sql.Identifier(SHOP_SCHEMA),
                    table=sql.Identifier(table),
                    role=who,
                )
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Create the shop's tables; with roles, grant them their rights.")
    parser.add_argument("--api-role", help="the web app's role: places and reads orders")
    parser.add_argument("--worker-role", help="the worker's role: writes the outbox and the reports")
    args = parser.parse_args()
    with psycopg.connect(dsn()) as connection:
        create_tables(connection)
        grant_tables(connection, api=args.api_role, worker=args.worker_role)
    roles = [r for r in (args.api_role, args.worker_role) if r]
    print(f"shop tables ready in schema {SHOP_SCHEMA!r}" + (f", rights granted to {', '.join(roles)}" if roles else ""))
