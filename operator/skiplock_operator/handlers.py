"""kopf decorators only: each body delegates to its concern's module (reconcile, autoscaler, schedules, retention).

Handlers are registered on an explicit registry (``register``), so tests and ``run()`` build the same
operator. Handlers return None: kopf would store return values under ``status.<handler>``.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from skiplock_operator import autoscaler, reconcile, retention, runtime, schedules
from skiplock_operator.config import GROUP, KIND, PLURAL, VERSION, OperatorConfig
from skiplock_operator.k8s import DSN_LABEL, Kube
from skiplock_operator.metrics import OperatorMetrics
from skiplock_operator.resources import MANAGED_BY, MANAGER


class CompactKopfRecords(logging.Filter):
    """kopf's object logger attaches its whole settings object to every record (a JSON formatter dumps it
    all); keep one short ``object`` field instead, so a line stays one short event."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = vars(record).pop("k8s_ref", None)
        vars(record).pop("settings", None)
        vars(record).pop("k8s_skip", None)
        if isinstance(ref, dict) and ref.get("name"):
            record.object = f"{ref.get('namespace') or ''}/{ref['name']}".lstrip("/")
        return True


def compact_kopf_logs() -> None:
    logger = logging.getLogger("kopf.objects")
    if not any(isinstance(f, CompactKopfRecords) for f in logger.filters):
        logger.addFilter(CompactKopfRecords())


def configure(settings: kopf.OperatorSettings, *, peering: str | None, standalone: bool) -> None:
    """kopf settings: progress and diff-base in our own annotations (status stays ours), quiet events."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP,
        key="last-handled-configuration",
    )
    settings.persistence.finalizer = f"{GROUP}/operator"
    # Events are posted explicitly (kopf.event): a Warning for each error condition, Normal for scale
    # decisions and mode changes, all with the operator's own text. Log lines are not turned into Events
    # (kopf's own lines can carry exception text).
    settings.posting.enabled = True
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    settings.peering.standalone = standalone
    if peering:
        settings.peering.name = peering
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # No namespace or CRD watching: the namespaces are named (or all), so the RBAC needs neither
    # namespaces nor customresourcedefinitions; a CRD installed later needs an operator restart.
    settings.scanning.disabled = True
    # The watches ask the API server for our objects only (kopf's ``labels=`` filters are client-side): the DSN
    # Secret watch no longer streams every Secret of the watched namespaces, nor the Deployment watch every
    # Deployment.
    settings.watching.label_selectors["", "v1", "secrets"] = f"{DSN_LABEL}=true"
    settings.watching.label_selectors["apps", "v1", "deployments"] = f"{MANAGED_BY}={MANAGER}"


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, metrics: OperatorMetrics) -> None:
    resource = (GROUP, VERSION, PLURAL)

    server = config.server
    if server:

        @kopf.on.login(registry=registry, id="login")
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, insecure=config.insecure)
    else:

        @kopf.on.login(registry=registry, id="login")
        def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
            return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry, id="startup")
    async def startup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        kube = await Kube.connect(config.server, insecure=config.insecure)
        memo.runtime = runtime.Runtime(config, kube, metrics)
        logger.info("skiplock operator started")

    @kopf.on.cleanup(registry=registry, id="cleanup")
    async def cleanup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        rt: runtime.Runtime | None = getattr(memo, "runtime", None)
        if rt is not None:
            await rt.close()
        logger.info("skiplock operator stopped")

    @kopf.on.resume(*resource, registry=registry, id="reconcile")
    @kopf.on.create(*resource, registry=registry, id="reconcile")
    @kopf.on.update(*resource, registry=registry, id="reconcile")
    async def reconcile_jobqueue(body: kopf.Body, memo: kopf.Memo, retry: int, logger: kopf.Logger, **_: Any) -> None:
        await reconcile.reconcile(memo.runtime, body, retry, logger)

    @kopf.on.delete(*resource, registry=registry, id="delete")
    async def delete_jobqueue(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile.finalize(memo.runtime, body)

    if config.watch_deployments:

        @kopf.on.event("apps", "v1", "deployments", registry=registry, id="owned", labels={MANAGED_BY: MANAGER})
        def owned_deployment(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
            """Drift correction: a change to a Deployment we own wakes its JobQueue, whose poll undoes it."""
            rt: runtime.Runtime | None = getattr(memo, "runtime", None)
            for ref in body.get("metadata", {}).get("ownerReferences") or []:
                if rt is not None and ref.get("controller") and ref.get("kind") == KIND:
                    rt.owned_deployment_changed(body["metadata"]["namespace"], ref["name"])

    if config.watch_secrets:

        @kopf.on.event("", "v1", "secrets", registry=registry, id="dsn-secret", labels={DSN_LABEL: "true"})
        def dsn_secret(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
            """A rotated DSN is used at once: the cached value goes and the JobQueues that read it wake."""
            rt: runtime.Runtime | None = getattr(memo, "runtime", None)
            if rt is not None:
                rt.secret_changed(body["metadata"]["namespace"], body["metadata"]["name"])

    @kopf.daemon(*resource, registry=registry, id="schedules", cancellation_backoff=1.0, cancellation_timeout=5.0)
    async def fire_schedules(
        body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
    ) -> None:
        """Periodic tasks of the JobQueue's queues, fired from the database (no application code needed)."""
        await schedules.ScheduleFirer(memo.runtime, body, logger).run(stopped)

    @kopf.daemon(*resource, registry=registry, id="autoscale", cancellation_backoff=1.0, cancellation_timeout=5.0)
    async def autoscale(
        body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
    ) -> None:
        await autoscaler.Autoscaler(memo.runtime, body, logger).run(stopped)

    @kopf.daemon(*resource, registry=registry, id="retention", cancellation_backoff=1.0, cancellation_timeout=5.0)
    async def purge(
        body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
    ) -> None:
        await retention.Retention(memo.runtime, body, logger).run(stopped)
