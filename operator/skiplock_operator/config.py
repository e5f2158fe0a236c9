"""The operator process's own settings (not a JobQueue's): ``run()`` arguments or ``SKIPLOCK_OPERATOR_*``.

The admin's policy lives here too: which images, service accounts, pod annotation and label keys, environment
variable names, Secrets, image pull secrets and database hosts a JobQueue may use, and whether it may set
scheduling fields. A JobQueue that breaks the policy gets ``Ready=False`` reason ``PolicyViolation`` and a Warning
Event, and its worker Deployment (if any) is scaled to zero.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "skiplock.io"
VERSION = "v1alpha1"
PLURAL = "jobqueues"
KIND = "JobQueue"
ENV = "SKIPLOCK_OPERATOR_"
DENIED_ENV_NAMES = ("PYTHON*", "LD_*", "BROWSER")
"""Environment names a JobQueue may not set unless the admin allows them by exact name: the interpreter's and
the dynamic loader's switches (``PYTHONWARNINGS`` + ``BROWSER`` runs a shell command, ``LD_PRELOAD`` loads a
library) run code of the tenant's choice inside an allowed image, before any skiplock code."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What a JobQueue creator may ask for. An empty tuple means "anything" (say so in the docs)."""

    allowed_images: tuple[str, ...] = ()
    """Image prefixes, matched on whole path segments (``registry.example.com/team-a`` allows
    ``registry.example.com/team-a/app:1``, never ``registry.example.com/team-a-evil/app``); empty: any image."""

    allowed_service_accounts: tuple[str, ...] = ()
    """Service account names a JobQueue may set; empty: any (leaving it unset is always allowed)."""

    allowed_pod_annotations: tuple[str, ...] = ()
    """Pod annotation keys (exact, or a prefix ending in ``/`` or ``*``); empty: any key."""

    allow_scheduling: bool = False
    """Whether spec.nodeSelector, spec.tolerations and spec.affinity may be set (default off)."""

    allowed_dsn_hosts: tuple[str, ...] = ()
    """Database hosts the operator connects to (exact names, ``.suffix`` domains, IP networks);
    empty: any host."""

    allowed_env_names: tuple[str, ...] = ()
    """Names ``spec.env`` may set (exact, or a prefix ending in ``*``); empty: any name not denied. An exact
    entry here also lifts a denial (``PYTHONUNBUFFERED``)."""

    denied_env_names: tuple[str, ...] = DENIED_ENV_NAMES
    """Names ``spec.env`` may not set (exact, or a prefix ending in ``*``), unless allowed by exact name."""

    allowed_secrets: tuple[str, ...] = ()
    """Secrets the worker pods may get: ``spec.dsnSecretRef`` and every ``spec.env[].valueFrom.secretKeyRef``
    (exact names, or a prefix ending in ``*``); empty: any Secret of the namespace."""

    allowed_pod_label_keys: tuple[str, ...] = ()
    """Pod label keys (exact, or a prefix ending in ``/`` or ``*``); empty: any key."""

    allowed_image_pull_secrets: tuple[str, ...] = ()
    """Names ``spec.imagePullSecrets`` may list (exact, or a prefix ending in ``*``); empty: any."""


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    server: str | None = None
    """Kubernetes API URL to use instead of in-cluster or kubeconfig credentials (tests, local runs)."""

    insecure: bool = False
    """Skip TLS verification of ``server`` (only for local emulators)."""

    database_timeout_seconds: float = 5.0
    """Longest wait for one database connect or stats query (default 5 s). An outage shows within
    pollingIntervalSeconds + this + 2 s."""

    retry_cap_seconds: float = 60.0
    """Upper bound of the back-off between attempts while a Secret or the Kubernetes API fails (default 60 s)."""

    secret_ttl_seconds: float = 30.0
    """How long the autoscaler reuses a DSN read from its Secret (default 30 s). A watched Secret that
    changes is re-read at once, so this only bounds what a missed watch event can cost."""

    metrics_port: int | None = 9465
    """Port of the operator's own /metrics (default 9465; None turns it off)."""

    watch_deployments: bool = True
    """Watch the Deployments the operator owns, so a hand edit is undone at once (needs Deployment
    ``list``/``watch``). Off: drift is undone at the next poll, and ``get`` is enough."""

    watch_secrets: bool = True
    """Watch opted-in DSN Secrets, so a rotated DSN is used at once (needs Secret ``list``/``watch``).
    Off: a rotation is seen within ``secret_ttl_seconds``, and ``get`` is enough."""

    drain_pods: bool = True
    """Busy-pod-safe scale-in: rank the worker pods by the jobs they hold (``pod-deletion-cost``) and drain the
    ones to remove before lowering replicas. Needs pods ``get``/``list``/``patch`` in the watched namespaces;
    off, the operator reads no pods and scale-in lowers replicas at once."""
    policy: Policy = Policy()

    default_worker_resources: Mapping[str, Any] = field(default_factory=dict)
    """Resources of a worker container whose JobQueue sets none (``SKIPLOCK_OPERATOR_DEFAULT_WORKER_RESOURCES``,
    JSON), so no worker pod runs BestEffort."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorConfig:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        if env.get(ENV + "SERVER"):
            values["server"] = env[ENV + "SERVER"]
        if env.get(ENV + "DATABASE_TIMEOUT_SECONDS"):
            values["database_timeout_seconds"] = float(env[ENV + "DATABASE_TIMEOUT_SECONDS"])
        if env.get(ENV + "SECRET_TTL_SECONDS"):
            values["secret_ttl_seconds"] = float(env[ENV + "SECRET_TTL_SECONDS"])
        if env.get(ENV + "METRICS_PORT"):
            port = int(env[ENV + "METRICS_PORT"])
            values["metrics_port"] = port or None
        for name in ("watch_deployments", "watch_secrets", "drain_pods"):
            raw = env.get(ENV + name.upper(), "").strip().lower()
            if raw:
                values[name] = _flag(name, raw)
        values["policy"] = policy_from_env(env)
        raw_resources = env.get(ENV + "DEFAULT_WORKER_RESOURCES", "").strip()
        if raw_resources:
            try:
                parsed = json.loads(raw_resources)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ValueError(f"{ENV}DEFAULT_WORKER_RESOURCES must be a JSON object (requests/limits)")
            values["default_worker_resources"] = parsed
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def _flag(name: str, raw: str) -> bool:
    if raw not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"{ENV}{name.upper()} must be true or false (got {raw!r})")
    return raw in ("true", "1", "yes")


def _items(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in env.get(ENV + name, "").split(",") if part.strip())


def policy_from_env(env: Mapping[str, str]) -> Policy:
    """``SKIPLOCK_OPERATOR_ALLOWED_IMAGES``, ``..._ALLOWED_SERVICE_ACCOUNTS``, ``..._ALLOWED_ANNOTATION_KEYS``,
    ``..._ALLOWED_POD_LABEL_KEYS``, ``..._ALLOWED_ENV_NAMES``, ``..._DENIED_ENV_NAMES`` (unset: the default denials,
    empty: none), ``..._ALLOWED_SECRETS``, ``..._ALLOWED_IMAGE_PULL_SECRETS``, ``..._ALLOWED_DSN_HOSTS``
    (comma-separated) and ``..._ALLOW_SCHEDULING`` (true/false)."""
    scheduling = env.get(ENV + "ALLOW_SCHEDULING", "").strip().lower()
    denied = _items(env, "DENIED_ENV_NAMES") if ENV + "DENIED_ENV_NAMES" in env else DENIED_ENV_NAMES
    return Policy(
        allowed_images=_items(env, "ALLOWED_IMAGES"),
        allowed_service_accounts=_items(env, "ALLOWED_SERVICE_ACCOUNTS"),
        allowed_pod_annotations=_items(env, "ALLOWED_ANNOTATION_KEYS"),
        allow_scheduling=_flag("allow_scheduling", scheduling) if scheduling else False,
        allowed_dsn_hosts=_items(env, "ALLOWED_DSN_HOSTS"),
        allowed_env_names=_items(env, "ALLOWED_ENV_NAMES"),
        denied_env_names=denied,
        allowed_secrets=_items(env, "ALLOWED_SECRETS"),
        allowed_pod_label_keys=_items(env, "ALLOWED_POD_LABEL_KEYS"),
        allowed_image_pull_secrets=_items(env, "ALLOWED_IMAGE_PULL_SECRETS"),
    )
