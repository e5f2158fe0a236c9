"""What every part of the operator shares: the :class:`Runtime` (kopf's ``memo``), the DSN cache, status writes.

The Runtime holds the Kubernetes client, the database connections, the LISTEN hub, metrics, and per-JobQueue
wake-up events and status locks. :func:`write_status` is the one way a status changes: a read-modify-write under
that JobQueue's lock (the reconcile handler and the autoscaler both write conditions, and a merge patch replaces
the whole list). :class:`Daemon` is the base of the three per-JobQueue daemons: each starts with the same gate
(the spec parses, the policy allows it) and reads the DSN the same way.

Everything written to a status, an Event or a log line is the operator's own text: a classified reason
and a fixed message, never a driver's message (it can quote the DSN, or whatever a Secret held).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from skiplock.backoff import backoff_seconds
from skiplock_operator import status
from skiplock_operator.config import OperatorConfig
from skiplock_operator.database import DatabaseProblem, Databases
from skiplock_operator.k8s import Kube
from skiplock_operator.metrics import OperatorMetrics
from skiplock_operator.spec import InvalidSpecError, JobQueueSpec, parse_spec, policy_violations
from skiplock_operator.wakeup import Wakeups

Key = tuple[str, str]
Condition = tuple[str, bool, str, str]


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
        self._claims: dict[str, dict[Key, int]] = {}
        """Per database server: the connections each JobQueue's workers may hold (the cap across JobQueues)."""

    def claim(self, server: str, key: Key, connections: int) -> None:
        """Record what this JobQueue's workers hold on ``server`` (the other JobQueues' budgets leave it out)."""
        for claims in self._claims.values():
            claims.pop(key, None)
        self._claims.setdefault(server, {})[key] = connections

    def claimed_by_others(self, server: str, key: Key) -> int:
        return sum(n for k, n in self._claims.get(server, {}).items() if k != key)

    def operator_connections(self, server: str) -> int:
        """The operator's own connections to ``server``: its query connections and its listeners."""
        return self.databases.open_to(server) + self.wakeups.open_to(server)

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
        for claims in self._claims.values():
            claims.pop(key, None)
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


class Daemon:
    """What every per-JobQueue daemon (autoscaler, schedules, retention) shares: the runtime, the live body,
    its key, and one gate. :meth:`allowed` gives the spec only when it parses and the admin's policy allows it;
    otherwise the daemon does nothing (the reconcile handler reports why, once)."""

    IDLE_SECONDS = 5.0
    """How soon a daemon looks again at a spec it may not run."""

    def __init__(self, rt: Runtime, body: kopf.Body, logger: logging.Logger | Any) -> None:
        self.rt, self.body, self.logger = rt, body, logger
        self.key = key_of(body)

    def allowed(self) -> JobQueueSpec | None:
        try:
            spec = parse_spec(self.body.get("spec"))
        except InvalidSpecError:
            return None
        return None if policy_violations(spec, self.rt.config.policy) else spec

    async def dsn(self, spec: JobQueueSpec, *, fresh: bool = False) -> str:
        """The operator's DSN for this JobQueue (cached; raises SecretProblem)."""
        return await read_dsn(self.rt, self.key, spec, fresh=fresh)
