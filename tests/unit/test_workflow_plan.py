"""The pure parts of workflows: the link options of an enqueue, and the plan a canvas becomes (no database)."""

from __future__ import annotations

import uuid

import pytest

from skiplock.app import App
from skiplock.errors import EnqueueError, ResultError
from skiplock.store.links import Links, encode_result, split_links
from skiplock.workflows import _Job, _plan, chain, chord, group


def test_link_options_are_split_from_the_others_and_validated() -> None:
    assert split_links({"priority": 3}) == (None, {"priority": 3})
    wid = str(uuid.uuid4())
    links, rest = split_links({"after": [3, 1, 3], "on_parent_failure": "run", "workflow_id": wid, "delay": 5})
    assert links == Links((3, 1), True, wid) and rest == {"delay": 5}
    for bad, message in (
        ({"after": 7}, "list of job ids"),
        ({"after": "7"}, "list of job ids"),
        ({"after": [0]}, "positive job ids"),
        ({"after": [True]}, "positive job ids"),
        ({"after": [1], "on_parent_failure": "ignore"}, "'cancel' or 'run'"),
        ({"workflow_id": "nope"}, "must be a UUID"),
        ({"after": [1], "unique_key": "k"}, "cannot be unique"),
    ):
        with pytest.raises(EnqueueError, match=message):
            split_links(bad)


def test_a_return_value_that_cannot_be_stored_is_a_result_error() -> None:
    assert encode_result(None, 100) is None
    assert encode_result({"a": 1}, 100) == '{"a":1}'
    with pytest.raises(ResultError, match="return value cannot be stored: return value is not JSON-serialisable"):
        encode_result(object(), 100)
    with pytest.raises(ResultError, match="over the 10-byte limit"):
        encode_result("x" * 20, 10)


def test_chain_group_and_chord_become_jobs_with_their_parents() -> None:
    app = App("plan")

    @app.task(queue="q", name="plan.t")
    def t(job: object) -> None: ...

    a, b, c, d, cb = (t.s({"n": n}) for n in range(5))
    out: list[_Job] = []
    last = _plan(chain(a, group(b, c), d), (), out)
    assert [(j.sig.payload["n"], j.parents) for j in out] == [(0, ()), (1, (0,)), (2, (0,)), (3, (1, 2))]
    assert last == (3,)
    out = []
    last = _plan(chord([a, b], cb), (), out)
    assert [(j.sig.payload["n"], j.parents, j.run_on_parent_failure) for j in out] == [
        (0, (), False),
        (1, (), False),
        (4, (0, 1), True),
    ]
    assert last == (2,)
    with pytest.raises(ValueError, match="at least one"):
        group()
