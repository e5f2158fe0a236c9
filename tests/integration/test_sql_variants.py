"""Every variant a template renders (skiplock/sql/template.py) is SQL PostgreSQL accepts, with the columns of the
statement it is written as, and each one is used by the package."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import psycopg
import pytest

import skiplock
from skiplock.sql import QUERY_FILES, queries_for


def _variants() -> dict[str, str]:
    """variant name -> the name of the statement its template is written as."""
    folder = resources.files("skiplock.sql").joinpath("queries")
    out: dict[str, str] = {}
    for filename in QUERY_FILES:
        written = ""
        for line in folder.joinpath(filename).read_text(encoding="utf-8").splitlines():
            if m := re.match(r"-- name: (\w+)$", line):
                written = m[1]
            elif m := re.match(r"-- variant: (\w+) ", line):
                out[m[1]] = written
    return out


VARIANTS = _variants()


def _numbered(text: str) -> str:
    """``%(name)s`` parameters as ``$n``, the way the server sees them once psycopg has bound them."""
    order: dict[str, int] = {}
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${order.setdefault(m[1], len(order) + 1)}", text)
    return text.replace("%%", "%")


def _prepared(conn: psycopg.Connection, text: str) -> list[str]:
    """Prepare ``text`` (PostgreSQL parses and analyses it), return its result columns, deallocate."""
    conn.execute(f"PREPARE variant AS {_numbered(text)}".encode())
    try:
        described = conn.pgconn.describe_prepared(b"variant")
        return [(described.fname(i) or b"").decode() for i in range(described.nfields)]
    finally:
        conn.execute("DEALLOCATE variant")


def test_the_claim_is_one_template_of_six_statements():
    assert {v for v, t in VARIANTS.items() if t == "job_complete_and_claim"} == {
        "job_complete_and_claim_one",
        "job_complete_and_claim_unlimited",
        "job_complete_and_claim_unlimited_one",
        "job_complete_and_claim_one_after",
        "job_complete_and_claim_unlimited_one_after",
    }


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_is_used_by_the_package(name: str):
    package = Path(skiplock.__file__).parent
    uses = re.compile(rf"\.{name}\b")
    assert any(uses.search(p.read_text(encoding="utf-8")) for p in package.rglob("*.py")), (
        f"no module of skiplock runs the variant {name}: drop it from its template"
    )


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_prepares_with_the_columns_of_its_template(pg_dsn: str, schema: str, name: str):
    q = queries_for(schema)
    text, written = getattr(q, name), getattr(q, VARIANTS[name])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        if text.startswith("COPY"):  # COPY cannot be prepared: run it with no rows
            with conn.cursor().copy(text.encode()):
                pass
            return
        assert _prepared(conn, text) == _prepared(conn, written), f"{name} returns other columns than {VARIANTS[name]}"
