"""The knob table against every surface that repeats it: Settings, the worker's flags, env names, the CRD, the docs."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from skiplock import Queue
from skiplock.cli import build_parser
from skiplock.errors import ConfigError
from skiplock.knobs import BY_NAME, KNOBS, Knob, crd_field_problems, knob_crd_fields, knob_flags
from skiplock.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "jobqueues.skiplock.io.yaml").read_text())
SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

# CRD defaults that differ from the worker's on purpose, and why.
CRD_DEFAULT_DIFFERS = {"logFormat": "pods log JSON for the cluster's log pipeline; a terminal gets plain lines"}

# Spec fields that are the operator's, not a worker setting (a new spec field must be a knob or be listed here).
OPERATOR_FIELDS = {
    "image",
    "imagePullPolicy",
    "imagePullSecrets",
    "dsnSecretRef",
    "operatorDsnSecretRef",
    "replicas",
    "paused",
    "scaling",
    "resources",
    "env",
    "nodeSelector",
    "tolerations",
    "affinity",
    "serviceAccountName",
    "podLabels",
    "podAnnotations",
}


def crd_field(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = SPEC
    for part in path.split("."):
        node = (node or {}).get("properties", {}).get(part)
    return node


def annotation_type(annotation: Any) -> type:
    text = str(annotation).removesuffix(" | None")
    if text.startswith("tuple"):
        return tuple
    return {"int": int, "float": float, "bool": bool, "str": str, "LogFormat": str}[text]


# ---------------------------------------------------------------------------------------------- the table itself
def test_every_knob_is_named_once_and_fully_described():
    for attr in ("name", "flag", "crd"):
        values = [getattr(k, attr) for k in KNOBS if getattr(k, attr) is not None]
        assert len(values) == len(set(values)), f"two knobs share a {attr}"
    for k in KNOBS:
        assert k.help.strip() and k.env == "SKIPLOCK_" + k.name.upper()
        assert k.default is None or isinstance(k.default, k.type), k.name


def test_knob_crd_fields_maps_the_crd_path_to_the_knob():
    fields_ = knob_crd_fields()
    assert fields_["leaseSeconds"] is BY_NAME["lease_seconds"]
    assert fields_["backoff.baseSeconds"] is BY_NAME["backoff_base_seconds"]
    assert "dsn" not in {k.name for k in fields_.values()}  # a DSN never sits in a spec: it comes from a Secret


@pytest.mark.parametrize(
    ("knob", "value", "problem"),
    [
        ("lease_seconds", 0, "lease_seconds must be > 0"),
        ("concurrency", 0, "concurrency must be >= 1"),
        ("metrics_port", 70000, "metrics_port must be within 0..65535"),
        ("backoff_cap_seconds", 1e13, "backoff_cap_seconds must be at most"),
        ("log_format", "xml", "log_format must be one of plain, json"),
        ("queues", ("ok", "not ok"), "queues 'not ok' must match"),
        ("handler", "nocolon", "look like 'package.module:function'"),
        ("lease_seconds", float("nan"), "finite"),
    ],
)
def test_a_knob_says_what_is_wrong(knob: str, value: Any, problem: str):
    assert problem in (BY_NAME[knob].problem(value) or "")
    with pytest.raises(ConfigError, match="invalid settings"):
        Settings(**{knob: value})


def test_a_knob_accepts_its_bounds():
    assert BY_NAME["backoff_jitter"].problem(0) is None and BY_NAME["backoff_jitter"].problem(1) is None
    assert BY_NAME["max_attempts"].problem(1000) is None and BY_NAME["max_attempts"].problem(1001)
    assert BY_NAME["log_level"].problem("debug") is None  # level names are case-insensitive


# ---------------------------------------------------------------------------------------------- Settings
def test_settings_fields_are_the_knobs_with_the_same_defaults_and_types():
    settings_fields = {f.name: f for f in fields(Settings)}
    assert list(settings_fields) == [k.name for k in KNOBS]
    for k in KNOBS:
        f = settings_fields[k.name]
        assert f.default is not MISSING and f.default == k.default, k.name
        assert annotation_type(f.type) is k.type, k.name


def sample(k: Knob) -> Any:
    """A valid value other than the default, for every knob."""
    special: dict[str, Any] = {
        "dsn": "postgresql://db/app",
        "schema": "s1",
        "queue": "q1",
        "queues": ("a", "b"),
        "app": "m.tasks:app",
        "handler": "m.jobs:run",
        "metrics_host": "127.0.0.1",
        "worker_id": "w-1",
    }
    if k.name in special:
        return special[k.name]
    if k.choices:
        return k.choices[-1]
    if k.type is bool:
        return not k.default
    if k.type is int:
        return k.default + 1
    return k.default / 2 if k.default else 1.5


def render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return ",".join(value) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_each_knob_is_read_from_its_env_name_and_written_back_by_to_env(k: Knob):
    value = sample(k)
    s = Settings.from_env(env={k.env: render(value)})
    assert getattr(s, k.name) == value
    assert Settings.env_name(k.name) == k.env
    if k.name not in ("dsn", "worker_id"):
        assert getattr(Settings.from_env(env={k.env: s.to_env()[k.env]}), k.name) == value


def test_settings_from_arguments_never_read_the_environment(monkeypatch):
    monkeypatch.setenv("SKIPLOCK_CONCURRENCY", "3")
    monkeypatch.setenv("SKIPLOCK_DSN", "postgresql://env/db")
    assert Settings().concurrency == 10 and Settings().dsn is None
    assert Settings.from_env().concurrency == 3 and Settings.from_env(concurrency=4).concurrency == 4


def test_setting_only_the_lease_derives_heartbeat_and_recovery():
    s = Settings(lease_seconds=4)
    assert (s.heartbeat_seconds, s.recover_seconds) == (1.0, 2.0)
    assert Settings(lease_seconds=600).recover_seconds == 30.0
    with pytest.raises(ConfigError, match="heartbeat_seconds"):
        Settings(lease_seconds=4, heartbeat_seconds=3)


# ---------------------------------------------------------------------------------------------- CLI
def worker_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["worker"]


def test_worker_flags_are_the_knob_flags():
    actions = {opt: a for a in worker_parser()._actions for opt in a.option_strings}
    extra = set(actions) - set(knob_flags()) - {"-h", "--help", "--dsn-file"}
    assert not extra, f"worker flags that are not in the knob table: {sorted(extra)}"
    for flag, k in knob_flags().items():
        assert flag in actions, f"{flag} ({k.name}) is not a flag of skiplock worker"
        assert actions[flag].dest == k.name


def test_common_knobs_are_accepted_before_and_after_the_command():
    before = build_parser().parse_args(["--schema", "s1", "--log-level", "DEBUG", "migrate"])
    after = build_parser().parse_args(["migrate", "--schema", "s1", "--log-level", "DEBUG"])
    assert (before.schema, before.log_level) == (after.schema, after.log_level) == ("s1", "DEBUG")
    both = build_parser().parse_args(["--schema", "outer", "migrate", "--schema", "inner"])
    assert both.schema == "inner"  # the one nearer the command wins
    assert build_parser().parse_args(["--schema", "outer", "migrate"]).schema == "outer"


# ---------------------------------------------------------------------------------------------- CRD
@pytest.mark.parametrize("path", sorted(knob_crd_fields()), ids=str)
def test_crd_field_agrees_with_its_knob(path: str):
    k = knob_crd_fields()[path]
    field = crd_field(path)
    assert field is not None, f"spec.{path} ({k.name}) is missing from the CRD"
    if k.type is tuple:
        assert field["items"]["type"] == "string", path
    tolerated = path in CRD_DEFAULT_DIFFERS
    problems = crd_field_problems(k, {n: v for n, v in field.items() if n != "default" or not tolerated})
    assert problems == []
    if path in CRD_DEFAULT_DIFFERS:
        assert field["default"] != k.default, f"spec.{path} now has the worker's default: drop it from the list"


def test_crd_field_problems_finds_each_kind_of_drift():
    lease, log_format, queue = BY_NAME["lease_seconds"], BY_NAME["log_format"], BY_NAME["queue"]
    good = {"type": "number", "minimum": 1, "maximum": 86400, "default": 60}
    assert crd_field_problems(lease, good) == []
    for bad, words in (
        ({**good, "type": "integer"}, "type"),
        ({**good, "default": 30}, "defaults to 30"),
        ({**good, "minimum": 0}, "minimum 0"),
        ({"type": "number"}, "minimum None"),
    ):
        [problem] = crd_field_problems(lease, bad)
        assert words in problem and "spec.leaseSeconds" in problem
    assert "enum" in crd_field_problems(log_format, {"type": "string", "enum": ["plain", "xml"]})[0]
    assert "pattern" in crd_field_problems(queue, {"type": "string", "pattern": ".*"})[0]
    assert "maximum" in crd_field_problems(BY_NAME["max_attempts"], {"type": "integer", "minimum": 1})[0]


def test_every_crd_spec_field_is_a_knob_or_the_operators():
    knob_roots = {path.split(".")[0] for path in knob_crd_fields()}
    unknown = set(SPEC["properties"]) - knob_roots - OPERATOR_FIELDS
    assert not unknown, f"spec fields that are neither a knob nor the operator's own: {sorted(unknown)}"
    nested = {f"backoff.{name}" for name in SPEC["properties"]["backoff"]["properties"]}
    assert nested <= set(knob_crd_fields()), nested - set(knob_crd_fields())


def test_the_drift_lists_name_real_knobs():
    crd_paths = set(knob_crd_fields())
    assert set(CRD_DEFAULT_DIFFERS) <= crd_paths


# ---------------------------------------------------------------------------------------------- docs
def test_configuration_reference_is_generated_from_the_table():
    spec = importlib.util.spec_from_file_location("gen_knob_docs", ROOT / "tools" / "gen-knob-docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == module.render(), "docs/configuration.md is stale: run python tools/gen-knob-docs.py"
    for k in KNOBS:
        assert f"`{k.env}`" in committed


def gen_crd_knobs() -> Any:
    spec = importlib.util.spec_from_file_location("gen_crd_knobs", ROOT / "tools" / "gen-crd-knobs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_crd_knob_has_its_crd_field_entry() -> None:
    from skiplock.knobs import CRD_FIELDS

    assert set(CRD_FIELDS) == {k.name for k in KNOBS if k.crd}


def test_the_checked_in_crd_is_what_the_knob_table_generates() -> None:
    """tools/gen-crd-knobs.py writes the worker-setting properties; the committed CRD (and the chart's copy) must be
    current: run `python tools/gen-crd-knobs.py` after changing a knob."""
    tool = gen_crd_knobs()
    text = (ROOT / "crds" / "jobqueues.skiplock.io.yaml").read_text()
    assert tool.generate(text) == text, "crds/ is out of date: run python tools/gen-crd-knobs.py"
    chart = (ROOT / "charts" / "skiplock" / "crds-src" / "jobqueues.skiplock.io.yaml").read_text()
    assert chart == text, "the chart's copy is out of date: run tools/sync-crds.sh"


def test_the_generator_rewrites_a_hand_edited_knob_field_and_nothing_else() -> None:
    tool = gen_crd_knobs()
    text = (ROOT / "crds" / "jobqueues.skiplock.io.yaml").read_text()
    edited = text.replace("                  maximum: 10000\n", "                  maximum: 99999\n", 1)  # prefetch
    edited = edited.replace("Pull policy of the worker image.", "(edited)", 1)  # not a knob
    assert edited.count("99999") == 1 and "(edited)" in edited
    regenerated = tool.generate(edited)
    assert "99999" not in regenerated
    assert "(edited)" in regenerated


@pytest.mark.parametrize("dsn", ["sup3rsecret", "host=h password=sup3rsecret junk", "postgresql://u:sup3rsecret@[::1"])
def test_a_malformed_dsn_is_a_config_error_that_never_shows_the_dsn(dsn):
    """Issue 37, item 11: a DSN Secret holding something else reached libpq, whose parse error quotes it
    (`missing "=" after "<value>"`), and the library printed that whole. Settings refuses it, naming the setting."""
    for build in (
        lambda: Settings(dsn=dsn),
        lambda: Settings.from_env(env={"SKIPLOCK_DSN": dsn}),
        lambda: Settings.from_env(env={"DATABASE_URL": dsn}),
        lambda: Queue(dsn=dsn),
    ):
        with pytest.raises(ConfigError, match=r"the DSN is malformed \(setting dsn: ") as caught:
            build()
        assert "sup3rsecret" not in str(caught.value) and "missing" not in str(caught.value)
