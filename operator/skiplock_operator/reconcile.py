"""JobQueue to API calls: the create/update/resume reconcile, the per-object autoscaler loop, and cleanup.

State shared by all handlers lives on one :class:`Runtime` (kopf's ``memo``): the Kubernetes client, the
database pools, the LISTEN hub, metrics, and per-JobQueue wake-up events and status locks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import kopf

from skiplock import QueueStats, __version__
from skiplock.errors import DatabaseUnavailableError
from skiplock_operator import resources, scaling, status
from skiplock_operator.config import OperatorConfig
from skiplock_operator.database import Databases
from skiplock_operator.k8s import Kube, KubeApiError
from skiplock_operator.metrics import OperatorMetrics
from skiplock_operator.spec import InvalidSpecError, JobQueueSpec, parse_spec
from skiplock_operator.wakeup import Wakeups

Key = tuple[str, str]
Condition = tuple[str, bool, str, str]


class Runtime:
    def __init__(self, config: OperatorConfig, kube: Kube, metrics: OperatorMetrics) -> None:
        self.config = config
        self.kube = kube
        self.metrics = metrics
        self.databases = Databases(timeout=config.database_timeout_seconds)
        self.wakeups = Wakeups(retry_cap=config.retry_cap_seconds)
        self.secrets: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._kicks: dict[Key, asyncio.Event] = {}
        self._locks: dict[Key, asyncio.Lock] = {}

    def kick(self, key: Key) -> asyncio.Event:
        """The event that wakes this JobQueue's autoscaler (NOTIFY, a spec change)."""
        return self._kicks.setdefault(key, asyncio.Event())

    def lock(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def forget(self, key: Key) -> None:
        await self.wakeups.unsubscribe(key)
        await self.databases.release(key)
        self._kicks.pop(key, None)
        self._locks.pop(key, None)
        self.metrics.forget(*key)

    async def close(self) -> None:
        await self.wakeups.close()
        await self.databases.close()
        await self.kube.close()

    def backoff(self, attempt: int, base: float = 1.0) -> float:
        return float(min(self.config.retry_cap_seconds, base * 2 ** max(0, attempt)))


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
    (the status kopf last saw) saves the read when it already shows every value."""
    if seen is not None and not status_changes(seen, fields, conditions, generation):
        return
    namespace, name = key
    async with rt.lock(key):
        current = await rt.kube.get_jobqueue(namespace, name)
        if current is None:
            return
        changes = status_changes(current.get("status") or {}, fields, conditions, generation)
        if changes:
            await rt.kube.patch_jobqueue_status(namespace, name, changes)


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


async def read_dsn(rt: Runtime, namespace: str, spec: JobQueueSpec, *, fresh: bool = False) -> str | None:
    """The DSN from the JobQueue's Secret, re-read at most every ``secret_ttl_seconds`` (or when ``fresh``)."""
    key = (namespace, spec.dsn_secret_name, spec.dsn_secret_key)
    cached = rt.secrets.get(key)
    if cached is not None and not fresh and time.monotonic() - cached[0] < rt.config.secret_ttl_seconds:
        return cached[1]
    value = await rt.kube.read_secret_key(*key)
    if value is None:
        rt.secrets.pop(key, None)
    else:
        rt.secrets[key] = (time.monotonic(), value)
    return value


def secret_missing(spec: JobQueueSpec) -> str:
    return f"Secret {spec.dsn_secret_name!r} with key {spec.dsn_secret_key!r} not found"


def initial_replicas(spec: JobQueueSpec, last_desired: Any) -> int:
    s = spec.scaling
    if not s.enabled:
        return spec.replicas if spec.replicas is not None else s.min_replicas
    wanted = last_desired if isinstance(last_desired, int) else s.min_replicas
    replicas = min(s.max_replicas, max(s.min_replicas, wanted))
    cap = scaling.budget_cap(s, spec.concurrency)
    return replicas if cap is None else min(replicas, cap)


# ---------------------------------------------------------------------------------------------- reconcile
async def reconcile(rt: Runtime, body: Mapping[str, Any], retry: int, logger: logging.Logger | Any) -> None:
    """Validate, migrate the schema, then create or patch the worker Deployment (create/update/resume)."""
    key = key_of(body)
    generation = body["metadata"].get("generation")
    try:
        spec = parse_spec(body.get("spec"))
    except InvalidSpecError as exc:
        rt.metrics.reconciles.labels("invalid").inc()
        await write_status(
            rt,
            key,
            generation=generation,
            fields={"observedGeneration": generation},
            conditions=((status.READY, False, status.INVALID_SPEC, str(exc)),),
        )
        raise kopf.PermanentError(f"invalid spec: {exc}") from None
    dsn = await read_dsn(rt, key[0], spec, fresh=True)
    if dsn is None:
        rt.metrics.reconciles.labels("retry").inc()
        rt.metrics.errors.labels("secret").inc()
        await write_status(
            rt,
            key,
            generation=generation,
            conditions=((status.READY, False, status.SECRET_NOT_FOUND, secret_missing(spec)),),
        )
        raise kopf.TemporaryError(secret_missing(spec), delay=rt.backoff(retry, 2.0))
    try:
        migrated = await rt.databases.ensure_schema(key, dsn, spec.schema)
    except DatabaseUnavailableError as exc:
        rt.metrics.reconciles.labels("retry").inc()
        rt.metrics.errors.labels("database").inc()
        await write_status(
            rt,
            key,
            generation=generation,
            conditions=(
                (status.DATABASE_REACHABLE, False, status.CONNECT_FAILED, str(exc)),
                (
                    status.SCHEMA_READY,
                    False,
                    status.MIGRATION_PENDING,
                    "waiting for the database to migrate the schema",
                ),
                (status.READY, False, status.CONNECT_FAILED, str(exc)),
            ),
        )
        raise kopf.TemporaryError(str(exc), delay=rt.backoff(retry)) from None
    if migrated:
        logger.info(f"schema {spec.schema!r} is migrated")
    try:
        await ensure_deployment(rt, body, spec)
    except KubeApiError as exc:
        rt.metrics.reconciles.labels("error").inc()
        rt.metrics.errors.labels("kubernetes").inc()
        raise kopf.TemporaryError(str(exc), delay=rt.backoff(retry)) from None
    await write_status(
        rt,
        key,
        generation=generation,
        fields={
            "observedGeneration": generation,
            "selector": ",".join(f"{k}={v}" for k, v in resources.selector_labels(key[1]).items()),
        },
        conditions=(
            (status.DATABASE_REACHABLE, True, status.CONNECTED, "the operator reached the database"),
            (status.SCHEMA_READY, True, status.MIGRATED, f"schema {spec.schema!r} is at the latest version"),
            (status.READY, True, status.RECONCILED, ready_message(key)),
        ),
    )
    rt.metrics.reconciles.labels("success").inc()
    rt.kick(key).set()


def ready_message(key: Key) -> str:
    return f"worker Deployment {resources.deployment_name(key[1])!r} is reconciled"


async def ensure_deployment(rt: Runtime, body: Mapping[str, Any], spec: JobQueueSpec) -> None:
    namespace, name = key_of(body)
    dname = resources.deployment_name(name)
    actual = await rt.kube.get_deployment(namespace, dname)
    if actual is None:
        replicas = initial_replicas(spec, (body.get("status") or {}).get("desiredReplicas"))
        desired = resources.build_deployment(body, spec, replicas=replicas, version=__version__)
        try:
            await rt.kube.create_deployment(namespace, desired)
            return
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        actual = await rt.kube.get_deployment(namespace, dname)  # created meanwhile: patch it like any other
        if actual is None:
            raise KubeApiError(409, f"Deployment {dname!r} conflicts but cannot be read")
    desired = resources.build_deployment(body, spec, replicas=None, version=__version__)
    patch = resources.drift_patch(desired, actual) or {}
    manual = spec.replicas if not spec.scaling.enabled and not spec.paused else None
    if manual is not None and (actual.get("spec") or {}).get("replicas") != manual:
        patch.setdefault("spec", {})["replicas"] = manual
    if patch:
        await rt.kube.patch_deployment(namespace, dname, patch)


async def finalize(rt: Runtime, body: Mapping[str, Any]) -> None:
    """Delete the worker Deployment (GC would too; 404 counts as done) and drop pools and listeners."""
    namespace, name = key_of(body)
    await rt.kube.delete_deployment(namespace, resources.deployment_name(name))
    await rt.forget((namespace, name))


# ---------------------------------------------------------------------------------------------- autoscaler
class Autoscaler:
    """One JobQueue's scaling loop (a kopf daemon): poll, decide, scale, report; sleep until the interval
    passes or the kick event is set (NOTIFY while at zero, a spec change)."""

    IDLE_SECONDS = 5.0
    MIN_POLL_GAP_SECONDS = 0.1

    def __init__(self, rt: Runtime, body: kopf.Body, logger: logging.Logger | Any) -> None:
        self.rt, self.body, self.logger = rt, body, logger
        self.key = key_of(body)
        self.history: tuple[scaling.Recommendation, ...] = ()
        self.failures = 0

    async def run(self, stopped: Any) -> None:
        kick = self.rt.kick(self.key)
        last_poll = -math.inf
        try:
            while not stopped:
                pause = self.MIN_POLL_GAP_SECONDS - (time.monotonic() - last_poll)
                if pause > 0:  # a stream of NOTIFYs (below the activation threshold) must not become a query storm
                    await asyncio.sleep(pause)
                kick.clear()
                last_poll = time.monotonic()
                try:
                    delay = await self.step(kick)
                except (KubeApiError, OSError) as exc:
                    self.rt.metrics.errors.labels("kubernetes").inc()
                    self.logger.warning(f"autoscaler step failed: {exc}")
                    delay = self.rt.backoff(self.failures)
                    self.failures += 1
                except Exception:  # never let one bad poll end the loop (CancelledError still passes)
                    self.rt.metrics.errors.labels("unexpected").inc()
                    self.logger.exception("autoscaler step failed unexpectedly")
                    delay = self.rt.backoff(self.failures)
                    self.failures += 1
                source = await wait(kick, stopped, delay)
                self.rt.metrics.wakeups.labels(source).inc()
        finally:
            await self.rt.wakeups.unsubscribe(self.key)

    async def step(self, kick: asyncio.Event) -> float:
        """One poll; returns the seconds to wait before the next one."""
        rt, (namespace, name) = self.rt, self.key
        try:
            spec = parse_spec(self.body.get("spec"))
        except InvalidSpecError:
            return self.IDLE_SECONDS  # the reconcile handler reports it; nothing to scale
        interval = spec.scaling.polling_interval_seconds
        deployment = await rt.kube.get_deployment(namespace, resources.deployment_name(name))
        if deployment is None:
            conditions = (self.body.get("status") or {}).get("conditions")
            if status.is_true(conditions, status.SCHEMA_READY):  # reconciled once, then deleted by hand
                self.logger.warning("worker Deployment is missing: creating it again")
                await ensure_deployment(rt, self.body, spec)
            return interval  # else not created yet: the reconcile handler waits for the database
        current = int((deployment.get("spec") or {}).get("replicas", 1))
        rt.metrics.current_replicas.labels(namespace, name).set(current)
        if spec.paused:
            await self.rt.wakeups.unsubscribe(self.key)
            await self.report(
                deployment,
                None,
                current,
                conditions=(
                    (
                        status.SCALING_ACTIVE,
                        False,
                        status.PAUSED,
                        "spec.paused is true: replicas are left alone",
                    ),
                ),
            )
            return interval
        dsn = await read_dsn(rt, namespace, spec, fresh=self.failures > 0)
        if dsn is None:
            await write_status(
                rt,
                self.key,
                conditions=((status.READY, False, status.SECRET_NOT_FOUND, secret_missing(spec)),),
            )
            return rt.backoff(self.failures, interval)
        started = time.monotonic()
        try:
            await rt.databases.ensure_schema(self.key, dsn, spec.schema)  # a no-op once per pool; new DSN: migrate
            stats = await rt.databases.stats(self.key, dsn, spec.schema, spec.queue, lease_seconds=spec.lease_seconds)
        except DatabaseUnavailableError as exc:
            return await self.unreachable(str(exc), interval)
        rt.metrics.poll_duration.observe(time.monotonic() - started)
        self.failures = 0
        if not spec.scaling.enabled:
            await self.rt.wakeups.unsubscribe(self.key)
            await self.report(
                deployment,
                stats,
                current,
                desired=spec.replicas,
                conditions=(
                    (
                        status.SCALING_ACTIVE,
                        False,
                        status.AUTOSCALING_DISABLED,
                        "spec.scaling.enabled is false: spec.replicas (kubectl scale) sets the replicas",
                    ),
                ),
            )
            return interval
        obs = scaling.Observation(stats.ready, stats.processing, stats.oldest_ready_age_seconds)
        now = time.monotonic()
        if not self.history:  # a fresh loop (operator restart): today's replicas count as a recommendation,
            self.history = (scaling.Recommendation(now, current),)  # so no scale-down before a full window
        decision = scaling.decide(
            obs,
            current,
            spec.scaling,
            concurrency=spec.concurrency,
            now=now,
            history=self.history,
        )
        self.history = decision.history
        scaled_at = None
        if decision.changed:
            await rt.kube.scale_deployment(namespace, resources.deployment_name(name), decision.replicas)
            direction = "up" if decision.replicas > current else "down"
            rt.metrics.scale_decisions.labels(direction, decision.reason).inc()
            rt.metrics.current_replicas.labels(namespace, name).set(decision.replicas)
            kopf.event(self.body, type="Normal", reason=decision.reason, message=decision.message)
            self.logger.info(decision.message)
            scaled_at = status.now_iso()
        if decision.replicas == 0 and spec.listen:
            await rt.wakeups.subscribe(self.key, dsn, spec.worker_settings().channel, spec.queue, kick)
        else:
            await rt.wakeups.unsubscribe(self.key)
        scaling_condition: Condition = (
            (status.SCALING_ACTIVE, True, status.CONNECTION_BUDGET_LIMITED, decision.message)
            if decision.budget_limited
            else (
                status.SCALING_ACTIVE,
                True,
                status.BACKLOG_POLLED,
                f"{decision.reason}: {decision.message}",
            )
        )
        await self.report(
            deployment,
            stats,
            decision.replicas,
            desired=decision.replicas,
            scaled_at=scaled_at,
            conditions=(scaling_condition,),
        )
        return interval

    async def unreachable(self, message: str, interval: float) -> float:
        """Keep the replicas as they are (no scale to zero on errors), say so, and back off."""
        self.rt.metrics.errors.labels("database").inc()
        self.failures += 1
        self.logger.warning(f"database unreachable, replicas kept: {message}")
        await write_status(
            self.rt,
            self.key,
            conditions=(
                (status.DATABASE_REACHABLE, False, status.CONNECT_FAILED, message),
                (
                    status.SCALING_ACTIVE,
                    False,
                    status.CONNECT_FAILED,
                    "replicas are kept until the database answers",
                ),
                (status.READY, False, status.CONNECT_FAILED, message),
            ),
        )
        return self.rt.backoff(self.failures, interval)

    async def report(
        self,
        deployment: Mapping[str, Any],
        stats: QueueStats | None,
        replicas: int,
        *,
        desired: int | None = None,
        scaled_at: str | None = None,
        conditions: tuple[Condition, ...] = (),
    ) -> None:
        namespace, name = self.key
        dep_status = deployment.get("status") or {}
        fields: dict[str, Any] = {
            "replicas": int(dep_status.get("replicas") or 0),
            "readyReplicas": int(dep_status.get("readyReplicas") or 0),
            "desiredReplicas": desired if desired is not None else replicas,
        }
        if stats is not None:
            fields["backlog"] = {
                "ready": stats.ready,
                "delayed": stats.delayed,
                "processing": stats.processing,
                "stalled": stats.stalled,
                "failed": stats.failed,
            }
            fields["oldestReadyAgeSeconds"] = round(stats.oldest_ready_age_seconds, 3)
            self.rt.metrics.ready_backlog.labels(namespace, name).set(stats.ready)
            conditions = (
                (status.DATABASE_REACHABLE, True, status.CONNECTED, "the operator reached the database"),
                (status.READY, True, status.RECONCILED, ready_message(self.key)),
                *conditions,
            )
        if scaled_at:
            fields["lastScaleTime"] = scaled_at
        self.rt.metrics.desired_replicas.labels(namespace, name).set(fields["desiredReplicas"])
        seen = self.body.get("status") or {}
        await write_status(self.rt, self.key, fields=fields, conditions=conditions, seen=seen)


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
