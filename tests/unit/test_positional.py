"""The claim's placeholders converted once per query text (skiplock.store.run.positional), as psycopg converts them."""

from __future__ import annotations

import pytest
from psycopg._queries import PostgresQuery

from skiplock.settings import Settings
from skiplock.store.run import positional
from skiplock.store.statements import Statements


def _psycopg(query: str, names: tuple[str, ...]) -> tuple[bytes, tuple[str, ...]]:
    pq = PostgresQuery(_Transformer())
    pq.convert(query, dict.fromkeys(names))
    return pq.query, tuple(pq._order or ())


class _Transformer:  # what PostgresQuery needs of a transformer to convert (dumping is not tested here)
    encoding = "utf-8"
    types = ()
    formats = None

    def dump_sequence(self, params, formats):  # type: ignore[no-untyped-def]
        return [None] * len(params)


def test_every_named_query_converts_as_psycopg_converts_it() -> None:
    q = Statements(Settings(dsn="postgresql://localhost/x")).q
    queries = {n: getattr(q, n) for n in dir(q) if not n.startswith("_") and isinstance(getattr(q, n), str)}
    converted = {n: positional(text) for n, text in queries.items()}
    assert converted["job_complete_and_claim"] is not None  # the claims, above all
    for name, found in converted.items():
        if found is not None:
            assert _psycopg(queries[name], found[1]) == found, name


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT %(a)s, %(b)s, %(a)s", (b"SELECT $1, $2, $1", ("a", "b"))),
        ("SELECT 5 %% 2, %(x)s", (b"SELECT 5 % 2, $1", ("x",))),
        ("SELECT 1", (b"SELECT 1", ())),
        ("SELECT %s", None),  # positional: psycopg's own conversion
        ("SELECT %(a)b", None),  # a binary placeholder
        ("SELECT %(a)s, 'é'", None),  # not ASCII
        (b"SELECT %(a)s", None),  # not text
    ],
)
def test_placeholders_it_takes_and_the_ones_it_leaves_to_psycopg(query: object, expected: object) -> None:
    assert positional(query) == expected
    assert positional(query) == expected  # and again, from its cache
