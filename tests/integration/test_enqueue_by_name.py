"""A producer enqueueing by task name (``Queue.enqueue(queue, payload, task=...)``, ``AsyncQueue``,
``enqueue_many``) gets the defaults the workers registered for the task (store/tasks.py), read inside the enqueue
statement itself; explicit options win; a plain enqueue keeps its statement. Real PostgreSQL.

The worker's own registration (a real ``skiplock worker`` process) is in test_cli_guidance.py; here the tasks are
registered with the statement and parameters the worker sends (``task_register``), which is quicker to set up."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from skiplock import App, AsyncQueue, Queue, Settings
from skiplock.sql import queries_for
from skiplock.store.tasks import defaults_of, register_params


@pytest.fixture
def registered(settings: Settings) -> None:
    """What a worker running this app registers at start: ``once`` with max_attempts=1, priority 7, skip on retry;
    ``plain`` declaring nothing."""
    app = App(schema=settings.schema)

    @app.task(name="once", queue="mail", max_attempts=1, priority=7, serial_skip_on_retry=True)
    def once(job: Any) -> None:
        return None

    @app.task(name="plain", queue="mail")
    def plain(job: Any) -> None:
        return None

    with psycopg.connect(settings.dsn or "", autocommit=True) as conn:
        conn.execute(queries_for(settings.schema).task_register, register_params(map(defaults_of, app), "app", "w1"))


def options_of(pg_dsn: str, schema: str, ids: list[int]) -> list[tuple[int, int, bool]]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(
            f'SELECT max_attempts, priority, serial_skip_on_retry FROM "{schema}".jobs WHERE id = ANY(%s) ORDER BY id',
            (ids,),
        ).fetchall()


def test_an_enqueue_by_name_takes_the_registered_defaults_and_explicit_options_win(
    registered, queue: Queue, pg_dsn: str, schema: str
):
    by_name = queue.enqueue("mail", {}, task="once").id
    explicit = queue.enqueue("mail", {}, task="once", max_attempts=4, priority=-1, serial_skip_on_retry=False).id
    partly = queue.enqueue("mail", {}, task="once", max_attempts=3).id
    keyed = queue.enqueue("mail", {}, task="once", idempotency_key="k1").id
    undeclared = queue.enqueue("mail", {}, task="plain").id  # registered, declaring nothing: the producer's settings
    unknown = queue.enqueue("mail", {}, task="nobody-registered").id
    anonymous = queue.enqueue("mail", {}).id
    assert options_of(pg_dsn, schema, [by_name, explicit, partly, keyed, undeclared, unknown, anonymous]) == [
        (1, 7, True),
        (4, -1, False),
        (3, 7, True),
        (1, 7, True),
        (queue.settings.max_attempts, 0, False),
        (queue.settings.max_attempts, 0, False),
        (queue.settings.max_attempts, 0, False),
    ]


def test_enqueue_many_and_unique_enqueues_by_name_take_them_too(registered, queue: Queue, pg_dsn: str, schema: str):
    many = queue.enqueue_many("mail", [{"n": 1}, {"n": 2}], task="once")
    keyed = queue.enqueue_many("mail", [{"n": 3}], task="once", idempotency_keys=["a"])
    unique = queue.enqueue("mail", {"n": 4}, task="once", unique_key="u1")
    replaced = queue.enqueue("mail", {"n": 5}, task="once", unique_key="u1", unique_conflict="replace")
    uniques = queue.enqueue_many("mail", [{"n": 6}], task="once", unique_keys=["u2"], max_attempts=2)
    assert replaced.duplicate and replaced.id == unique.id
    ids = [*many, *keyed, unique.id, *uniques]
    assert options_of(pg_dsn, schema, ids) == [(1, 7, True)] * 4 + [(2, 7, True)]
    plain = queue.enqueue_many("mail", [{"n": 7}])
    assert options_of(pg_dsn, schema, list(plain)) == [(queue.settings.max_attempts, 0, False)]


async def test_the_async_queue_enqueues_by_name_the_same(registered, aqueue: AsyncQueue, pg_dsn: str, schema: str):
    one = await aqueue.enqueue("mail", {}, task="once")
    many = await aqueue.enqueue_many("mail", [{}, {}], task="once", priority=2)
    assert options_of(pg_dsn, schema, [one.id, *many]) == [(1, 7, True), (1, 2, True), (1, 2, True)]


def test_a_bad_explicit_option_by_name_is_still_refused(registered, queue: Queue):
    with pytest.raises(Exception, match="max_attempts must be an integer"):
        queue.enqueue("mail", {}, task="once", max_attempts=0)
