"""bench/backend_instructions.py counts a PostgreSQL backend's instructions a job under callgrind (needs valgrind,
which CI installs; skipped elsewhere without it, failed in CI)."""

from __future__ import annotations

import json
import shutil

from support.ci import missing
from support.scripts import REPO, run_python


def test_backend_instructions_of_the_honest_loop_and_of_skiplocks_statement() -> None:
    if shutil.which("valgrind") is None:
        missing("valgrind not installed (apt-get install -y --no-install-recommends valgrind)")
    script = str(REPO / "bench" / "backend_instructions.py")
    proc = run_python([script, "--jobs", "400", "--variants", "honest,statement"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = {d["variant"]: d for d in (json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{"))}
    assert set(lines) == {"honest", "statement"}
    # both drained 400 jobs: a backend spends tens of thousands of instructions a job, not zero, not millions
    assert all(10_000 < d["instructions_per_job"] < 2_000_000 for d in lines.values()), lines
    assert "| statement |" in proc.stdout and "x honest" in proc.stdout
