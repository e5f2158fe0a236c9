"""The control channel (cancel, pause, drain): a random name per schema that only the schema's roles can read, and
notifications folded in the worker, so a flood of them costs a few rechecks (issue 37, item 6)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from skiplock import AsyncQueue, Queue, Settings
from skiplock.app import App
from skiplock.grant import apply_grants
from skiplock.migrate import migrate
from skiplock.store.run import execute
from skiplock.store.statements import Statements
from skiplock.worker import Worker
from skiplock.worker.wakeup import CONTROL_FOLD_SECONDS
from support.pg import await_for, drop_schema, wait_for
from support.roles import login_roles


def channel_of(dsn: str, settings: Settings) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return execute(conn, Statements(settings).control_channel())


def test_the_control_channel_is_random_per_schema_and_only_the_schemas_roles_read_it(pg_dsn, schema, settings):
    """Any role may LISTEN or NOTIFY on any channel: the name (it was ``<schema>_control``) is the secret."""
    other = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, other)
    try:
        mine, theirs = channel_of(pg_dsn, settings), channel_of(pg_dsn, settings.replace(schema=other))
    finally:
        drop_schema(pg_dsn, other)
    assert mine != theirs and schema not in mine and mine != f"{schema}_control"
    assert mine.startswith("skiplock_control_") and len(mine) == len("skiplock_control_") + 32
    outsider_schema = f"t_{uuid.uuid4().hex[:12]}"  # another tenant: its roles hold grants on its own schema only
    with login_roles(pg_dsn, schema) as roles, login_roles(pg_dsn, outsider_schema) as outsider:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            apply_grants(conn, schema, producer=roles.producer, worker=roles.worker, operator=roles.operator)
        assert channel_of(roles.dsn(pg_dsn, roles.worker), settings) == mine, "the worker role reads it (LISTEN)"
        for role in (outsider.producer, outsider.worker, outsider.operator):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                channel_of(outsider.dsn(pg_dsn, role), settings)


def test_cancel_pause_and_drain_notify_on_the_schemas_channel(queue: Queue, pg_dsn, schema, settings):
    channel = channel_of(pg_dsn, settings)
    job = queue.enqueue("q", {}).id
    [claimed] = queue.claim("q", limit=1, worker="w")
    assert claimed.id == job
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        queue.pause("q")
        assert queue.cancel(ids=[job]) == [job]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the operator's drain request
            execute(conn, Statements(settings).drain_set(["pod-1"], True))
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=3)]
    assert heard == ["pause", "cancel", "pause"]


def test_a_schema_migrated_before_the_random_channel_gets_one(pg_dsn, schema, settings):
    """An upgrade: the migration draws the name for a schema that has none, and leaves an existing one alone."""
    before = channel_of(pg_dsn, settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, schema)
        assert channel_of(pg_dsn, settings) == before, "migrating again keeps the name"
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "control_channel")))
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE name LIKE '%%control_channel'").format(
                sql.Identifier(schema, "schema_migrations")
            )
        )
        report = migrate(conn, schema)
    assert [m.split("_", 1)[1] for m in report.applied] == ["control_channel"]
    after = channel_of(pg_dsn, settings)
    assert after.startswith("skiplock_control_") and after != before


def scans_of(dsn: str, schema: str, table: str) -> int:
    """Scans of one table of ``schema`` (sequential and index), from the server's statistics."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = %s",
            (schema, table),
        ).fetchone()
    return int(row[0]) if row else 0


def sessions_of(dsn: str, role: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)).fetchone()
    return int(row[0]) if row else 0


