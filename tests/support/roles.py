"""Login roles for the least-privilege tests: a producer, a worker and an operator role, dropped after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from support.pg import drop_schema


@dataclass
class Roles:
    producer: str
    worker: str
    operator: str
    password: str

    def dsn(self, base: str, role: str) -> str:
        return make_conninfo(base, user=role, password=self.password)


@contextlib.contextmanager
def login_roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    """Three new login roles sharing one password (with characters a DSN must escape); on the way out the schema
    is dropped, then whatever the roles own, then the roles."""
    tag = uuid.uuid4().hex[:8]
    made = Roles(f"sk_prod_{tag}", f"sk_work_{tag}", f"sk_op_{tag}", f"Pw-{tag}-s3cr3t%x")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for role in (made.producer, made.worker, made.operator):
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(made.password))
            )
    try:
        yield made
    finally:
        drop_schema(pg_dsn, schema)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for role in (made.producer, made.worker, made.operator):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
