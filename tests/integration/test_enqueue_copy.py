"""``enqueue_many`` without keys writes its jobs with COPY: the same rows, ids and NOTIFY as the INSERT it replaces."""

from __future__ import annotations

import select
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from skiplock import AsyncQueue, PayloadError, Queue, Settings
from skiplock.store.copy import COLUMN_DEFAULTS, COPY_CHUNK

TRICKY = [
    {"tab\there": "new\nline", "cr": "a\rb", "bs": "C:\\dir\\", "quote": '"', "nul_text": "\\u0000"},
    "\\N",
    "\\.",
    ["ü", "日本", "🙂", 1.5e-7, 10**18, None, True],
    None,
    0,
    "",
    {},
]


def _rows(pg_dsn: str, schema: str, ids: list[int]) -> list[dict[str, Any]]:
    with psycopg.connect(pg_dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(f'SELECT * FROM "{schema}".jobs WHERE id = ANY(%s) ORDER BY id', (ids,))
        return cur.fetchall()


def _notified(conn: psycopg.Connection, timeout: float) -> list[str]:
    select.select([conn.fileno()], [], [], timeout)
    return [n.payload for n in conn.notifies(timeout=0.3, stop_after=10)]


def test_ids_come_back_in_payload_order_and_every_payload_is_stored_as_given(queue: Queue, pg_dsn, schema):
    ids = queue.enqueue_many("q", TRICKY)
    assert len(ids) == len(TRICKY) and ids == sorted(ids) and len(set(ids)) == len(ids)
    rows = _rows(pg_dsn, schema, ids)
    assert [r["payload"] for r in rows] == TRICKY
    assert [r.id for r in ids.results] == ids and ids.duplicates == []
    for r in rows:
        assert (r["queue"], r["status"], r["task"], r["priority"], r["attempts"]) == ("q", "pending", None, 0, 0)
        assert (r["max_attempts"], r["serial_key"], r["serial_skip_on_retry"]) == (5, None, False)
        assert r["visible_at"] == r["created_at"] == r["updated_at"]  # due at the transaction's now()


def test_the_options_are_written_to_every_job(queue: Queue, pg_dsn, schema):
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    ids = queue.enqueue_many(
        "q",
        [{"a": 1}, {"b": 2}],
        task="t\\x.one",
        priority=-7,
        max_attempts=9,
        run_at=at,
        delay=timedelta(seconds=1.5),
        serial_key="k\tey\\\nwith\rescapes",
        serial_skip_on_retry=True,
    )
    for r in _rows(pg_dsn, schema, ids):
        assert (r["task"], r["priority"], r["max_attempts"]) == ("t\\x.one", -7, 9)
        assert r["visible_at"] == at + timedelta(seconds=1.5)
        assert (r["serial_key"], r["serial_skip_on_retry"]) == ("k\tey\\\nwith\rescapes", True)


@pytest.mark.parametrize(
    "options",
    [
        # by task name with every registered option given (else an INSERT reading the registry: test_enqueue_by_name)
        {"task": "t", "priority": 0, "max_attempts": 5, "serial_skip_on_retry": False},
        {"priority": 3},
        {"max_attempts": 6},
        {"serial_key": "k"},
        {"serial_key": "k", "serial_skip_on_retry": True},
        {"delay": 30},
    ],
)
def test_one_option_off_its_column_default_copies_every_column(queue: Queue, pg_dsn, schema, options):
    assert not queue._s.enqueue_many("q", [1], options).plain
    ids = queue.enqueue_many("q", [1, 2], **options)
    for r in _rows(pg_dsn, schema, ids):
        assert {k: r[k] for k in options if k != "delay"} == {k: v for k, v in options.items() if k != "delay"}
        assert (r["visible_at"] > r["created_at"]) == ("delay" in options)


def test_jobs_that_keep_every_column_default_are_copied_as_id_payload_and_queue(queue: Queue, settings, pg_dsn, schema):
    defaults = {"priority": 0, "max_attempts": 5, "task": None, "serial_key": None, "serial_skip_on_retry": False}
    assert queue._s.enqueue_many("q", [1], {}).plain and queue._s.enqueue_many("q", [1], defaults).plain
    # the settings' max_attempts is not the table's default: written in every row
    with Queue(settings=settings.replace(max_attempts=7), max_size=1) as q7:
        assert not q7._s.enqueue_many("q", [1], {}).plain
        ids = q7.enqueue_many("q", [1, 2])
    assert [r["max_attempts"] for r in _rows(pg_dsn, schema, ids)] == [7, 7]


def test_the_column_defaults_the_plain_copy_relies_on_are_the_tables(pg_dsn, schema):
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT column_name, column_default FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = 'jobs' AND column_name = ANY(%s)",
            (schema, list(COLUMN_DEFAULTS)),
        ).fetchall()
    expected = {k: None if v is None else str(v).lower() for k, v in COLUMN_DEFAULTS.items()}
    assert dict(rows) == expected  # e.g. max_attempts '5', serial_skip_on_retry 'false', task NULL


