import re
from importlib import resources

import pytest

from skiplock.sql import Queries, include, migrations, parse, queries_for


def test_every_query_is_loaded_and_rendered_for_the_schema():
    q = queries_for("custom_schema")
    for name in Queries.__annotations__:
        text = getattr(q, name)
        assert "{schema}" not in text, name
        if "jobs" in text:
            assert '"custom_schema".jobs' in text, name


def test_a_typo_in_a_query_name_fails():
    with pytest.raises(AttributeError, match="no query named"):
        queries_for("skiplock").job_clam  # noqa: B018


def test_values_only_go_in_as_named_parameters():
    folder = resources.files("skiplock.sql").joinpath("queries")
    for entry in folder.iterdir():
        text = entry.read_text()
        assert not re.search(r"%s(?!\w)", text.replace("%%s", "")), f"positional placeholder in {entry.name}"
        assert "format(%(" not in text, f"value interpolated into SQL text in {entry.name}"


def test_parse_needs_headers_and_bodies():
    with pytest.raises(ValueError, match="no '-- name:' header"):
        parse("SELECT 1;")
    with pytest.raises(ValueError, match="no body"):
        parse("-- name: empty\n-- nothing here\n")


def test_migrations_are_numbered_without_gaps():
    versions = [m.version for m in migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_hostile_schema_names_are_quoted_not_interpolated():
    q = queries_for('we"ird')
    assert '"we""ird".jobs' in q.job_complete_and_claim


def test_parts_are_included_and_a_missing_part_fails():
    assert include("WITH /* include: a */ SELECT 1", {"a": "a AS (SELECT 2)"}) == "WITH a AS (SELECT 2) SELECT 1"
    with pytest.raises(ValueError, match="no SQL part named 'b'"):
        include("/* include: b */", {"a": ""})
    q = queries_for("s")
    for name in Queries.__annotations__:
        assert "/* include:" not in getattr(q, name), name
    # the claim statements share their parts: the serial-key condition is in all six
    claims = [getattr(q, n) for n in Queries.__annotations__ if n.startswith("job_complete_and_claim")]
    assert len(claims) == 6 and all("k.serial_skip_on_retry" in c for c in claims)


def test_parts_may_include_parts_but_not_in_a_cycle():
    assert include("/* include: a */", {"a": "x /* include: b */", "b": "y"}) == "x y"
    with pytest.raises(ValueError, match="deeper than"):
        include("/* include: a */", {"a": "/* include: a */"})
