"""The wait-time target's math (pure): replicas from arrivals, service time, backlog and due-soon work."""

from __future__ import annotations

import pytest

from skiplock_operator import scaling, waittarget
from skiplock_operator.scaling import Observation, ScalingSpec, decide
from skiplock_operator.waittarget import Estimator, Load

WAIT = ScalingSpec(target_wait_seconds=30, pod_startup_seconds=10, max_replicas=50)


def test_keep_up_is_littles_law_plus_headroom() -> None:
    load = Load(arrival_rate=50, service_seconds=2)  # 100 slots busy on average, 120 with headroom
    assert waittarget.slots(0, 0, load, 30, 10) == pytest.approx(120)
    assert waittarget.replicas(0, 0, load, 30, 10, concurrency=10) == 12


def test_the_backlog_is_cleared_in_the_target_minus_the_pod_start_up() -> None:
    load = Load(arrival_rate=0, service_seconds=1)
    assert waittarget.slots(400, 0, load, 30, 10) == pytest.approx(20)  # 400 job-seconds in 20 s
    assert waittarget.slots(400, 0, load, 5, 10) == pytest.approx(400)  # a target below start-up: one job each


def test_jobs_in_flight_keep_their_slots() -> None:
    assert waittarget.replicas(0, 35, Load(), 30, 10, concurrency=10) == 4


def test_predicted_wait() -> None:
    load = Load(arrival_rate=5, service_seconds=2)  # 10 slots keep up
    assert waittarget.predicted_wait(0, 3, load, 2, 10) == 0.0
    assert waittarget.predicted_wait(100, 20, load, 2, 10) == pytest.approx(100 * 2 / 10)
    assert waittarget.predicted_wait(100, 10, load, 1, 10) is None  # cannot keep up
    assert waittarget.predicted_wait(5, 0, Load(), 0, 10) is None
    assert waittarget.predicted_wait(0, 0, Load(), 0, 10) == 0.0


def test_the_estimator_reads_rate_and_service_time_from_poll_counts() -> None:
    e = Estimator(window=15)
    e.observe(0.0, 0, 0, 0)  # starts the clock
    for t in range(5, 20, 5):
        e.observe(float(t), arrived=50, done=50, processing=20)  # 10/s in, 10/s out, 20 in flight: 2 s each
    load = e.load(15.0, due_soon=3)
    assert load.arrival_rate == pytest.approx(10)
    assert load.service_seconds == pytest.approx(2)
    assert load.due_soon == 3


def test_due_soon_work_starts_a_worker_at_zero() -> None:
    obs = Observation(ready=0, load=Load(due_soon=1))
    d = decide(obs, 0, WAIT, concurrency=10, now=0.0)
    assert (d.replicas, d.reason) == (1, scaling.DUE_SOON)
    backlog_mode = decide(obs, 0, ScalingSpec(), concurrency=10, now=0.0)
    assert backlog_mode.replicas == 0  # backlog mode does not pre-scale


def test_wait_mode_scales_on_the_target_not_the_backlog_per_replica() -> None:
    obs = Observation(ready=200, load=Load(arrival_rate=0, service_seconds=0.1))
    d = decide(obs, 1, WAIT, concurrency=10, now=0.0)  # 20 job-seconds in 20 s: one slot, one replica
    assert d.replicas == 1
    assert decide(obs, 1, ScalingSpec(max_replicas=50), concurrency=10, now=0.0).replicas == 20
