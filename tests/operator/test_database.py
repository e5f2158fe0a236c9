"""The operator's database side against a real PostgreSQL: pooling, migration, errors, the LISTEN hub."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from skiplock import AsyncQueue
from skiplock.migrate import acurrent_version, latest_version
from skiplock_operator.database import DatabaseProblem, Databases
from skiplock_operator.wakeup import Wakeups
from support.ci import missing
from support.pg import await_for

from .test_conditions import closed_port_dsn


async def test_pools_are_shared_per_dsn_and_schema_and_closed_with_their_last_user(
    pg_dsn: str, schema: str, aqueue: AsyncQueue
) -> None:
    dbs = Databases(timeout=2)
    try:
        await aqueue.enqueue_many("q", [{}, {}, {}])
        first = (await dbs.stats("a", pg_dsn, schema, ["q"], lease_seconds=60))["q"]
        assert (first.ready, first.processing) == (3, 0)
        await dbs.stats("b", pg_dsn, schema, ["q"], lease_seconds=60)
        assert len(dbs) == 1, "two JobQueues on one (DSN, schema) share one connection"
        empty = (await dbs.stats("b", pg_dsn, schema, ["other"], lease_seconds=60))["other"]
        assert empty.ready == 0 and empty.queue == "other"
        await dbs.release("a")
        assert len(dbs) == 1
        await dbs.release("b")
        assert len(dbs) == 0
    finally:
        await dbs.close()


async def test_a_namespace_with_no_jobqueue_left_keeps_no_threads_and_no_pinned_address(
    pg_dsn: str, schema: str
) -> None:
    """Each namespace got resolver and schedule threads, and each DSN its resolved addresses, for the operator's
    whole life: JobQueues come and go, so they piled up. Its last JobQueue's release lets them go."""
    import threading

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    if conninfo_to_dict(pg_dsn).get("host") not in ("127.0.0.1", "localhost"):
        missing("a TCP DSN on this machine (SKIPLOCK_TEST_DSN), to name its server by host name")
    by_name = make_conninfo(pg_dsn, host="localhost")  # a host name: the resolver pins its address

    def threads(prefix: str) -> int:
        return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))

    before = threads("skiplock-resolve"), threads("skiplock-schedule")
    dbs = Databases(timeout=2)
    try:
        for name in ("a", "b"):
            await dbs.fire_schedules(("gone", name), by_name, schema, ["q"], "skiplock_wake")
        assert dbs.pinned(by_name) != by_name, "the connect pinned the resolved address"
        assert threads("skiplock-resolve") > before[0] and threads("skiplock-schedule") > before[1]
        await dbs.release(("gone", "a"))
        assert dbs.pinned(by_name) != by_name, "the namespace's other JobQueue still uses the DSN"
        await dbs.release(("gone", "b"))
        assert dbs.pinned(by_name) == by_name
        await await_for(
            lambda: (threads("skiplock-resolve"), threads("skiplock-schedule")) == before,
            timeout=10,
            what="the namespace's threads to end",
        )
    finally:
        await dbs.close()


async def test_ensure_schema_migrates_once(pg_dsn: str, fresh_schema: str) -> None:
    dbs = Databases(timeout=2)
    try:
        assert await dbs.ensure_schema("a", pg_dsn, fresh_schema) is True
        assert await dbs.ensure_schema("a", pg_dsn, fresh_schema) is False
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            assert await acurrent_version(conn, fresh_schema) == latest_version()
    finally:
        await dbs.close()


async def test_unreachable_database_is_one_classified_error_and_no_connection() -> None:
    dbs = Databases(timeout=1)
    with pytest.raises(DatabaseProblem) as info:
        await dbs.stats("a", closed_port_dsn(), "skiplock", ["q"], lease_seconds=60)
    assert info.value.reason == "ConnectRefused"
    assert str(info.value) == "the database server refused the connection" and len(dbs) == 0
    await dbs.close()


async def test_listen_hub_shares_one_listener_per_dsn_and_channel(pg_dsn: str, schema: str, aqueue: AsyncQueue) -> None:
    """One LISTEN connection per (DSN, channel) (issue 37 item 7): JobQueues of one schema share it and wake
    together (each then polls its own queues); a JobQueue of another schema (another channel) is not woken."""
    hub = Wakeups()
    mine, same_schema, elsewhere = asyncio.Event(), asyncio.Event(), asyncio.Event()
    try:
        await hub.subscribe("a", pg_dsn, aqueue.settings.channel, ["mine"], mine)
        await hub.subscribe("b", pg_dsn, aqueue.settings.channel, ["other"], same_schema)
        await hub.subscribe("c", pg_dsn, aqueue.settings.channel + "_x", ["mine"], elsewhere)
        await await_for(lambda: all(hub.listening(u) for u in "abc"), what="LISTEN established")
        assert len(hub) == 2, "one listener per (DSN, channel)"
        for event in (mine, same_schema, elsewhere):
            event.clear()
        await aqueue.enqueue("mine", {"id": uuid.uuid4().hex})
        await asyncio.wait_for(mine.wait(), timeout=5)
        assert not elsewhere.is_set()
        await hub.unsubscribe("a")
        assert hub.listening("b"), "the shared listener stays while a subscriber remains"
        await hub.unsubscribe("b")
        await hub.unsubscribe("c")
        assert not hub.subscribed("a") and not hub.listening("b") and len(hub) == 0
    finally:
        await hub.close()
