"""Every JobQueue in examples/ applies cleanly on the default install (the operator's default settings): it
validates against the CRD schema and its rules, and the operator reconciles it to Ready=True."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from support.pg import await_for

from .conftest import CRDS, Cluster
from .test_conditions import is_status

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))


def jobqueues() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "JobQueue":
                found.append((str(path.relative_to(ROOT)), doc))
    return found


def test_every_example_jobqueue_matches_the_crd_schema() -> None:
    crd = yaml.safe_load(CRDS[0].read_text(encoding="utf-8"))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert len(jobqueues()) >= 3
    for where, doc in jobqueues():
        assert not list(jsonschema.Draft7Validator(schema).iter_errors(doc)), where


@pytest.mark.parametrize(("where", "doc"), jobqueues(), ids=[w for w, _ in jobqueues()])
async def test_every_example_jobqueue_is_ready_on_the_default_install(
    where: str, doc: dict[str, Any], pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    spec = {**doc["spec"], "schema": schema}
    for ref in ("dsnSecretRef", "operatorDsnSecretRef"):  # the workers' DSN, and the owner's where one is named
        if ref in spec:
            await cluster.apply_secret(spec[ref]["name"], pg_dsn, spec[ref].get("key", "dsn"))
    name = doc["metadata"]["name"]
    await cluster.create_jobqueue(name, spec)
    await await_for(
        lambda: is_status(cluster, name, "Ready", "True") or is_status(cluster, name, "Ready", "False"),
        timeout=20,
        what=f"{where} reconciled",
    )
    assert is_status(cluster, name, "Ready", "True"), (where, cluster.condition(name, "Ready"))
