"""Periodic tasks against a real PostgreSQL: registration by a worker and by `skiplock schedules sync`, the
compare-and-set of a tick, catch-up after downtime (the last missed tick only), stale and removed schedules,
and the schedules command."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from skiplock import App, Settings
from skiplock.cli import main
from skiplock.schedule import STALE_SECONDS
from skiplock.store.schedules import fire_due, register_sync
from skiplock.store.statements import Statements
from skiplock.worker import Worker
from support.pg import await_for


def tick_jobs(dsn: str, schema: str, task: str = "periodic.tick") -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT id, payload->>'scheduled_at' FROM \"{schema}\".jobs WHERE task = %s ORDER BY id", (task,)
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def db(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def periodic_app(schema: str, **timing: Any) -> App:
    app = App("periodic", schema=schema)

    @app.task(name="periodic.tick", queue="ticks", **(timing or {"every": 1}))
    async def tick(job: object) -> None:
        return None

    return app


def test_the_compare_and_set_fires_a_tick_once(settings: Settings, pg_dsn: str, schema: str, queue: Any) -> None:
    app = periodic_app(schema, every=3600)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register_sync(conn, Statements(settings), app.schedules)
        conn.execute(f"UPDATE \"{schema}\".schedules SET next_run_at = now() - interval '1 second'")
        [(due,)] = conn.execute(f'SELECT next_run_at FROM "{schema}".schedules').fetchall()
    params = {
        "name": "periodic.tick",
        "expected": due,
        "tick": due,
        "following": due + timedelta(hours=1),
        "payload": "{}",
        "unique_key": "schedule:periodic.tick@x",
        "unique_states": ["pending", "processing", "done", "failed", "cancelled"],
        "channel": settings.channel,
    }
    first = db(pg_dsn, Statements(settings).q.schedule_fire, params)
    second = db(pg_dsn, Statements(settings).q.schedule_fire, params)  # a firer that read the same row: CAS fails
    assert first[0][0] == 1 and first[0][1] is not None
    assert second[0][:2] == (0, None)
    # The unique key is the second guard: a firer whose compare-and-set passes again inserts nothing twice.
    db(pg_dsn, f'UPDATE "{schema}".schedules SET next_run_at = %s', (due,))
    third = db(pg_dsn, Statements(settings).q.schedule_fire, params)
    assert third[0][0] == 1 and third[0][1] is None
    assert len(tick_jobs(pg_dsn, schema)) == 1


async def test_a_worker_registers_and_fires_every_tick(settings: Settings, pg_dsn: str, schema: str) -> None:
    app = periodic_app(schema)
    registry = CollectorRegistry()
    labels = {"task": "periodic.tick", "result": "enqueued"}

    def enqueued() -> float:
        return registry.get_sample_value("skiplock_schedule_ticks_total", labels) or 0.0

    async with Worker(app, settings=settings.replace(concurrency=2), registry=registry):
        await await_for(lambda: enqueued() >= 3, timeout=15, what="three ticks")
    jobs = tick_jobs(pg_dsn, schema)
    ticks = [t for _, t in jobs]
    assert len(set(ticks)) == len(ticks) >= 3
    [(name, app_name, every)] = db(pg_dsn, f'SELECT name, app, every_seconds FROM "{schema}".schedules')
    assert (name, app_name, every) == ("periodic.tick", "periodic", 1.0)
    assert 3 <= enqueued() <= len(jobs)  # a tick fired as the worker stopped may go uncounted


async def test_after_downtime_only_the_last_missed_tick_runs(settings: Settings, pg_dsn: str, schema: str) -> None:
    app = periodic_app(schema)
    async with Worker(app, settings=settings):
        await await_for(lambda: len(tick_jobs(pg_dsn, schema)) >= 1, timeout=15, what="a first tick")
    before = tick_jobs(pg_dsn, schema)
    [(stopped,)] = db(pg_dsn, "SELECT now()")
    await await_for(
        lambda: db(pg_dsn, "SELECT now() > %s + interval '4.5 seconds'", (stopped,))[0][0],
        timeout=10,
        what="four ticks missed",
    )
    registry = CollectorRegistry()

    def skipped() -> float:
        labels = {"task": "periodic.tick", "result": "skipped"}
        return registry.get_sample_value("skiplock_schedule_ticks_total", labels) or 0.0

    async with Worker(app, settings=settings, registry=registry):
        await await_for(lambda: len(tick_jobs(pg_dsn, schema)) > len(before), timeout=15, what="the catch-up")
        await await_for(skipped, timeout=5, what="the missed ticks counted")
    after = tick_jobs(pg_dsn, schema)
    last_before = max(t for _, t in before)
    first_after = min(t for _, t in after if t > last_before)
    [(gap,)] = db(pg_dsn, "SELECT extract(epoch FROM %s::timestamptz - %s::timestamptz)", (first_after, last_before))
    assert gap >= 4, f"the first tick after the restart ({first_after}) should be the last missed one"
    assert skipped() >= gap - 1  # the ticks between the last one before and the first one after


async def test_stale_schedules_are_not_fired_and_come_back_from_the_next_tick(
    settings: Settings, pg_dsn: str, schema: str, queue: Any
) -> None:
    app = periodic_app(schema, every=3600)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register_sync(conn, Statements(settings), app.schedules)
        conn.execute(
            f'UPDATE "{schema}".schedules SET seen_at = now() - make_interval(secs => %s), '
            "next_run_at = now() - interval '1 hour'",
            (STALE_SECONDS + 60,),
        )
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
        fired, next_due = await fire_due(aconn, Statements(settings))
    assert fired == [] and next_due is None and tick_jobs(pg_dsn, schema) == []
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register_sync(conn, Statements(settings), app.schedules)  # registered again: from the next tick
        [(fresh,)] = conn.execute(
            f"SELECT next_run_at > now() - interval '1 minute' FROM \"{schema}\".schedules"
        ).fetchall()
    assert fresh, "a stale schedule registered again starts from its next tick, not from an hour ago"


def test_schedules_command_syncs_lists_prunes_and_removes(
    pg_dsn: str, schema: str, queue: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--dsn", pg_dsn, "--schema", schema]
    db(pg_dsn, f'INSERT INTO "{schema}".schedules (name, app, queue, task, every_seconds, next_run_at, period_seconds) '
       "VALUES ('periodic.gone', 'periodic', 'ticks', 'periodic.gone', 60, now(), 60)")  # fmt: skip
    assert main(["schedules", "sync", "--app", "support.periodic_app:app", *base]) == 0
    assert "registered 1 schedule(s) of app 'periodic'" in capsys.readouterr().out
    assert main(["schedules", *base]) == 0
    listing = capsys.readouterr().out
    assert "periodic.tick" in listing and "every 1s" in listing and "periodic.gone" in listing
    assert main(["schedules", "sync", "--app", "support.periodic_app:app", "--prune", *base]) == 0
    assert "removed 1 schedule(s) no longer defined\n  periodic.gone" in capsys.readouterr().out
    assert main(["schedules", "remove", "periodic.tick", "nope", *base]) == 1
    assert capsys.readouterr().out.splitlines() == ["periodic.tick: removed", "nope: no such schedule"]
    assert db(pg_dsn, f'SELECT count(*) FROM "{schema}".schedules') == [(0,)]
    assert main(["schedules", "sync", *base]) == 2  # no --app


def test_enqueue_command_unique_flags(pg_dsn: str, schema: str, queue: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--dsn", pg_dsn, "--schema", schema]
    args = [
        "enqueue",
        "--task",
        "mail",
        "--payload",
        '{"to": "a", "n": 1}',
        "--unique-by",
        "to",
        "--queue",
        "mail",
        *base,
    ]
    assert main(args) == 0  # an unregistered task needs its queue (--queue)
    first = capsys.readouterr().out.strip()
    args[4] = '{"to": "a", "n": 2}'
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == f"{first} (duplicate: a job with this key exists)"
    assert main(["enqueue", "--payload", "{}", "--unique-for", "1h", *base]) == 2  # needs --task
    assert (
        main(
            [
                "enqueue",
                "--task",
                "t",
                "--payload",
                "{}",
                "--unique-key",
                "k",
                "--unique-states",
                "done",
                "--queue",
                "q",
                *base,
            ]
        )
        == 2
    )
    [stats] = queue.stats()
    assert stats.ready == 1


async def test_a_row_that_cannot_be_fired_does_not_block_the_others(
    settings: Settings, pg_dsn: str, schema: str, queue: Any
) -> None:
    app = periodic_app(schema, every=3600)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register_sync(conn, Statements(settings), app.schedules)
        conn.execute(
            f'INSERT INTO "{schema}".schedules (name, app, queue, task, cron, timezone, next_run_at, period_seconds) '
            "VALUES ('broken', 'periodic', 'ticks', 'broken', '* * * * *', 'Not/AZone', now(), 60)"
        )
        conn.execute(f"UPDATE \"{schema}\".schedules SET next_run_at = now() - interval '1 second'")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
        fired, _ = await fire_due(aconn, Statements(settings))
    assert [f.name for f in fired] == ["periodic.tick"]
    assert len(tick_jobs(pg_dsn, schema)) == 1


SCHEDULE_COLUMNS = "name, app, queue, task, cron, every_seconds, timezone, max_attempts, next_run_at, period_seconds"
GOOD = {
    "name": "'s'", "app": "'a'", "queue": "'q'", "task": "'t'", "cron": "NULL", "every_seconds": "60",
    "timezone": "'UTC'", "max_attempts": "5", "next_run_at": "now()", "period_seconds": "60",
}  # fmt: skip


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("every_seconds", "'NaN'"),
        ("every_seconds", "'Infinity'"),
        ("every_seconds", "1e300"),
        ("every_seconds", "0.0001"),
        ("period_seconds", "'NaN'"),
        ("period_seconds", "'Infinity'"),
        ("next_run_at", "'infinity'"),
        ("next_run_at", "'-infinity'"),
        ("next_run_at", "'0044-03-15 BC'"),
        ("max_attempts", "0"),
        ("max_attempts", "1001"),
        ("timezone", "repeat('z', 65)"),
        ("cron", "repeat('*', 201)"),
        ("name", "''"),
        ("app", "repeat('a', 201)"),
    ],
)
def test_the_schedules_table_refuses_what_a_firer_cannot_compute_with(pg_dsn: str, schema: str, column, value) -> None:
    """Issue 37, item 3: a worker role writes schedule rows that every firer reads (the operator too). A value no
    firer can compute with is refused by the table, as the client refuses it."""
    values = {**GOOD, column: value}
    statement = f'INSERT INTO "{schema}".schedules ({SCHEDULE_COLUMNS}) VALUES ({", ".join(values.values())})'
    with pytest.raises(psycopg.errors.CheckViolation):
        db(pg_dsn, statement)
    db(pg_dsn, f'INSERT INTO "{schema}".schedules ({SCHEDULE_COLUMNS}) VALUES ({", ".join(GOOD.values())})')


async def test_a_row_that_cannot_be_fired_is_parked_and_the_others_fire(
    settings: Settings, pg_dsn: str, schema: str
) -> None:
    """Issue 37 (low): one bad schedule row stopped all firing (the round failed on it, every round). It is parked,
    saying why, the others fire, and its app's next registration unparks it."""
    app = periodic_app(schema, every=3600)
    s = Statements(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register_sync(conn, s, app.schedules)
        # rows stored before the bounds of 0019 (a dropped check stands for them): a tick time out of range
        conn.execute(f'ALTER TABLE "{schema}".schedules DROP CONSTRAINT schedules_every_bound_check')
        conn.execute(
            f'INSERT INTO "{schema}".schedules ({SCHEDULE_COLUMNS}) VALUES '
            "('huge', 'other', 'ticks', 'huge', NULL, 1e300, 'UTC', 5, now(), 60), "
            "('nowhere', 'other', 'ticks', 'nowhere', '* * * * *', NULL, 'Not/AZone', 5, now(), 60)"
        )
        conn.execute(f"UPDATE \"{schema}\".schedules SET next_run_at = now() - interval '1 second'")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
        fired, _ = await fire_due(aconn, s)
        assert [f.name for f in fired] == ["periodic.tick"]
        again, next_due = await fire_due(aconn, s)
        assert again == [] and next_due is not None and next_due > 60, "parked rows are not due any more"
    assert len(tick_jobs(pg_dsn, schema)) == 1
    parked = dict(db(pg_dsn, f'SELECT name, parked FROM "{schema}".schedules WHERE parked IS NOT NULL'))
    assert set(parked) == {"huge", "nowhere"}
    assert "every must be a number" in parked["huge"] and "Not/AZone" in parked["nowhere"]
    listed = main(["schedules", "--dsn", pg_dsn, "--schema", schema])
    assert listed == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE \"{schema}\".schedules SET parked = 'by hand' WHERE name = 'periodic.tick'")
        register_sync(conn, s, app.schedules)  # its app registers it again: unparked (the others are not its)
    assert {r[0] for r in db(pg_dsn, f'SELECT name FROM "{schema}".schedules WHERE parked IS NULL')} == {
        "periodic.tick"
    }
