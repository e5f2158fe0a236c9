"""bench/enqueue_instructions.py counts a producer's instructions an enqueue under callgrind (needs valgrind, which
CI installs; skipped elsewhere without it, failed in CI)."""

from __future__ import annotations

import json
import shutil

from support.ci import missing
from support.scripts import REPO, run_python


def test_enqueue_instructions_of_the_plain_loop_and_of_skiplocks_enqueues(pg_dsn: str) -> None:
    if shutil.which("valgrind") is None:
        missing("valgrind not installed (apt-get install -y --no-install-recommends valgrind)")
    script = str(REPO / "bench" / "enqueue_instructions.py")
    args = ["--dsn", pg_dsn, "--calls", "20", "--modes", "plain,pool,conn,many"]
    proc = run_python([script, *args], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    medians = {d["mode"]: d for d in lines if d["type"] == "median"}
    assert set(medians) == {"plain", "pool", "conn", "many"}
    # a call costs tens of thousands of instructions, not zero, not tens of millions
    assert all(5_000 < d["instructions"] < 20_000_000 for d in medians.values()), medians
    assert medians["pool"]["x_plain"] > 0 and "x_plain" not in medians["many"]
    assert "| pool | tree |" in proc.stdout and "| many | tree |" in proc.stdout
