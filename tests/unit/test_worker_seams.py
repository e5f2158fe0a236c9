"""Unit tests of the worker's seams with fake neighbours (no database): routing, slots, failures, the completer's
buffers, the served queues, per-job payload decoding and the lazy async job.conn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from skiplock import NonRetryableError, Settings
from skiplock.app import App
from skiplock.errors import ConfigError
from skiplock.handlers import Handler
from skiplock.job import (
    AsyncLazyConnection,
    Job,
    Outcome,
    decode_payload,
    job_from_claim,
    job_from_row,
    payload_depth_exceeded,
)
from skiplock.limits import TaskLimits
from skiplock.metrics import BoundMetrics, WorkerMetrics
from skiplock.store.statements import Claim, Failure, Recovered, Statements
from skiplock.worker import serve_queues
from skiplock.worker.claimer import Claimer
from skiplock.worker.completer import Completer, failure_for
from skiplock.worker.executor import (
    AsyncExecutor,
    Entry,
    Executors,
    Router,
    Slots,
    Target,
    ThreadExecutor,
    UnknownTaskError,
)
from skiplock.worker.leases import Leases
from skiplock.worker.pools import async_pool, sync_pool
from skiplock.worker.scope import Scope
from skiplock.worker.wakeup import Wakeup

SETTINGS = Settings(
    dsn="postgresql://x@127.0.0.1/none", backoff_base_seconds=4, backoff_cap_seconds=8, backoff_jitter=0
)
SCOPE = Scope(SETTINGS, "me", ("q",))


def job(job_id: int = 1, *, task: str | None = None, queue: str = "q", attempts: int = 1) -> Job:
    return Job(id=job_id, queue=queue, payload={}, attempts=attempts, max_attempts=5, task=task)


def entry(j: Job, handler: Callable[[Job], None] = lambda job: None) -> Entry:
    return Entry(j, Target(handler, False), 0.0)


def app_with(*names: str, **options: Any) -> App:
    app = App()
    for name in names:
        app.task(name=name, **options)(lambda job: None)
    return app


def bound_metrics(queues: Sequence[str] = ("q",), capacity: int = 1) -> dict[str, BoundMetrics]:
    return WorkerMetrics(CollectorRegistry()).describe_worker(list(queues), capacity, "t")


# ---------------------------------------------------------------------------------------------- routing
def test_router_sends_a_job_to_its_task_and_a_job_without_one_to_the_catch_all() -> None:
    app = app_with("a")
    handler = Handler("h:f", lambda job: None, False)
    router = Router(app, handler)
    target_a = router.targets.get("a")
    assert target_a is not None and target_a.task is app.get("a")
    default = router.targets.get(None)
    assert default is not None and default.func is handler.func and default.task is None
    assert "b" not in router.targets
    unknown = router.unknown(job(task="b"))
    assert isinstance(unknown, UnknownTaskError) and str(unknown) == "no task 'b' registered in this worker"


def test_router_without_a_catch_all_refuses_jobs_without_a_task_and_knows_its_colours() -> None:
    app = App()

    async def a(job: Job) -> None:
        pass

    app.task(name="s")(lambda job: None)
    app.task(name="a")(a)

    router = Router(app, None)
    assert None not in router.targets
    assert str(router.unknown(job())) == "job has no task and this worker has no default handler (--handler)"
    assert router.kinds == {True, False}
    assert Router(app_with("x", lease_seconds=5), None).lease_overrides() == {"x": 5}


def test_serve_queues_follow_settings_then_the_app_then_the_default_queue() -> None:
    app = App()
    app.task(name="m", queue="mail")(lambda job: None)
    app.task(name="r", queue="reports")(lambda job: None)
    handler = Handler("h:f", lambda job: None, False)
    assert serve_queues(SETTINGS.replace(queues=("x",)), app, None) == ("x",)
    assert serve_queues(SETTINGS, app, None) == ("mail", "reports")
    assert serve_queues(SETTINGS, app, handler) == ("mail", "reports", "default")
    assert serve_queues(SETTINGS, None, handler) == ("default",)


# ---------------------------------------------------------------------------------------------- slots
async def test_slots_count_free_places_forget_only_the_same_attempt_and_signal_each_end() -> None:
    slots = Slots(2)
    first = job(1)
    slots.add(entry(first))
    slots.add(entry(job(2)))
    assert slots.free() == 0 and slots.holds(first)
    assert slots.pop(job(1, attempts=2)) is None, "another attempt of the same job is not this slot"
    assert slots.pop(first) is not None and slots.freed.is_set() and slots.free() == 1
    assert slots.pop(first) is None
    assert slots.running_in("q") == 1 and slots.running_in("other") == 0, "running jobs by queue, for the gauges"
    again = slots.add(entry(first))  # the same attempt claimed anew (handed back, then claimed again)
    stale = entry(first)
    assert slots.collect([stale]) == [], "a result of an entry the slots no longer hold is dropped"
    assert slots.collect([again]) == [again] and slots.running_in("q") == 1 and slots.free() == 1


def test_a_waiting_job_whose_lease_ran_out_by_the_workers_estimate_never_starts() -> None:
    """Its lease ends ``lease`` seconds after its claim or the last heartbeat that renewed it, whichever is later:
    past that (the worker stalled, or heartbeats failed) another worker may run it, so no slot starts it."""
    now = time.monotonic()
    slots = Slots(3, lease=5.0)
    stale_async, fresh, renewed = job(2), job(4), job(5)
    stale_loop = Job(id=3, queue="q", payload={}, attempts=1, max_attempts=5, timeout_seconds=9.0)
    slots.wait(
        [
            Entry(stale_async, Target(lambda j: None, True), now - 6.0),
            Entry(stale_loop, Target(lambda j: None, False), now - 6.0),  # a timeout of its own: the loop starts it
            Entry(fresh, Target(lambda j: None, True), now - 1.0),
        ]
    )
    assert slots.start_for_loop() == [], "a sync job with a timeout, started by the loop"
    started = slots.next_for_task()
    assert started is not None and started.job is fresh, "an async job: the stale one is passed over"
    assert [e.job for e in slots.take_expired()] == [stale_loop, stale_async]
    assert slots.take_expired() == []
    slots.wait([Entry(renewed, Target(lambda j: None, True), now - 6.0)])
    slots.mark_renewed(now - 1.0)  # a heartbeat since renewed the leases of the jobs still waiting
    started = slots.next_for_task()
    assert started is not None and started.job is renewed
    assert slots.take_expired() == []


def test_a_handler_thread_skips_a_waiting_job_whose_lease_ran_out() -> None:
    now = time.monotonic()
    slots = Slots(1, lease=5.0)
    old, new = job(1), job(2)
    slots.wait([Entry(old, Target(lambda j: None, False), now - 6.0), Entry(new, Target(lambda j: None, False), now)])
    e = slots.next_for_thread(now=now)
    assert e is not None and e.job is new
    assert [x.job for x in slots.take_expired()] == [old]
    assert not slots.holds(old), "no longer held: no heartbeat renews it"


# ---------------------------------------------------------------------------------------------- failures
def test_a_failure_retries_with_the_tasks_backoff_unless_its_type_is_non_retryable() -> None:
    class Permanent(Exception):
        pass

    app = app_with("t", non_retryable=Permanent, backoff_base_seconds=1, backoff_cap_seconds=1, backoff_jitter=0)
    task = app.get("t")
    flaky = failure_for(job(attempts=3), RuntimeError("x"), task, SETTINGS)
    assert flaky.retry and flaky.delay_seconds == 1.0 and flaky.error == "RuntimeError: x"
    assert not failure_for(job(), Permanent("no"), task, SETTINGS).retry
    assert not failure_for(job(), NonRetryableError("no"), None, SETTINGS).retry
    default = failure_for(job(attempts=3), RuntimeError("x"), None, SETTINGS)
    assert default.delay_seconds == 8.0, "the worker's backoff: min(cap 8, 4 * 2**2)"


def test_task_options_are_validated_when_the_task_is_registered() -> None:
    app = App()
    with pytest.raises(ConfigError, match="unknown task option"):
        app.task(name="x", retries=3)
    with pytest.raises(ConfigError, match="max_attempts"):
        app.task(name="x", max_attempts=0)
    app.task(name="x")(lambda job: None)
    with pytest.raises(ConfigError, match="registered twice"):
        app.task(name="x")(lambda job: None)


# ---------------------------------------------------------------------------------------------- typed fakes
class FakeStore:
    """The data access every seam asks for, in memory: records what would be written, answers like the database
    would (job 13 lost its lease; nothing was cancelled). It satisfies CompleterStore, LeaseStore and ClaimStore."""

    def __init__(self, claims: list[list[Job]] | None = None) -> None:
        self.written: list[list[int]] = []
        self.results: list[list[tuple[int, str]]] = []
        self.failed: list[list[int]] = []
        self.carried: list[list[int]] = []  # done jobs each claim carried
        self.claims = list(claims or [])  # what each claim returns, in turn (then nothing)
        self.heartbeats: list[list[int]] = []
        self.held: set[int] | None = None  # what a heartbeat finds held (None: every job it was given)
        self.cancelled: set[int] = set()
        self.recovered: list[Recovered] = []
        self.released: list[list[int]] = []
        self.uncertain = False

    async def backoff(self, stopping: asyncio.Event) -> None:
        return None

    def replan(self) -> None:
        return None

    # the completer
    async def complete(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        self.written.append([j.id for j in jobs])
        return {j.id for j in jobs if j.id != 13}

    async def complete_results(self, done: Sequence[tuple[Job, str]], *, worker: str) -> set[int]:
        self.results.append([(j.id, r) for j, r in done])
        return {j.id for j, _ in done}

    async def confirm_done(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        return set()

    async def fail(self, failures: Sequence[Failure], *, worker: str) -> dict[int, str]:
        self.failed.append([f.job.id for f in failures])
        return {f.job.id: "pending" if f.retry else "failed" for f in failures}

    async def snooze(self, jobs: Sequence[Job], delays: Sequence[float], *, worker: str) -> set[int]:
        return {j.id for j in jobs}

    async def cancelled_among(self, jobs: Sequence[Job], *, worker: str, operation: str = "complete") -> set[int]:
        return {j.id for j in jobs} & self.cancelled

    # the leases
    async def heartbeat(
        self,
        jobs: Sequence[Job],
        *,
        worker: str,
        leases: Sequence[float] | None = None,
        timeouts: Sequence[float | None] | None = None,
    ) -> set[int]:
        self.heartbeats.append([j.id for j in jobs])
        ids = {j.id for j in jobs}
        return ids if self.held is None else ids & self.held

    async def recover_expired(self, *, queues: Sequence[str], lease_seconds: float | None = None) -> list[Recovered]:
        recovered, self.recovered = self.recovered, []
        return recovered

    async def release(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
        self.released.append([j.id for j in jobs])
        return {j.id for j in jobs}

    async def release_orphans(self, *, worker: str, queues: Sequence[str], known: Sequence[int]) -> list[int]:
        return []

    # the claimer
    async def complete_and_claim(self, done: Sequence[Job], claim: Claim, limit: int) -> tuple[set[int], list[Job]]:
        self.carried.append([j.id for j in done])
        jobs = self.claims.pop(0) if self.claims else []
        return {j.id for j in done}, jobs[:limit]

    async def stream_claims(self) -> None:
        return None

    async def give_back_claim_connection(self) -> None:
        return None

    async def paused(self, queues: Sequence[str]) -> list[str]:
        return []

    async def jobs_table_bytes(self) -> int:
        return 0

    async def next_start(self, tasks: Sequence[str], queues: Sequence[str]) -> float | None:
        return None

    async def drain_requested(self, pod: str) -> bool:
        return False


class FakeResults:
    """The executors' neighbour (the completer's side of Results): records what it is told."""

    def __init__(self) -> None:
        self.finished_entries: list[Entry] = []
        self.failures: list[tuple[Failure, Outcome]] = []
        self.timeouts: list[tuple[Entry, int]] = []

    def finished(self, results: list[Entry]) -> None:
        self.finished_entries.extend(results)

    def fail(self, failure: Failure, cause: Outcome = "failed") -> None:
        self.failures.append((failure, cause))

    def timed_out(self, entry: Entry, error: BaseException, stuck: int) -> None:
        self.timeouts.append((entry, stuck))


class FakeUnwritten:
    """The leases' view of the completer."""

    def __init__(self) -> None:
        self.unstarted: list[tuple[int, bool]] = []
        self.cancelled: list[int] = []

    def jobs(self) -> list[Job]:
        return []

    def holds(self, job: Job) -> bool:
        return False

    def count_unstarted(self, job: Job, cancelled: bool) -> None:
        self.unstarted.append((job.id, cancelled))

    def count_cancelled(self, job: Job) -> None:
        self.cancelled.append(job.id)


