"""Pure replica math: backlog in, desired replicas out (no I/O, no clocks; ``now`` is passed in).

The policy, in order: ``ceil(ready / targetBacklogPerReplica)`` (or, with ``targetWaitSeconds``, the replicas
:mod:`skiplock_operator.waittarget` derives from the arrival rate, service time, backlog and due-soon work),
but never fewer replicas than the jobs in flight keep busy (``ceil(processing / concurrency)``); stay at zero
until the ready backlog reaches the activation threshold; one more replica than now when the oldest ready job
waited longer than ``maxOldestReadyAgeSeconds``; clamp to [min, max]; cap by the connection budget. Scale-ups
apply at once; a scale-down applies only when every recommendation of the stabilization window agrees (the
highest one wins, as the HPA does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from skiplock.settings import WORKER_EXTRA_CONNECTIONS
from skiplock_operator import waittarget

DEFAULT_BUDGET_PERCENT = 80
"""``connectionBudget: 0`` means this share of the server's max_connections, minus its reserved connections."""
WORKER_CONNECTION_OVERHEAD = WORKER_EXTRA_CONNECTIONS
"""Connections one worker holds besides one per concurrent job: control pool, LISTEN and the metrics scrape."""

# Decision reasons (also the Kubernetes Event reasons of scale changes): CamelCase, a bounded set.
ACTIVATED = "Activated"
BACKLOG_GREW = "BacklogGrew"
OLDEST_READY_AGE = "OldestReadyAge"
MIN_REPLICAS = "MinReplicas"
BACKLOG_SHRANK = "BacklogShrank"
MAX_REPLICAS = "MaxReplicas"
CONNECTION_BUDGET = "ConnectionBudget"
STABILIZING = "Stabilizing"
BELOW_ACTIVATION = "BelowActivation"
STEADY = "Steady"
PAUSED = "Paused"
WAIT_TARGET = "WaitTarget"
DUE_SOON = "DueSoon"
REASONS = (
    WAIT_TARGET,
    DUE_SOON,
    ACTIVATED,
    BACKLOG_GREW,
    OLDEST_READY_AGE,
    MIN_REPLICAS,
    BACKLOG_SHRANK,
    MAX_REPLICAS,
    CONNECTION_BUDGET,
    STABILIZING,
    BELOW_ACTIVATION,
    STEADY,
    PAUSED,
)


@dataclass(frozen=True)
class ScalingSpec:
    """``spec.scaling`` of a JobQueue (defaults equal the CRD's; a unit test checks it)."""

    enabled: bool = True
    min_replicas: int = 0
    max_replicas: int = 10
    target_backlog_per_replica: int = 10
    activation_backlog: int = 1
    max_oldest_ready_age_seconds: float = 0.0
    scale_down_stabilization_seconds: float = 60.0
    polling_interval_seconds: float = 5.0
    connection_budget: int = 0
    scale_in_drain_seconds: float = 300.0
    """Longest wait for the pods chosen to go to finish their jobs before replicas drop (0: no wait, no drain)."""
    target_wait_seconds: float = 0.0
    """Wait-time target (0: backlog mode, ``targetBacklogPerReplica``); see :mod:`skiplock_operator.waittarget`."""
    pod_startup_seconds: float = 15.0
    """How long a new worker pod takes to claim; the wait target budgets for it and pre-scales this far ahead."""

    @property
    def wait_mode(self) -> bool:
        return self.target_wait_seconds > 0


@dataclass(frozen=True)
class Budget:
    """The connection budget in force: ``spec.scaling.connectionBudget``, or (0) the server's default."""

    connections: int
    origin: str
    replicas: int
    """Most replicas it allows (connections // (concurrency + overhead)); 0 connections left allow none."""

    def status(self) -> dict[str, object]:
        return {"connections": self.connections, "maxReplicas": self.replicas, "source": self.origin}


