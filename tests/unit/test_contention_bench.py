"""bench/contention.py and bench/contention_instructions.py: 2 against 4 workers in counts, and in the server's
instructions under callgrind (needs valgrind, which CI installs; skipped elsewhere without it, failed in CI)."""

from __future__ import annotations

import json
import shutil

from support.ci import missing
from support.scripts import REPO, run_python


def test_contention_counts_the_claims_of_each_worker_count() -> None:
    script = str(REPO / "bench" / "contention.py")
    proc = run_python([script, "--jobs", "400", "--repeat", "1", "--workers", "1,2"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert [r["workers"] for r in runs] == [1, 2]
    # every job went through the claim index once at least, and was written to the WAL
    assert all(r["jobs"] == 400 and r["index_entries_per_job"] >= 1 and r["wal_bytes_per_job"] > 0 for r in runs)
    assert "| this tree | 2 |" in proc.stdout and "CPU or what they wait on" in proc.stdout


def test_contention_instructions_of_the_workers_backends() -> None:
    if shutil.which("valgrind") is None:
        missing("valgrind not installed (apt-get install -y --no-install-recommends valgrind)")
    script = str(REPO / "bench" / "contention_instructions.py")
    proc = run_python([script, "--jobs", "300", "--workers", "1"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run] = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    # the claims and completions of 300 jobs: tens of thousands of instructions a job, not zero, not tens of millions
    assert 10_000 < run["instructions_per_job"] < 20_000_000, run
