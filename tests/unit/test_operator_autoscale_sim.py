"""bench/autoscale_sim.py keeps running, and the policy keeps beating the KEDA-like baseline where it should."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "autoscale_sim.py"


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("autoscale_sim", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["autoscale_sim"] = module
    spec.loader.exec_module(module)
    return module


def test_idle_then_burst_starts_sooner_and_costs_less(sim: ModuleType) -> None:
    cluster = sim.Cluster()
    ours = sim.simulate("idle", sim.idle_then_burst, sim.Skiplock, cluster, seed=1)
    keda = sim.simulate("idle", sim.idle_then_burst, sim.KedaLike, cluster, seed=1)
    assert ours.jobs == keda.jobs == 1000
    assert ours.p50_wait_seconds < keda.p50_wait_seconds
    assert ours.replica_seconds < keda.replica_seconds


def test_steady_load_does_not_flap(sim: ModuleType) -> None:
    result = sim.simulate("steady", sim.steady, sim.Skiplock, sim.Cluster(), seed=1)
    assert result.scale_events <= 10 and result.p99_wait_seconds <= 5


def test_json_lines(sim: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 * len(sim.SCENARIOS)
    assert {"p50_wait_seconds", "p99_wait_seconds", "peak_backlog", "replica_seconds", "scale_events"} <= rows[0].keys()
