"""The only Kubernetes API caller (kubernetes_asyncio): Secrets, Deployments, JobQueue status.

Calls return plain dicts (the JSON the server sent), ``None`` for 404, and raise :class:`KubeApiError`
otherwise, so the rest of the operator never handles client models.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio import client, config

from skiplock_operator.config import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"


class KubeApiError(Exception):
    """A Kubernetes API call failed with a status other than 404."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._apps = client.AppsV1Api(api)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls, server: str | None = None, *, insecure: bool = False) -> Kube:
        """In-cluster credentials, else the kubeconfig; or a bare ``server`` URL (tests, local emulators)."""
        if server:
            conf = client.Configuration(host=server)
            conf.verify_ssl = not insecure
            return cls(client.ApiClient(conf))
        conf = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            await config.load_kube_config(client_configuration=conf)
        return cls(client.ApiClient(conf))

    async def close(self) -> None:
        await self._api.close()

    @staticmethod
    async def _json(call: Awaitable[Any]) -> dict[str, Any] | None:
        resp = await call
        try:
            raw = await resp.read()
        finally:
            resp.release()
        if resp.status == 404:
            return None
        if not 200 <= resp.status < 300:
            try:
                message = json.loads(raw).get("message", "")
            except (ValueError, AttributeError):
                message = raw[:200].decode("utf-8", "replace")
            raise KubeApiError(resp.status, str(message)[:300])
        data = json.loads(raw) if raw else {}
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ secrets
    async def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        """The decoded value of one key of a Secret, or None when the Secret or the key is missing."""
        secret = await self._json(self._core.read_namespaced_secret(name, namespace, _preload_content=False))
        if secret is None:
            return None
        encoded = (secret.get("data") or {}).get(key)
        if encoded is None:
            return None
        try:
            return base64.b64decode(encoded).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None

    # ------------------------------------------------------------------ deployments
    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json(self._apps.read_namespaced_deployment(name, namespace, _preload_content=False))

    async def create_deployment(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        created = await self._json(
            self._apps.create_namespaced_deployment(namespace, body, _preload_content=False)  # type: ignore[arg-type]
        )
        return created or {}

    async def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        return await self._json(
            self._apps.patch_namespaced_deployment(  # type: ignore[call-arg]
                name,
                namespace,
                patch,
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
        return await self.patch_deployment(namespace, name, {"spec": {"replicas": replicas}})

    async def delete_deployment(self, namespace: str, name: str) -> bool:
        """Delete (foreground is not needed: the pods drain on SIGTERM). False when it was already gone."""
        body = {"propagationPolicy": "Background"}
        gone = await self._json(
            self._apps.delete_namespaced_deployment(
                name,
                namespace,
                body=body,  # type: ignore[arg-type]
                _preload_content=False,
            )
        )
        return gone is not None

    # ------------------------------------------------------------------ jobqueues
    async def get_jobqueue(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json(
            self._custom.get_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                _preload_content=False,
            )
        )

    async def patch_jobqueue_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        return await self._json(
            self._custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )
