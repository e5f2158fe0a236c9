"""The scaling policy as tables: backlog in, replicas and reason out (no clock, no I/O)."""

from __future__ import annotations

import pytest

from skiplock_operator import scaling
from skiplock_operator.scaling import Decision, Observation, Recommendation, ScalingSpec, decide

SPEC = ScalingSpec(min_replicas=0, max_replicas=10, target_backlog_per_replica=10, scale_down_stabilization_seconds=60)


@pytest.mark.parametrize(
    ("ready", "processing", "current", "spec", "replicas", "reason"),
    [
        (0, 0, 0, SPEC, 0, scaling.STEADY),
        (1, 0, 0, SPEC, 1, scaling.ACTIVATED),
        (35, 0, 0, SPEC, 4, scaling.ACTIVATED),
        (35, 0, 2, SPEC, 4, scaling.BACKLOG_GREW),
        (500, 0, 2, SPEC, 10, scaling.BACKLOG_GREW),  # clamped to max
        (4, 0, 0, ScalingSpec(activation_backlog=5), 0, scaling.BELOW_ACTIVATION),
        (5, 0, 0, ScalingSpec(activation_backlog=5), 1, scaling.ACTIVATED),
        (0, 0, 0, ScalingSpec(min_replicas=2), 2, scaling.MIN_REPLICAS),
        (0, 3, 1, SPEC, 1, scaling.STEADY),  # in-flight work keeps one worker
        (10, 0, 1, SPEC, 1, scaling.STEADY),
        (11, 0, 1, SPEC, 2, scaling.BACKLOG_GREW),
    ],
)
def test_decision_table(
    ready: int, processing: int, current: int, spec: ScalingSpec, replicas: int, reason: str
) -> None:
    d = decide(Observation(ready, processing), current, spec, concurrency=10, now=0.0)
    assert (d.replicas, d.reason) == (replicas, reason)


def test_scale_up_is_immediate_and_scale_down_waits_for_the_window() -> None:
    history: tuple[Recommendation, ...] = ()
    d = decide(Observation(80), 1, SPEC, concurrency=10, now=0.0, history=history)
    assert d.replicas == 8 and d.changed
    d = decide(Observation(0), 8, SPEC, concurrency=10, now=10.0, history=d.history)
    assert (d.replicas, d.reason) == (8, scaling.STABILIZING)
    d = decide(Observation(0), 8, SPEC, concurrency=10, now=59.0, history=d.history)
    assert d.replicas == 8
    d = decide(Observation(0), 8, SPEC, concurrency=10, now=61.0, history=d.history)
    assert (d.replicas, d.reason) == (0, scaling.BACKLOG_SHRANK)


def test_scale_down_goes_to_the_highest_recommendation_of_the_window() -> None:
    d = decide(Observation(60), 6, SPEC, concurrency=10, now=0.0)
    d = decide(Observation(30), 6, SPEC, concurrency=10, now=30.0, history=d.history)
    d = decide(Observation(0), 6, SPEC, concurrency=10, now=61.0, history=d.history)
    assert (d.replicas, d.reason) == (3, scaling.BACKLOG_SHRANK)  # 30 s ago the backlog asked for 3


def test_oldest_ready_age_adds_a_replica_per_poll() -> None:
    spec = ScalingSpec(target_backlog_per_replica=100, max_oldest_ready_age_seconds=30, max_replicas=3)
    d = decide(Observation(50, 10, oldest_ready_age_seconds=45), 1, spec, concurrency=10, now=0.0)
    assert (d.replicas, d.reason) == (2, scaling.OLDEST_READY_AGE)
    d = decide(Observation(50, 20, oldest_ready_age_seconds=50), 2, spec, concurrency=10, now=5.0, history=d.history)
    assert d.replicas == 3
    d = decide(Observation(50, 30, oldest_ready_age_seconds=55), 3, spec, concurrency=10, now=10.0, history=d.history)
    assert d.replicas == 3  # never above maxReplicas


def test_connection_budget_caps_and_says_so() -> None:
    spec = ScalingSpec(max_replicas=20, connection_budget=51)  # 51 // (10 + 7) = 3
    d = decide(Observation(1000), 1, spec, concurrency=10, now=0.0)
    assert d.replicas == 3 and d.budget_limited and "connectionBudget" in d.message
    assert scaling.budget_cap(spec, 10) == 3 and scaling.budget_cap(SPEC, 10) is None


def test_a_lowered_limit_applies_at_once() -> None:
    d = decide(Observation(1000), 8, ScalingSpec(max_replicas=4), concurrency=10, now=0.0)
    assert (d.replicas, d.reason) == (4, scaling.MAX_REPLICAS)
    # 51 // (10 + 7) = 3
    d = decide(Observation(1000), 8, ScalingSpec(max_replicas=20, connection_budget=51), concurrency=10, now=0.0)
    assert (d.replicas, d.reason) == (3, scaling.CONNECTION_BUDGET)


def test_paused_leaves_replicas_alone() -> None:
    d = decide(Observation(1000), 2, SPEC, concurrency=10, now=0.0, paused=True)
    assert d == Decision(2, 2, scaling.PAUSED, d.message, history=())
    assert not d.changed


def test_every_reason_is_camel_case() -> None:
    assert all(r[0].isupper() and r.isalpha() for r in scaling.REASONS)


def test_the_budget_is_one_cap_per_server_that_a_spec_can_only_lower() -> None:
    from skiplock_operator.scaling import connection_budget

    # 80 % of 100 minus 3 reserved = 77; less 2 of the operator's own and 26 held by another JobQueue: 49
    shared = connection_budget(0, (100, 3), 20, operator_connections=2, others=26)
    assert (shared.connections, shared.replicas) == (49, 1)
    assert "2 held by the operator and 26 by other JobQueues' workers" in shared.origin
    lower = connection_budget(30, (100, 3), 20, operator_connections=2, others=26)
    assert (lower.connections, lower.origin) == (30, "spec.scaling.connectionBudget 30")
    higher = connection_budget(100_000, (100, 3), 20, operator_connections=2, others=26)
    assert higher.connections == 49 and "capped by the server" in higher.origin
    assert connection_budget(0, (100, 3), 20, others=500).replicas == 0  # nothing left: no replica
