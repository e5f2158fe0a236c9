"""bench/autoscale_sim.py keeps running (a smoke test: the figures are the bench's, in docs/operator.md)."""

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


def test_json_lines_for_every_trace_and_policy(sim: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(r["trace"], r["policy"]) for r in rows} == {(t, p.name) for t in sim.TRACES for p in sim.POLICIES}
    wanted = {"p99_wait_seconds", "replica_seconds", "scale_events", "jobs_cut", "worst_due_to_start_seconds"}
    assert wanted <= rows[0].keys()


def test_the_table_has_a_row_per_result(sim: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--only", "delayed-from-zero"]) == 0
    out = capsys.readouterr().out
    assert out.count("| delayed-from-zero |") == len(sim.POLICIES)


def test_pre_scaling_models_the_pod_start_up(sim: ModuleType) -> None:
    """Simulated seconds, not wall time: the wait-target mode starts the worker a pod start-up ahead."""
    cluster = sim.Cluster()
    ours = sim.simulate("z", sim.delayed_from_zero, sim.WaitTarget, cluster, seed=1)
    today = sim.simulate("z", sim.delayed_from_zero, sim.Backlog, cluster, seed=1)
    assert ours.worst_due_to_start_seconds <= 1
    assert today.worst_due_to_start_seconds >= cluster.startup_seconds


def test_the_wait_target_holds_steady_load_and_matches_backlog_mode_on_bursts(sim: ModuleType) -> None:
    """Simulated seconds: no flapping on steady traffic (no more scale events than backlog mode), and the issue's
    bar on the bursty trace (p99 wait no worse, no more replica-seconds)."""
    cluster = sim.Cluster()

    def both(trace: str) -> tuple[object, object]:
        run = [sim.simulate(trace, sim.TRACES[trace], p, cluster, seed=7) for p in (sim.WaitTarget, sim.Backlog)]
        return run[0], run[1]

    ours, today = both("steady")
    assert ours.scale_events <= today.scale_events
    assert ours.p99_wait_seconds <= today.p99_wait_seconds
    ours, today = both("bursty")
    assert ours.p99_wait_seconds <= today.p99_wait_seconds
    assert ours.replica_seconds <= today.replica_seconds
