"""Condition types, reasons and the pure ``set_condition`` (``lastTransitionTime`` moves only on a flip)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from skiplock_operator.database import REASONS

# Condition types: positive, so True is good.
READY = "Ready"
DATABASE_REACHABLE = "DatabaseReachable"
SCHEMA_READY = "SchemaReady"
SCALING_ACTIVE = "ScalingActive"
QUEUES_ACTIVE = "QueuesActive"
"""True while no served queue is paused in the database (spec.paused, or `skiplock pause` by hand)."""
CONDITION_TYPES = (READY, DATABASE_REACHABLE, SCHEMA_READY, SCALING_ACTIVE, QUEUES_ACTIVE)

# Reasons (CamelCase constants).
RECONCILED = "Reconciled"
INVALID_SPEC = "InvalidSpec"
SECRET_NOT_FOUND = "SecretNotFound"
CONNECTED = "Connected"
CONNECT_FAILED = "ConnectFailed"
MIGRATED = "Migrated"
MIGRATION_PENDING = "MigrationPending"
BACKLOG_POLLED = "BacklogPolled"
CONNECTION_BUDGET_LIMITED = "ConnectionBudgetLimited"
AUTOSCALING_DISABLED = "AutoscalingDisabled"
PAUSED = "Paused"
CLAIMING = "Claiming"
PAUSED_BY_COMMAND = "PausedByCommand"
DEPLOYMENT_MISSING = "DeploymentMissing"
DEPLOYMENT_CONFLICT = "DeploymentConflict"
SECRET_NOT_OPTED_IN = "SecretNotOptedIn"
POLICY_VIOLATION = "PolicyViolation"
MANUAL_REPLICAS = "ManualReplicas"
# Database reasons: the classified ones of skiplock_operator.database (DSNInvalid, ConnectRefused, ...).

WARNING_REASONS = frozenset(
    {
        INVALID_SPEC,
        SECRET_NOT_FOUND,
        SECRET_NOT_OPTED_IN,
        POLICY_VIOLATION,
        DEPLOYMENT_CONFLICT,
        CONNECT_FAILED,
        MIGRATION_PENDING,
        *REASONS,
    }
)
"""Reasons of error conditions: a condition turning to one of them posts a Warning Event (else Normal)."""

MAX_MESSAGE = 1024


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: datetime | None = None,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new conditions list with ``type_`` set; the others are kept as they were, in order."""
    word = "True" if status else "False"
    message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions or ():
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        flipped = cond.get("status") != word
        new = {
            "type": type_,
            "status": word,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso(now)
            if flipped or not cond.get("lastTransitionTime")
            else cond["lastTransitionTime"],
        }
        if observed_generation is not None:
            new["observedGeneration"] = observed_generation
        elif "observedGeneration" in cond:
            new["observedGeneration"] = cond["observedGeneration"]
        out.append(new)
    if not found:
        new = {
            "type": type_,
            "status": word,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso(now),
        }
        if observed_generation is not None:
            new["observedGeneration"] = observed_generation
        out.append(new)
    return out


def get_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return bool(cond and cond.get("status") == "True")
