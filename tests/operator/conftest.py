"""kopf running for real (its own thread and loop) against the kmock emulator, with a real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from prometheus_client import CollectorRegistry

from skiplock.logs import JsonFormatter
from skiplock_operator import serve
from skiplock_operator.config import OperatorConfig
from skiplock_operator.metrics import OperatorMetrics
from support.kmock_k8s import K8sEmulator, new_emulator
from support.pg import drop_schema

CRDS = sorted((Path(__file__).resolve().parents[2] / "crds").glob("*.yaml"))
NAMESPACE = "default"
JQ = kmock.resource("skiplock.io", "v1alpha1", "jobqueues")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SECRETS = kmock.resource("", "v1", "secrets")
EVENTS = kmock.resource("", "v1", "events")
EVENTS_V1 = kmock.resource("events.k8s.io", "v1", "events")


class Cluster:
    """The emulated API server, with the few verbs the tests need (all through HTTP, so kopf sees them)."""

    def __init__(self, emu: K8sEmulator) -> None:
        self.emu = emu

    async def _send(self, method: str, url: str, body: Any, content_type: str = "application/merge-patch+json") -> None:
        async with self.emu.request(method, url, json=body, headers={"Content-Type": content_type}) as resp:
            assert resp.status < 300, f"{method} {url}: {resp.status} {await resp.text()}"

    async def apply_secret(self, name: str, dsn: str, key: str = "dsn", *, opted_in: bool = True) -> None:
        """A DSN Secret; ``opted_in`` adds the ``skiplock.io/dsn: "true"`` label the operator requires."""
        data = {key: base64.b64encode(dsn.encode()).decode()}
        meta: dict[str, Any] = {"name": name, "labels": {"skiplock.io/dsn": "true"} if opted_in else {}}
        if self.get(SECRETS, name) is None:
            body = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}
            await self._send("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body, "application/json")
        else:
            await self._send("PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}", {"data": data})

    async def patch_secret_labels(self, name: str, labels: dict[str, str]) -> None:
        await self._send("PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}", {"metadata": {"labels": labels}})

    async def create(self, url: str, body: dict[str, Any]) -> None:
        await self._send("POST", url, body, "application/json")

    async def create_jobqueue(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": "skiplock.io/v1alpha1", "kind": "JobQueue", "metadata": {"name": name}, "spec": spec}
        await self._send(
            "POST", f"/apis/skiplock.io/v1alpha1/namespaces/{NAMESPACE}/jobqueues", body, "application/json"
        )

    async def patch_jobqueue(self, name: str, patch: dict[str, Any]) -> None:
        await self._send("PATCH", f"/apis/skiplock.io/v1alpha1/namespaces/{NAMESPACE}/jobqueues/{name}", patch)

    async def delete_jobqueue(self, name: str) -> None:
        await self._send("DELETE", f"/apis/skiplock.io/v1alpha1/namespaces/{NAMESPACE}/jobqueues/{name}", None)

    async def patch_deployment(self, name: str, patch: dict[str, Any]) -> None:
        await self._send("PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}", patch)

    def get(self, resource: Any, name: str) -> dict[str, Any] | None:
        for (res, namespace, obj_name), obj in self.emu.objects.items():
            if res == resource and namespace == NAMESPACE and obj_name == name and not obj.deleted:
                return dict(obj.raw)
        return None

    def jobqueue(self, name: str) -> dict[str, Any] | None:
        return self.get(JQ, name)

    def deployment(self, name: str) -> dict[str, Any] | None:
        return self.get(DEPLOYMENTS, f"{name}-worker")

    def replicas(self, name: str) -> int | None:
        dep = self.deployment(name)
        return None if dep is None else dep["spec"].get("replicas")

    def events(self) -> list[dict[str, Any]]:
        return [
            dict(obj.raw)
            for (res, _, _), obj in self.emu.objects.items()
            if res in (EVENTS, EVENTS_V1) and not obj.deleted
        ]

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        jq = self.jobqueue(name) or {}
        for cond in (jq.get("status") or {}).get("conditions") or []:
            if cond["type"] == type_:
                return dict(cond)
        return None


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    emu = new_emulator(CRDS)
    async with emu, kmock.Server(emu):
        yield Cluster(emu)


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, **options: Any) -> AsyncIterator[OperatorMetrics]:
    """The real operator (``skiplock_operator.serve``) in its own thread and event loop."""
    stop, ready = threading.Event(), threading.Event()
    config_options: dict[str, Any] = {
        "database_timeout_seconds": 2.0,
        "retry_cap_seconds": 1.0,
        "secret_ttl_seconds": 0.0,  # tests swap the DSN in the Secret and expect the next poll to see it
        **options.pop("config", {}),
    }
    config = OperatorConfig(server=str(cluster.emu.url), insecure=True, metrics_port=None, **config_options)
    metrics = OperatorMetrics(CollectorRegistry())
    failures: list[BaseException] = []
    kwargs: dict[str, Any] = {"namespaces": [NAMESPACE], "all_namespaces": False, "standalone": True, **options}

    def main() -> None:
        try:
            asyncio.run(serve(config=config, metrics=metrics, stop_flag=stop, ready_flag=ready, **kwargs))
        except BaseException as exc:  # reported below
            failures.append(exc)

    thread = threading.Thread(target=main, name="kopf", daemon=True)
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 20), f"operator did not start: {failures}"
        yield metrics
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 20)
    assert not thread.is_alive(), "operator did not stop"
    assert not failures, "".join(traceback.format_exception(failures[0]))


class CapturedLog(logging.Handler):
    """Every record of the process at INFO and above (the operator's default level), as JSON log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def captured_log() -> Iterator[CapturedLog]:
    handler = CapturedLog()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def metric(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    """One sample of the operator's registry (None when the series does not exist)."""
    registry = metrics.registry
    value = registry.get_sample_value(name, labels)
    return None if value is None else float(value)


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[OperatorMetrics]:
    async with running_operator(cluster) as metrics:
        yield metrics


@pytest.fixture
def fresh_schema(pg_dsn: str) -> Any:
    """A schema name nobody migrated yet (the operator must), dropped after."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(pg_dsn, name)


def jobqueue_spec(queue: str, schema: str, **scaling: Any) -> dict[str, Any]:
    return {
        "queue": queue,
        "handler": "app.jobs:run",
        "image": "example.com/app-worker:1.0",
        "dsnSecretRef": {"name": "db"},
        "schema": schema,
        "concurrency": 4,
        "scaling": {
            "minReplicas": 0,
            "maxReplicas": 5,
            "targetBacklogPerReplica": 10,
            "scaleDownStabilizationSeconds": 1,
            "pollingIntervalSeconds": 0.2,
            **scaling,
        },
    }