def test_a_delay_counts_from_the_transactions_now_and_a_delayed_batch_does_not_notify(queue: Queue, pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.settings.channel}"')
        ids = queue.enqueue_many("q", [{}, {}], delay=60)
        assert _notified(listener, 0.3) == []
        queue.enqueue_many("q", [{}], run_at=datetime.now(UTC) - timedelta(hours=1))  # due already: notifies
        assert _notified(listener, 2.0) == ["q"]
    for r in _rows(pg_dsn, schema, ids):
        assert r["visible_at"] == r["created_at"] + timedelta(seconds=60)


def test_in_the_callers_transaction_nothing_is_seen_or_notified_before_commit(queue: Queue, pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.settings.channel}"')
        with psycopg.connect(pg_dsn) as conn:
            ids = queue.enqueue_many("q", [{"n": i} for i in range(50)], conn=conn)
            assert _rows(pg_dsn, schema, ids) == []  # another session sees nothing yet
            assert _notified(listener, 0.2) == [], "notification before commit"
            conn.rollback()
        assert queue.stats() == []
        assert _notified(listener, 0.3) == [], "notification from a rolled-back transaction"
        with psycopg.connect(pg_dsn) as conn:
            first = queue.enqueue_many("q", [{"n": i} for i in range(3)], conn=conn)
            single = queue.enqueue("q", {"n": 3}, conn=conn).id
            second = queue.enqueue_many("q", [{"n": i} for i in range(4, 6)], conn=conn)
            conn.commit()
        assert _notified(listener, 2.0) == ["q"], "one notification per transaction and queue"
    every = [*first, single, *second]
    assert every == sorted(every)
    assert [r["payload"] for r in _rows(pg_dsn, schema, every)] == [{"n": i} for i in range(6)]


