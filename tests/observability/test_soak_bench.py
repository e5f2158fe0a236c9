"""Smoke test of ``bench/soak.py`` (``make bench-soak``) at a tiny size against the tests' PostgreSQL: it measures a
capacity, soaks at a fixed rate with retention purging, samples every series the issue asks for, and ends with a
summary and its verdict. How fast anything was is never asserted (the figures belong to docs/performance.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg

from support.scripts import REPO, run_python

SERIES = {
    "started_per_s",
    "enqueued_per_s",
    "pickup_p50_ms",
    "pickup_p99_ms",
    "table_bytes",
    "index_bytes",
    "live",
    "dead",
    "autovacuums",
    "wal_bytes_per_s",
}


def test_a_short_soak_samples_every_series_and_gives_a_verdict(pg_dsn: str) -> None:
    args = ["--minutes", "0.25", "--sample", "2", "--window", "0.08", "--capacity-jobs", "300", "--workers", "1"]
    args += ["--concurrency", "2", "--rate", "40", "--retain-done", "4", "--retain-failed", "4"]
    args += ["--purge-interval", "4", "--dsn", pg_dsn]
    proc = run_python([str(REPO / "bench" / "soak.py"), *args])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(
        r"^verdict: throughput (NOT )?flat, p99 (NOT )?flat, table and indexes (NOT )?bounded$", proc.stdout, re.M
    ), proc.stdout[-2000:]
    found = re.search(r"^json lines: (\S+)$", proc.stdout, re.M)
    assert found is not None
    out = Path(found.group(1))
    try:
        lines: list[dict[str, Any]] = [json.loads(line) for line in out.read_text().splitlines()]
    finally:
        out.unlink()
    kinds = [line["kind"] for line in lines]
    assert kinds[:2] == ["settings", "capacity"] and kinds[-1] == "summary"
    settings = lines[0]
    assert settings["machine"]["git_commit"] and settings["machine"]["cores"] >= 1, "the machine and the commit"
    assert lines[1]["jobs"] == 300 and lines[1]["jobs_per_s"] > 0
    samples = [line for line in lines if line["kind"] == "sample"]
    assert len(samples) >= 5
    assert all(set(s) >= SERIES for s in samples), SERIES - set(samples[0])
    assert sum(s["started_per_s"] for s in samples) > 0 and max(s["table_bytes"] for s in samples) > 0
    summary = lines[-1]
    assert {"flat_throughput", "flat_p99", "bounded", "table_bytes_growth", "index_bytes_growth"} <= set(summary)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # its schema is dropped when it ends
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = %s", [settings["schema"]]).fetchall()
    assert left == []
