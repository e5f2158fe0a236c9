import re
from importlib import resources

import pytest

from skiplock.sql import Queries, compact, migrations, parse, queries_for, template


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


def test_compact_drops_comments_and_indentation_but_not_what_is_quoted():
    text = "SELECT 'a -- b', \"x--y\"  -- why\n\n    -- a line of its own\n    , $f$ -- kept\n  $f$ -- end"
    assert compact(text) == "SELECT 'a -- b', \"x--y\"\n, $f$ -- kept\n  $f$"
    assert compact("SELECT 'it''s -- here'\n  FROM t -- the table") == "SELECT 'it''s -- here'\nFROM t"


def test_the_statements_sent_carry_no_comment_and_the_usual_claims_fit_psycopgs_parse_cache():
    # psycopg caches a statement's parsed placeholders only up to this length (psycopg._queries); longer ones are
    # parsed again on every execution
    cached = 4096
    q = queries_for("a_schema_name_of_the_longest_length_postgresql_takes_63_bytes__")
    for name in Queries.__annotations__:
        assert not re.search(r"^\s|--", getattr(q, name), re.MULTILINE), name
    for name in CLAIMS:
        if "unlimited" in name:
            assert len(getattr(q, name)) < cached, (name, len(getattr(q, name)))


CLAIMS = [n for n in Queries.__annotations__ if n.startswith("job_complete_and_claim")]


def test_a_template_keeps_a_flagged_part_in_its_variants_only():
    text = "SELECT 1/*[one*/, 2/*[!two*/, 3/*!two]*//*one]*/\n/*[!one*/\n  , 4\n/*!one]*/;"
    assert template.render(text, frozenset()) == "SELECT 1\n  , 4\n;"
    assert template.render(text, frozenset({"one"})) == "SELECT 1, 2, 3\n;"
    assert template.render(text, frozenset({"one", "two"})) == "SELECT 1, 2\n;"
    assert template.flags_of(text) == {"one", "two"}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("SELECT 1 /*[one*/, 2", "never closed"),
        ("SELECT 1 /*one]*/", "closes nothing"),
        ("SELECT /*[one*/ /*[two*/ 1 /*one]*/ /*two]*/", "closes two"),
    ],
)
def test_an_unbalanced_or_crossed_marker_fails(text: str, error: str):
    with pytest.raises(ValueError, match=error):
        template.render(text, frozenset())


def test_a_variant_flag_that_marks_nothing_or_a_bad_variant_line_fails():
    with pytest.raises(ValueError, match="mark no part"):
        parse("-- name: q\n-- doc\n-- variant: q_two (two)\nSELECT 1 /*[one*/, 2 /*one]*/;\n")
    with pytest.raises(ValueError, match="not a variant line"):
        parse("-- name: q\n-- doc\n-- variant: q_two two\nSELECT 1;\n")


def test_the_six_claim_statements_are_the_ones_the_statements_pick():
    q = queries_for("s")
    assert len(CLAIMS) == 6 and all("k.serial_skip_on_retry" in getattr(q, n) for n in CLAIMS)
    assert all("/* include:" not in getattr(q, n) for n in Queries.__annotations__)


def test_each_traced_enqueue_is_its_plain_twin_plus_the_trace_context_column():
    """The ``traced`` variant of each enqueue statement (jobs.sql) is the statement plus one column, nothing else."""
    from skiplock.sql import _raw_queries

    texts = {s.name: s.text for s in _raw_queries()}
    twins = [name for name in texts if name.endswith("_traced")]
    plain = ("job_enqueue", "job_enqueue_many", "job_copy_many", "job_enqueue_unique", "job_enqueue_many_unique")
    by_name = [n for n in texts if n.startswith("job_enqueue") and n.endswith("_by_name")]
    assert sorted(twins) == sorted(f"{n}_traced" for n in (*plain, *by_name)), "every enqueue statement has its twin"

    def without_trace(text: str) -> str:
        text = re.sub(r",\s*%\(trace_context\)s::jsonb", "", text)
        text = re.sub(r",\s*trace_context\b", "", text)
        return re.sub(r"\s+", " ", text)

    for twin in twins:
        assert "trace_context" in texts[twin], twin
        assert without_trace(texts[twin]) == re.sub(r"\s+", " ", texts[twin.removesuffix("_traced")]), twin


BY_NAME = [n for n in Queries.__annotations__ if n.endswith("_by_name")]
_REGISTERED = re.compile(
    r"coalesce\(%\((priority|max_attempts|serial_skip_on_retry)\)s::\w+,\s*\(SELECT t\.\1 FROM \"s\"\.tasks AS t "
    r"WHERE t\.name = %\(task\)s\),\s*(?:0|false|%\(max_attempts_default\)s)\)"
)


@pytest.mark.parametrize("name", BY_NAME)
def test_each_enqueue_by_name_is_its_plain_statement_with_the_registered_defaults_word_for_word(name: str):
    """The ``by_name`` variant of each enqueue statement (jobs.sql): apart from reading priority, max_attempts and
    serial_skip_on_retry from the registry, it is the plain statement, word for word."""
    q = queries_for("s")
    by_name, plain = getattr(q, name), getattr(q, name.removesuffix("_by_name"))
    assert len(_REGISTERED.findall(by_name)) == (1 if "replace" in name else 3)
    undone = _REGISTERED.sub(lambda m: f"%({m[1]})s", by_name)
    assert undone.split() == plain.split(), f"{name} drifted from {name.removesuffix('_by_name')}"


def test_every_enqueue_statement_has_its_by_name_twin():
    plain = {n for n in Queries.__annotations__ if n.startswith("job_enqueue") and not n.endswith("_traced")}
    plain |= {"job_replace_unique"}
    assert {n for n in plain if not n.endswith("_by_name")} == {n.removesuffix("_by_name") for n in BY_NAME}
