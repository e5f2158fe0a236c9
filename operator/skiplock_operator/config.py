"""The operator process's own settings (not a JobQueue's): ``run()`` arguments or ``SKIPLOCK_OPERATOR_*``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

GROUP = "skiplock.io"
VERSION = "v1alpha1"
PLURAL = "jobqueues"
KIND = "JobQueue"


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    server: str | None = None
    """Kubernetes API URL to use instead of in-cluster or kubeconfig credentials (tests, local runs)."""

    insecure: bool = False
    """Skip TLS verification of ``server`` (only for local emulators)."""

    database_timeout_seconds: float = 5.0
    """Longest wait for one database connect or stats query (default 5 s)."""

    retry_cap_seconds: float = 60.0
    """Upper bound of the back-off between attempts while a database or Secret is missing (default 60 s)."""

    secret_ttl_seconds: float = 30.0
    """How long the autoscaler reuses a DSN read from its Secret (default 30 s; a failure re-reads at once)."""

    metrics_port: int | None = 9465
    """Port of the operator's own /metrics (default 9465; None turns it off)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorConfig:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        if env.get("SKIPLOCK_OPERATOR_SERVER"):
            values["server"] = env["SKIPLOCK_OPERATOR_SERVER"]
        if env.get("SKIPLOCK_OPERATOR_DATABASE_TIMEOUT_SECONDS"):
            values["database_timeout_seconds"] = float(env["SKIPLOCK_OPERATOR_DATABASE_TIMEOUT_SECONDS"])
        if env.get("SKIPLOCK_OPERATOR_SECRET_TTL_SECONDS"):
            values["secret_ttl_seconds"] = float(env["SKIPLOCK_OPERATOR_SECRET_TTL_SECONDS"])
        if env.get("SKIPLOCK_OPERATOR_METRICS_PORT"):
            port = int(env["SKIPLOCK_OPERATOR_METRICS_PORT"])
            values["metrics_port"] = port or None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
