"""Pure builders: a JobQueue's spec to the worker Deployment (dicts in, dicts out; no network)."""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

import kopf

from skiplock_operator.spec import METRICS_PORT, JobQueueSpec

NAME = "skiplock-worker"
CONTAINER = "worker"
LABEL_QUEUE = "skiplock.io/queue"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "skiplock-operator"
GRACE_MARGIN_SECONDS = 10
"""Added to shutdownGraceSeconds: the worker hands unfinished jobs back after its grace, then exits."""


def label_value(text: str) -> str:
    """``text`` as a valid label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.")


def deployment_name(jobqueue: str) -> str:
    return f"{jobqueue}-worker"


def instance_label(jobqueue: str) -> str:
    """The JobQueue's name as a label value. A name that does not fit (over 63 characters) keeps its first 52 and
    ends in a hash of the whole name, so two names that share their first 63 characters get distinct selectors."""
    value = label_value(jobqueue)
    if value == jobqueue:
        return value
    digest = hashlib.sha256(jobqueue.encode()).hexdigest()[:10]
    return f"{value[:52].rstrip('-_.')}-{digest}"


def selector_labels(jobqueue: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": instance_label(jobqueue)}


def labels(jobqueue: str, spec: JobQueueSpec, version: str) -> dict[str, str]:
    return {
        **selector_labels(jobqueue),
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "skiplock",
        MANAGED_BY: MANAGER,
        "app.kubernetes.io/version": label_value(version),
        LABEL_QUEUE: label_value(spec.queue),
    }


def termination_grace_seconds(spec: JobQueueSpec) -> int:
    return math.ceil(spec.shutdown_grace_seconds) + GRACE_MARGIN_SECONDS


def container_env(spec: JobQueueSpec) -> list[dict[str, Any]]:
    """Downward API identity, the DSN from its Secret, settings from ``Settings.to_env()``, user env last."""
    field_refs = {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
    }
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in field_refs.items()
    ]
    env.append(
        {
            "name": "SKIPLOCK_DSN",
            "valueFrom": {"secretKeyRef": {"name": spec.dsn_secret_name, "key": spec.dsn_secret_key}},
        }
    )
    env.extend({"name": k, "value": v} for k, v in sorted(spec.worker_env().items()))
    env.extend(copy.deepcopy(dict(item)) for item in spec.env)
    return env


def container_security() -> dict[str, Any]:
    """The restricted Pod Security Standard for the worker container."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def pod_template(jobqueue: str, spec: JobQueueSpec, version: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": ["worker"],
        "env": container_env(spec),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "startupProbe": probe("/healthz", 2, 30),
        "livenessProbe": probe("/healthz", 10, 3),
        "readinessProbe": probe("/readyz", 5, 2),
        "securityContext": container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if spec.resources:
        container["resources"] = copy.deepcopy(dict(spec.resources))
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [copy.deepcopy(dict(t)) for t in spec.tolerations]
    if spec.affinity:
        pod["affinity"] = copy.deepcopy(dict(spec.affinity))
    meta: dict[str, Any] = {"labels": {**spec.pod_labels, **labels(jobqueue, spec, version)}}
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
        **spec.pod_annotations,
    }
    meta["annotations"] = annotations
    return {"metadata": meta, "spec": pod}


def build_deployment(
    owner: Mapping[str, Any], spec: JobQueueSpec, *, replicas: int | None, version: str
) -> dict[str, Any]:
    """The worker Deployment of one JobQueue, adopted by it (deleting the JobQueue deletes it)."""
    jobqueue = owner["metadata"]["name"]
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": deployment_name(jobqueue), "labels": labels(jobqueue, spec, version)},
        "spec": {
            "selector": {"matchLabels": selector_labels(jobqueue)},
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": pod_template(jobqueue, spec, version),
        },
    }
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    kopf.adopt(body, owner=owner)  # type: ignore[arg-type]  # any body-shaped mapping
    return body


def with_selector(desired: Mapping[str, Any], selector: Mapping[str, str]) -> dict[str, Any]:
    """``desired`` keeping an existing Deployment's ``selector`` (immutable): one made before a long JobQueue name
    got a hashed instance label keeps its own, in its labels and its pods' labels too."""
    body = copy.deepcopy(dict(desired))
    body["spec"]["selector"] = {"matchLabels": dict(selector)}
    body["metadata"]["labels"].update(selector)
    body["spec"]["template"]["metadata"]["labels"].update(selector)
    return body


def is_subset(wanted: Any, actual: Any) -> bool:
    """Whether everything in ``wanted`` is in ``actual`` (the server may add defaults we did not set)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(k in actual and is_subset(v, actual[k]) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(wanted) == len(actual)
            and all(is_subset(w, a) for w, a in zip(wanted, actual, strict=True))
        )
    return bool(wanted == actual)


def drift_patch(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch bringing ``actual`` back to ``desired`` (replicas untouched), or None when in step."""
    patch: dict[str, Any] = {}
    wanted_labels = desired["metadata"].get("labels", {})
    if not is_subset(wanted_labels, actual.get("metadata", {}).get("labels", {})):
        patch["metadata"] = {"labels": wanted_labels}
    spec_patch = {k: v for k, v in desired["spec"].items() if k not in ("replicas", "selector")}
    actual_spec = actual.get("spec", {})
    changed = {k: v for k, v in spec_patch.items() if not is_subset(v, actual_spec.get(k))}
    if changed:
        patch["spec"] = changed
    return patch or None
