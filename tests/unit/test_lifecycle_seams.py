"""The lifecycle parts of the worker seams alone (no database): slots told of a cancel, stuck slots, the timeout
a job runs under, Snooze's bounds and the retention lock key."""

from __future__ import annotations

import asyncio

import pytest

from skiplock import Job, Snooze
from skiplock.app import App
from skiplock.worker.executor import Entry, Router, Slots, Target, is_timeout, timed_out_error, timeout_for


def job(job_id: int, **kw: object) -> Job:
    return Job(id=job_id, queue="q", payload={}, attempts=1, max_attempts=3, **kw)  # type: ignore[arg-type]


def entry(j: Job) -> Entry:
    return Entry(j, Target(lambda job: None, False), 0.0)


async def test_slots_tell_only_the_named_running_jobs_and_cancel_async_ones():
    slots = Slots(4)
    a, b = slots.add(entry(job(1))), slots.add(entry(job(2)))
    a.handle = asyncio.create_task(asyncio.sleep(60))
    hit = slots.cancel({1, 99})
    assert hit == [a] and a.cancelled and not b.cancelled
    with pytest.raises(asyncio.CancelledError):
        await a.handle
    assert slots.cancel({1}) == [], "told once"
    seen = job(1).with_conn(None, a)
    assert seen.cancelled and not job(1).cancelled, "job.cancelled reads the slot's event"


def test_a_stuck_slot_stays_taken_but_its_lease_is_no_longer_renewed():
    slots = Slots(2)
    first = slots.add(entry(job(1)))
    slots.add(entry(job(2)))
    first.stuck = True
    assert slots.free() == 0 and slots.stuck() == 1
    assert [j.id for j in slots.jobs()] == [2] and not slots.holds(job(1))
    assert slots.get(job(1)) is first and slots.pop(job(1)) is first and slots.free() == 1


def test_a_jobs_own_timeout_beats_its_tasks():
    app = App()

    @app.task(name="t", timeout_seconds=30)
    def t(j):
        pass

    target = Router(app, None).targets["t"]
    assert timeout_for(job(1, task="t"), target) == 30
    assert timeout_for(job(1, task="t", timeout_seconds=5), target) == 5
    assert timeout_for(job(1), Target(lambda j: None, False)) is None
    assert Router(app, None).timeouts() == {"t": 30}
    err = timed_out_error(5)
    assert is_timeout(err) and str(err) == "the handler ran past its timeout of 5s" and not is_timeout(TimeoutError())


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "5"])
def test_snooze_takes_a_bounded_number_of_seconds(bad):
    assert Snooze(0).seconds == 0 and Snooze(2.5).seconds == 2.5
    with pytest.raises(ValueError, match="Snooze"):
        Snooze(bad)  # type: ignore[arg-type]
