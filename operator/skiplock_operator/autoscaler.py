"""One JobQueue's autoscaler (a kopf daemon): observe, bring the Deployment in line, decide, scale, report.

It is the worker Deployment's one writer (:mod:`skiplock_operator.workload`): it creates the Deployment, undoes
drift and sets the replicas in every mode; with autoscaling off (paused, manual replicas, disabled) it only
reports. It sleeps until the polling interval passes, a delayed job comes due, or its kick event is set (a NOTIFY,
a spec, Deployment or Secret change).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from skiplock import QueueStats
from skiplock.store.statements import FlowCursor
from skiplock_operator import pause, scalein, scaling, status, waittarget, workload
from skiplock_operator.database import PERMISSION_DENIED, DatabaseProblem, server_key
from skiplock_operator.k8s import KubeApiError
from skiplock_operator.pause import Pause
from skiplock_operator.runtime import Condition, Daemon, Runtime, SecretProblem, database_conditions, wait, write_status
from skiplock_operator.spec import InvalidSpecError, JobQueueSpec, parse_spec, policy_violations

DUE_MARGIN_SECONDS = 0.05
"""Poll this long after a delayed job's visible_at, so the job is ready when the poll looks."""


@dataclass(frozen=True)
class Poll:
    """What one poll read from the database."""

    stats: dict[str, QueueStats]
    due_in: float | None
    """Seconds until the first delayed job (wait-target mode: or cron tick) of the served queues comes due."""
    budget: scaling.Budget
    pause: Pause
    load: waittarget.Load
    """Arrival rate, service time, and (wait-target mode) the work due within podStartupSeconds."""

    @property
    def total(self) -> QueueStats:
        return total_stats(self.stats)

    def wake_in(self, spec: JobQueueSpec) -> float:
        """Seconds to the next poll: the interval, or sooner when delayed work comes due (wait-target mode: one
        pod start-up earlier, so a worker is ready when it does)."""
        interval = spec.scaling.polling_interval_seconds
        if self.due_in is None or self.due_in <= 0:
            return interval
        lead = spec.scaling.pod_startup_seconds if spec.scaling.wait_mode else 0.0
        if self.due_in > lead:
            return min(interval, self.due_in - lead)
        return min(interval, self.due_in + DUE_MARGIN_SECONDS)

    def status(self, replicas: int, concurrency: int) -> dict[str, Any]:
        """``predictedWaitSeconds`` (None, hence absent, when ``replicas`` cannot keep up) and ``load``."""
        total, load = self.total, self.load
        wait = waittarget.predicted_wait(total.ready, total.processing, load, replicas, concurrency)
        return {
            "predictedWaitSeconds": None if wait is None else round(wait, 1),
            "load": {
                "arrivalRate": round(load.arrival_rate, 2),
                "serviceSeconds": round(load.service_seconds, 2),
                "dueSoon": load.due_soon,
            },
        }


def autoscaled(spec: JobQueueSpec) -> bool:
    return not (spec.paused or spec.manual or not spec.scaling.enabled)


