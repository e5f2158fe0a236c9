"""Validate a custom resource the way the API server would, offline: structural defaults, the CRD's
openAPIV3Schema (jsonschema Draft 7 ignores the x-kubernetes-* keywords) and its x-kubernetes-validations
CEL rules (cel-python; Kubernetes-only CEL libraries such as quantity are not covered)."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema


def served_version(crd: dict[str, Any], api_version: str) -> dict[str, Any]:
    group, _, version = api_version.partition("/")
    assert crd["spec"]["group"] == group, f"{api_version} is not served by {crd['metadata']['name']}"
    for v in crd["spec"]["versions"]:
        if v["name"] == version and v.get("served"):
            return dict(v)
    raise AssertionError(f"{crd['metadata']['name']} serves no {version}")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill in `default`s top-down, as the API server does before validation."""
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def as_declared(schema: dict[str, Any], value: Any) -> Any:
    """Typed as the API server types it for CEL: a `number` field is a double even when written as 20."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: as_declared(props.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_declared(schema.get("items", {}), item) for item in value]
    return value


def cel_failures(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    failures = []
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        try:
            result = program.evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as exc:
            result = exc
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            failures.append(f"{path or '.'}: {rule.get('message', rule['rule'])} ({result!r})")
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                failures += cel_failures(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            failures += cel_failures(schema["items"], item, f"{path}[{i}]")
    return failures


def problems(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """Everything the API server would reject in `obj` (an empty list when it would be admitted)."""
    version = served_version(crd, obj["apiVersion"])
    names = crd["spec"]["names"]
    out = []
    if obj["kind"] != names["kind"]:
        out.append(f"kind {obj['kind']} is not {names['kind']}")
    if crd["spec"]["scope"] == "Namespaced" and not obj["metadata"].get("namespace"):
        out.append("a namespaced kind without metadata.namespace")
    schema = version["schema"]["openAPIV3Schema"]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    body = apply_defaults(schema, copy.deepcopy(body))
    validator = jsonschema.Draft7Validator(schema)
    out += [f"{'.'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in validator.iter_errors(body)]
    if not out:
        out += cel_failures(schema, as_declared(schema, body))
    return out
