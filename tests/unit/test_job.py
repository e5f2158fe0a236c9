"""Job: ``job.conn`` as a handler sees it (no database needed)."""

from __future__ import annotations

import contextlib

from skiplock import Job
from skiplock.job import LazyConnection


def test_conn_is_none_outside_a_worker_and_with_conn_keeps_the_rest():
    job = Job(1, "q", {"a": 1}, 1, 3, priority=5, idempotency_key="k")
    assert job.conn is None
    sentinel = object()
    bound = job.with_conn(sentinel)
    assert bound.conn is sentinel and job.conn is None, "with_conn returns a new job"
    assert bound == job and (bound.id, bound.payload, bound.priority, bound.idempotency_key) == (1, {"a": 1}, 5, "k")


def test_a_lazy_connection_is_acquired_on_first_use_only_and_once():
    calls: list[int] = []
    conn = object()

    def acquire():
        calls.append(1)
        return conn

    lease = LazyConnection(acquire)
    job = Job(1, "q", None, 1, 3).with_conn(lease)
    assert calls == [] and lease.conn is None, "nothing is checked out before the handler asks"
    assert job.conn is conn and job.conn is conn
    assert calls == [1] and lease.conn is conn


def test_a_failed_checkout_is_remembered_even_when_the_handler_swallows_it():
    def acquire():
        raise TimeoutError("pool exhausted")

    lease = LazyConnection(acquire)
    job = Job(1, "q", None, 1, 3).with_conn(lease)
    with contextlib.suppress(TimeoutError):
        job.conn  # noqa: B018 - the access is the checkout
    assert isinstance(lease.failed, TimeoutError) and lease.conn is None