class FakeHeld:
    """The leases' view of the executors: jobs running and jobs waiting in the buffer."""

    def __init__(self, running: list[Job], waiting: list[Job]) -> None:
        self.running, self.waiting = running, waiting
        self.renewed: list[float] = []
        self.told: set[int] = set()

    def jobs(self) -> list[Job]:
        return self.running + self.waiting

    def holds(self, job: Job) -> bool:
        return job in self.running or job in self.waiting

    def forget_waiting(self, jobs: list[Job]) -> list[Job]:
        gone = [j for j in self.waiting if j in jobs]
        self.waiting = [j for j in self.waiting if j not in jobs]
        return gone

    def mark_renewed(self, sent: float) -> None:
        self.renewed.append(sent)

    def cancel(self, ids: set[int]) -> list[Job]:
        self.told |= {j.id for j in self.running if j.id in ids}
        return self.forget_waiting([j for j in self.waiting if j.id in ids])


class FakeRoom:
    """The claimer's view of the executors: free slots and the buffer (a list of jobs)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.started = 0
        self.busy = 0
        self.buffer: list[Job] = []
        self.ran: list[Job] = []  # started and finished at once (start() with ``run_at_start``)
        self.run_at_start = False

    def free(self) -> int:
        return self.capacity - self.busy

    def running(self) -> int:
        return self.busy

    def waiting(self) -> int:
        return len(self.buffer)

    def oldest_claim(self) -> float | None:
        return None

    def admit(self, jobs: list[Job]) -> None:
        self.buffer.extend(jobs)

    def start(self) -> None:
        if self.run_at_start:
            self.started += len(self.buffer)
            self.ran += self.take_buffer()

    def take_buffer(self) -> list[Job]:
        jobs, self.buffer = self.buffer, []
        return jobs

    def take_expired(self) -> list[Job]:
        return []

    def drop_waiting_longer(self, limit: Callable[[Job], float], now: float) -> list[Job]:
        return []


class FakeHandBack:
    """The claimer's view of the leases."""

    shortest = 60.0

    def lease_for(self, job: Job) -> float:
        return 60.0

    async def release(self, jobs: list[Job]) -> int:
        return len(jobs)

    async def reclaim_orphans(self) -> bool:
        return True


