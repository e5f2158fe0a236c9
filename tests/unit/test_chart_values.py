"""The chart's values, read without helm: a prose comment on every key, a strict schema that accepts the
defaults and every ci/ scenario, and chart metadata in step with the package."""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "skiplock"
VALUES = CHART / "values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
SCENARIOS = sorted(CHART.glob("ci/*-values.yaml"))


def keys_with_comments() -> list[tuple[str, bool]]:
    """(dotted key, has a comment right above it) for every mapping key in values.yaml, parsed as the values
    reference generator parses it (one parser for the docs and this check)."""
    spec = importlib.util.spec_from_file_location("gen_helm_docs", ROOT / "tools" / "gen-helm-docs.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return [(key, bool(comment)) for key, comment in tool.commented_keys(VALUES.read_text())]


def test_every_key_has_a_comment() -> None:
    keys = keys_with_comments()
    assert len(keys) > 60
    missing = [key for key, commented in keys if not commented]
    assert not missing, f"values.yaml keys without a comment: {missing}"


def schema_at(dotted: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = SCHEMA
    for part in dotted.split("."):
        if node is None:
            return None
        props = node.get("properties")
        if props is None:
            return {}  # a free-form map (labels, resources ...): its keys are the user's
        node = props.get(part)
    return node


def test_schema_describes_every_key() -> None:
    for key, _ in keys_with_comments():
        node = schema_at(key)
        assert node is not None, f"{key} is in values.yaml but not in values.schema.json"
        if node:
            assert node.get("description"), f"{key} has no description in values.schema.json"


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path or ".", node)]
    for name, sub in node.get("properties", {}).items():
        out += walk(sub, f"{path}.{name}")
    return out


def test_schema_closes_every_object_of_ours() -> None:
    for path, node in walk(SCHEMA):
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"


@pytest.mark.parametrize("values", [VALUES, *SCENARIOS], ids=lambda p: p.name)
def test_defaults_and_scenarios_satisfy_the_schema(values: Path) -> None:
    defaults = yaml.safe_load(VALUES.read_text())
    merged = merge(defaults, yaml.safe_load(values.read_text()) or {})
    jsonschema.Draft7Validator(SCHEMA).validate(merged)


@pytest.mark.parametrize(
    "override",
    [
        {"typo": 1},
        {"operator": {"replica": 2}},
        {"rbac": {"scope": "all"}},
        {"image": {"digest": "latest"}},
        {"metrics": {"podMonitor": {"interval": "often"}}},
        {"crds": {"keep": "yes"}},
        {"rbac": {"namespaces": ["Team_A"]}},
        {"rbac": {"namespaces": ["a", "a"]}},
        {"policy": {"allowedImages": ["ghcr.io/a/,ghcr.io/b/"]}},
        {"policy": {"allowedImage": []}},
        {"policy": {"admission": {"failurePolicy": "Sometimes"}}},
        {"networkPolicy": {"postgres": {"ports": [0]}}},
        {"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1"]}}},
        {"workerDefaults": {"resources": {"requests": {"cpu": "lots"}}}},
    ],
    ids=[
        "typo",
        "nested-typo",
        "enum",
        "digest",
        "duration",
        "type",
        "namespace-name",
        "namespace-twice",
        "comma-in-list",
        "policy-typo",
        "failure-policy",
        "port-zero",
        "cidr-without-mask",
        "bad-quantity",
    ],
)
def test_schema_rejects(override: dict[str, Any]) -> None:
    merged = merge(yaml.safe_load(VALUES.read_text()), override)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(merged)


def merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
    return over


def test_chart_versions_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def test_monitoring_defaults_are_off() -> None:
    metrics = yaml.safe_load(VALUES.read_text())["metrics"]
    for key in ("serviceMonitor", "podMonitor", "prometheusRule", "dashboard"):
        assert metrics[key]["enabled"] is False, key


def test_one_kind_per_template() -> None:
    for path in sorted((CHART / "templates").glob("*.yaml")):
        kinds = set(re.findall(r"^kind: *(\w+)", path.read_text(), re.MULTILINE))
        kinds |= {"CustomResourceDefinition"} if path.name == "crds.yaml" else set()
        assert len(kinds) <= 2, f"{path.name}: {kinds}"  # kopfpeering.yaml picks one of two kinds
        if len(kinds) == 2:
            assert kinds == {"KopfPeering", "ClusterKopfPeering"} or path.name == "kopfpeering.yaml"


def test_secure_defaults() -> None:
    """Namespaced RBAC, no allow-list turned into a wildcard for scheduling fields, workers never BestEffort."""
    values = yaml.safe_load(VALUES.read_text())
    assert values["rbac"]["scope"] == "namespace" and values["rbac"]["namespaces"] == []
    policy = values["policy"]
    assert (policy["allowTolerations"], policy["allowAffinity"], policy["allowNodeSelector"]) == (False, False, False)
    assert policy["admission"]["enabled"] is False and policy["admission"]["failurePolicy"] == "Fail"
    resources = values["workerDefaults"]["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
    assert values["image"]["tag"] == "" and values["image"]["digest"] == ""  # appVersion: an immutable tag
