"""Busy-pod-safe scale-in: the pods to remove are the ones holding the least, and they stop claiming first.

Before the autoscaler lowers a worker Deployment's replicas, this module ranks the Deployment's pods by the
jobs they hold (the jobs table says which worker id holds what and since when; a worker id starts with its pod's
name) and sets ``controller.kubernetes.io/pod-deletion-cost`` on each, lowest on the pods chosen to go, so the
ReplicaSet deletes those. Because that annotation is best effort, the chosen pods are also asked, through the
database (``skiplock.worker.drain``), to stop claiming, and the replicas are lowered only once they hold nothing,
or after ``spec.scaling.scaleInDrainSeconds``. The target itself never drops below what running work needs (the
autoscaler's ``ceil(processing / concurrency)`` floor). A backlog that grows back during the wait withdraws the
request. Status (``status.scaleIn``) and Events say which pods were drained and why.

Ranking and messages are pure; :class:`ScaleIn` does the I/O for one JobQueue's autoscaler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from skiplock_operator import resources, status
from skiplock_operator.spec import JobQueueSpec

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LEAVING_COST = -(2**31)
"""The pods chosen to go: the lowest cost there is, so the ReplicaSet deletes them before any other."""
JOB_COST = 100_000
"""Cost of one held job; the seconds of work held (up to JOB_COST - 1) break ties: less invested goes first."""
MAX_COST = 2**31 - 1
DRAINING = "Draining"
SCALED_IN = "ScaledIn"
DRAIN_WITHDRAWN = "DrainWithdrawn"
REASONS = (DRAINING, SCALED_IN, DRAIN_WITHDRAWN)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodLoad:
    pod: str
    jobs: int = 0
    held_seconds: float = 0.0
    """Seconds since its oldest held job was claimed."""


HOSTNAME_MAX = 63
"""A pod's host name is its name cut to this length; a worker's default id starts with its host name."""


def held_by(pod: str, holdings: Mapping[str, tuple[int, float]]) -> tuple[int, float]:
    """What ``pod`` holds: the worker ids starting with its name (or with its host name, the name cut to 63)."""
    return holdings.get(pod) or holdings.get(pod[:HOSTNAME_MAX]) or (0, 0.0)


def drain_key(pod: str) -> str:
    """The name a drain request of ``pod`` goes under: its host name, which its workers' ids start with."""
    return pod[:HOSTNAME_MAX]


def loads_of(pods: Sequence[str], holdings: Mapping[str, tuple[int, float]]) -> list[PodLoad]:
    return [PodLoad(p, *held_by(p, holdings)) for p in pods]


def ranked(loads: Sequence[PodLoad]) -> list[PodLoad]:
    """First to go first: fewest jobs held, then least work invested, then by name (stable)."""
    return sorted(loads, key=lambda x: (x.jobs, x.held_seconds, x.pod))


def deletion_cost(load: PodLoad) -> int:
    return min(MAX_COST, load.jobs * JOB_COST + min(JOB_COST - 1, int(load.held_seconds)))


def choose(loads: Sequence[PodLoad], remove: int) -> list[PodLoad]:
    return ranked(loads)[: max(0, remove)]


def describe(loads: Sequence[PodLoad]) -> str:
    """``a (idle), b (2 jobs, 41 s)``."""
    return ", ".join(
        f"{x.pod} (idle)"
        if not x.jobs
        else f"{x.pod} ({x.jobs} job{'s' if x.jobs > 1 else ''}, {x.held_seconds:.0f} s)"
        for x in loads
    )


@dataclass(frozen=True)
class Drain:
    current: int
    target: int
    pods: tuple[PodLoad, ...]
    started: float
    since: str


@dataclass(frozen=True)
class Verdict:
    """What the autoscaler does this poll: the replicas to set, and what the status says about scale-in."""

    replicas: int
    report: dict[str, Any] | None = None


