"""JobQueue to API calls: the create/update/resume reconcile, the per-object autoscaler loop, and cleanup.

State shared by all handlers lives on one :class:`Runtime` (kopf's ``memo``): the Kubernetes client, the
database connections, the LISTEN hub, metrics, and per-JobQueue wake-up events and status locks.

Everything written to a status, an Event or a log line is the operator's own text: a classified reason
and a fixed message, never a driver's message (it can quote the DSN, or whatever a Secret held).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import kopf

from skiplock import QueueStats, __version__
from skiplock.backoff import backoff_seconds
from skiplock_operator import resources, scalein, scaling, status
from skiplock_operator.config import OperatorConfig
from skiplock_operator.database import DatabaseProblem, Databases
from skiplock_operator.k8s import Kube, KubeApiError
from skiplock_operator.metrics import OperatorMetrics
from skiplock_operator.spec import InvalidSpecError, JobQueueSpec, parse_spec, policy_violations
from skiplock_operator.wakeup import Wakeups

Key = tuple[str, str]
Condition = tuple[str, bool, str, str]
Pause = tuple[dict[str, Any], Condition | None]
"""What the pause sync adds to a status write: fields (paused, pausedQueues) and the QueuesActive condition."""
log = logging.getLogger(__name__)
DUE_MARGIN_SECONDS = 0.05
"""Poll this long after a delayed job's visible_at, so the job is ready when the poll looks."""


