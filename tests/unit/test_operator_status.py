"""Conditions: standard shape, positive types, lastTransitionTime moves only on a flip."""

from __future__ import annotations

from datetime import UTC, datetime

from skiplock_operator import status

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 12, 5, 0, tzinfo=UTC)


def test_new_condition_has_the_standard_shape() -> None:
    conds = status.set_condition([], status.READY, True, status.RECONCILED, "ok", now=T0, observed_generation=3)
    assert conds == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "ok",
            "lastTransitionTime": "2026-01-01T12:00:00Z",
            "observedGeneration": 3,
        }
    ]


def test_transition_time_moves_only_on_a_flip() -> None:
    conds = status.set_condition([], status.DATABASE_REACHABLE, True, status.CONNECTED, "ok", now=T0)
    same = status.set_condition(conds, status.DATABASE_REACHABLE, True, status.CONNECTED, "still ok", now=T1)
    assert same[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z" and same[0]["message"] == "still ok"
    flipped = status.set_condition(same, status.DATABASE_REACHABLE, False, status.CONNECT_FAILED, "down", now=T1)
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z" and flipped[0]["status"] == "False"


def test_other_conditions_are_kept_in_order_and_messages_bounded() -> None:
    conds = status.set_condition([], status.READY, True, status.RECONCILED, "a", now=T0)
    conds = status.set_condition(conds, status.SCALING_ACTIVE, True, status.BACKLOG_POLLED, "b", now=T0)
    conds = status.set_condition(conds, status.READY, False, status.INVALID_SPEC, "x" * 5000, now=T1)
    assert [c["type"] for c in conds] == ["Ready", "ScalingActive"]
    assert len(conds[0]["message"]) == status.MAX_MESSAGE
    assert status.is_true(conds, status.SCALING_ACTIVE) and not status.is_true(conds, status.READY)
    assert status.get_condition(conds, status.SCHEMA_READY) is None


def test_types_and_reasons_are_camel_case() -> None:
    words = [v for k, v in vars(status).items() if k.isupper() and isinstance(v, str)]
    assert words and all(w[0].isupper() and w.isalpha() for w in words)


def test_observed_generation_is_kept_when_not_given() -> None:
    conds = status.set_condition([], status.READY, True, status.RECONCILED, "a", now=T0, observed_generation=4)
    conds = status.set_condition(conds, status.READY, True, status.RECONCILED, "b", now=T1)
    assert conds[0]["observedGeneration"] == 4


def test_status_changes_sends_only_what_differs() -> None:
    from skiplock_operator.runtime import status_changes

    ready = (status.READY, True, status.RECONCILED, "ok")
    old = {"desiredReplicas": 2, "conditions": status.set_condition([], *ready)}
    assert status_changes(old, {"desiredReplicas": 2}, (ready,), None) == {}
    changed = status_changes(old, {"desiredReplicas": 3}, ((status.READY, False, status.INVALID_SPEC, "bad"),), None)
    assert changed["desiredReplicas"] == 3 and changed["conditions"][0]["status"] == "False"


def test_only_changed_conditions_post_events() -> None:
    from skiplock_operator.runtime import transitions

    old = [
        {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "a"},
        {"type": "DatabaseReachable", "status": "True", "reason": "Connected", "message": "b"},
    ]
    same = (("Ready", True, "Reconciled", "another message"),)
    assert transitions(old, same) == []
    flipped = ("DatabaseReachable", False, "ConnectRefused", "x")
    new_reason = ("Ready", True, "Other", "y")
    added = ("ScalingActive", False, "ManualReplicas", "z")
    assert transitions(old, (flipped, new_reason, added)) == [flipped, new_reason, added]


def test_ownership_is_the_controller_reference() -> None:
    from skiplock_operator.workload import controller_uid

    assert controller_uid({"metadata": {}}) is None
    refs = [{"uid": "a", "controller": False}, {"uid": "b", "controller": True}]
    assert controller_uid({"metadata": {"ownerReferences": refs}}) == "b"
