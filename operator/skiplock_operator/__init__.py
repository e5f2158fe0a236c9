"""skiplock's Kubernetes operator: JobQueue resources to autoscaled worker Deployments.

``import skiplock_operator`` stays cheap: kopf and the Kubernetes client load only inside :func:`serve`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from skiplock import ConfigError

__all__ = ["run", "serve"]

log = logging.getLogger(__name__)
_METRICS: dict[int, Any] = {}


async def serve(
    *,
    namespaces: list[str],
    all_namespaces: bool,
    liveness_port: int | None = None,
    peering: str | None = None,
    standalone: bool = True,
    config: Any = None,
    metrics: Any = None,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
) -> None:
    """Run the operator in the current event loop until ``stop_flag`` is set or a signal arrives."""
    import kopf

    from skiplock_operator.config import OperatorConfig
    from skiplock_operator.handlers import compact_kopf_logs, configure, register

    config = config or OperatorConfig.from_env()
    compact_kopf_logs()
    registry = kopf.OperatorRegistry()
    settings = kopf.OperatorSettings()
    configure(settings, peering=peering, standalone=standalone)
    register(registry, config, metrics or _process_metrics(config.metrics_port))
    await kopf.operator(
        registry=registry,
        settings=settings,
        standalone=standalone,
        peering_name=peering,
        clusterwide=all_namespaces,
        namespaces=[] if all_namespaces else namespaces,
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
        memo=kopf.Memo(),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def _process_metrics(port: int | None) -> Any:
    """One metrics object per process (a registry refuses the same names twice); the exporter starts once."""
    from prometheus_client import REGISTRY

    from skiplock.exporter import serve as serve_metrics
    from skiplock_operator.metrics import OperatorMetrics

    if id(REGISTRY) not in _METRICS:
        if port:  # the worker's server: binds first (a busy port is a clear error), 404s, bounded, timeouts
            serve_metrics(REGISTRY, "0.0.0.0", port, {}, what="operator metrics").start()
        _METRICS[id(REGISTRY)] = OperatorMetrics(REGISTRY)
    return _METRICS[id(REGISTRY)]


def run(
    namespaces: list[str],
    all_namespaces: bool,
    liveness_port: int | None,
    peering: str | None,
    standalone: bool,
) -> int:
    """Blocking entry point of ``skiplock operator``; returns the exit code (2: usage or missing extra)."""
    if not all_namespaces and not namespaces:
        log.error("give --namespace NS (repeatable) or --all-namespaces")
        return 2
    try:
        import kopf  # noqa: F401 - only to fail early with a clear message
    except ImportError as exc:
        log.error("the operator needs the extra: pip install 'skiplock[operator]' (%s)", exc)
        return 2
    from skiplock_operator.config import OperatorConfig

    try:
        config = OperatorConfig.from_env()
    except ValueError as exc:
        log.error("invalid SKIPLOCK_OPERATOR_* setting: %s", exc)
        return 2
    try:
        asyncio.run(
            serve(
                config=config,
                namespaces=namespaces,
                all_namespaces=all_namespaces,
                liveness_port=liveness_port,
                peering=peering,
                standalone=standalone,
            )
        )
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # e.g. a busy metrics port
        log.error("%s", exc)
        return 2
    return 0