def flood(dsn: str, channel: str, count: int) -> float:
    """``count`` control notifications, each in its own transaction (PostgreSQL folds equal ones within one)."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(count):
            conn.execute("SELECT pg_notify(%s, %s)", (channel, ("cancel", "pause")[i % 2]))
    return time.monotonic() - started


async def test_a_flood_of_control_notifications_costs_a_few_rechecks_and_cancel_and_pause_still_work(
    pg_dsn, schema, settings
):
    """Before: each notification read made the worker look again (its paused queues and drain request, its held
    jobs), so 3,000 NOTIFYs from anyone who knew the channel cost it thousands of queries. Now they are folded:
    at most one look per CONTROL_FOLD_SECONDS, plus the periodic one. Counted on the server: the scans of the
    drains table, which the worker reads once per look at its controls and never otherwise. The worker runs under
    the worker role that ``skiplock grant`` sets up, so its listener reads the channel's name with that role's
    rights (and its look at the drain requests too: the role could not read them before)."""
    app = App()
    started, stopped = threading.Event(), threading.Event()

    @app.task(name="blocks", queue="q")
    async def blocks(job: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            stopped.set()
            raise

    channel = channel_of(pg_dsn, settings)
    with login_roles(pg_dsn, schema) as roles:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            apply_grants(conn, schema, producer=roles.producer, worker=roles.worker, operator=roles.operator)
        # the heartbeat (which also finds cancels) is far off: a cancel seen soon was seen through the channel
        s = settings.replace(
            dsn=roles.dsn(pg_dsn, roles.worker), poll_seconds=0.2, lease_seconds=120, heartbeat_seconds=50
        )
        async with await AsyncQueue.open(settings=settings) as aq:
            worker = Worker(app, settings=s)
            begun = time.monotonic()
            async with worker:
                job = await insert_task(aq, "q", "blocks")
                await await_for(started.is_set, timeout=20, what="the handler started")
                took = await asyncio.wait_for(asyncio.to_thread(flood, pg_dsn, channel, 3000), timeout=120)
                await aq.pause("q")
                await await_for(
                    lambda: worker.registry.get_sample_value("skiplock_worker_queue_paused", {"queue": "q"}) == 1,
                    timeout=5,
                    what="the pause seen after the flood",
                )
                assert await aq.cancel(ids=[job]) == [job]
                await await_for(stopped.is_set, timeout=10, what="the running job cancelled after the flood")
            elapsed = time.monotonic() - begun
        wait_for(lambda: sessions_of(pg_dsn, roles.worker) == 0, timeout=20, what="the worker's sessions gone")
        looks = scans_of(pg_dsn, schema, "drains")  # a session's statistics are flushed when it ends
    bound = elapsed / CONTROL_FOLD_SECONDS + elapsed / 1.0 + 4  # folded looks, periodic looks (every 1 s), start
    assert 1 <= looks <= bound, f"{looks} looks at the controls in {elapsed:.1f} s ({took:.1f} s of 3,000 NOTIFYs)"


async def insert_task(aq: AsyncQueue, queue: str, task: str) -> int:
    async with aq.pool.connection() as conn:
        cur = await conn.execute(
            sql.SQL("INSERT INTO {} (queue, payload, task) VALUES (%s, '{{}}', %s) RETURNING id").format(
                sql.Identifier(aq.settings.schema, "jobs")
            ),
            (queue, task),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_worker_role_that_cannot_read_the_name_still_listens_for_wake_ups(
    pg_dsn, schema, settings, caplog: pytest.LogCaptureFixture
):
    """An upgrade that migrated but did not re-run ``skiplock grant``: the worker says so once, and its listener
    still takes wake-ups (before, it failed on every connection and the worker only polled)."""
    with login_roles(pg_dsn, schema) as roles:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            apply_grants(conn, schema, worker=roles.worker)
            conn.execute(
                sql.SQL("REVOKE SELECT ON {} FROM {}").format(
                    sql.Identifier(schema, "control_channel"), sql.Identifier(roles.worker)
                )
            )
        ran: list[int] = []
        s = settings.replace(dsn=roles.dsn(pg_dsn, roles.worker), poll_seconds=30, lease_seconds=60)
        worker = Worker(settings=s, handler=lambda job: ran.append(job.id))
        async with worker, await AsyncQueue.open(settings=settings) as aq:
            await await_for(lambda: worker.listener is not None and worker.listener.connected, timeout=15,
                            what="the listener connected")  # fmt: skip
            job = (await aq.enqueue("default", {})).id
            await await_for(lambda: ran == [job], timeout=10, what="the job woken by NOTIFY (the poll is 30 s)")
    warnings = [r for r in caplog.records if getattr(r, "action", None) == "control_channel_unreadable"]
    assert len(warnings) == 1 and "skiplock grant" in warnings[0].getMessage()
