"""kopf decorators only: each body delegates to :mod:`skiplock_operator.reconcile`.

Handlers are registered on an explicit registry (``register``), so tests and ``run()`` build the same
operator. Handlers return None: kopf would store return values under ``status.<handler>``.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from skiplock_operator import reconcile
from skiplock_operator.config import GROUP, PLURAL, VERSION, OperatorConfig
from skiplock_operator.k8s import Kube
from skiplock_operator.metrics import OperatorMetrics


def configure(settings: kopf.OperatorSettings, *, peering: str | None, standalone: bool) -> None:
    """kopf settings: progress and diff-base in our own annotations (status stays ours), quiet events."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP,
        key="last-handled-configuration",
    )
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.level = logging.WARNING
    settings.peering.standalone = standalone
    if peering:
        settings.peering.name = peering
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # No namespace or CRD watching: the namespaces are named (or all), so the RBAC needs neither
    # namespaces nor customresourcedefinitions; a CRD installed later needs an operator restart.
    settings.scanning.disabled = True


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, metrics: OperatorMetrics) -> None:
    resource = (GROUP, VERSION, PLURAL)

    server = config.server
    if server:

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, insecure=config.insecure)
    else:

        @kopf.on.login(registry=registry)
        def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
            return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        kube = await Kube.connect(config.server, insecure=config.insecure)
        memo.runtime = reconcile.Runtime(config, kube, metrics)
        logger.info("skiplock operator started")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        runtime: reconcile.Runtime | None = getattr(memo, "runtime", None)
        if runtime is not None:
            await runtime.close()
        logger.info("skiplock operator stopped")

    @kopf.on.resume(*resource, registry=registry, id="reconcile")
    @kopf.on.create(*resource, registry=registry, id="reconcile")
    @kopf.on.update(*resource, registry=registry, id="reconcile")
    async def reconcile_jobqueue(body: kopf.Body, memo: kopf.Memo, retry: int, logger: kopf.Logger, **_: Any) -> None:
        await reconcile.reconcile(memo.runtime, body, retry, logger)

    @kopf.on.delete(*resource, registry=registry, id="delete")
    async def delete_jobqueue(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile.finalize(memo.runtime, body)

    @kopf.daemon(*resource, registry=registry, id="autoscale", cancellation_backoff=1.0, cancellation_timeout=5.0)
    async def autoscale(
        body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
    ) -> None:
        await reconcile.Autoscaler(memo.runtime, body, logger).run(stopped)
