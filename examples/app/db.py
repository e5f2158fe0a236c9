"""The shop's database settings and its tables. Read from the environment once, at import:

- ``DATABASE_URL``: the PostgreSQL DSN (the skiplock worker reads it too);
- ``SHOP_SCHEMA``: the schema of the shop's own tables (default ``shop``);
- ``SKIPLOCK_SCHEMA``: the schema of skiplock's jobs table (default ``skiplock``), for producers and workers alike.
"""

from __future__ import annotations

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


if __name__ == "__main__":
    with psycopg.connect(dsn()) as connection:
        create_tables(connection)
    print(f"shop tables ready in schema {SHOP_SCHEMA!r}")
