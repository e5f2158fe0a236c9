"""The listener's reconnection, against a real PostgreSQL: its backend terminated, its role refused for a while."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from skiplock import AsyncQueue, Settings
from skiplock.grant import apply_grants
from skiplock.listener import Listener
from skiplock.worker import Worker
from support.pg import await_for
from support.roles import login_roles


@pytest.fixture
def role_dsn(pg_dsn: str) -> Iterator[tuple[str, str]]:
    """A login role of its own (so the test can refuse its connections without touching anyone else's), and its DSN."""
    role = f"listen_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(role)))
    params = conninfo_to_dict(pg_dsn)
    params.update(user=role, password=role)
    yield role, make_conninfo(**params)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def terminate(dsn: str, role: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = %s", (role,)
        ).fetchone()
    return int(row[0]) if row else 0


def notify(dsn: str, channel: str, payload: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def test_the_listener_comes_back_within_a_second_of_the_database_after_a_long_refusal(
    pg_dsn: str, role_dsn: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the pause between attempts doubled up to 30 s (0.5, 1, 2, 4, 8 s...), so after a few seconds of
    refused connections the listener came back seconds after the database did (pick-up stayed slow long after the
    outage). Each pause it announces is at most a second now, and it is back within one pause of the database."""
    caplog.set_level(logging.WARNING, logger="skiplock.listener")
    role, dsn = role_dsn
    channel = f"c_{uuid.uuid4().hex[:10]}"
    woken: list[int] = []
    states: list[bool] = []
    listener = Listener(dsn, channel, "q", lambda: woken.append(1), on_state=states.append)
    task = asyncio.create_task(listener.run())
    try:
        await await_for(lambda: listener.connected, timeout=10, what="the listener's first connection")
        for _ in range(3):  # dropped several times in a row: it comes back each time
            up = states.count(True)
            assert await asyncio.to_thread(terminate, pg_dsn, role) >= 1
            await await_for(lambda up=up: states.count(True) > up, timeout=5, what="back after a terminate")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
        await asyncio.to_thread(terminate, pg_dsn, role)
        await await_for(lambda: not listener.connected, timeout=5, what="the listener down")
        await asyncio.sleep(8.0)  # refused for a while: several failed attempts in a row
        assert not listener.connected
        announced = (re.search(r"reconnecting in ([0-9.]+)s", r.getMessage()) for r in caplog.records)
        pauses = [float(m[1]) for m in announced if m]
        assert len(pauses) >= 8 and max(pauses) <= 1.0, pauses
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))
        # one reconnect pause (at most 1 s) plus a connection and the self-probe's round trip
        await await_for(lambda: listener.connected, timeout=2.5, what="the listener back soon after the database")
        before = len(woken)
        await asyncio.to_thread(notify, pg_dsn, channel, "q")
        await await_for(lambda: len(woken) > before, timeout=5, what="a NOTIFY waking the listener")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task



async def test_a_probe_that_succeeded_before_is_repeated_a_second_later_not_a_minute(
    pg_dsn: str, role_dsn: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that gets no answer once the listener has proven itself (a server still recovering from a restart)
    is no PgBouncer in transaction mode: before, it was retried a minute later, polling only meanwhile."""
    role, dsn = role_dsn
    answers = iter([True, False])  # the first probe is answered, the one after a reconnect is not; then real ones
    real = Listener._probe

    async def probe(self: Listener, conn: psycopg.AsyncConnection[object]) -> bool:
        answer = next(answers, None)
        return answer if answer is not None else await real(self, conn)

    monkeypatch.setattr(Listener, "_probe", probe)
    states: list[bool] = []
    listener = Listener(dsn, f"c_{uuid.uuid4().hex[:10]}", "q", lambda: None, on_state=states.append)
    task = asyncio.create_task(listener.run())
    try:
        await await_for(lambda: listener.connected, timeout=10, what="the listener's first connection")
        assert await asyncio.to_thread(terminate, pg_dsn, role) >= 1
        await await_for(lambda: states.count(True) == 2, timeout=8, what="the listener back after a missed probe")
        assert not listener.unsupported
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_pick_up_resumes_within_the_poll_of_the_listener_being_back_after_refused_connections(
    pg_dsn: str, schema: str, settings: Settings
) -> None:
    """Issue 42: pick-up within poll + 1 s of the listener being back. Before: while the database refused
    connections, the control pool gave up each connection attempt at once (psycopg_pool, reconnect_timeout=0) and
    tried again only at the next checkout, so the claim already waiting for a connection waited its whole 10 s
    after the database was back. Now the listener's return makes the pool connect at once."""
    with login_roles(pg_dsn, schema) as roles:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            apply_grants(conn, schema, worker=roles.worker)
        ran: list[int] = []
        s = settings.replace(dsn=roles.dsn(pg_dsn, roles.worker), poll_seconds=1.0, lease_seconds=30)
        worker = Worker(settings=s, handler=lambda job: ran.append(job.id))
        async with worker, await AsyncQueue.open(settings=settings) as aq:
            listening = worker.listener
            assert listening is not None
            await await_for(lambda: listening.connected, timeout=15, what="the listener connected")
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(roles.worker)))
            await asyncio.to_thread(terminate, pg_dsn, roles.worker)
            await await_for(lambda: not listening.connected, timeout=5, what="the listener down")
            await asyncio.sleep(3.0)  # claims fail, then wait for a connection the pool gave up making
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(roles.worker)))
            await await_for(lambda: listening.connected, timeout=5, what="the listener back")
            back = time.monotonic()
            job = (await aq.enqueue("default", {})).id
            await await_for(lambda: job in ran, timeout=20, what="the job run")
            took = time.monotonic() - back
    assert took <= s.poll_seconds + 1.0, f"picked up {took:.1f} s after the listener was back"