def connection_budget(
    spec_budget: int,
    limits: tuple[int, int] | None,
    concurrency: int,
    *,
    operator_connections: int = 0,
    others: int = 0,
) -> Budget:
    """The connections this JobQueue's workers may hold. The server's share is DEFAULT_BUDGET_PERCENT % of its
    ``max_connections`` minus ``superuser_reserved_connections`` (``limits``), less the operator's own connections
    to that server and what the other JobQueues' workers on it hold (``others``): one cap per database server,
    across JobQueues. ``connectionBudget`` > 0 can only lower it. Without ``limits`` (not read), the spec's
    budget as written."""
    per = connections_per_replica(concurrency)
    written = f"spec.scaling.connectionBudget {spec_budget}"
    if limits is None:
        return Budget(spec_budget, written, spec_budget // per)
    max_connections, reserved = limits
    share = max(0, max_connections * DEFAULT_BUDGET_PERCENT // 100 - reserved)
    free = max(0, share - operator_connections - others)
    origin = f"{DEFAULT_BUDGET_PERCENT} % of the server's max_connections {max_connections} minus {reserved} reserved"
    if operator_connections or others:
        origin += f", less {operator_connections} held by the operator and {others} by other JobQueues' workers"
    if 0 < spec_budget <= free:
        return Budget(spec_budget, written, spec_budget // per)
    origin = f"{written}, capped by the server: {origin}" if spec_budget else f"connectionBudget 0: {origin}"
    return Budget(free, origin, free // per)


@dataclass(frozen=True)
class Observation:
    """What one stats query saw for one queue."""

    ready: int
    processing: int = 0
    oldest_ready_age_seconds: float = 0.0
    load: waittarget.Load = field(default_factory=waittarget.Load)
    """Arrival rate, service time and due-soon work (read in wait-target mode only)."""


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class Decision:
    current: int
    replicas: int
    reason: str
    message: str
    budget_limited: bool = False
    history: tuple[Recommendation, ...] = field(default=(), repr=False)

    @property
    def changed(self) -> bool:
        return self.replicas != self.current


def connections_per_replica(concurrency: int) -> int:
    return concurrency + WORKER_CONNECTION_OVERHEAD


def budget_cap(spec: ScalingSpec, concurrency: int) -> int | None:
    """Most replicas the connection budget allows, or None when there is no budget."""
    if spec.connection_budget <= 0:
        return None
    return spec.connection_budget // connections_per_replica(concurrency)


def demand(obs: Observation, current: int, spec: ScalingSpec, concurrency: int) -> tuple[int, bool]:
    """Replicas the backlog asks for before clamping, and whether the oldest-age rule forced it.

    The ready backlog asks for ``ceil(ready / target)``; the jobs in flight for the replicas busy with
    them, ``ceil(processing / concurrency)``. Without that floor a steady load that keeps the ready
    backlog near zero would scale down, build a backlog, scale up, and flap.
    """
    if spec.wait_mode:
        target, startup = spec.target_wait_seconds, spec.pod_startup_seconds
        wanted = waittarget.replicas(obs.ready, obs.processing, obs.load, target, startup, concurrency, current)
    else:
        wanted = max(math.ceil(obs.ready / spec.target_backlog_per_replica), math.ceil(obs.processing / concurrency))
    due_soon = obs.load.due_soon if spec.wait_mode else 0
    if current == 0 and obs.processing == 0 and obs.ready < spec.activation_backlog and not due_soon:
        wanted = 0
    age_limit = spec.max_oldest_ready_age_seconds
    if age_limit > 0 and obs.ready > 0 and obs.oldest_ready_age_seconds > age_limit and current + 1 > wanted:
        return current + 1, True
    return wanted, False


def decide(
    obs: Observation,
    current: int,
    spec: ScalingSpec,
    *,
    concurrency: int,
    now: float,
    history: tuple[Recommendation, ...] = (),
    paused: bool = False,
    budget_origin: str = "",
) -> Decision:
    """Desired replicas for one poll; ``history`` is the previous decision's, passed back in."""
    if paused:
        return Decision(current, current, PAUSED, "spec.paused is true: replicas are left alone", history=history)
    wanted, aged = demand(obs, current, spec, concurrency)
    desired = min(spec.max_replicas, max(spec.min_replicas, wanted))
    cap = budget_cap(spec, concurrency)
    limited = cap is not None and desired > cap
    if cap is not None:
        desired = min(desired, cap)
    window_start = now - spec.scale_down_stabilization_seconds
    kept = (*tuple(r for r in history if r.at > window_start), Recommendation(now, desired))
    budget_note = (
        f"; capped at {cap} by the connection budget of {spec.connection_budget} connections "
        f"({budget_origin or 'spec.scaling.connectionBudget'}; {connections_per_replica(concurrency)} per replica)"
        if limited
        else ""
    )
    seen = f"ready={obs.ready} processing={obs.processing} oldestReadyAge={obs.oldest_ready_age_seconds:.0f}s"
    if spec.wait_mode:
        load = obs.load
        seen += (
            f" arrivals={load.arrival_rate:.2f}/s service={load.service_seconds:.2f}s dueSoon={load.due_soon}"
            f" targetWait={spec.target_wait_seconds:g}s"
        )

    if desired > current:
        if spec.wait_mode and obs.load.due_soon and obs.ready < spec.activation_backlog:
            reason = DUE_SOON
        elif current == 0 and desired > 0 and wanted > 0 and obs.ready >= spec.activation_backlog:
            reason = ACTIVATED
        elif aged:
            reason = OLDEST_READY_AGE
        elif wanted < spec.min_replicas:
            reason = MIN_REPLICAS
        else:
            reason = WAIT_TARGET if spec.wait_mode else BACKLOG_GREW
        return Decision(current, desired, reason, f"scale {current} -> {desired}: {seen}{budget_note}", limited, kept)

    if desired < current:
        hard_limit = min(spec.max_replicas, cap if cap is not None else spec.max_replicas)
        if current > hard_limit:  # a lowered maxReplicas or budget applies at once
            reason = CONNECTION_BUDGET if cap is not None and cap < spec.max_replicas else MAX_REPLICAS
            target = max(desired, min(hard_limit, max(r.replicas for r in kept)))
            return Decision(current, target, reason, f"scale {current} -> {target}: {seen}{budget_note}", limited, kept)
        held = max(r.replicas for r in kept)
        if held < current:
            return Decision(current, held, BACKLOG_SHRANK, f"scale {current} -> {held}: {seen}", limited, kept)
        window = spec.scale_down_stabilization_seconds
        return Decision(
            current,
            current,
            STABILIZING,
            f"{desired} replicas would do; holding {current} for the {window:.0f}s stabilization window: {seen}",
            limited,
            kept,
        )

    if current == 0 and obs.ready > 0:
        return Decision(
            current,
            0,
            BELOW_ACTIVATION,
            f"ready backlog {obs.ready} is below activationBacklog {spec.activation_backlog}",
            limited,
            kept,
        )
    return Decision(current, current, STEADY, f"{current} replicas: {seen}{budget_note}", limited, kept)
