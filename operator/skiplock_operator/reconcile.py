"""The JobQueue handlers: create/update/resume (validate, migrate, report, wake the autoscaler) and delete.

The handler never writes the worker Deployment (:mod:`skiplock_operator.workload` has one writer, the autoscaler
daemon, which it wakes). What it owns: the verdict on the spec (InvalidSpec, PolicyViolation), the schema
migration (SchemaReady), and the retries kopf runs for those.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from skiplock_operator import resources, status, workload
from skiplock_operator.database import DatabaseProblem
from skiplock_operator.runtime import Key, Runtime, SecretProblem, database_conditions, key_of, read_dsn, write_status
from skiplock_operator.spec import InvalidSpecError, parse_spec, policy_violations

log = logging.getLogger(__name__)


async def reconcile(rt: Runtime, body: Mapping[str, Any], retry: int, logger: logging.Logger | Any) -> None:
    """Validate, check the policy, migrate the schema, report; then wake the autoscaler, which brings the
    Deployment in line (create/update/resume)."""
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
        ),
    )
    rt.metrics.reconciles.labels("success").inc()
    rt.kick(key).set()  # the autoscaler creates the Deployment or applies the change now


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


async def finalize(rt: Runtime, body: Mapping[str, Any]) -> None:
    """Delete the worker Deployment (if this JobQueue controls it), resume what spec.paused held, forget."""
    await workload.delete(rt, body)
    if (body.get("status") or {}).get("paused"):
        await resume_on_delete(rt, body)
    await rt.forget(key_of(body))


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