def test_on_an_autocommit_connection_the_batch_commits_as_one(queue: Queue, pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ids = queue.enqueue_many("q", [{"n": 1}, {"n": 2}], conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with conn.transaction():  # an open transaction block: the batch joins it, and rolls back with it
            more = queue.enqueue_many("q", [{"n": 3}], conn=conn)
            raise psycopg.Rollback()
    assert len(_rows(pg_dsn, schema, ids)) == 2 and _rows(pg_dsn, schema, more) == []


def test_a_pool_without_autocommit_commits_the_batch_when_the_call_returns(settings: Settings, pg_dsn, schema):
    with ConnectionPool(pg_dsn, min_size=1, max_size=1) as pool:
        q = Queue(pool=pool, settings=settings)
        ids = q.enqueue_many("q", [{"n": 1}, {"n": 2}])
        assert [r["payload"] for r in _rows(pg_dsn, schema, ids)] == [{"n": 1}, {"n": 2}]


def test_a_bad_payload_leaves_the_callers_transaction_usable(queue: Queue, pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        ok = queue.enqueue("q", {"first": True}, conn=conn).id
        with pytest.raises(PayloadError, match="NUL"):
            queue.enqueue_many("q", [{"fine": 1}, {"bad": "a\x00b"}, {"late": float("nan")}], conn=conn)
        with pytest.raises(PayloadError, match="not JSON-serialisable"):
            queue.enqueue_many("q", [{"bad": float("nan")}, {"late": "a\x00b"}], conn=conn)
        ids = queue.enqueue_many("q", [{"after": True}], conn=conn)
        conn.commit()
    assert queue.get(ok) is not None and queue.get(ids[0]) is not None
    assert queue.stats()[0].ready == 2


def test_a_batch_of_several_chunks_is_stored_in_order_and_a_bad_payload_in_a_late_chunk_writes_nothing(
    queue: Queue, pg_dsn, schema
):
    n = 3 * COPY_CHUNK + 7
    ids = queue.enqueue_many("q", [{"n": i} for i in range(n)])
    assert len(ids) == n and ids == sorted(ids)
    assert [r["payload"] for r in _rows(pg_dsn, schema, ids)] == [{"n": i} for i in range(n)]
    bad = [{"n": i} for i in range(n)]
    bad[2 * COPY_CHUNK + 3] = {"late": float("nan")}
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{queue.settings.channel}"')
        # In the call's own transaction the COPY has sent two chunks when the third fails: all rolled back.
        with pytest.raises(PayloadError, match="not JSON-serialisable"):
            queue.enqueue_many("q", bad)
        assert _notified(listener, 0.3) == [], "notification from a rolled-back batch"
        with psycopg.connect(pg_dsn) as conn:  # in the caller's, every payload is checked before anything is sent
            ok = queue.enqueue("q", {"first": True}, conn=conn).id
            with pytest.raises(PayloadError, match="not JSON-serialisable"):
                queue.enqueue_many("q", bad, conn=conn)
            conn.commit()
        assert _notified(listener, 2.0) == ["q"]
    assert queue.get(ok) is not None
    assert queue.stats()[0].ready == n + 1
    assert len(queue.enqueue_many("q", [{"after": True}])) == 1  # the pool's connection came back usable


def test_keys_that_are_all_none_take_the_copy_and_report_each_payload(queue: Queue):
    ids = queue.enqueue_many("q", [{}, {}], idempotency_keys=[None, None])
    assert len(ids) == 2 and [r.id for r in ids.results] == ids and not any(r.duplicate for r in ids.results)


def test_an_empty_batch_writes_nothing(queue: Queue):
    assert queue.enqueue_many("q", []) == []
    assert queue.stats() == []


async def test_the_async_twin_copies_in_order_and_rolls_back_with_the_caller(aqueue: AsyncQueue, pg_dsn, schema):
    ids = await aqueue.enqueue_many("q", TRICKY, priority=3, delay=5)
    rows = _rows(pg_dsn, schema, ids)
    assert ids == sorted(ids) and [r["payload"] for r in rows] == TRICKY
    assert all(r["priority"] == 3 and r["visible_at"] == r["created_at"] + timedelta(seconds=5) for r in rows)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        gone = await aqueue.enqueue_many("q", [{}, {}], conn=conn)
        await conn.rollback()
    assert _rows(pg_dsn, schema, gone) == []
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        kept = await aqueue.enqueue_many("q", [{"k": 1}], conn=conn)
    assert [r["payload"] for r in _rows(pg_dsn, schema, kept)] == [{"k": 1}]


async def test_the_async_twin_writes_nothing_when_a_late_chunk_holds_a_bad_payload(aqueue: AsyncQueue, pg_dsn, schema):
    bad: list[Any] = [{"n": i} for i in range(2 * COPY_CHUNK)]
    bad[-1] = "nul \x00 char"
    with pytest.raises(PayloadError, match="NUL"):
        await aqueue.enqueue_many("q", bad)
    assert await aqueue.stats() == []
    ids = await aqueue.enqueue_many("q", bad[:-1])
    assert [r["payload"] for r in _rows(pg_dsn, schema, ids)] == bad[:-1]