class ScaleIn:
    """Scale-in of one JobQueue (owned by its autoscaler; the drain in progress lives here)."""

    def __init__(self, rt: Any, key: tuple[str, str], body: kopf.Body, logger: logging.Logger | Any) -> None:
        self.rt, self.key, self.body, self.logger = rt, key, body, logger
        self.drain: Drain | None = None
        self.fresh = True  # requests of an earlier operator run are withdrawn at the first poll
        self.leftover = False  # requests of pods scaled away, withdrawn once the pods are gone

    @property
    def prefix(self) -> str:
        return resources.deployment_name(self.key[1]) + "-"

    async def step(self, spec: JobQueueSpec, dsn: str, current: int, wanted: int) -> Verdict:
        """``wanted`` is the autoscaler's decision; the replicas to set now come back (``current`` to hold)."""
        if self.drain is not None:
            return await self._follow(spec, dsn, current, wanted, self.drain)
        if self.fresh or self.leftover:
            await self._tidy(spec, dsn)
        if wanted >= current:
            return Verdict(wanted)
        return await self._start(spec, dsn, current, wanted)

    async def cancel(self, spec: JobQueueSpec, dsn: str, why: str) -> None:
        """Withdraw a drain in progress (the backlog grew back, autoscaling turned off, ...)."""
        drain, self.drain = self.drain, None
        if drain is None:
            return
        await self.rt.databases.set_draining(self.key, dsn, spec.schema, [drain_key(p.pod) for p in drain.pods], False)
        message = f"drain of {', '.join(p.pod for p in drain.pods)} withdrawn: {why}"
        kopf.event(self.body, type="Normal", reason=DRAIN_WITHDRAWN, message=message)
        self.logger.info(message)

    async def _pods(self) -> list[str]:
        pods = await self.rt.kube.list_pods(self.key[0], resources.selector_labels(self.key[1]))
        return [
            p["metadata"]["name"]
            for p in pods
            if not (p.get("metadata") or {}).get("deletionTimestamp")
            and str(p["metadata"].get("name", "")).startswith(self.prefix)
        ]

    async def _tidy(self, spec: JobQueueSpec, dsn: str) -> None:
        """Withdraw this Deployment's requests nobody follows: all of them at the first poll (a restarted operator
        starts over), later those of pods that are gone."""
        prefix = drain_key(self.prefix)
        mine = [p for p in await self.rt.databases.drains(self.key, dsn, spec.schema) if p.startswith(prefix)]
        live = set() if self.fresh else {drain_key(p) for p in await self._pods()}
        await self.rt.databases.set_draining(self.key, dsn, spec.schema, [p for p in mine if p not in live], False)
        self.fresh = False
        self.leftover = any(p in live for p in mine)

    async def _start(self, spec: JobQueueSpec, dsn: str, current: int, wanted: int) -> Verdict:
        names = await self._pods()
        holdings = await self.rt.databases.holdings(self.key, dsn, spec.schema, spec.served_queues)
        loads = loads_of(names, holdings)
        # Replicas without a pod yet go first (the ReplicaSet removes unscheduled pods before running ones).
        leaving = choose(loads, (current - wanted) - max(0, current - len(names)))
        await self._annotate(loads, {x.pod for x in leaving})
        await self.rt.databases.set_draining(
            self.key, dsn, spec.schema, [drain_key(x.pod) for x in leaving], True, f"scale {current} -> {wanted}"
        )
        self.leftover = bool(leaving)  # their rows go once the pods are gone (next scale-in, or a restart)
        busy = [x for x in leaving if x.jobs]
        if not busy:
            note = f"; removed first: {describe(leaving)}" if leaving else ""
            return Verdict(wanted, {"message": f"scale {current} -> {wanted}{note}", "draining": None})
        self.drain = Drain(current, wanted, tuple(leaving), time.monotonic(), status.now_iso())
        message = (
            f"scale {current} -> {wanted} waits up to {spec.scaling.scale_in_drain_seconds:.0f} s "
            f"(scaleInDrainSeconds) for the pods to go to stop claiming and finish: {describe(leaving)}"
        )
        kopf.event(self.body, type="Normal", reason=DRAINING, message=message)
        self.logger.info(message)
        return Verdict(current, self._report(self.drain, busy, message))

    async def _follow(self, spec: JobQueueSpec, dsn: str, current: int, wanted: int, drain: Drain) -> Verdict:
        if wanted != drain.target or current != drain.current:
            await self.cancel(spec, dsn, f"the autoscaler now wants {wanted} replicas (was {drain.target})")
            return Verdict(wanted if wanted >= current else current, {"draining": None})
        names = set(await self._pods())
        holdings = await self.rt.databases.holdings(self.key, dsn, spec.schema, spec.served_queues)
        busy = [x for x in loads_of([p.pod for p in drain.pods if p.pod in names], holdings) if x.jobs]
        waited = time.monotonic() - drain.started
        if busy and waited < spec.scaling.scale_in_drain_seconds:
            return Verdict(current, self._report(drain, busy, None))
        self.drain = None
        if busy:
            message = (
                f"scale {drain.current} -> {drain.target} after {waited:.0f} s (scaleInDrainSeconds): "
                f"{describe(busy)} still held work; their workers hand it back at shutdown"
            )
        else:
            message = (
                f"scale {drain.current} -> {drain.target} after {waited:.1f} s: the drained pods hold nothing "
                f"({', '.join(p.pod for p in drain.pods)})"
            )
        kopf.event(self.body, type="Normal", reason=SCALED_IN, message=message)
        self.logger.info(message)
        return Verdict(drain.target, {"message": message, "draining": None})

    async def _annotate(self, loads: Sequence[PodLoad], leaving: set[str]) -> None:
        for load in loads:
            cost = LEAVING_COST if load.pod in leaving else deletion_cost(load)
            await self.rt.kube.annotate_pod(self.key[0], load.pod, {DELETION_COST: str(cost)})

    @staticmethod
    def _report(drain: Drain, busy: Sequence[PodLoad], message: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "draining": [p.pod for p in drain.pods],
            "target": drain.target,
            "since": drain.since,
            "waitingFor": describe(busy),
        }
        if message:
            out["message"] = message
        return out