def make_completer(
    store: FakeStore | None = None,
    observe: Callable[[Job, Outcome], None] | None = None,
    scope: Scope = SCOPE,
    wakeup: Wakeup | None = None,
) -> Completer:
    return Completer(store or FakeStore(), scope, bound_metrics(), wakeup or Wakeup(), observe)


# ---------------------------------------------------------------------------------------------- completer
async def test_the_completer_hands_done_jobs_to_claims_in_id_order_and_counts_what_was_written() -> None:
    observed: list[tuple[int, str]] = []
    store = FakeStore()
    completer = make_completer(store, lambda j, o: observed.append((j.id, o)))
    for i in (3, 1, 2):
        completer.defer(job(i))
    assert completer.holds(job(2)) and not completer.holds(job(2, attempts=2))
    taken = completer.take_done()
    assert [j.id for j in taken] == [1, 2, 3] and completer.pending == 0
    completer.give_back(taken)
    assert completer.pending == 3
    completer.defer(job(13))
    assert await completer.flush()
    assert store.written == [[1, 2, 3, 13]]
    assert sorted(observed) == [(1, "done"), (2, "done"), (3, "done"), (13, "lease_lost")]


async def test_done_jobs_with_results_are_written_by_a_statement_of_their_own_never_by_a_claim() -> None:
    observed: list[tuple[int, str]] = []
    store = FakeStore()
    completer = make_completer(store, lambda j, o: observed.append((j.id, o)))
    plain, valued = entry(job(1)), entry(job(2))
    for e in (plain, valued):
        e.outcome = "done"
    valued.result = '{"sum":3}'
    completer.finished([plain, valued])
    assert [j.id for j in completer.take_done()] == [1], "only the plain job rides on a claim"
    assert completer.holds(job(2)) and completer.pending == 1
    assert await completer.flush()
    assert store.results == [[(2, '{"sum":3}')]] and completer.pending == 0
    assert observed == [(2, "done")]


async def test_the_completer_dispatches_each_reported_outcome_and_survives_a_failing_observer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    seen: list[tuple[int, str]] = []

    def observe(j: Job, outcome: Outcome) -> None:
        seen.append((j.id, outcome))
        raise RuntimeError("observer bug")

    completer = make_completer(store, observe)
    done, failed, lost, cancelled = entry(job(1)), entry(job(2)), entry(job(3)), entry(job(4))
    done.outcome = "done"
    failed.outcome, failed.error = "failed", RuntimeError("boom")
    lost.outcome = "lease_lost"
    cancelled.outcome, cancelled.cancelled = "cancelled", True
    with caplog.at_level(logging.ERROR):
        completer.finished([done, failed, lost, cancelled])
        assert [j.id for j in completer.take_done()] == [1], "a plain done job waits for a claim"
        assert (4, "cancelled") in seen
        assert await completer.flush()
    assert store.failed == [[2]]
    assert sorted(seen) == [(2, "retried"), (3, "lease_lost"), (4, "cancelled")]
    assert sum("worker callback" in r.getMessage() for r in caplog.records) == 3, "each failure logged, none raised"


async def test_a_sync_timeout_is_failed_at_once_and_counted_timed_out() -> None:
    store = FakeStore()
    seen: list[tuple[int, str]] = []
    completer = make_completer(store, lambda j, o: seen.append((j.id, o)))
    e = entry(job(5))
    completer.timed_out(e, TimeoutError("late"), stuck=1)
    assert completer.pending == 1 and await completer.flush()
    assert store.failed == [[5]] and seen == [(5, "timed_out")]


async def test_a_job_that_held_back_another_wakes_the_claim_loop_once_written_alone() -> None:
    wakeup = Wakeup()
    limited = TaskLimits(task="g", global_concurrency=1)
    completer = make_completer(scope=Scope(SETTINGS, "me", ("q",), limits=(limited,)), wakeup=wakeup)
    flusher = asyncio.create_task(completer.run())
    completer.defer(job(1, task="other"))
    await wait_for(lambda: not completer.pending)
    await asyncio.sleep(0.01)
    assert not wakeup.work.is_set(), "a job of an unlimited task unblocks nothing: no claim"
    completer.defer(job(2, task="g"))
    await wait_for(wakeup.work.is_set)
    assert wakeup.source == "completed"
    await completer.close(flusher)


async def test_done_jobs_wait_for_a_coming_claim_past_the_flush_delay_but_never_longer_than_the_cap() -> None:
    from skiplock.worker.completer import FLUSH_DELAY_SECONDS, FLUSH_MAX_WAIT_SECONDS

    store = FakeStore()
    wakeup = Wakeup()
    completer = make_completer(store, wakeup=wakeup)
    wakeup.claiming(True)  # a claim is in flight, and its successor never takes them
    flusher = asyncio.create_task(completer.run())
    start = time.monotonic()
    completer.defer(job(1))
    while not store.written:
        await asyncio.sleep(0.002)
    assert store.written == [[1]] and completer.flushes == 1, "written alone once the cap passed"
    assert time.monotonic() - start >= FLUSH_MAX_WAIT_SECONDS

    wakeup.claiming(False)  # no claim coming: written alone after the delay
    start = time.monotonic()
    completer.defer(job(2))
    while len(store.written) < 2:
        await asyncio.sleep(0.002)
    assert store.written[1] == [2] and FLUSH_DELAY_SECONDS <= time.monotonic() - start < FLUSH_MAX_WAIT_SECONDS

    wakeup.claiming(True)  # a claim comes and takes them: nothing written alone
    completer.defer(job(3))
    await asyncio.sleep(FLUSH_DELAY_SECONDS * 2)
    assert [j.id for j in completer.take_done()] == [3]
    await asyncio.sleep(FLUSH_MAX_WAIT_SECONDS)
    assert len(store.written) == 2 and completer.flushes == 2
    await completer.close(flusher)


# ---------------------------------------------------------------------------------------------- claimer
def make_claimer(
    settings: Settings = SETTINGS, capacity: int = 2, queues: tuple[str, ...] = ("q",), store: FakeStore | None = None
) -> tuple[Claimer, FakeRoom, Wakeup]:
    """A claimer of ``queues`` over ``capacity`` slots, with fake neighbours (no database)."""
    metrics = WorkerMetrics(CollectorRegistry())
    bound = metrics.describe_worker(list(queues), capacity, "t")
    scope = Scope(settings, "me", queues)
    store = store or FakeStore()
    wakeup = Wakeup()
    room = FakeRoom(capacity)
    completer = Completer(store, scope, bound, wakeup)
    claimer = Claimer(store, scope, completer, room, FakeHandBack(), wakeup, metrics, bound)
    return claimer, room, wakeup


