"""The worker Deployment: the only code that creates, patches, scales or deletes it.

One writer: the autoscaler daemon calls :func:`ensure` (create, or undo drift) and :func:`scale` on every poll,
whatever the mode (autoscaled, manual ``spec.replicas``, paused, scaling off); the delete handler calls
:func:`delete`. The reconcile handler never writes the Deployment: it validates, migrates and wakes the
autoscaler. So no two writers race over ``spec.replicas``, and a Deployment is only ever what one loop decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from skiplock import __version__
from skiplock_operator import resources
from skiplock_operator.k8s import KubeApiError
from skiplock_operator.runtime import Key, Runtime, key_of
from skiplock_operator.spec import JobQueueSpec


def initial_replicas(spec: JobQueueSpec, last_desired: Any, cap: int | None = None) -> int:
    """Replicas of a Deployment created now: the manual count, else the last desired one (an operator restart or
    a re-created Deployment starts where it was), within min/max; never above ``cap`` (the connection budget)."""
    s = spec.scaling
    if spec.replicas is not None:
        replicas = spec.replicas
    elif not s.enabled:
        replicas = s.min_replicas
    else:
        wanted = last_desired if isinstance(last_desired, int) else s.min_replicas
        replicas = min(s.max_replicas, max(s.min_replicas, wanted))
    return replicas if cap is None else min(replicas, cap)


def manual_replicas(spec: JobQueueSpec, cap: int | None) -> int | None:
    """``spec.replicas`` within the connection budget (None: not in manual mode)."""
    if spec.replicas is None:
        return None
    return spec.replicas if cap is None else min(spec.replicas, cap)


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


def ready_message(key: Key) -> str:
    return f"worker Deployment {resources.deployment_name(key[1])!r} is reconciled"


def replicas_of(deployment: Mapping[str, Any]) -> int:
    return int((deployment.get("spec") or {}).get("replicas", 1))


async def ensure(
    rt: Runtime, body: Mapping[str, Any], spec: JobQueueSpec, *, cap: int | None = None
) -> dict[str, Any] | None:
    """Create the worker Deployment or bring it back to the spec (drift); None when a Deployment of that
    name exists that this JobQueue does not control (nothing is changed then). Else the Deployment. ``cap``:
    the most replicas the connection budget allows (manual ``spec.replicas`` included)."""
    namespace, name = key_of(body)
    uid = str(body["metadata"].get("uid"))
    dname = resources.deployment_name(name)
    if not spec.resources and rt.config.default_worker_resources:  # the admin's default: no BestEffort workers
        spec = dataclasses.replace(spec, resources=rt.config.default_worker_resources)
    actual = await rt.kube.get_deployment(namespace, dname)
    if actual is None:
        replicas = initial_replicas(spec, (body.get("status") or {}).get("desiredReplicas"), cap)
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
    selector = ((actual.get("spec") or {}).get("selector") or {}).get("matchLabels")
    if selector and selector != desired["spec"]["selector"]["matchLabels"]:
        desired = resources.with_selector(desired, selector)  # immutable: an older Deployment keeps its own
    patch = resources.drift_patch(desired, actual) or {}
    manual = manual_replicas(spec, cap)
    if manual is not None and not spec.paused and replicas_of(actual) != manual:
        patch.setdefault("spec", {})["replicas"] = manual
    if patch:
        return await rt.kube.patch_deployment(namespace, dname, patch) or actual
    return actual


async def scale(rt: Runtime, key: Key, replicas: int) -> None:
    await rt.kube.scale_deployment(key[0], resources.deployment_name(key[1]), replicas)


async def stop(rt: Runtime, body: Mapping[str, Any]) -> bool:
    """Scale the worker Deployment to zero if this JobQueue controls it and it runs; True when it did."""
    namespace, name = key_of(body)
    actual = await rt.kube.get_deployment(namespace, resources.deployment_name(name))
    if actual is None or controller_uid(actual) != str(body["metadata"].get("uid")) or replicas_of(actual) == 0:
        return False
    await scale(rt, (namespace, name), 0)
    return True


async def delete(rt: Runtime, body: Mapping[str, Any]) -> None:
    """Delete the worker Deployment if this JobQueue controls it (with a UID precondition)."""
    namespace, name = key_of(body)
    dname = resources.deployment_name(name)
    actual = await rt.kube.get_deployment(namespace, dname)
    if actual is not None and controller_uid(actual) == str(body["metadata"].get("uid")):
        await rt.kube.delete_deployment(namespace, dname, uid=str(actual["metadata"].get("uid")))
