"""Unique jobs and the per-payload results of enqueue_many, against a real PostgreSQL: keys by payload or by
payload keys, periods, state sets, skip and replace on conflict, concurrent producers, and the batch mapping."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from skiplock import App, ConfigError, EnqueueError, EnqueueManyResult, Queue, Settings
from skiplock.metrics import ENQUEUE_DUPLICATES
from skiplock.store.statements import Failure
from skiplock.unique import unique_key


@pytest.fixture
def app(settings: Settings, queue: Queue) -> Iterator[App]:
    a = App(schema=settings.schema)
    a.connect(settings=settings)
    try:
        yield a
    finally:
        a.close()


def statuses(queue: Queue, task: str) -> list[tuple[int, str, dict[str, object]]]:
    with queue.pool.connection() as conn:
        rows = conn.execute(
            f'SELECT id, status, payload FROM "{queue.settings.schema}".jobs WHERE task = %s ORDER BY id', (task,)
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def finish(queue: Queue, worker: str = "w1") -> None:
    jobs = queue.claim("default", limit=100, worker=worker)
    queue.complete(jobs, worker=worker)


def test_unique_by_payload_keys_skips_a_live_duplicate_and_frees_the_key_when_done(app: App, queue: Queue) -> None:
    @app.task(name="sync.user", unique_by=["user"])
    def sync_user(job: object) -> None: ...

    first = sync_user.enqueue({"user": 1, "note": "a"})
    again = sync_user.enqueue({"user": 1, "note": "b"})  # other keys do not matter
    other = sync_user.enqueue({"user": 2})
    assert not first.duplicate and again.duplicate and again.id == first.id
    assert not other.duplicate and other.id != first.id
    finish(queue)  # done: pending/processing (the default) no longer hold the key
    after = sync_user.enqueue({"user": 1})
    assert not after.duplicate and after.id not in (first.id, other.id)
    assert [s for _, s, _ in statuses(queue, "sync.user")] == ["done", "done", "pending"]


def test_unique_for_holds_the_key_through_done_within_the_period(app: App, queue: Queue) -> None:
    @app.task(name="digest", unique_for=3600)  # unique by the task alone, one per hour, done included
    def digest(job: object) -> None: ...

    first = digest.enqueue({})
    finish(queue)
    assert digest.enqueue({"other": "payload"}).id == first.id
    # The next period is a new key (periods are aligned to the epoch).
    now = datetime.now(UTC).timestamp()
    assert unique_key("digest", {}, unique_by=None, unique_for=3600, now=now) != unique_key(
        "digest", {}, unique_by=None, unique_for=3600, now=now + 3600
    )


def test_replace_updates_a_pending_holder_but_not_a_running_one(app: App, queue: Queue) -> None:
    @app.task(name="reindex", unique_by=["doc"], unique_conflict="replace")
    def reindex(job: object) -> None: ...

    first = reindex.enqueue({"doc": 7, "version": 1})
    later = datetime.now(UTC) + timedelta(hours=1)
    second = reindex.enqueue({"doc": 7, "version": 2}, run_at=later)
    assert second.duplicate and second.id == first.id
    [(_, status, payload)] = statuses(queue, "reindex")
    assert status == "pending" and payload == {"doc": 7, "version": 2}
    assert queue.get(first.id)["visible_at"] >= later - timedelta(seconds=1)  # type: ignore[index]
    reindex.enqueue({"doc": 7, "version": 3})  # run now again
    [job] = queue.claim("default", limit=10, worker="w1")
    third = reindex.enqueue({"doc": 7, "version": 4})  # processing: left alone, reported as the duplicate
    assert third.duplicate and third.id == job.id
    [(_, status, payload)] = statuses(queue, "reindex")
    assert status == "processing" and payload == {"doc": 7, "version": 3}


def test_concurrent_producers_insert_one_job(app: App, queue: Queue, settings: Settings) -> None:
    @app.task(name="once", unique_by="payload")
    def once(job: object) -> None: ...

    barrier = threading.Barrier(8)
    results: list[tuple[int, bool]] = []
    lock = threading.Lock()

    def produce() -> None:
        with Queue(settings=settings, max_size=1) as own:
            barrier.wait()
            for i in range(20):
                r = own.enqueue("default", {"n": i}, task="once", **once.unique_options([{"n": i}]))
                with lock:
                    results.append((r.id, r.duplicate))

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    rows = statuses(queue, "once")
    assert len(rows) == 20  # one per payload, whoever won each race
    assert len(results) == 160 and sum(1 for _, dup in results if not dup) == 20
    assert {i for i, _ in results} == {r[0] for r in rows}


def test_enqueue_many_reports_each_payload(app: App, queue: Queue) -> None:
    payloads = [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}]
    ids = queue.enqueue_many("default", payloads, idempotency_keys=["k1", None, "k1", "k2"])
    assert isinstance(ids, EnqueueManyResult) and len(ids) == 3  # as before: the ids inserted
    assert [r.duplicate for r in ids.results] == [False, False, True, False]
    assert ids.results[2].id == ids.results[0].id and ids.duplicates == [2]
    again = queue.enqueue_many("default", [{"a": 5}, {"a": 6}], idempotency_keys=["k2", "k3"])
    assert list(again) == [again.results[1].id]
    assert again.results[0].duplicate and again.results[0].id == ids.results[3].id == ids[2]

    @app.task(name="many.unique", unique_by=["u"])
    def many(job: object) -> None: ...

    before = ENQUEUE_DUPLICATES.labels("many.unique")._value.get()
    out = many.enqueue_many([{"u": 1}, {"u": 2}, {"u": 1}])
    more = many.enqueue_many([{"u": 2}, {"u": 3}])
    assert len(out) == 2 and [r.duplicate for r in out.results] == [False, False, True]
    assert out.results[2].id == out.results[0].id
    assert [r.duplicate for r in more.results] == [True, False] and more.results[0].id == out.results[1].id
    assert ENQUEUE_DUPLICATES.labels("many.unique")._value.get() == before + 2


def test_bad_unique_options_are_refused(app: App, queue: Queue) -> None:
    with pytest.raises(ConfigError, match="unique_by"):
        app.task(name="bad1", unique_by="everything")(lambda job: None)
    with pytest.raises(ConfigError, match="unique_states"):
        app.task(name="bad2", unique_by="payload", unique_states=["done"])(lambda job: None)
    with pytest.raises(ConfigError, match="unique_conflict"):
        app.task(name="bad3", unique_by="payload", unique_conflict="merge")(lambda job: None)
    with pytest.raises(ConfigError, match="unique_for"):
        app.task(name="bad4", unique_for=0)(lambda job: None)
    keyed = app.task(name="keyed", unique_by=["user"])(lambda job: None)
    with pytest.raises(EnqueueError, match="payload is a list"):
        keyed.enqueue([1, 2])
    with pytest.raises(EnqueueError, match="idempotency key"):
        keyed.enqueue({"user": 1}, idempotency_key="k")
    assert statuses(queue, "keyed") == []


def test_retry_of_a_failed_unique_job_skips_a_taken_key(app: App, queue: Queue, settings: Settings) -> None:
    @app.task(name="flaky", unique_by="payload", max_attempts=1)
    def flaky(job: object) -> None: ...

    first = flaky.enqueue({"x": 1})
    [job] = queue.claim("default", limit=1, worker="w1")
    queue.fail([Failure(job, "boom", 0.0, retry=False)], worker="w1")
    second = flaky.enqueue({"x": 1})  # failed does not hold the key by default
    assert not second.duplicate and second.id != first.id
    assert queue.retry_failed(ids=[first.id]) == []  # its key is taken: left failed, no unique violation
    with psycopg.connect(settings.dsn or "") as conn:
        n = conn.execute(f'SELECT count(*) FROM "{settings.schema}".jobs WHERE status = %s', ("pending",)).fetchone()
    assert n == (1,)


def test_replace_in_a_batch_updates_the_pending_holders_only(app: App, queue: Queue) -> None:
    @app.task(name="batch.replace", unique_by=["k"], unique_conflict="replace")
    def batch(job: object) -> None: ...

    first = batch.enqueue_many([{"k": 1, "v": "a"}, {"k": 2, "v": "a"}])
    [running] = queue.claim("default", limit=1, worker="w1")  # k=1 runs: left alone
    again = batch.enqueue_many([{"k": 1, "v": "b"}, {"k": 2, "v": "b"}, {"k": 3, "v": "b"}, {"k": 2, "v": "c"}])
    assert [r.duplicate for r in again.results] == [True, True, False, True]
    assert again.results[0].id == running.id and again.results[1].id == first[1] == again.results[3].id
    payloads = {p["k"]: (status, p["v"]) for _, status, p in statuses(queue, "batch.replace")}
    assert payloads == {1: ("processing", "a"), 2: ("pending", "b"), 3: ("pending", "b")}  # a repeat: its first


def test_a_unique_job_keeps_its_serial_key_one_and_many(app: App, queue: Queue) -> None:
    @app.task(name="sync.account", unique_by=["account"])
    def sync_account(job: object) -> None: ...

    one = sync_account.enqueue({"account": 1}, serial_key="account:1")
    many = queue.enqueue_many(
        "default",
        [{"n": 1}, {"n": 2}],
        task="other",
        unique_keys=["k1", "k2"],
        serial_key="account:2",
        serial_skip_on_retry=True,
    )
    with queue.pool.connection() as conn:
        rows = conn.execute(
            f'SELECT id, serial_key, serial_skip_on_retry FROM "{queue.settings.schema}".jobs ORDER BY id'
        ).fetchall()
    assert rows == [(one.id, "account:1", False), (many[0], "account:2", True), (many[1], "account:2", True)]