async def test_a_claimer_waiting_for_room_for_a_batch_claims_at_once_when_done_jobs_hurry_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skiplock.worker import claimer as claimer_module

    monkeypatch.setattr(claimer_module, "CLAIM_GATHER_BUFFERED_SECONDS", 60.0)  # only a hurry ends the wait
    claimer, room, wakeup = make_claimer()
    assert not wakeup.hurry(), "neither gathering nor claiming: the done jobs are flushed alone"
    room.buffer = [job(i) for i in range(1, 4)]  # buffered: a long window
    gathering = asyncio.create_task(claimer._gather_slots(100))
    await asyncio.sleep(0.01)
    assert not gathering.done() and wakeup.hurry() and wakeup.hurried == 1
    assert await asyncio.wait_for(gathering, 5) == claimer._room(), "back at once with the room it has"
    assert not wakeup.hurry(), "no claim coming once the loop moved on"
    assert claimer.stats()["claims_hurried"] == 1


async def test_the_claim_loop_carries_done_jobs_admits_what_it_claims_and_stops_when_idle() -> None:
    store = FakeStore(claims=[[job(7), job(8)]])
    metrics = WorkerMetrics(CollectorRegistry())
    bound = metrics.describe_worker(["q"], 2, "t")
    wakeup = Wakeup()
    completer = Completer(store, SCOPE, bound, wakeup)
    room = FakeRoom(2)
    room.run_at_start = True
    claimer = Claimer(store, SCOPE, completer, room, FakeHandBack(), wakeup, metrics, bound, until_idle=True)
    completer.defer(job(3))
    await asyncio.wait_for(claimer.run(), 5)
    assert store.carried[0] == [3], "the first claim carried the finished job"
    assert [j.id for j in room.ran] == [7, 8], "claimed jobs admitted, then started"
    assert wakeup.stopping.is_set() and claimer.claims >= 2 and claimer.empty_claims >= 1


async def test_a_control_notification_during_the_gather_for_a_batch_claims_nothing_and_crashes_nothing() -> None:
    """Before: the gather came back with no room (a control notification not looked at yet holds claims, see
    ``Claimer._room``) and the loop claimed a batch of 0, whose "full batch" bookkeeping raised IndexError and ended
    the worker: any NOTIFY on the control channel at the wrong moment."""
    claimer, room, wakeup = make_claimer(SETTINGS.replace(concurrency=4, batch=4), capacity=4)
    room.busy = 3  # one slot free, the batch wants four: the loop gathers room for a few milliseconds
    loop = asyncio.get_running_loop()
    running = asyncio.create_task(claimer.run())
    loop.call_soon(wakeup.control)  # runs once the loop waits in the gather
    await asyncio.sleep(0.1)
    assert not running.done(), running.done() and running.exception()
    assert claimer.claims == 0, "nothing claimed while the notification was not looked at"
    wakeup.stop()
    await asyncio.wait_for(running, 5)


def test_a_busy_claimer_claims_once_a_batch_fits_but_never_waits_for_more_than_half_its_buffer() -> None:
    def claimer_with(**changes: Any) -> Claimer:
        claimer, _, _ = make_claimer(SETTINGS.replace(concurrency=10, **changes), 10)
        claimer._rate, claimer._window_start = 100_000.0, __import__("time").monotonic()  # a fast pace: no cap
        return claimer

    assert Settings(dsn="postgresql://x@h/d").batch == 200 and Settings(dsn="postgresql://x@h/d").prefetch == 400
    assert claimer_with(batch=200, prefetch=400).gather_target() == 200, "the defaults: a whole batch"
    assert claimer_with(batch=100, prefetch=400).gather_target() == 100
    # a batch as large as the buffer: claimed once the slots and half the buffer are free, so the rest of the buffer
    # keeps the slots busy while the claim is in flight
    assert claimer_with(batch=200, prefetch=200).gather_target() == 110
    assert claimer_with(batch=500, prefetch=400).gather_target() == 210
    assert claimer_with(batch=200, prefetch=0).gather_target() == 10, "no buffer: room for every slot"
    slow = claimer_with(batch=200, prefetch=400)
    slow._rate = 2.0  # two jobs a second: the buffer may hold 6 (1/20 of a 60 s lease)
    assert slow.allowed() == 6 and slow.gather_target() == 13


def test_the_pace_of_a_burst_after_an_idle_spell_is_measured_from_its_first_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from skiplock.worker import claimer as claimer_module

    clock = [1000.0]
    monkeypatch.setattr(claimer_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))  # the claimer's clock
    claimer, slots, _ = make_claimer(SETTINGS.replace(concurrency=10), 10)
    assert claimer.allowed() == 0, "no pace yet: no buffer"
    clock[0] += 1.9  # idle, looked at by the poll
    assert claimer.allowed() == 0
    clock[0] += 1.9
    slots.started += 10  # a NOTIFY: the slots fill
    assert claimer.allowed() == 0
    for _ in range(6):  # then 20,000 jobs a second
        clock[0] += 0.002
        slots.started += 40
        claimer.allowed()
    # 240 jobs in 12 ms after the first fill (it once counted the idle seconds as well: about 60 jobs a second)
    assert claimer._rate == pytest.approx(20_000, rel=0.01)
    assert claimer.allowed() == 400, "the whole buffer, a few milliseconds into the burst"
    clock[0] += 0.3  # a window closes: the pace holds
    slots.started += 6000
    assert claimer.allowed() == 400 and claimer._rate > 10_000
    clock[0] += 0.3  # nothing started for a whole window: the pace is unknown again
    assert claimer.allowed() == 0 and claimer._rate == 0