async def test_the_listener_wakes_for_its_queues_and_controls_only_and_again_after_its_backend_is_killed(
    pg_dsn: str, role_dsn: tuple[str, str]
) -> None:
    """Notifications are read off the socket by a reader callback: each one for a queue served wakes once, one for
    another queue does not, a control word on the extra channel calls its callback, and a terminated backend is
    noticed (the callback's read fails), reconnected and listened on again."""
    role, dsn = role_dsn
    channel, control = f"c_{uuid.uuid4().hex[:10]}", f"k_{uuid.uuid4().hex[:10]}"
    wakes: list[float] = []
    controls: list[str] = []
    states: list[bool] = []

    async def also(conn: psycopg.AsyncConnection[object]) -> dict:
        return {control: (("cancel",), lambda: controls.append("cancel"))}

    listener = Listener(dsn, channel, ["a", "b"], lambda: wakes.append(time.monotonic()), states.append, also=also)
    task = asyncio.create_task(listener.run())
    try:
        await await_for(lambda: listener.connected, timeout=10, what="the listener connected")
        await await_for(lambda: len(wakes) == 1, timeout=5, what="the wake on connecting")
        for payload in ("a", "other", "b"):
            await asyncio.to_thread(notify, pg_dsn, channel, payload)
        await asyncio.to_thread(notify, pg_dsn, control, "cancel")
        await asyncio.to_thread(notify, pg_dsn, control, "not-a-word")
        await await_for(lambda: len(wakes) == 3 and controls == ["cancel"], timeout=5, what="two wakes, one control")
        assert await asyncio.to_thread(terminate, pg_dsn, role) >= 1
        await await_for(lambda: states == [True, False, True], timeout=10, what="the killed backend noticed, back")
        await await_for(lambda: len(wakes) == 4, timeout=5, what="the wake on connecting again")
        await asyncio.to_thread(notify, pg_dsn, channel, "a")
        await await_for(lambda: len(wakes) == 5, timeout=5, what="a wake after the reconnect")
        await asyncio.sleep(0.2)
        assert (len(wakes), controls) == (5, ["cancel"])
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
