"""kmock's Kubernetes emulator, fixed for kopf (what it fixes is listed below), plus resource registration.

What the subclass changes, all on writes and watches:
- every write sets ``uid``, ``creationTimestamp`` (on create), ``generation`` (bumped when ``spec`` changes)
  and a growing ``resourceVersion``; create fills ``apiVersion``/``kind`` (``kopf.adopt`` needs them);
- a create with ``metadata.generateName`` and no name gets a generated name (kopf posts Events so);
- a delete with ``preconditions.uid`` that does not match answers 409 and deletes nothing;
- a JSON patch whose ``test`` fails (or that cannot apply) answers 422, as the API server does, not 500;
- a list answers the current resourceVersion, and a watch subscribes to the event bus *before* it takes
  its snapshot, then skips states older than what it already sent (no lost events, no stale replays);
- an object whose last finalizer goes away while it is being deleted is gone at once.
A JSON object PATCH stays a merge patch (RFC 7386), whatever the Content-Type.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import enums, k8s, rendering

BUILTINS: dict[str, dict[str, Any]] = {
    "apps/v1/deployments": {"kind": "Deployment", "namespaced": True, "subresources": ["status", "scale"]},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "v1/events": {"kind": "Event", "namespaced": True},
    "events.k8s.io/v1/events": {"kind": "Event", "namespaced": True},
    # kopf waits for these two in discovery before it watches anything (it never lists them with
    # scanning disabled, which matters: kmock cannot list namespaces).
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {"kind": "CustomResourceDefinition", "namespaced": False},
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class K8sEmulator(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)
        self._last_version = 0

    # ------------------------------------------------------------------ helpers
    def _next_version(self) -> str:
        self._last_version = next(self._versions)
        return str(self._last_version)

    def _identity(self, resource: Any) -> tuple[str, str]:
        api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        kinds = [self.resources[known].kind for known in self.resources if known == resource]
        kind = kinds[0] if kinds and kinds[0] else resource.plural.capitalize()
        return api_version, kind

    async def _emit(self, resource: Any, kind: str, raw: dict[str, Any]) -> None:
        await self._buses[resource].put({"type": kind, "object": copy.deepcopy(raw)})

    # ------------------------------------------------------------------ writes
    async def _handle(self, request: rendering.Request) -> Any:
        action = request.action
        writes = (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)
        if request.resource is None or action not in writes:
            return await super()._handle(request)
        if action != enums.action.CREATE and request.name is None:
            return await super()._handle(request)  # collection-wide verbs: leave them to kmock
        async with self._lock:
            if action == enums.action.CREATE:
                await self._create(request)
            elif action == enums.action.UPDATE:
                await self._update(request)
            else:
                await self._delete(request)
        # Render the stored state through kmock's own response handlers (they only read).
        return await k8s.KubernetesScaffold._handle(self, request)

    async def _create(self, request: rendering.Request) -> None:
        sent = request.data.get("metadata") if isinstance(request.data, dict) else None
        if isinstance(sent, dict) and not sent.get("name") and sent.get("generateName"):
            sent["name"] = f"{sent['generateName']}{uuid.uuid4().hex[:5]}"  # as the API server does (kmock's
            # own response rendering finds the new object by this name, so it goes into the request too)
        data = copy.deepcopy(request.data or {})
        meta = data.setdefault("metadata", {})
        if not meta.get("name"):
            raise k8s.KubernetesError(status=422, reason="Invalid", message="metadata.name or generateName is required")
        namespace = request.namespace or meta.get("namespace")
        key = (request.resource, namespace, meta.get("name"))
        if key in self._objects and not self._objects[key].deleted:
            raise k8s.KubernetesObjectConflictError()
        api_version, kind = self._identity(request.resource)
        data.setdefault("apiVersion", api_version)
        data.setdefault("kind", kind)
        if namespace:
            meta["namespace"] = namespace
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            generation=1,
            resourceVersion=self._next_version(),
        )
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        await self._emit(request.resource, "ADDED", data)

    async def _update(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise k8s.KubernetesObjectNotFoundError()
        obj = self._objects[key]
        old = copy.deepcopy(obj.raw)
        patch = request.data
        if isinstance(patch, list):
            try:
                new = jsonpatch.apply_patch(old, patch, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise k8s.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
        else:
            new = merge_patch(old, patch or {})
        meta = new.setdefault("metadata", {})
        old_meta = old.get("metadata", {})
        for field in ("uid", "creationTimestamp", "name", "namespace"):  # immutable
            if field in old_meta:
                meta[field] = old_meta[field]
        if request.subresource == "status":
            new = {**old, "status": new.get("status", {})}  # the status subresource writes status only
            meta = new["metadata"] = copy.deepcopy(old_meta)
        elif new.get("spec") != old.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_version()
        obj.create(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            obj.delete()
            await self._emit(request.resource, "DELETED", new)
        else:
            await self._emit(request.resource, "MODIFIED", new)

    async def _delete(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise k8s.KubernetesObjectNotFoundError()
        obj = self._objects[key]
        current = copy.deepcopy(obj.raw)
        meta = current.setdefault("metadata", {})
        wanted_uid = (
            ((request.data or {}).get("preconditions") or {}).get("uid") if isinstance(request.data, dict) else None
        )
        if wanted_uid and wanted_uid != meta.get("uid"):
            raise k8s.KubernetesError(status=409, reason="Conflict", message="Precondition failed: UID mismatch")
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                meta["resourceVersion"] = self._next_version()
                obj.create(current)
                await self._emit(request.resource, "MODIFIED", current)
            return
        meta["resourceVersion"] = self._next_version()
        obj.create(current)
        obj.delete()
        await self._emit(request.resource, "DELETED", current)

    # ------------------------------------------------------------------ reads
    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        version = str(self._last_version)
        payload = await super()._serve_list(request)
        assert isinstance(payload, dict)
        payload["metadata"] = {"resourceVersion": version}
        api_version, kind = self._identity(request.resource)
        payload.setdefault("apiVersion", api_version)
        payload.setdefault("kind", f"{kind}List")
        return payload

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers at once
        assert request.resource is not None
        bus = self._buses[request.resource]
        marker = await bus.mark()  # subscribe first: nothing written after the snapshot is lost
        try:
            since = int(request.params.get("resourceVersion") or 0)
            sent: dict[tuple[Any, Any], int] = {}
            async with self._lock:
                snapshot = [
                    copy.deepcopy(obj.raw)
                    for (resource, namespace, _), obj in self._objects.items()
                    if resource == request.resource
                    and not obj.deleted
                    and (request.namespace is None or namespace == request.namespace)
                ]
            for raw in snapshot:
                version = _version(raw)
                sent[_where(raw)] = version
                if version > since:
                    yield {"type": "ADDED", "object": raw}
            async for event in bus.stream(since=marker):
                raw = event.get("object", {})
                if request.namespace is not None and raw.get("metadata", {}).get("namespace") != request.namespace:
                    continue
                if _version(raw) <= max(since, sent.get(_where(raw), 0)):
                    continue  # already sent in the snapshot, or older than the client's resourceVersion
                sent[_where(raw)] = _version(raw)
                yield event
        finally:
            await bus.unmark(marker)


def _version(raw: Mapping[str, Any]) -> int:
    try:
        return int(raw.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _where(raw: Mapping[str, Any]) -> tuple[Any, Any]:
    meta = raw.get("metadata", {})
    return meta.get("namespace"), meta.get("name")


def register(emu: kmock.KubernetesEmulator, resources: Mapping[str, Mapping[str, Any]]) -> None:
    for key, info in resources.items():
        emu.resources[key] = kmock.ResourceInfo(
            kind=info["kind"],
            namespaced=info["namespaced"],
            verbs=VERBS,
            subresources=info.get("subresources", []),
            shortnames=info.get("shortnames", []),
            singular=info.get("singular"),
        )


def register_crds(emu: kmock.KubernetesEmulator, paths: Iterable[Path]) -> None:
    """Serve every resource our CRD files declare (a POSTed CRD registers nothing in kmock)."""
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            names = spec["names"]
            for version in spec["versions"]:
                found[f"{spec['group']}/{version['name']}/{names['plural']}"] = {
                    "kind": names["kind"],
                    "namespaced": spec["scope"] == "Namespaced",
                    "subresources": sorted(version.get("subresources", {})),
                    "shortnames": names.get("shortNames", []),
                    "singular": names.get("singular"),
                }
    register(emu, found)


def new_emulator(crd_paths: Iterable[Path] = ()) -> K8sEmulator:
    emu = K8sEmulator()
    register(emu, BUILTINS)
    register_crds(emu, crd_paths)
    return emu