def test_a_burst_is_first_paced_once_a_second_slots_worth_of_jobs_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain claims a slot's worth a claim until the pace is known: the first estimate comes with the first fill and
    one more slot's worth, 2 ms into the burst (not three fills and 10 ms: two more round trips of small claims)."""
    from types import SimpleNamespace

    from skiplock.worker import claimer as claimer_module

    clock = [1000.0]
    monkeypatch.setattr(claimer_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    claimer, slots, _ = make_claimer(SETTINGS.replace(concurrency=10), 10)
    slots.started += 10  # the first claim fills the slots
    assert claimer.allowed() == 0
    clock[0] += 0.0015
    slots.started += 10  # the second claim's jobs start
    assert claimer.allowed() == 0, "1.5 ms is too soon for a pace"
    clock[0] += 0.001
    assert claimer.allowed() == 400, "the whole buffer from the third claim on"
    assert claimer._rate == pytest.approx(4_000), "the first fill left out: 10 jobs in 2.5 ms"
    slow, slow_slots, _ = make_claimer(SETTINGS.replace(concurrency=10), 10)
    slow_slots.started += 10
    slow.allowed()
    clock[0] += 0.125  # jobs of 125 ms: the next slot's worth starts when the first ends
    slow_slots.started += 10
    assert slow.allowed() == 240 and slow._rate == pytest.approx(80), "80 jobs a second: 3 s of them"


# ---------------------------------------------------------------------------------------------- payloads
def test_each_claimed_payload_is_decoded_on_its_own() -> None:
    assert decode_payload('{"a": [1, 2]}') == ({"a": [1, 2]}, None)
    value, error = decode_payload("[" * 100_000 + "]" * 100_000)
    assert value is None and error and error.startswith("PayloadError: payload cannot be decoded")
    row = {"id": 1, "queue": "q", "payload": "[" * 100_000, "attempts": 1, "max_attempts": 1, "task": "t"}
    bad = job_from_row(row)
    assert bad.decode_error and bad.task == "t" and bad.payload is None
    assert payload_depth_exceeded("[" * 201 + "]" * 201) and not payload_depth_exceeded('["[[[[[[["]')
    bad_claim = job_from_claim((None, 1, "q", "t", "[" * 100_000, 1, 1, 0, None, None, None, None, None, None))
    assert bad_claim.decode_error == bad.decode_error and bad_claim.task == "t" and bad_claim.payload is None


def test_a_claim_row_becomes_the_same_job_as_a_dict_row_and_claims_come_back_in_claim_order() -> None:
    from datetime import UTC, datetime, timedelta

    from skiplock.job import CLAIM_ROW
    from skiplock.store.statements import completed_and_claimed

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    trace_context = {"traceparent": "00-x"}
    values = (7, "q", "t", '{"a": 1}', 2, 5, 3, t0, t0 + timedelta(seconds=1), "key", 1.5, "k1", trace_context)
    assert job_from_claim((None, *values)) == job_from_row(dict(zip(CLAIM_ROW, values, strict=True)))
    j = job_from_claim((None, *values))
    assert (j.id, j.payload, j.priority, j.idempotency_key, j.timeout_seconds, j.serial_key, j.decode_error) == (
        7,
        {"a": 1},
        3,
        "key",
        1.5,
        "k1",
        None,
    )
    handed = j.with_conn("conn", "flag")
    assert handed == j and handed.conn == "conn" and handed._cancel == "flag" and j.conn is None
    rows = [
        (None, 9, "q", None, "{}", 1, 5, 0, t0, t0, None, None, None, None),
        (None, 8, "q", None, "{}", 1, 5, 0, t0, t0, None, None, None, None),
        (None, 10, "q", None, "{}", 1, 5, 5, t0, t0 + timedelta(seconds=9), None, None, None, None),
        ([4, 6], None, None, None, None, None, None, None, None, None, None, None, None, None),
    ]
    completed, claimed = completed_and_claimed(rows)
    assert completed == {4, 6} and [c.id for c in claimed] == [10, 8, 9], "priority, then due time, then id"
    import random

    shuffled = random.Random(13)
    due = [t0 + timedelta(seconds=s) for s in range(4)]
    many = [
        (None, i, "q", None, "{}", 1, 5, shuffled.choice((-1, 0, 2)), t0, shuffled.choice(due), None, None, None, None)
        for i in range(1, 81)
    ]
    shuffled.shuffle(many)
    expected = [r[1] for r in sorted(many, key=lambda r: (-r[7], r[9], r[1]))]
    assert [c.id for c in completed_and_claimed(many)[1]] == expected, "ties of priority and due time included"


# ---------------------------------------------------------------------------------------------- lazy job.conn
class FakeConn:
    def __init__(self) -> None:
        self.executed: list[str] = []

    async def execute(self, query: str) -> str:
        self.executed.append(query)
        return "cursor"

    def transaction(self) -> Any:
        conn = self

        class Tx:
            async def __aenter__(self) -> Any:
                conn.executed.append("BEGIN")
                return self

            async def __aexit__(self, *exc: Any) -> None:
                conn.executed.append("END")

        return Tx()


async def test_the_async_job_conn_checks_out_on_first_use_only() -> None:
    checkouts: list[FakeConn] = []

    async def acquire() -> FakeConn:
        checkouts.append(FakeConn())
        return checkouts[-1]

    untouched = AsyncLazyConnection(acquire)
    await untouched.rollback()  # nothing to roll back: no checkout
    assert untouched.conn is None and checkouts == []
    lazy = AsyncLazyConnection(acquire)
    assert await lazy.execute("SELECT 1") == "cursor"
    async with lazy.transaction():
        await lazy.execute("SELECT 2")
    assert len(checkouts) == 1 and checkouts[0].executed == ["SELECT 1", "BEGIN", "SELECT 2", "END"]
    with pytest.raises(AttributeError, match="acquire"):
        _ = AsyncLazyConnection(acquire).info


async def test_a_failed_async_checkout_is_remembered_even_if_the_handler_swallows_it() -> None:
    async def acquire() -> Any:
        raise OSError("pool closed")

    lazy = AsyncLazyConnection(acquire)
    with pytest.raises(OSError):
        await lazy.execute("SELECT 1")
    assert isinstance(lazy.failed, OSError)
    await asyncio.sleep(0)


async def test_a_flush_in_flight_keeps_its_jobs_held() -> None:
    gate = asyncio.Event()

    class SlowStore(FakeStore):
        async def complete(self, jobs: Sequence[Job], *, worker: str) -> set[int]:
            await gate.wait()
            return {j.id for j in jobs}

    completer = make_completer(SlowStore())
    completer.defer(job(7))
    flush = asyncio.create_task(completer.flush())
    await asyncio.sleep(0.01)
    assert completer.holds(job(7)) and [j.id for j in completer.jobs()] == [7], "in flight: still this worker's"
    gate.set()
    assert await flush and completer.jobs() == []


def test_one_claim_takes_and_locks_about_limit_rows_over_all_queues() -> None:
    from skiplock.store.statements import per_queue_limit

    assert per_queue_limit(10, 1) == 10 and per_queue_limit(10, 3) == 4 and per_queue_limit(10, 50) == 1


def test_a_claim_of_several_queues_gives_the_short_queues_a_small_share_and_the_busy_ones_the_rest() -> None:
    claimer, _, _ = make_claimer(queues=("a", "b", "c"))

    def took(shares: list[int], jobs: list[Job]) -> bool:
        claimer._short = claimer._short_queues(shares, jobs)
        return claimer._busy(sum(shares), shares, jobs)

    assert claimer.shares(200) == [67, 67, 67], "nothing known: equal shares"
    assert took([67, 67, 67], [job(i, queue="a") for i in range(67)] + [job(100, queue="b")]), "a gave all 67"
    assert claimer.shares(200) == [197, 2, 1], "b gave 1 (next: 2), c none (next: 1), a the rest"
    assert claimer.shares(10) == [7, 2, 1], "never more than the equal share for a short queue"
    # c got a backlog: it fills its small share, and the next claim shares equally between a and c
    assert took([197, 2, 1], [job(i, queue="a") for i in range(197)] + [job(300, queue="c")])
    assert claimer.shares(200) == [100, 1, 100], "b gave none of its 2: 1 next"
    assert not took([100, 1, 100], []), "an empty claim: no queue gave its share"
    assert claimer.shares(200) == [67, 67, 67], "all short: equal shares again"
    assert not claimer._busy(3, [1, 1, 1], [job(1, queue="a")]), "one job: an idle worker's claim, not a stream"
    one, _, _ = make_claimer()
    assert one.shares(200) is None, "one queue: no shares"


# ---------------------------------------------------------------------------------------------- thread executor
STATEMENTS = Statements(SETTINGS)


def thread_pool() -> ConnectionPool[Any]:
    """job.conn's pool, never opened: these handlers never use job.conn."""
    return sync_pool(SETTINGS.require_dsn(), "test", 1, timeout=1)


def task_pool() -> AsyncConnectionPool[Any]:
    return async_pool(SETTINGS.require_dsn(), "test", 1, timeout=1)


async def test_handler_threads_start_buffered_jobs_themselves_and_a_slow_one_holds_only_its_slot() -> None:
    import threading

    gate = threading.Event()
    results: list[Entry] = []
    slow_id = 3  # blocks until the gate opens: the other jobs still run, on the other thread

    def handler(j: Job) -> None:
        if j.id == slow_id:
            gate.wait(30)

    slots = Slots(2)
    executor = ThreadExecutor(2, slots, thread_pool(), STATEMENTS, "me", results.extend, lambda e, err: None)
    try:
        jobs = [job(i) for i in range(1, 41)]
        slots.wait([entry(j, handler) for j in jobs])  # no loop start: the threads take them as slots free
        for _ in range(3000):
            if len(results) == len(jobs) - 1:
                break
            await asyncio.sleep(0.01)
        assert sorted(r.job.id for r in results) == [j.id for j in jobs if j.id != slow_id]
        assert {r.outcome for r in results} == {"done"}
        assert slots.free() == 1 and slots.waiting() == 0, "the slow job keeps its slot, nothing else does"
        assert len(slots) == len(jobs), "each job stays held (its lease renewed) until the loop collects its result"
        gate.set()
        for _ in range(3000):
            if len(results) == len(jobs):
                break
            await asyncio.sleep(0.01)
        assert results[-1].job.id == slow_id and results[-1].outcome == "done" and slots.free() == 2
        assert slots.started == len(jobs)
    finally:
        gate.set()
        executor.close(join=False)


async def test_handler_threads_start_nothing_once_draining_and_the_buffer_is_handed_back_whole() -> None:

    results: list[Entry] = []
    slots = Slots(2)
    slots.shut()
    executor = ThreadExecutor(2, slots, thread_pool(), STATEMENTS, "me", results.extend, lambda e, err: None)
    try:
        slots.wait([entry(job(i)) for i in range(1, 6)])
        await asyncio.sleep(0.2)
        assert results == [] and slots.started == 0 and slots.waiting() == 5
        assert [j.id for j in slots.jobs()] == [1, 2, 3, 4, 5], "waiting jobs are held: their leases are renewed"
        gone = slots.drop_waiting(lambda e: False)
        assert [e.job.id for e in gone] == [1, 2, 3, 4, 5] and slots.waiting() == 0
    finally:
        executor.close(join=False)


# ---------------------------------------------------------------------------------------------- async runners
def async_entry(j: Job, handler: Callable[[Job], Any]) -> Entry:
    return Entry(j, Target(handler, True), 0.0)


def ran_count(results: list[Entry], n: int) -> Callable[[], bool]:
    return lambda: len(results) == n


async def wait_for(check: Callable[[], bool]) -> None:
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_async_runners_take_buffered_jobs_themselves_and_a_slow_one_holds_only_its_slot() -> None:

    gate = asyncio.Event()
    results: list[Entry] = []
    slow_id = 3  # awaits the gate: the other jobs still run, on the other runner

    async def handler(j: Job) -> None:
        if j.id == slow_id:
            await gate.wait()

    slots = Slots(2)
    executor = AsyncExecutor(2, slots, task_pool(), STATEMENTS, "me", results.append)
    try:
        jobs = [job(i) for i in range(1, 41)]
        slots.wait([async_entry(j, handler) for j in jobs])
        assert slots.waiting() == 40 and results == [], "nothing starts before a runner is woken"
        executor.wake()
        await wait_for(lambda: len(results) == len(jobs) - 1)
        assert sorted(r.job.id for r in results) == [j.id for j in jobs if j.id != slow_id]
        assert {r.outcome for r in results} == {"done"}
        assert slots.free() == 1 and slots.waiting() == 0, "the slow job keeps its slot, nothing else does"
        assert len(slots) == len(jobs), "each job stays held (its lease renewed) until the loop collects its result"
        gate.set()
        await wait_for(lambda: len(results) == len(jobs))
        assert results[-1].job.id == slow_id and slots.free() == 2 and slots.started == len(jobs)
        assert all(e.handle is None for e in slots.entries()), "a runner's task is a job's handle only while it runs"
    finally:
        gate.set()
        await executor.stop()


async def test_each_async_job_starts_with_the_workers_context_and_an_uncancelled_task() -> None:
    """A runner whose job set a context variable, or whose job was cancelled, gives way to a fresh runner: the next
    job never sees what an earlier one left behind."""
    import contextvars

    var: contextvars.ContextVar[int] = contextvars.ContextVar("var")
    results: list[Entry] = []
    seen: dict[int, tuple[int | None, int, asyncio.Task[Any]]] = {}  # job id -> (var, cancelling, runner task)
    gate = asyncio.Event()

    async def handler(j: Job) -> None:
        task = asyncio.current_task()
        assert task is not None
        seen[j.id] = (var.get(None), task.cancelling(), task)
        if j.id in (1, 3):
            var.set(j.id)
        if j.id == 5:
            await gate.wait()  # cancelled here
        if j.id == 7:
            with contextlib.suppress(asyncio.CancelledError):
                await gate.wait()  # cancelled here, and the handler swallows it

    slots = Slots(1)
    executor = AsyncExecutor(1, slots, task_pool(), STATEMENTS, "me", results.append)
    try:
        for i in range(1, 10):
            slots.wait([async_entry(job(i), handler)])
            executor.wake()
            if i in (5, 7):
                await wait_for(partial(seen.__contains__, i))
                assert slots.cancel({i})[0].handle is not None
            await wait_for(ran_count(results, i))
        assert [r.outcome for r in results] == ["done"] * 4 + ["cancelled"] + ["done"] * 4
        assert all(value is None and cancelling == 0 for value, cancelling, _ in seen.values()), seen
        runners = [seen[i][2] for i in range(1, 10)]
        assert runners[0] != runners[1] and runners[1] == runners[2], "a fresh runner after job 1 set the variable"
        assert runners[5] != runners[4] and runners[7] != runners[6], "and after each cancel"
        assert len(executor._runners) == 1
    finally:
        await executor.stop()
    assert not executor._runners, "closing stops the idle runners"


async def test_a_runner_woken_but_cancelled_before_it_ran_does_not_keep_the_others_asleep() -> None:

    results: list[Entry] = []

    async def handler(j: Job) -> None:
        return None

    slots = Slots(2)
    executor = AsyncExecutor(2, slots, task_pool(), STATEMENTS, "me", results.append)
    try:
        await asyncio.sleep(0)  # both runners idle
        slots.wait([async_entry(job(1), handler)])
        executor.wake()  # one runner woken ...
        for t in list(executor._runners):
            t.cancel()  # ... and cancelled before it ran; the slots stay open, so successors start
        await wait_for(lambda: len(results) == 1)
        await asyncio.sleep(0)
        slots.wait([async_entry(job(2), handler)])
        executor.wake()
        await wait_for(lambda: len(results) == 2)
        assert [r.outcome for r in results] == ["done", "done"]
    finally:
        await executor.stop()


async def test_async_jobs_handed_back_at_the_end_of_a_drain_end_their_runners_for_good() -> None:

    results: list[Entry] = []

    async def stuck(j: Job) -> None:
        await asyncio.Event().wait()

    async def cancels_itself(j: Job) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    slots = Slots(2)
    executor = AsyncExecutor(2, slots, task_pool(), STATEMENTS, "me", results.append)
    try:
        slots.wait([async_entry(job(1), cancels_itself)])
        executor.wake()
        await wait_for(lambda: len(results) == 1)
        assert results[0].outcome == "handed_back"
        assert slots.pop(results[0].job) is not None  # the loop collects it: its slot is free again
        await wait_for(lambda: len(executor._runners) == 2)  # a successor keeps the slots served
        slots.wait([async_entry(job(i), stuck) for i in (2, 3)])
        executor.wake()
        await wait_for(lambda: slots.free() == 0)
        slots.shut()  # the drain: nothing new starts, and the grace period is over
        handles = [e.handle for e in slots.entries() if e.handle is not None]
        assert len(handles) == 2
        for h in handles:
            h.cancel()
        await asyncio.wait(handles)
        assert [r.outcome for r in results[1:]] == ["handed_back", "handed_back"]
        assert not executor._runners, "no successor once draining"
    finally:
        await executor.stop()


# ---------------------------------------------------------------------------------------------- executors (the seam)
def make_executors(
    app: App | None = None, handler: Handler | None = None, capacity: int = 2, *, threads: bool = True
) -> tuple[Executors, FakeResults, Wakeup]:
    results, wakeup = FakeResults(), Wakeup()
    scope = Scope(SETTINGS.replace(concurrency=capacity), "me", ("q",))
    executors = Executors(
        scope,
        Router(app, handler),
        results,
        wakeup,
        bound_metrics(capacity=capacity),
        statements=STATEMENTS,
        thread_pool=thread_pool() if threads else None,
    )
    return executors, results, wakeup


async def test_the_executors_admit_runnable_jobs_and_fail_the_rest_with_their_cause() -> None:
    ran: list[int] = []
    app = App()
    app.task(name="known")(lambda j: ran.append(j.id))
    executors, results, _ = make_executors(app)
    try:
        undecodable = job_from_row({"id": 3, "queue": "q", "payload": "[" * 100_000, "attempts": 1,
                                    "max_attempts": 1, "task": "known"})  # fmt: skip
        executors.admit([job(1, task="known"), job(2, task="missing"), undecodable])
        assert [(f.job.id, cause, f.retry) for f, cause in results.failures] == [
            (2, "unknown_task", True),
            (3, "failed", False),
        ]
        await wait_for(lambda: len(results.finished_entries) == 1)
        assert ran == [1] and results.finished_entries[0].outcome == "done"
        assert executors.running() == 0 and executors.free() == 2, "its slot freed before the completer was told"
    finally:
        await executors.close()


async def test_the_executors_free_slots_start_buffered_jobs_and_tell_the_claim_loop() -> None:
    gate = threading.Event()
    handler = Handler("h:f", lambda j: gate.wait(30), False)
    executors, results, wakeup = make_executors(handler=handler, capacity=1)
    try:
        executors.admit([job(1), job(2), job(3)])
        await wait_for(lambda: executors.running() == 1)
        assert executors.waiting() == 2 and [j.id for j in executors.buffered()] == [2, 3]
        assert {j.id for j in executors.jobs()} == {1, 2, 3} and executors.holds(job(2))
        wakeup.freed.clear()
        gate.set()
        await wait_for(lambda: len(results.finished_entries) == 3)
        assert wakeup.freed.is_set(), "the claim loop learns that slots are free"
        assert executors.started == 3 and executors.free() == 1
    finally:
        gate.set()
        await executors.close()


async def test_a_cancel_drops_buffered_jobs_and_tells_the_running_one() -> None:
    gate = threading.Event()
    seen: list[bool] = []

    def handler(j: Job) -> None:
        gate.wait(30)
        seen.append(j.cancelled)

    executors, results, _ = make_executors(handler=Handler("h:f", handler, False), capacity=1)
    try:
        executors.admit([job(1), job(2), job(3)])
        await wait_for(lambda: executors.running() == 1)
        dropped = executors.cancel({1, 2})
        assert [j.id for j in dropped] == [2], "the buffered one never starts; the running one is told"
        gate.set()
        await wait_for(lambda: len(results.finished_entries) == 2)
        assert seen == [True, False] and [e.job.id for e in results.finished_entries] == [1, 3]
    finally:
        gate.set()
        await executors.close()


async def test_a_sync_job_past_its_timeout_is_reported_once_and_its_slot_stays_stuck() -> None:
    gate = threading.Event()
    app = App()
    app.task(name="slow", timeout_seconds=0.05)(lambda j: gate.wait(30))
    executors, results, _ = make_executors(app, capacity=1)
    try:
        executors.admit([job(1, task="slow")])
        executors.start()  # a sync job with a timeout: the loop starts it
        await wait_for(lambda: bool(results.timeouts))
        ((e, stuck),) = results.timeouts
        assert e.job.id == 1 and e.stuck and stuck == 1 == executors.stuck() and executors.free() == 0
        assert executors.jobs() == [], "its job was failed: its lease is no longer renewed"
        gate.set()
        await wait_for(lambda: executors.free() == 1)
        assert len(results.timeouts) == 1
    finally:
        gate.set()
        await executors.close()


async def test_a_drain_hands_back_the_jobs_of_threads_still_running_when_the_grace_period_ends() -> None:
    gate = threading.Event()
    executors, _, _ = make_executors(handler=Handler("h:f", lambda j: gate.wait(30), False), capacity=1)
    try:
        executors.admit([job(1), job(2)])
        await wait_for(lambda: executors.running() == 1)
        executors.shut()
        assert [j.id for j in executors.take_buffer()] == [2]
        await executors.drain(0.05)
        assert [j.id for j in executors.take_abandoned()] == [1] and executors.running() == 0
        assert executors.abandoned == 1 and executors.take_abandoned() == []
    finally:
        gate.set()
        await executors.close()


# ---------------------------------------------------------------------------------------------- leases
def make_leases(store: FakeStore, held: FakeHeld, unwritten: FakeUnwritten, wakeup: Wakeup) -> Leases:
    return Leases(store, SCOPE, bound_metrics(), unwritten, held, wakeup)


async def test_a_heartbeat_that_finds_a_buffered_jobs_lease_lost_removes_it_before_it_starts() -> None:
    store, unwritten, wakeup = FakeStore(), FakeUnwritten(), Wakeup()
    running, buffered, cancelled = job(1), job(2), job(3)
    held = FakeHeld([running], [buffered, cancelled])
    store.held, store.cancelled = {1}, {3}
    leases = make_leases(store, held, unwritten, wakeup)
    await leases.beat()
    assert store.heartbeats == [[1, 2, 3]] and held.renewed, "every held lease renewed, the buffer's included"
    assert held.waiting == [], "never started"
    assert sorted(unwritten.unstarted) == [(2, False), (3, True)], "counted lost, or cancelled"


async def test_recovered_jobs_and_cancels_reach_the_claim_loop_and_the_executors() -> None:
    store, unwritten, wakeup = FakeStore(), FakeUnwritten(), Wakeup()
    held = FakeHeld([job(1)], [job(2)])
    leases = make_leases(store, held, unwritten, wakeup)
    store.recovered = [Recovered(9, "q", "pending", 1)]
    assert await leases.recover() == 1 and wakeup.work.is_set() and wakeup.source == "recovered"
    store.cancelled = {1, 2}
    checking = asyncio.create_task(leases.cancellations())
    wakeup.control()  # a cancel announced on the control channel
    await wait_for(lambda: held.told == {1})
    checking.cancel()
    assert unwritten.cancelled == [2], "the buffered one counted cancelled at once; the running one reports itself"
    assert await leases.release([job(5)]) == 1 and store.released == [[5]] and leases.released == 1


# ---------------------------------------------------------------------------------------------- the shared wake-up
async def test_control_notifications_are_folded_a_burst_into_one_look_a_flood_into_a_few() -> None:
    from skiplock.worker.wakeup import CONTROL_FOLD_SECONDS

    wakeup = Wakeup()
    looks = 0

    async def look() -> None:  # what the leases and the claimer do: wait, clear, look
        nonlocal looks
        while True:
            await wakeup.cancels_changed.wait()
            wakeup.cancels_changed.clear()
            looks += 1

    looking = asyncio.create_task(look())
    wakeup.control()
    await asyncio.sleep(0)
    assert looks == 1, "the first is passed on at once (a cancel takes effect without delay)"
    for _ in range(1000):  # a burst: folded into one more look, at the end of the interval
        wakeup.control()
        await asyncio.sleep(0)
    assert looks == 1
    await asyncio.sleep(CONTROL_FOLD_SECONDS * 1.5)
    assert looks == 2, "the burst's notifications are looked at once, after the interval"
    flood_until = time.monotonic() + CONTROL_FOLD_SECONDS * 4
    while time.monotonic() < flood_until:  # a flood for four intervals: about one look each
        wakeup.control()
        await asyncio.sleep(0.001)
    await asyncio.sleep(CONTROL_FOLD_SECONDS * 1.5)
    assert 3 <= looks <= 2 + 4 + 1, looks
    looking.cancel()


def test_the_wakeup_hurries_only_a_gathering_claim_loop_and_a_second_stop_forces_the_drain() -> None:
    wakeup = Wakeup()
    assert not wakeup.hurry()
    wakeup.gathering(True)
    assert wakeup.hurry() and wakeup.hurried_now and wakeup.freed.is_set() and wakeup.hurried == 1
    assert wakeup.hurry() and wakeup.hurried == 1, "one hurry per gathering"
    wakeup.gathering(False)
    wakeup.claiming(True)
    assert wakeup.hurry(), "a claim in flight: the next one comes soon"
    assert wakeup.stop() and wakeup.stopping.is_set() and wakeup.work.is_set() and not wakeup.forced
    assert not wakeup.hurry(), "draining: nothing waits for a claim"
    assert not wakeup.stop() and wakeup.forced


def test_observing_a_batch_gives_the_histogram_of_observing_each_amount() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from skiplock.metrics import observe_many

    amounts = [0.0, 0.0004, 0.005, 0.005, 0.7, 3.0, 1e9, 0.02]
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("t_seconds", "t", ["queue"], registry=one).labels("q")
    h2 = Histogram("t_seconds", "t", ["queue"], registry=many).labels("q")
    for a in amounts:
        h1.observe(a)
    observe_many(h2, amounts)
    observe_many(h2, [])

    def lines(r: CollectorRegistry) -> list[str]:
        return [x for x in generate_latest(r).decode().splitlines() if not x.startswith("t_seconds_created")]

    assert lines(one) == lines(many) and 't_seconds_count{queue="q"} 8.0' in lines(many)


def test_the_tally_applies_its_counts_before_any_read_of_the_registry_and_once_enough_amounts_wait() -> None:
    from prometheus_client import CollectorRegistry

    from skiplock.metrics import WorkerMetrics

    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    bound = m.describe_worker(["a", "b"], 1, "t")

    def count(metric: Any, suffix: str, **labels: str) -> float | None:  # read without a flush: its own collect
        samples = (s for f in metric.collect() for s in f.samples)
        return next((s.value for s in samples if s.labels == labels and s.name.endswith(suffix)), None)

    m.tally.add(counts=[(bound["a"].claimed, 3), (bound["b"].claimed, 2), (bound["a"].claimed, 1)])
    m.tally.add(amounts=[(bound["a"].duration, [0.1, 0.2]), (bound["b"].wait, [5.0])])
    assert count(m.jobs_claimed, "_total", queue="a") == 0, "held until the registry is read"
    assert registry.get_sample_value("skiplock_jobs_claimed_total", {"queue": "a"}) == 4
    assert registry.get_sample_value("skiplock_jobs_claimed_total", {"queue": "b"}) == 2
    assert registry.get_sample_value("skiplock_job_duration_seconds_count", {"queue": "a"}) == 2
    assert registry.get_sample_value("skiplock_job_duration_seconds_sum", {"queue": "a"}) == pytest.approx(0.3)
    assert registry.get_sample_value("skiplock_job_wait_seconds_count", {"queue": "b"}) == 1
    m.tally.FLUSH_AT = 3  # bounded memory when nobody scrapes: applied once that many amounts wait
    m.tally.add(amounts=[(bound["b"].duration, [1.0, 2.0])])
    assert count(m.job_duration, "_count", queue="b") == 0
    m.tally.add(amounts=[(bound["b"].duration, [3.0])])
    assert count(m.job_duration, "_count", queue="b") == 3


def test_a_payload_decodes_to_what_json_gives_big_integers_and_odd_numbers_included() -> None:
    import json

    from skiplock.job import decode_payload

    texts = [
        '{"n": 1, "s": "\\u00e9", "l": [1.5, null, true]}',
        "123456789012345678901234567890",  # past 64 bits: an int, never a float
        '{"id": 98765432109876543210}',
        '"12345678901234567890 in a string"',
        "1e400",  # jsonb keeps it; json reads inf
        '"\\ud800"',  # a lone surrogate
        "[" * 300 + "]" * 300,
    ]
    for text in texts:
        value, error = decode_payload(text)
        assert error is None and value == json.loads(text) and type(value) is type(json.loads(text)), text
    assert decode_payload('{"n": 9223372036854775808}')[0]["n"] == 2**63, "one past int64 stays exact"
    assert decode_payload("nope") == (None, "PayloadError: payload cannot be decoded: JSONDecodeError")
