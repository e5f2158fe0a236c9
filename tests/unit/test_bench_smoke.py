"""Smoke test of the benchmark suite: every scenario once at tiny size, against the tests' PostgreSQL.

It checks that each case ran and produced sane figures (all jobs drained, positive rates, percentiles in order),
never how fast anything was: timings on a shared machine prove nothing.
"""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

import pytest

from support.scripts import REPO, run_python


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _bench(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a bench/ script as a user would (without the tests' SKIPLOCK_* settings); it must succeed."""
    proc = run_python([str(REPO / "bench" / script), *args], timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def bench_lines(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "bench.jsonl"
    proc = _bench("run.py", "--quick", "--repeat", "1", "--dsn", pg_dsn, "--json-out", str(out), timeout=480)
    assert "| drain (median)" in proc.stdout and "| target " in proc.stdout
    return [json.loads(line) for line in out.read_text().splitlines()]


def _by(lines: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {line["case"]: line for line in lines if line["type"] == kind}


def test_meta_names_settings_versions_and_machine(bench_lines: list[dict[str, Any]]) -> None:
    meta = bench_lines[0]
    assert meta["type"] == "meta"
    assert meta["settings"]["mode"] == "quick" and meta["settings"]["workers"] >= 1
    machine = meta["machine"]
    assert machine["cores"] >= 1 and machine["skiplock"] and machine["psycopg"]
    assert "PostgreSQL" in machine["postgres"] or machine["postgres"][0].isdigit()
    assert bench_lines[-1]["type"] == "end"


def test_every_case_ran_once(bench_lines: list[dict[str, Any]]) -> None:
    runs = [line for line in bench_lines if line["type"] == "run"]
    cases = {line["case"] for line in runs}
    assert {"enqueue", "drain noop", "drain noop [ceiling]", "drain write", "drain write [plain tx]"} <= cases
    assert {"drain noop async", "drain write async", "drain noop C=64", "drain noop W=4"} <= cases
    assert {"drain noop [ceiling] W=4", "drain noop, 5,000 finished rows", "latency NOTIFY", "latency poll"} <= cases
    assert {"drain noop [honest]", "drain noop [honest] W=4", "latency NOTIFY [honest]"} <= cases  # the seed's table
    assert {"drain noop, 10% serial keys", "drain noop, limited task", "drain noop, 50 queues"} <= cases
    assert "drain noop, 2 queues, 1 idle" in cases
    assert {"workflow fan-out 200 + callback", "workflow chain of 20"} <= cases
    assert all(line["rep"] == 1 for line in runs)
    assert set(_by(bench_lines, "median")) == cases


def test_enqueue_figures_are_sane(bench_lines: list[dict[str, Any]]) -> None:
    m = _by(bench_lines, "median")["enqueue"]
    keys = (
        "single_jobs_per_s",
        "bulk_jobs_per_s",
        "bulk_tx_jobs_per_s",
        "copy_jobs_per_s",
        "copy_chunked_jobs_per_s",
        "plain_single_jobs_per_s",
        "bulk_vs_copy",
        "bulk_tx_vs_copy",
    )
    for key in keys:
        assert _positive(m[key]), key


def test_drains_finish_every_job_once_with_sane_counters(bench_lines: list[dict[str, Any]]) -> None:
    drains = {k: v for k, v in _by(bench_lines, "median").items() if k.startswith("drain")}
    assert len(drains) >= 8
    for name, m in drains.items():
        if "[pgqueuer]" not in name:  # pgqueuer deletes finished jobs: no attempts column to read
            assert m["jobs"] > 0 and m["max_attempts_seen"] == 1, name  # every job done on its first attempt
        for key in ("seconds", "jobs_per_s", "wal_bytes_per_job", "worker_rss_mb"):
            assert _positive(m[key]), (name, key)
        # CPU time is counted in clock ticks (10 ms): a tiny, fast drain may round down to zero.
        assert m["worker_cpu_us_per_job"] >= 0, name
        assert m["commits_per_job"] > 0 and m["write_tx_per_job"] > 0, name  # not negative noise
    for name in ("drain noop", "drain noop async", "drain noop W=4", "drain write", "drain write async"):
        assert _positive(drains[name]["vs_ceiling"]), name
    for name in ("drain noop", "drain noop W=4", "drain noop [ceiling]", "drain noop [ceiling] W=4"):
        assert _positive(drains[name]["vs_honest"]), name
        assert _positive(drains[name]["wal_vs_honest"]), name
    # counted per transaction, not per statement or per job (how the two compare depends on the batch sizes the
    # machine's load makes, so each is only held within what one batch of claims and completions can write)
    for name in ("drain noop [ceiling]", "drain noop"):
        assert drains[name]["write_tx_per_job"] < 1, name


def test_latency_percentiles_are_ordered(bench_lines: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    medians = _by(bench_lines, "median")
    for name in ("latency NOTIFY", "latency poll"):
        m = medians[name]
        assert m["jobs"] > 0 and _positive(m["rate_per_s"])
        assert 0 <= m["p50_ms"] <= m["p95_ms"] <= m["p99_ms"] <= m["max_ms"], name
        # counted by the workers themselves (their stop lines), not inferred from the server's commits
        assert m["empty_claims_per_job"] is not None and 0 <= m["empty_claims_per_job"] < 5, name
    honest = medians["latency NOTIFY [honest]"]
    assert 0 <= honest["p50_ms"] <= honest["p99_ms"] <= honest["max_ms"]
    assert _positive(medians["latency NOTIFY"]["p50_vs_honest"])
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import pgqueuer_bench

    if pgqueuer_bench.available():  # the bench extra: pgqueuer's pick-up, measured the same way
        pgq = medians["latency NOTIFY [pgqueuer]"]
        assert pgq["jobs"] == medians["latency NOTIFY"]["jobs"] and _positive(pgq["rate_per_s"])
        assert 0 <= pgq["p50_ms"] <= pgq["p95_ms"] <= pgq["p99_ms"] <= pgq["max_ms"]
        assert _positive(pgq["p50_vs_honest"])
        assert _positive(medians["latency NOTIFY"]["p50_vs_pgqueuer"])
        assert _positive(medians["latency NOTIFY"]["p99_vs_pgqueuer"])


def test_targets_are_reported(bench_lines: list[dict[str, Any]]) -> None:
    targets = [line for line in bench_lines if line["type"] == "target"]
    assert len(targets) >= 13
    assert all(t["value"] is not None and t["met"] in (True, False) for t in targets)


def test_instruction_counts_come_from_callgrind(pg_dsn: str) -> None:
    """bench/instructions.py drains a few jobs under callgrind and reports instructions per job (needs valgrind,
    which CI installs; skipped elsewhere without it, failed in CI)."""
    import shutil

    from support.ci import missing

    if shutil.which("valgrind") is None:
        missing("valgrind not installed (apt-get install -y --no-install-recommends valgrind)")
    proc = _bench("instructions.py", "--jobs", "300", "--repeat", "1", "--dsn", pg_dsn, timeout=300)
    [median] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"type": "median"')]
    assert median["variant"] == "tree" and 1_000 < median["instructions_per_job"] < 10_000_000, median
    assert "| tree |" in proc.stdout


def test_compare_rows_take_turns_running_before_their_main_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import run

    def case(name: str) -> Any:
        return ("drain", name, lambda: {})

    cases = [case(n) for n in ("a", "a [old]", "ceiling", "b", "b [old]", "c")]
    names = [[c[1] for c in run.in_turn(cases, rep, " [old]")] for rep in range(3)]
    assert names[0] == names[2] == ["a", "a [old]", "ceiling", "b", "b [old]", "c"]
    assert names[1] == ["a [old]", "a", "ceiling", "b [old]", "b", "c"]
    assert run.in_turn(cases, 1, None) == cases, "no --compare: always the same order"


def test_cases_filter_runs_only_the_matching_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--cases REGEX`` keeps the cases whose name matches, in their run order (the ceilings beside skiplock)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import run
    import scenario

    cfg = scenario.Config(
        server=None,  # type: ignore[arg-type]  # building the cases connects to nothing
        workers=2,
        concurrency=10,
        batch=None,
        poll_seconds=2.0,
        drain_timeout=1.0,
        **run.MODES["quick"],
    )
    a = run.parse_args(["--cases", r"^drain noop( \[honest\])?( W=4)?$"])
    names = [name for _, name, _ in run.build_cases(cfg, a)[0]]
    assert names == ["drain noop", "drain noop [honest]", "drain noop W=4", "drain noop [honest] W=4"]


def test_workflow_figures_are_sane(bench_lines: list[dict[str, Any]]) -> None:
    medians = _by(bench_lines, "median")
    fan = medians["workflow fan-out 200 + callback"]
    assert fan["jobs"] == 200 and fan["rounds"] == 2 and fan["jobs_per_s"] > 0
    assert 0 < fan["callback_p50_ms"] <= fan["callback_p99_ms"], "the callback starts after its last child ends"
    chain = medians["workflow chain of 20"]
    assert chain["jobs"] == 20 and chain["jobs_per_s"] > 0
