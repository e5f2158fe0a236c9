"""Tasks on the producer side: registration, enqueue by task and by name (sync and async), defaults and
overrides, the caller's transaction, and the errors of bad arguments. Real PostgreSQL."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from skiplock import App, AsyncQueue, ConfigError, EnqueueError, PayloadError, Queue, Settings, Task


def make_app(schema: str) -> tuple[App, Task, Task]:
    app = App(schema=schema)

    @app.task(queue="emails", priority=5, max_attempts=3)
    def send_receipt(job):
        return None

    @app.task(name="reports.build")
    async def build_report(job):
        return None

    return app, send_receipt, build_report


@pytest.fixture
def tasks(settings: Settings) -> Iterator[tuple[App, Task, Task]]:
    app, send, build = make_app(settings.schema)
    app.connect(settings=settings)
    try:
        yield app, send, build
    finally:
        app.close()


@pytest.fixture
async def atasks(settings: Settings) -> AsyncIterator[tuple[App, Task, Task]]:
    app, send, build = make_app(settings.schema)
    await app.aconnect(settings=settings)
    try:
        yield app, send, build
    finally:
        await app.aclose()


def row(queue: Queue, job_id: int) -> dict:
    found = queue.get(job_id)
    assert found is not None
    return found


# ---------------------------------------------------------------------------------------------- registration
def test_name_defaults_to_module_and_function_and_options_are_kept():
    app, send, build = make_app("skiplock")
    assert send.name == f"{__name__}.make_app.<locals>.send_receipt"
    assert build.name == "reports.build" and build.is_async and not send.is_async
    assert (send.queue, send.options.priority, send.options.max_attempts) == ("emails", 5, 3)
    assert app.get("reports.build") is build and app.queues == ("emails", "default")


def test_registering_two_tasks_under_one_name_is_an_error_at_import_time():
    app = App()

    @app.task(name="dup")
    def first(job):
        return None

    with pytest.raises(ConfigError, match="'dup' is registered twice"):

        @app.task(name="dup")
        def second(job):
            return None


def test_unknown_and_invalid_task_options_are_errors():
    app = App()
    with pytest.raises(ConfigError, match="unknown task option"):
        app.task(retries=3)
    with pytest.raises(ConfigError, match="max_attempts"):
        app.task(max_attempts=5000)
    with pytest.raises(ConfigError, match="task name"):
        app.task(name="x" * 201)(lambda job: None)
    with pytest.raises(ConfigError, match="schema"):
        App(schema="Not-A-Schema")


# ---------------------------------------------------------------------------------------------- enqueue by task
def test_task_enqueue_applies_the_task_defaults(tasks, queue: Queue):
    _, send, _ = tasks
    job = row(queue, send.enqueue({"order": 1}).id)
    assert (job["task"], job["queue"], job["priority"], job["max_attempts"]) == (send.name, "emails", 5, 3)
    assert job["payload"] == {"order": 1} and job["status"] == "pending" and job["lease_expires_at"] is None


def test_explicit_options_win_over_the_task_defaults(tasks, queue: Queue):
    _, send, build = tasks
    before = datetime.now(UTC)
    r = send.enqueue({}, queue="urgent", priority=-2, max_attempts=1, delay=timedelta(hours=1), idempotency_key="k1")
    job = row(queue, r.id)
    assert (job["queue"], job["priority"], job["max_attempts"]) == ("urgent", -2, 1)
    assert job["visible_at"] >= before + timedelta(minutes=59)
    assert send.enqueue({}, queue="urgent", idempotency_key="k1") == type(r)(r.id, duplicate=True)
    plain = row(queue, build.enqueue({}, priority=None).id)  # None = not given: the defaults apply
    assert (plain["task"], plain["queue"], plain["priority"], plain["max_attempts"]) == (
        "reports.build",
        "default",
        0,
        5,
    )


def test_task_enqueue_inside_the_callers_transaction_needs_no_binding(settings: Settings, queue: Queue, pg_dsn):
    _, send, _ = make_app(settings.schema)  # never connected
    with psycopg.connect(pg_dsn) as conn:
        kept = send.enqueue({"n": 1}, conn=conn).id
    with psycopg.connect(pg_dsn) as conn:
        dropped = send.enqueue({"n": 2}, conn=conn).id
        conn.rollback()
    assert row(queue, kept)["task"] == send.name
    assert queue.get(dropped) is None  # rolled back with the caller's transaction: no job


async def test_a_connection_of_the_wrong_kind_is_a_clear_error(settings: Settings, pg_dsn):
    _, send, _ = make_app(settings.schema)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
        with pytest.raises(ConfigError, match=r"must be a psycopg\.Connection"):
            send.enqueue({}, conn=aconn)  # type: ignore[arg-type]
    with psycopg.connect(pg_dsn) as conn, pytest.raises(ConfigError, match=r"must be a psycopg\.AsyncConnection"):
        await send.aenqueue({}, conn=conn)  # type: ignore[arg-type]


def test_enqueue_many_by_task_writes_the_task_on_every_job(tasks, queue: Queue):
    _, send, _ = tasks
    ids = send.enqueue_many([{"i": i} for i in range(3)], idempotency_keys=["a", "b", "a"])
    assert len(ids) == 2
    assert {row(queue, i)["task"] for i in ids} == {send.name}
    assert {row(queue, i)["queue"] for i in ids} == {"emails"}


def test_enqueue_by_name_through_the_queue_and_the_app(tasks, queue: Queue):
    app, send, _ = tasks
    by_queue = row(queue, queue.enqueue("emails", {"x": 1}, task="somebody.elses.task").id)
    assert (by_queue["task"], by_queue["max_attempts"]) == ("somebody.elses.task", queue.settings.max_attempts)
    by_app = row(queue, app.enqueue(send.name, {"x": 2}).id)
    assert (by_app["task"], by_app["queue"], by_app["priority"]) == (send.name, "emails", 5)
    many = queue.enqueue_many("bulk", [{}, {}], task="bulk.task")
    assert [row(queue, i)["task"] for i in many] == ["bulk.task", "bulk.task"]
    assert row(queue, queue.enqueue("plain", {}).id)["task"] is None  # no task: the queue's default handler


def test_a_task_of_an_unconnected_app_says_how_to_connect(settings: Settings):
    _, send, _ = make_app(settings.schema)
    with pytest.raises(ConfigError, match=r"not connected.*app.connect"):
        send.enqueue({})


def test_connect_refuses_settings_of_another_schema_and_a_second_binding(settings: Settings):
    app, _, _ = make_app(settings.schema)
    with pytest.raises(ConfigError, match="schema"):
        app.connect(settings=settings.replace(schema="elsewhere"))
    with app.connect(settings=settings) as q, pytest.raises(ConfigError, match="already connected"):
        app.connect(settings=settings)
    assert q.closed
    app.connect(settings=settings).close()  # closing the queue unbinds: connecting again works


# ---------------------------------------------------------------------------------------------- async
async def test_async_task_enqueue_with_defaults_overrides_and_by_name(atasks, aqueue: AsyncQueue):
    app, send, build = atasks
    job = await aqueue.get((await send.aenqueue({"a": 1})).id)
    assert job is not None and (job["task"], job["queue"], job["priority"]) == (send.name, "emails", 5)
    job = await aqueue.get((await build.aenqueue({}, queue="reports", max_attempts=2)).id)
    assert job is not None and (job["task"], job["queue"], job["max_attempts"]) == ("reports.build", "reports", 2)
    job = await aqueue.get((await app.aenqueue("reports.build", {})).id)
    assert job is not None and job["task"] == "reports.build"
    ids = await send.aenqueue_many([{}, {}])
    assert [(await aqueue.get(i) or {}).get("task") for i in ids] == [send.name, send.name]
    by_name = await aqueue.get((await aqueue.enqueue("emails", {}, task="by.name")).id)
    assert by_name is not None and by_name["task"] == "by.name"


async def test_async_task_enqueue_in_the_callers_transaction(settings: Settings, aqueue: AsyncQueue, pg_dsn):
    _, send, _ = make_app(settings.schema)  # never connected
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        kept = (await send.aenqueue({}, conn=conn)).id
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        dropped = (await send.aenqueue({}, conn=conn)).id
        await conn.rollback()
    assert (await aqueue.get(kept) or {}).get("task") == send.name
    assert await aqueue.get(dropped) is None


# ---------------------------------------------------------------------------------------------- errors
BAD_OPTIONS = [
    ({"delay": -1}, "delay"),
    ({"delay": float("nan")}, "delay"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 1001}, "max_attempts"),
    ({"priority": 40_000}, "priority"),
    ({"priority": True}, "priority"),
    ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
    ({"idempotency_key": "k" * 9000}, "1..255 characters"),
    ({"queue": "bad queue"}, "queue name"),
    ({"retries": 3}, "unknown enqueue option"),
]


@pytest.mark.parametrize(("options", "fragment"), BAD_OPTIONS, ids=lambda v: str(v)[:30])
def test_bad_task_enqueue_arguments_raise_enqueue_error_and_write_nothing(tasks, queue: Queue, options, fragment):
    _, send, _ = tasks
    with pytest.raises(EnqueueError, match=fragment) as info:
        send.enqueue({}, **options)
    assert len(str(info.value)) < 300  # a 9,000-character key is not echoed back
    assert queue.stats() == []


@pytest.mark.parametrize(("options", "fragment"), BAD_OPTIONS, ids=lambda v: str(v)[:30])
async def test_bad_async_enqueue_arguments_raise_enqueue_error(atasks, aqueue: AsyncQueue, options, fragment):
    _, send, _ = atasks
    with pytest.raises(EnqueueError, match=fragment):
        await send.aenqueue({}, **options)
    assert await aqueue.stats() == []


@pytest.mark.parametrize(
    ("task", "fragment"), [("", "task name"), ("x" * 201, "1..200"), ("tab\there", "printable"), (7, "task name")]
)
def test_bad_task_names_by_name_raise_enqueue_error(queue: Queue, task, fragment):
    with pytest.raises(EnqueueError, match=fragment):
        queue.enqueue("q", {}, task=task)
    with pytest.raises(EnqueueError, match=fragment):
        queue.enqueue_many("q", [{}], task=task)


def test_unknown_task_by_name_and_task_option_on_a_task(tasks):
    app, send, _ = tasks
    with pytest.raises(EnqueueError, match=r"no task 'nope' in app .*tasks: "):
        app.enqueue("nope", {})
    with pytest.raises(EnqueueError, match="takes no task= option"):
        send.enqueue({}, task="other")  # type: ignore[call-arg]


def test_payload_errors_are_enqueue_errors_and_value_errors(tasks):
    _, send, _ = tasks
    with pytest.raises(PayloadError) as info:
        send.enqueue({"x": float("nan")})
    assert isinstance(info.value, EnqueueError) and isinstance(info.value, ValueError)


def test_task_and_queue_methods_have_sync_and_async_twins():
    for sync, asynchronous in (("enqueue", "aenqueue"), ("enqueue_many", "aenqueue_many")):
        assert inspect.iscoroutinefunction(getattr(Task, asynchronous))
        assert list(inspect.signature(getattr(Task, sync)).parameters) == list(
            inspect.signature(getattr(Task, asynchronous)).parameters
        )
