"""bench/pickup_instructions.py counts a worker's instructions a pick-up (one job at a time) under callgrind, for
skiplock's worker and the honest plain loop (needs valgrind, which CI installs; skipped elsewhere without it, failed
in CI)."""

from __future__ import annotations

import json
import shutil

from support.ci import missing
from support.scripts import REPO, run_python


def test_pickup_instructions_of_skiplocks_worker_and_of_the_honest_loop(pg_dsn: str) -> None:
    if shutil.which("valgrind") is None:
        missing("valgrind not installed (apt-get install -y --no-install-recommends valgrind)")
    script = str(REPO / "bench" / "pickup_instructions.py")
    proc = run_python([script, "--dsn", pg_dsn, "--jobs", "5", "--repeat", "1"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    medians = {d["variant"]: d["instructions_per_job"] for d in lines if d["type"] == "median"}
    assert set(medians) == {"tree", "honest"}, medians
    # a pick-up costs hundreds of thousands of instructions in a Python worker: not zero, not billions
    assert all(10_000 < n < 1_000_000_000 for n in medians.values()), medians
    assert "| tree |" in proc.stdout and "| honest |" in proc.stdout