class SecretProblem(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Runtime:
    def __init__(self, config: OperatorConfig, kube: Kube, metrics: OperatorMetrics) -> None:
        self.config = config
        self.kube = kube
        self.metrics = metrics
        self.databases = Databases(
            timeout=config.database_timeout_seconds, allowed_hosts=config.policy.allowed_dsn_hosts
        )
        self.wakeups = Wakeups()
        self.secrets: dict[tuple[str, str, str], tuple[float, str]] = {}
        self.secret_users: dict[Key, set[str]] = {}
        self._kicks: dict[Key, asyncio.Event] = {}
        self._locks: dict[Key, asyncio.Lock] = {}

    def kick(self, key: Key) -> asyncio.Event:
        """The event that wakes this JobQueue's autoscaler (NOTIFY, a spec, Deployment or Secret change)."""
        return self._kicks.setdefault(key, asyncio.Event())

    def lock(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def secret_changed(self, namespace: str, name: str) -> None:
        """A watched Secret changed: forget its cached values and wake the JobQueues that read it."""
        for cached in [k for k in self.secrets if k[0] == namespace and k[1] == name]:
            del self.secrets[cached]
        for key, names in self.secret_users.items():
            if key[0] == namespace and name in names:
                self.kick(key).set()

    def owned_deployment_changed(self, namespace: str, owner: str) -> None:
        if (namespace, owner) in self._kicks:
            self.kick((namespace, owner)).set()

    async def forget(self, key: Key) -> None:
        await self.wakeups.unsubscribe(key)
        await self.databases.release(key)
        self._kicks.pop(key, None)
        self._locks.pop(key, None)
        self.secret_users.pop(key, None)
        self.metrics.forget(*key)

    async def close(self) -> None:
        await self.wakeups.close()
        await self.databases.close()
        await self.kube.close()

    def backoff(self, attempt: int, base: float = 1.0) -> float:
        return backoff_seconds(attempt + 1, base=base, cap=max(base, self.config.retry_cap_seconds), jitter=0.0)


def key_of(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


async def write_status(
    rt: Runtime,
    key: Key,
    *,
    fields: Mapping[str, Any] | None = None,
    conditions: tuple[Condition, ...] = (),
    generation: int | None = None,
    seen: Mapping[str, Any] | None = None,
) -> None:
    """Read-modify-write of ``.status`` under a per-JobQueue lock (the handler and the autoscaler both write
    conditions, and a merge patch replaces the whole list). Nothing is sent when nothing changed; ``seen``
    (the status kopf last saw) saves the read when it already shows every value. A condition that changes
    its status or reason posts one Event (Warning for error reasons, Normal otherwise)."""
    if seen is not None and not status_changes(seen, fields, conditions, generation):
        return
    namespace, name = key
    async with rt.lock(key):
        current = await rt.kube.get_jobqueue(namespace, name)
        if current is None:
            return
        old = current.get("status") or {}
        changes = status_changes(old, fields, conditions, generation)
        if changes:
            await rt.kube.patch_jobqueue_status(namespace, name, changes)
    posted: set[str] = set()
    for type_, ok, reason, message in transitions(old.get("conditions"), conditions):
        if reason in posted:  # Ready and DatabaseReachable often turn for one cause: one Event
            continue
        posted.add(reason)
        kind = "Warning" if not ok and reason in status.WARNING_REASONS else "Normal"
        kopf.event(current, type=kind, reason=reason, message=f"{type_}={ok}: {message}")  # type: ignore[arg-type]


def transitions(old: Any, conditions: tuple[Condition, ...]) -> list[Condition]:
    """The conditions whose status or reason differ from ``old`` (pure)."""
    out = []
    for cond in conditions:
        type_, ok, reason, _ = cond
        was = status.get_condition(old, type_)
        if was is None or was.get("status") != ("True" if ok else "False") or was.get("reason") != reason:
            out.append(cond)
    return out


def status_changes(
    old: Mapping[str, Any],
    fields: Mapping[str, Any] | None,
    conditions: tuple[Condition, ...],
    generation: int | None,
) -> dict[str, Any]:
    """The status fields that differ from ``old`` once ``fields`` and ``conditions`` are applied (pure)."""
    new = dict(fields or {})
    if conditions:
        conds = old.get("conditions") or []
        for type_, ok, reason, message in conditions:
            conds = status.set_condition(conds, type_, ok, reason, message, observed_generation=generation)
        new["conditions"] = conds
    return {k: v for k, v in new.items() if old.get(k) != v}


async def read_dsn(rt: Runtime, key: Key, spec: JobQueueSpec, *, fresh: bool = False) -> str:
    """The operator's DSN (``operatorDsnSecretRef``, else ``dsnSecretRef``), cached ``secret_ttl_seconds``;
    raises SecretProblem. Only a Secret labelled ``skiplock.io/dsn: "true"`` is used."""
    name, field = spec.operator_secret
    rt.secret_users[key] = {name}
    cache_key = (key[0], name, field)
    cached = rt.secrets.get(cache_key)
    if cached is not None and not fresh and time.monotonic() - cached[0] < rt.config.secret_ttl_seconds:
        return cached[1]
    rt.secrets.pop(cache_key, None)
    found = await rt.kube.read_secret_key(key[0], name, field)
    if not found.found or (found.opted_in and found.value is None):
        raise SecretProblem(status.SECRET_NOT_FOUND, f"Secret {name!r} with key {field!r} not found")
    if not found.opted_in or found.value is None:
        raise SecretProblem(
            status.SECRET_NOT_OPTED_IN,
            f'Secret {name!r} is not labelled skiplock.io/dsn: "true"; the operator reads only such Secrets',
        )
    rt.secrets[cache_key] = (time.monotonic(), found.value)
    return found.value


def database_conditions(exc: DatabaseProblem) -> tuple[Condition, ...]:
    return (
        (status.DATABASE_REACHABLE, False, exc.reason, str(exc)),
        (status.READY, False, exc.reason, str(exc)),
    )


def initial_replicas(spec: JobQueueSpec, last_desired: Any, budget: int = 0) -> int:
    s = spec.scaling
    if spec.replicas is not None:
        return spec.replicas
    if not s.enabled:
        return s.min_replicas
    wanted = last_desired if isinstance(last_desired, int) else s.min_replicas
    replicas = min(s.max_replicas, max(s.min_replicas, wanted))
    cap = scaling.budget_cap(dataclasses.replace(s, connection_budget=budget or s.connection_budget), spec.concurrency)
    return replicas if cap is None else min(replicas, cap)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def conflict_message(name: str) -> str:
    return (
        f"Deployment {resources.deployment_name(name)!r} exists but is not controlled by this JobQueue: "
        "it is left alone (rename or remove it)"
    )


# ---------------------------------------------------------------------------------------------- reconcile
async def reconcile(rt: Runtime, body: Mapping[str, Any], retry: int, logger: logging.Logger | Any) -> None:
    """Validate, migrate the schema, then create or patch the worker Deployment (create/update/resume)."""
    key = key_of(body)
    generation = body["metadata"].get("generation")
    try:
        spec = parse_spec(body.get("spec"))
    except InvalidSpecError as exc:
        await refuse(rt, key, generation, status.INVALID_SPEC, str(exc), "invalid")
        raise kopf.PermanentError(f"invalid spec: {exc}") from None
    violations = policy_violations(spec, rt.config.policy)
    if violations:
        await refuse(rt, key, generation, status.POLICY_VIOLATION, "; ".join(violations), "policy")
        raise kopf.PermanentError(f"policy violation: {'; '.join(violations)}")
    try:
        dsn = await read_dsn(rt, key, spec, fresh=True)
        migrated = await rt.databases.ensure_schema(key, dsn, spec.schema)
    except SecretProblem as exc:
        rt.metrics.reconciles.labels("retry").inc()
        rt.metrics.errors.labels("secret").inc()
        await write_status(rt, key, generation=generation, conditions=((status.READY, False, exc.reason, str(exc)),))
        raise kopf.TemporaryError(exc.reason, delay=rt.backoff(retry, 2.0)) from None
    except DatabaseProblem as exc:
        rt.metrics.reconciles.labels("retry").inc()
        rt.metrics.errors.labels("database").inc()
        rt.metrics.database_up.labels(*key).set(0)
        pending = (status.SCHEMA_READY, False, status.MIGRATION_PENDING, "waiting for the database to migrate")
        await write_status(rt, key, generation=generation, conditions=(*database_conditions(exc), pending))
        raise kopf.TemporaryError(exc.reason, delay=rt.backoff(retry)) from None
    if migrated:
        logger.info(f"schema {spec.schema!r} is migrated")
    try:
        deployment = await ensure_deployment(rt, body, spec)
    except KubeApiError as exc:
        rt.metrics.reconciles.labels("error").inc()
        rt.metrics.errors.labels("kubernetes").inc()
        raise kopf.TemporaryError(str(exc), delay=rt.backoff(retry)) from None
    if deployment is None:
        rt.metrics.reconciles.labels("retry").inc()
        rt.metrics.errors.labels("conflict").inc()
        await write_status(
            rt,
            key,
            generation=generation,
            conditions=((status.READY, False, status.DEPLOYMENT_CONFLICT, conflict_message(key[1])),),
        )
        raise kopf.TemporaryError(status.DEPLOYMENT_CONFLICT, delay=rt.backoff(retry, 5.0))
    await write_status(
        rt,
        key,
        generation=generation,
        fields={
            "observedGeneration": generation,
            "selector": ",".join(f"{k}={v}" for k, v in resources.selector_labels(key[1]).items()),
            "queues": ",".join(spec.served_queues),
        },
        conditions=(
            (status.DATABASE_REACHABLE, True, status.CONNECTED, "the operator reached the database"),
            (status.SCHEMA_READY, True, status.MIGRATED, f"schema {spec.schema!r} is at the latest version"),
            (status.READY, True, status.RECONCILED, ready_message(key)),
        ),
    )
    rt.metrics.reconciles.labels("success").inc()
    rt.kick(key).set()


async def refuse(rt: Runtime, key: Key, generation: Any, reason: str, message: str, result: str) -> None:
    rt.metrics.reconciles.labels("invalid").inc()
    rt.metrics.errors.labels(result).inc()
    await write_status(
        rt,
        key,
        generation=generation,
        fields={"observedGeneration": generation},
        conditions=((status.READY, False, reason, message),),
    )


def ready_message(key: Key) -> str:
    return f"worker Deployment {resources.deployment_name(key[1])!r} is reconciled"


async def ensure_deployment(
    rt: Runtime, body: Mapping[str, Any], spec: JobQueueSpec, *, budget: int = 0
) -> dict[str, Any] | None:
    """Create the worker Deployment or bring it back to the spec (drift); None when a Deployment of that
    name exists that this JobQueue does not control (nothing is changed then). Else the Deployment."""
    namespace, name = key_of(body)
    uid = str(body["metadata"].get("uid"))
    dname = resources.deployment_name(name)
    if not spec.resources and rt.config.default_worker_resources:  # the admin's default: no BestEffort workers
        spec = dataclasses.replace(spec, resources=rt.config.default_worker_resources)
    actual = await rt.kube.get_deployment(namespace, dname)
    if actual is None:
        replicas = initial_replicas(spec, (body.get("status") or {}).get("desiredReplicas"), budget)
        desired = resources.build_deployment(body, spec, replicas=replicas, version=__version__)
        try:
            return await rt.kube.create_deployment(namespace, desired) or desired
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        actual = await rt.kube.get_deployment(namespace, dname)  # created meanwhile: check whose it is
        if actual is None:
            raise KubeApiError(409, f"Deployment {dname!r} conflicts but cannot be read")
    if controller_uid(actual) != uid:
        return None
    desired = resources.build_deployment(body, spec, replicas=None, version=__version__)
    patch = resources.drift_patch(desired, actual) or {}
    if spec.manual and not spec.paused and (actual.get("spec") or {}).get("replicas") != spec.replicas:
        patch.setdefault("spec", {})["replicas"] = spec.replicas
    if patch:
        return await rt.kube.patch_deployment(namespace, dname, patch) or actual
    return actual


async def finalize(rt: Runtime, body: Mapping[str, Any]) -> None:
    """Delete the worker Deployment if this JobQueue controls it (with a UID precondition), then forget."""
    namespace, name = key_of(body)
    dname = resources.deployment_name(name)
    actual = await rt.kube.get_deployment(namespace, dname)
    if actual is not None and controller_uid(actual) == str(body["metadata"].get("uid")):
        await rt.kube.delete_deployment(namespace, dname, uid=str(actual["metadata"].get("uid")))
    if (body.get("status") or {}).get("paused"):
        await resume_on_delete(rt, body)
    await rt.forget((namespace, name))


async def resume_on_delete(rt: Runtime, body: Mapping[str, Any]) -> None:
    """A JobQueue deleted while spec.paused held its queues: resume them (best effort, never blocks the delete),
    so a JobQueue created again for them does not find them paused by one that is gone."""
    key = key_of(body)
    try:
        spec = parse_spec(body.get("spec"))
        dsn = await read_dsn(rt, key, spec)
        await rt.databases.set_paused(key, dsn, spec.schema, spec.served_queues, False)
    except (InvalidSpecError, SecretProblem, DatabaseProblem) as exc:
        reason = getattr(exc, "reason", type(exc).__name__)
        log.warning(f"the queues of deleted JobQueue {key[0]}/{key[1]} stay paused ({reason}): skiplock resume QUEUE")


# ---------------------------------------------------------------------------------------------- autoscaler
class Autoscaler:
    """One JobQueue's scaling loop (a kopf daemon): poll, decide, scale, report; sleep until the interval
    passes, a delayed job comes due, or the kick event is set (NOTIFY, a spec/Deployment/Secret change)."""

    IDLE_SECONDS = 5.0
    MIN_POLL_GAP_SECONDS = 0.1
    """Debounce at zero replicas: a stream of NOTIFYs becomes at most this many polls a second."""
    BUSY_POLL_GAP_SECONDS = 0.5
    """Debounce while workers run (1 -> N on NOTIFY): at most two polls a second."""

    def __init__(self, rt: Runtime, body: kopf.Body, logger: logging.Logger | Any) -> None:
        self.rt, self.body, self.logger = rt, body, logger
        self.key = key_of(body)
        self.history: tuple[scaling.Recommendation, ...] = ()
        self.failures = 0
        self.gap = self.MIN_POLL_GAP_SECONDS
        self.budget: scaling.Budget | None = None
        self.scale_in = scalein.ScaleIn(rt, self.key, body, logger)

    async def run(self, stopped: Any) -> None:
        kick = self.rt.kick(self.key)
        last_poll = -math.inf
        try:
            while not stopped:
                pause = self.gap - (time.monotonic() - last_poll)
                if pause > 0:  # notifications coalesce: one poll per gap at most
                    await asyncio.sleep(pause)
                kick.clear()
                last_poll = time.monotonic()
                try:
                    delay = await self.step()
                except (KubeApiError, OSError) as exc:
                    self.rt.metrics.errors.labels("kubernetes").inc()
                    self.logger.warning(f"autoscaler step failed: {exc}")
                    delay = self.rt.backoff(self.failures)
                    self.failures += 1
                except Exception as exc:  # never let one bad poll end the loop (CancelledError still passes)
                    self.rt.metrics.errors.labels("unexpected").inc()
                    self.logger.error(f"autoscaler step failed unexpectedly: {type(exc).__name__}")
                    delay = self.rt.backoff(self.failures)
                    self.failures += 1
                source = await wait(kick, stopped, delay)
                self.rt.metrics.wakeups.labels(source).inc()
        finally:
            await self.rt.wakeups.unsubscribe(self.key)

    async def step(self) -> float:
        """One poll; returns the seconds to wait before the next one."""
        rt, (namespace, name) = self.rt, self.key
        try:
            spec = parse_spec(self.body.get("spec"))
        except InvalidSpecError:
            return self.IDLE_SECONDS  # the reconcile handler reports it; nothing to scale
        if policy_violations(spec, rt.config.policy):
            return self.IDLE_SECONDS  # reported by the reconcile handler too
        interval = spec.scaling.polling_interval_seconds
        try:
            dsn = await read_dsn(rt, self.key, spec, fresh=self.failures > 0)
        except SecretProblem as exc:
            self.failures += 1
            rt.metrics.database_up.labels(namespace, name).set(0)
            await write_status(rt, self.key, conditions=((status.READY, False, exc.reason, str(exc)),))
            return min(interval, rt.backoff(self.failures))
        queues = spec.served_queues
        started = time.monotonic()
        try:
            await rt.databases.ensure_schema(self.key, dsn, spec.schema)  # a no-op once per connection
            stats = await rt.databases.stats(self.key, dsn, spec.schema, queues, lease_seconds=spec.lease_seconds)
            due = await rt.databases.next_due_seconds(self.key, dsn, spec.schema, queues)
            limits = (
                None if spec.scaling.connection_budget else await rt.databases.server_limits(self.key, dsn, spec.schema)
            )
        except DatabaseProblem as exc:
            return await self.unreachable(exc, interval)
        rt.metrics.poll_duration.observe(time.monotonic() - started)
        budget = scaling.connection_budget(spec.scaling.connection_budget, limits, spec.concurrency)
        self.budget = budget
        stats, pause = await self.sync_pause(spec, dsn, stats)
        rt.metrics.observe_queues(namespace, name, stats)
        self.failures = 0
        deployment = await ensure_deployment(rt, self.body, spec, budget=budget.connections)  # or undoes drift
        if deployment is None:
            await write_status(
                rt, self.key, conditions=((status.READY, False, status.DEPLOYMENT_CONFLICT, conflict_message(name)),)
            )
            return interval
        current = int((deployment.get("spec") or {}).get("replicas", 1))
        rt.metrics.current_replicas.labels(namespace, name).set(current)
        total = total_stats(stats)
        wake_in = interval if due is None else min(interval, due + DUE_MARGIN_SECONDS)
        if spec.paused or spec.manual or not spec.scaling.enabled:
            await rt.wakeups.unsubscribe(self.key)
            if self.scale_in.drain is not None:
                await self.scale_in.cancel(spec, dsn, "autoscaling is off (paused, manual replicas or disabled)")
            if spec.paused:
                why = (status.PAUSED, "spec.paused is true: replicas are left alone while the queues are paused")
            elif spec.manual:
                why = (
                    status.MANUAL_REPLICAS,
                    f"spec.replicas is {spec.replicas} (kubectl scale): autoscaling is off until it is unset",
                )
            else:
                why = (status.AUTOSCALING_DISABLED, "spec.scaling.enabled is false: replicas are left alone")
            await self.report(
                deployment,
                total,
                current,
                desired=spec.replicas if spec.manual else current,
                pause=pause,
                conditions=((status.SCALING_ACTIVE, False, *why),),
            )
            return interval
        obs = scaling.Observation(total.ready, total.processing, total.oldest_ready_age_seconds)
        now = time.monotonic()
        if not self.history:  # a fresh loop (operator restart): today's replicas count as a recommendation,
            self.history = (scaling.Recommendation(now, current),)  # so no scale-down before a full window
        policy = dataclasses.replace(spec.scaling, connection_budget=budget.connections)
        decision = scaling.decide(
            obs,
            current,
            policy,
            concurrency=spec.concurrency,
            now=now,
            history=self.history,
            budget_origin=budget.origin,
        )
        self.history = decision.history
        replicas, scale_in = decision.replicas, None
        if self.drains(spec):
            try:
                verdict = await self.scale_in.step(spec, dsn, current, decision.replicas)
            except DatabaseProblem as exc:
                return await self.unreachable(exc, interval)
            except KubeApiError as exc:  # pods unreadable (RBAC?): scale as without the feature, and say so
                self.logger.warning(f"scale-in without draining: the pods could not be read or annotated ({exc})")
                verdict = scalein.Verdict(decision.replicas)
            replicas, scale_in = verdict.replicas, verdict.report
        scaled_at = None
        if replicas != current:
            await rt.kube.scale_deployment(namespace, resources.deployment_name(name), replicas)
            direction = "up" if replicas > current else "down"
            rt.metrics.scale_decisions.labels(direction, decision.reason).inc()
            rt.metrics.current_replicas.labels(namespace, name).set(replicas)
            message = decision.message if replicas == decision.replicas else (scale_in or {}).get("message", "")
            kopf.event(self.body, type="Normal", reason=decision.reason, message=message)
            self.logger.info(message)
            scaled_at = status.now_iso()
        if spec.listen:  # at zero and while running: 0 -> 1 and 1 -> N both start from a NOTIFY
            await rt.wakeups.subscribe(self.key, dsn, spec.worker_settings().channel, queues, self.rt.kick(self.key))
        else:
            await rt.wakeups.unsubscribe(self.key)
        self.gap = self.MIN_POLL_GAP_SECONDS if replicas == 0 else self.BUSY_POLL_GAP_SECONDS
        scaling_condition: Condition = (
            (status.SCALING_ACTIVE, True, status.CONNECTION_BUDGET_LIMITED, decision.message)
            if decision.budget_limited
            else (status.SCALING_ACTIVE, True, status.BACKLOG_POLLED, f"{decision.reason}: {decision.message}")
        )
        if scale_in and scale_in.get("draining"):
            scaling_condition = (status.SCALING_ACTIVE, True, scalein.DRAINING, scale_in.get("waitingFor", ""))
        await self.report(
            deployment,
            total,
            replicas,
            desired=decision.replicas,
            scaled_at=scaled_at,
            pause=pause,
            conditions=(scaling_condition,),
            extra={"scaleIn": scale_in} if scale_in is not None else {},
        )
        return wake_in

    def drains(self, spec: JobQueueSpec) -> bool:
        """Busy-pod-safe scale-in is on: the operator may read pods, and the JobQueue allows a drain wait."""
        return self.rt.config.drain_pods and spec.scaling.scale_in_drain_seconds > 0

    async def sync_pause(
        self, spec: JobQueueSpec, dsn: str, stats: dict[str, QueueStats]
    ) -> tuple[dict[str, QueueStats], Pause]:
        """Bring the queues table in line with ``spec.paused``: pause every served queue while it is true, resume
        them once when it turns false (``status.paused`` remembers what the operator applied, so a queue paused
        by ``skiplock pause`` is never resumed behind the user's back). Idempotent: only queues whose row
        disagrees are written. Returns the stats as they now stand, the status fields and the condition."""
        queues = spec.served_queues
        held = [q for q in queues if stats[q].paused]
        applied = bool((self.body.get("status") or {}).get("paused"))
        todo = [q for q in queues if q not in held] if spec.paused else held if applied else []
        if todo:
            try:
                await self.rt.databases.set_paused(self.key, dsn, spec.schema, todo, spec.paused)
            except DatabaseProblem as exc:
                self.rt.metrics.errors.labels("database").inc()
                self.logger.warning(f"spec.paused={spec.paused} not applied to the database ({exc.reason})")
                why = f"spec.paused={str(spec.paused).lower()} is not applied yet: {exc}"
                return stats, ({}, (status.QUEUES_ACTIVE, False, exc.reason, why))
            await write_status(self.rt, self.key, fields={"paused": spec.paused})  # remembered before anything else
            verb = "paused" if spec.paused else "resumed"
            self.logger.info(f"queue(s) {', '.join(todo)} {verb} in the database (spec.paused={spec.paused})")
            held = list(queues) if spec.paused else []
            stats = {q: dataclasses.replace(row, paused=q in held) for q, row in stats.items()}
        fields = {"paused": spec.paused, "pausedQueues": held}
        listed = ", ".join(held)
        if spec.paused:
            message = (
                f"spec.paused is true: {listed} paused in the database; running jobs finish, nothing new is claimed"
            )
            return stats, (fields, (status.QUEUES_ACTIVE, False, status.PAUSED, message))
        if held:
            message = (
                f"{listed} paused in the database by `skiplock pause`: spec.paused is false, so the operator leaves "
                "them paused (`skiplock resume QUEUE`)"
            )
            return stats, (fields, (status.QUEUES_ACTIVE, False, status.PAUSED_BY_COMMAND, message))
        return stats, (fields, (status.QUEUES_ACTIVE, True, status.CLAIMING, "workers claim from every served queue"))

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
        stats: QueueStats,
        replicas: int,
        *,
        desired: int | None = None,
        scaled_at: str | None = None,
        pause: Pause = ({}, None),
        conditions: tuple[Condition, ...] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        namespace, name = self.key
        pause_fields, pause_condition = pause
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
            **({"connectionBudget": self.budget.status()} if self.budget is not None else {}),
            **pause_fields,
            **(extra or {}),
        }
        self.rt.metrics.ready_backlog.labels(namespace, name).set(stats.ready)
        conditions = (
            (status.DATABASE_REACHABLE, True, status.CONNECTED, "the operator reached the database"),
            (status.READY, True, status.RECONCILED, ready_message(self.key)),
            *((pause_condition,) if pause_condition else ()),  # before ScalingActive: its Event is the one posted
            *conditions,
        )
        if scaled_at:
            fields["lastScaleTime"] = scaled_at
        self.rt.metrics.desired_replicas.labels(namespace, name).set(fields["desiredReplicas"])
        seen = self.body.get("status") or {}
        await write_status(self.rt, self.key, fields=fields, conditions=conditions, seen=seen)


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


async def wait(kick: asyncio.Event, stopped: Any, timeout: float) -> str:
    """Sleep until ``timeout`` passes ("poll"), ``kick`` is set ("event") or the daemon is stopped."""
    deadline = time.monotonic() + timeout
    while not stopped:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "poll"
        try:
            await asyncio.wait_for(kick.wait(), timeout=min(remaining, 0.5))
        except TimeoutError:
            continue
        return "event"
    return "stopped"
