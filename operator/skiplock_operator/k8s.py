"""The only Kubernetes API caller: Secrets, Deployments, JobQueue status.

It uses the official synchronous ``kubernetes`` client, each call in a thread (``asyncio.to_thread``),
which is the pattern kopf documents for it: the operator's event loop never blocks on the API.
Calls return plain dicts (the JSON the server sent), ``None`` for 404, and raise :class:`KubeApiError`
otherwise, so the rest of the operator never handles client models.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from skiplock_operator.config import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
DSN_LABEL = "skiplock.io/dsn"
"""Only Secrets labelled ``skiplock.io/dsn: "true"`` are read for a DSN (an opt-in, not every Secret)."""
REQUEST_TIMEOUT_SECONDS = 30


class KubeApiError(Exception):
    """A Kubernetes API call failed with a status other than 404 (the message is the server's reason)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class SecretValue:
    """What a Secret lookup found: ``value`` only when the Secret opted in and holds the key."""

    found: bool
    opted_in: bool = False
    value: str | None = None


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._apps = client.AppsV1Api(api)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls, server: str | None = None, *, insecure: bool = False) -> Kube:
        """In-cluster credentials, else the kubeconfig; or a bare ``server`` URL (tests, local emulators)."""
        conf = client.Configuration()
        if server:
            conf.host = server
            conf.verify_ssl = not insecure
        else:
            try:
                config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                await asyncio.to_thread(config.load_kube_config, client_configuration=conf)
        return cls(client.ApiClient(conf))

    async def close(self) -> None:
        await asyncio.to_thread(self._api.close)

    @staticmethod
    async def _json(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        def run() -> tuple[int, bytes]:
            try:
                resp = call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs)
            except ApiException as exc:
                body = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
                return int(exc.status or 0), body
            try:
                return int(resp.status), resp.data
            finally:
                resp.release_conn()

        status, raw = await asyncio.to_thread(run)
        if status == 404:
            return None
        if not 200 <= status < 300:
            try:
                message = json.loads(raw).get("reason", "") or ""
            except (ValueError, AttributeError):
                message = ""
            raise KubeApiError(status, str(message)[:100])
        data = json.loads(raw) if raw else {}
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ secrets
    async def read_secret_key(self, namespace: str, name: str, key: str) -> SecretValue:
        """One key of a Secret, read only when the Secret carries the opt-in label."""
        secret = await self._json(self._core.read_namespaced_secret, name, namespace)
        if secret is None:
            return SecretValue(found=False)
        labels = (secret.get("metadata") or {}).get("labels") or {}
        if labels.get(DSN_LABEL) != "true":
            return SecretValue(found=True, opted_in=False)
        encoded = (secret.get("data") or {}).get(key)
        if not isinstance(encoded, str):
            return SecretValue(found=True, opted_in=True)
        try:
            return SecretValue(True, True, base64.b64decode(encoded).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError):
            return SecretValue(found=True, opted_in=True)

    # ------------------------------------------------------------------ deployments
    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json(self._apps.read_namespaced_deployment, name, namespace)

    async def create_deployment(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json(self._apps.create_namespaced_deployment, namespace, body) or {}

    async def patch_deployment(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        return await self._json(
            self._apps.patch_namespaced_deployment, name, namespace, dict(patch), _content_type=MERGE_PATCH
        )

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
        return await self.patch_deployment(namespace, name, {"spec": {"replicas": replicas}})

    async def delete_deployment(self, namespace: str, name: str, *, uid: str) -> bool:
        """Delete the Deployment only if it still is the object ``uid`` names (a precondition the server
        checks: a same-named Deployment created by someone else meanwhile survives). False when gone."""
        body = client.V1DeleteOptions(propagation_policy="Background", preconditions=client.V1Preconditions(uid=uid))
        try:
            gone = await self._json(self._apps.delete_namespaced_deployment, name, namespace, body=body)
        except KubeApiError as exc:
            if exc.status == 409:  # the precondition failed: not ours any more
                return False
            raise
        return gone is not None

    # ------------------------------------------------------------------ pods (scale-in; only with drain_pods)
    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The pods carrying every one of ``labels`` (the selector is also checked here)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        found = await self._json(self._core.list_namespaced_pod, namespace, label_selector=selector) or {}
        return [
            pod
            for pod in found.get("items") or []
            if all(((pod.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in labels.items())
        ]

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into a pod (a pod gone meanwhile is not an error)."""
        patch = {"metadata": {"annotations": dict(annotations)}}
        await self._json(self._core.patch_namespaced_pod, name, namespace, patch, _content_type=MERGE_PATCH)

    # ------------------------------------------------------------------ jobqueues
    async def get_jobqueue(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json(self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    async def patch_jobqueue_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        return await self._json(
            self._custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
        )