class Autoscaler(Daemon):
    MIN_POLL_GAP_SECONDS = 0.1
    """Debounce at zero replicas: a stream of NOTIFYs becomes at most this many polls a second."""
    BUSY_POLL_GAP_SECONDS = 0.5
    """Debounce while workers run (1 -> N on NOTIFY): at most two polls a second."""

    def __init__(self, rt: Runtime, body: kopf.Body, logger: logging.Logger | Any) -> None:
        super().__init__(rt, body, logger)
        self.history: tuple[scaling.Recommendation, ...] = ()
        self.failures = 0
        self.gap = self.MIN_POLL_GAP_SECONDS
        self.budget: scaling.Budget | None = None
        self.scale_in = scalein.ScaleIn(rt, self.key, body, logger)
        self.drain_denied = False
        self.flow = waittarget.Estimator()
        self.cursor: FlowCursor | None = None
        self.server = ""
        self.limits: tuple[int, int] | None = None

    async def run(self, stopped: Any) -> None:
        kick = self.rt.kick(self.key)
        last_poll = -math.inf
        try:
            while not stopped:
                pause_for = self.gap - (time.monotonic() - last_poll)
                if pause_for > 0:  # notifications coalesce: one poll per gap at most
                    await asyncio.sleep(pause_for)
                kick.clear()
                last_poll = time.monotonic()
                delay = await self.guarded_step()
                source = await wait(kick, stopped, delay)
                self.rt.metrics.wakeups.labels(source).inc()
        finally:
            await self.rt.wakeups.unsubscribe(self.key)

    async def guarded_step(self) -> float:
        """One step; a failure is counted and logged, and the next step comes after a back-off (never ends the loop;
        CancelledError still passes)."""
        try:
            return await self.step()
        except (KubeApiError, OSError) as exc:
            self.rt.metrics.errors.labels("kubernetes").inc()
            self.logger.warning(f"autoscaler step failed: {exc}")
        except Exception as exc:
            self.rt.metrics.errors.labels("unexpected").inc()
            self.logger.error(f"autoscaler step failed unexpectedly: {type(exc).__name__}")
        self.failures += 1
        return self.rt.backoff(self.failures - 1)

    async def step(self) -> float:
        """One poll; returns the seconds to wait before the next one."""
        spec = self.allowed()
        if spec is None:
            await self.stop_forbidden()
            return self.IDLE_SECONDS
        interval = spec.scaling.polling_interval_seconds
        try:
            dsn = await self.dsn(spec, fresh=self.failures > 0)
            poll = await self.observe(spec, dsn)
        except SecretProblem as exc:
            return await self.no_dsn(exc, interval)
        except DatabaseProblem as exc:
            return await self.unreachable(exc, interval)
        per = scaling.connections_per_replica(spec.concurrency)
        poll = self.live_budget(spec, poll)  # from here to the claim, no await: JobQueues on one server take turns
        manual = workload.manual_replicas(spec, poll.budget.replicas)
        if manual is not None:
            self.rt.claim(self.server, self.key, manual * per)
        deployment = await workload.ensure(self.rt, self.body, spec, cap=poll.budget.replicas)
        if deployment is None:
            conflict = (status.READY, False, status.DEPLOYMENT_CONFLICT, workload.conflict_message(self.key[1]))
            await write_status(self.rt, self.key, conditions=(conflict,))
            return interval
        current = workload.replicas_of(deployment)
        self.rt.metrics.current_replicas.labels(*self.key).set(current)
        if not autoscaled(spec):
            self.rt.claim(self.server, self.key, max(current, manual or 0) * per)
            await self.hold(spec, dsn, poll, deployment, current)
            return interval
        poll = self.live_budget(spec, poll)
        decision = self.decide(spec, poll, current)
        self.rt.claim(self.server, self.key, max(current, decision.replicas) * per)  # before the next await
        try:
            replicas, scale_in = await self.safe_scale_in(spec, dsn, current, decision)
        except DatabaseProblem as exc:
            return await self.unreachable(exc, interval)
        scaled_at = await self.apply(current, replicas, decision, scale_in)
        await self.listen(spec, dsn, replicas)
        await self.report(
            deployment,
            poll,
            replicas,
            concurrency=spec.concurrency,
            desired=decision.replicas,
            scaled_at=scaled_at,
            conditions=(scaling_condition(decision, scale_in),),
            extra={"scaleIn": scale_in} if scale_in is not None else {},
        )
        return poll.wake_in(spec)

    def live_budget(self, spec: JobQueueSpec, poll: Poll) -> Poll:
        """``poll`` with the connection budget as of now: the server's share less the operator's connections and
        what the other JobQueues on the server claimed. Computed and claimed with no await in between, so
        JobQueues sharing a server never both take the same free connections."""
        budget = scaling.connection_budget(
            spec.scaling.connection_budget,
            self.limits,
            spec.concurrency,
            operator_connections=self.rt.operator_connections(self.server),
            others=self.rt.claimed_by_others(self.server, self.key),
        )
        self.budget = budget
        return dataclasses.replace(poll, budget=budget)

    async def stop_forbidden(self) -> None:
        """A spec the policy forbids (the policy may have tightened since its Deployment was made) runs no worker:
        the Deployment is scaled to zero, with a Warning Event (the reconcile handler sets the condition)."""
        try:
            spec = parse_spec(self.body.get("spec"))
        except InvalidSpecError:
            return  # an invalid spec keeps what runs: the reconcile handler reports it
        violations = policy_violations(spec, self.rt.config.policy)
        if violations and await workload.stop(self.rt, self.body):
            self.rt.metrics.current_replicas.labels(*self.key).set(0)
            message = f"worker Deployment scaled to 0 (the operator's policy forbids it): {'; '.join(violations)}"
            kopf.event(self.body, type="Warning", reason=status.POLICY_VIOLATION, message=message)
            self.logger.warning(message)

    async def observe(self, spec: JobQueueSpec, dsn: str) -> Poll:
        """Read the queues, the next due time and the connection budget; apply ``spec.paused``."""
        rt, queues = self.rt, spec.served_queues
        started = time.monotonic()
        await rt.databases.ensure_schema(self.key, dsn, spec.schema)  # a no-op once per connection
        stats = await rt.databases.stats(self.key, dsn, spec.schema, queues, lease_seconds=spec.lease_seconds)
        arrived, done, self.cursor = await rt.databases.flow(self.key, dsn, spec.schema, queues, self.cursor)
        self.flow.observe(time.monotonic(), arrived, done, sum(row.processing for row in stats.values()))
        due_soon = 0
        if spec.scaling.wait_mode:  # delayed jobs and cron ticks, one pod start-up ahead
            horizon = spec.scaling.pod_startup_seconds
            due_soon, due = await rt.databases.due_soon(self.key, dsn, spec.schema, queues, horizon)
        else:
            due = await rt.databases.next_due_seconds(self.key, dsn, spec.schema, queues)
        self.limits = await rt.databases.server_limits(self.key, dsn, spec.schema)  # one cap per server
        rt.metrics.poll_duration.observe(time.monotonic() - started)
        self.server = server_key(dsn)
        self.budget = scaling.connection_budget(spec.scaling.connection_budget, self.limits, spec.concurrency)
        stats, paused = await pause.sync(rt, self.key, self.body, spec, dsn, stats, self.logger)
        rt.metrics.observe_queues(*self.key, stats)
        self.failures = 0
        return Poll(stats, due, self.budget, paused, self.flow.load(due_soon))

    async def hold(self, spec: JobQueueSpec, dsn: str, poll: Poll, deployment: Mapping[str, Any], current: int) -> None:
        """Autoscaling is off (paused, manual replicas, disabled): withdraw a drain, stop listening, say why."""
        await self.rt.wakeups.unsubscribe(self.key)
        if self.scale_in.drain is not None:
            await self.scale_in.cancel(spec, dsn, "autoscaling is off (paused, manual replicas or disabled)")
        if spec.paused:
            why = (status.PAUSED, "spec.paused is true: replicas are left alone while the queues are paused")
        elif spec.manual:
            capped = workload.manual_replicas(spec, poll.budget.replicas)
            why = (
                status.MANUAL_REPLICAS,
                f"spec.replicas is {spec.replicas} (kubectl scale): autoscaling is off until it is unset"
                + (
                    f"; capped at {capped} by the connection budget ({poll.budget.origin})"
                    if capped != spec.replicas
                    else ""
                ),
            )
        else:
            why = (status.AUTOSCALING_DISABLED, "spec.scaling.enabled is false: replicas are left alone")
        manual = workload.manual_replicas(spec, poll.budget.replicas)
        desired = manual if manual is not None else current
        condition = (status.SCALING_ACTIVE, False, *why)
        await self.report(
            deployment, poll, current, concurrency=spec.concurrency, desired=desired, conditions=(condition,)
        )

    def decide(self, spec: JobQueueSpec, poll: Poll, current: int) -> scaling.Decision:
        """The policy's answer for this poll (stabilization history kept here)."""
        total = poll.total
        now = time.monotonic()
        if not self.history:  # a fresh loop (operator restart): today's replicas count as a recommendation,
            self.history = (scaling.Recommendation(now, current),)  # so no scale-down before a full window
        decision = scaling.decide(
            scaling.Observation(total.ready, total.processing, total.oldest_ready_age_seconds, poll.load),
            current,
            # the budget in force (at least 1, so that no connection left caps at 0 replicas, not "no cap")
            dataclasses.replace(spec.scaling, connection_budget=max(1, poll.budget.connections)),
            concurrency=spec.concurrency,
            now=now,
            history=self.history,
            budget_origin=poll.budget.origin,
        )
        self.history = decision.history
        return decision

    async def safe_scale_in(
        self, spec: JobQueueSpec, dsn: str, current: int, decision: scaling.Decision
    ) -> tuple[int, dict[str, Any] | None]:
        """The replicas to set now and the ``status.scaleIn`` report: a scale-in waits for the pods chosen to go
        (:mod:`skiplock_operator.scalein`) when the feature is on."""
        if not (self.rt.config.drain_pods and spec.scaling.scale_in_drain_seconds > 0):
            return decision.replicas, None
        try:
            verdict = await self.scale_in.step(spec, dsn, current, decision.replicas)
            self.drain_denied = False
        except KubeApiError as exc:  # pods unreadable (RBAC?): scale as without the feature, and say so
            self.logger.warning(f"scale-in without draining: the pods could not be read or annotated ({exc})")
            verdict = scalein.Verdict(decision.replicas)
        except DatabaseProblem as exc:
            if exc.reason != PERMISSION_DENIED:
                raise  # the database is unreachable: replicas are kept
            if not self.drain_denied:  # once per streak: every poll would say it again
                self.logger.warning("scale-in without draining: the operator's role may not write drain requests")
            self.drain_denied = True
            verdict = scalein.Verdict(decision.replicas)
        return verdict.replicas, verdict.report

    async def apply(
        self, current: int, replicas: int, decision: scaling.Decision, scale_in: Mapping[str, Any] | None
    ) -> str | None:
        """Scale the Deployment when the replicas change, with a metric, an Event and a log line; returns when."""
        if replicas == current:
            return None
        await workload.scale(self.rt, self.key, replicas)
        self.rt.metrics.scale_decisions.labels("up" if replicas > current else "down", decision.reason).inc()
        self.rt.metrics.current_replicas.labels(*self.key).set(replicas)
        message = decision.message if replicas == decision.replicas else (scale_in or {}).get("message", "")
        kopf.event(self.body, type="Normal", reason=decision.reason, message=message)
        self.logger.info(message)
        return status.now_iso()

    async def listen(self, spec: JobQueueSpec, dsn: str, replicas: int) -> None:
        """LISTEN at zero and while running: 0 -> 1 and 1 -> N both start from a NOTIFY."""
        if spec.listen:
            channel = spec.worker_settings().channel
            await self.rt.wakeups.subscribe(
                self.key,
                dsn,
                channel,
                spec.served_queues,
                self.rt.kick(self.key),
                connect_dsn=self.rt.databases.pinned(dsn),
            )
        else:
            await self.rt.wakeups.unsubscribe(self.key)
        self.gap = self.MIN_POLL_GAP_SECONDS if replicas == 0 else self.BUSY_POLL_GAP_SECONDS

    async def no_dsn(self, exc: SecretProblem, interval: float) -> float:
        self.failures += 1
        self.rt.metrics.database_up.labels(*self.key).set(0)
        await write_status(self.rt, self.key, conditions=((status.READY, False, exc.reason, str(exc)),))
        return min(interval, self.rt.backoff(self.failures))

    async def unreachable(self, exc: DatabaseProblem, interval: float) -> float:
        """Keep the replicas as they are (no scale to zero on errors), say so, and poll again after one
        interval (no growing back-off: a healed database is seen at the next poll)."""
        self.rt.metrics.errors.labels("database").inc()
        self.rt.metrics.database_up.labels(*self.key).set(0)
        self.failures += 1
        if self.failures == 1:
            self.logger.warning(f"database unreachable ({exc.reason}), replicas kept")
        await write_status(
            self.rt,
            self.key,
            conditions=(
                *database_conditions(exc),
                (status.SCALING_ACTIVE, False, exc.reason, "replicas are kept until the database answers"),
            ),
        )
        return interval

    async def report(
        self,
        deployment: Mapping[str, Any],
        poll: Poll,
        replicas: int,
        *,
        concurrency: int,
        desired: int | None = None,
        scaled_at: str | None = None,
        conditions: tuple[Condition, ...] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        pause_fields, pause_condition = poll.pause
        stats = poll.total
        dep_status = deployment.get("status") or {}
        fields: dict[str, Any] = {
            "replicas": int(dep_status.get("replicas") or 0),
            "readyReplicas": int(dep_status.get("readyReplicas") or 0),
            "desiredReplicas": desired if desired is not None else replicas,
            "backlog": {
                "ready": stats.ready,
                "delayed": stats.delayed,
                "processing": stats.processing,
                "stalled": stats.stalled,
                "failed": stats.failed,
            },
            "oldestReadyAgeSeconds": round(stats.oldest_ready_age_seconds, 3),
            "connectionBudget": poll.budget.status(),
            **poll.status(desired if desired is not None else replicas, concurrency),
            **pause_fields,
            **(extra or {}),
        }
        if scaled_at:
            fields["lastScaleTime"] = scaled_at
        self.rt.metrics.ready_backlog.labels(*self.key).set(stats.ready)
        self.rt.metrics.desired_replicas.labels(*self.key).set(fields["desiredReplicas"])
        conditions = (
            (status.DATABASE_REACHABLE, True, status.CONNECTED, "the operator reached the database"),
            (status.READY, True, status.RECONCILED, workload.ready_message(self.key)),
            *((pause_condition,) if pause_condition else ()),  # before ScalingActive: its Event is the one posted
            *conditions,
        )
        seen = self.body.get("status") or {}
        await write_status(self.rt, self.key, fields=fields, conditions=conditions, seen=seen)


def scaling_condition(decision: scaling.Decision, scale_in: Mapping[str, Any] | None) -> Condition:
    """ScalingActive for an autoscaled poll: draining, capped by the budget, or the decision's reason."""
    if scale_in and scale_in.get("draining"):
        return (status.SCALING_ACTIVE, True, scalein.DRAINING, scale_in.get("waitingFor", ""))
    if decision.budget_limited:
        return (status.SCALING_ACTIVE, True, status.CONNECTION_BUDGET_LIMITED, decision.message)
    return (status.SCALING_ACTIVE, True, status.BACKLOG_POLLED, f"{decision.reason}: {decision.message}")


def total_stats(stats: Mapping[str, QueueStats]) -> QueueStats:
    """The JobQueue's queues as one (counts add up; the oldest age is the largest)."""
    rows = list(stats.values())
    return QueueStats(
        ",".join(stats),
        sum(r.ready for r in rows),
        sum(r.delayed for r in rows),
        sum(r.processing for r in rows),
        sum(r.stalled for r in rows),
        sum(r.failed for r in rows),
        max((r.oldest_ready_age_seconds for r in rows), default=0.0),
    )
