"""Smoke test of ``bench/ui.py`` (``make bench-ui``) at a tiny size against the tests' PostgreSQL: every page, API
call and action it times answers, the bulk actions change what they should, and the JSON lines and the summary are
written. The timings themselves are never asserted: the figures of a 5,000,000-row run are in its docstring."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from support.scripts import REPO, run_python


def test_the_ui_bench_calls_every_page_and_action_on_a_small_table(pg_dsn: str) -> None:
    args = ["--dsn", pg_dsn, "--done", "5000", "--failed", "100", "--repeat", "1"]
    proc = run_python([str(REPO / "bench" / "ui.py"), *args])
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1: a call over budget
    lines: list[dict[str, Any]] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    calls = {line["call"]: line for line in lines if line["kind"] == "call"}
    summary = lines[-1]
    assert summary["kind"] == "summary"
    assert summary["table"] == {"done": 5000, "failed": 100, "pending": 1950, "processing": 50}
    bad = {call: line["status"] for call, line in calls.items() if line["status"] not in (200, 202)}
    assert bad == {}
    pages = {re.sub(r"/(\d+|[0-9a-f]{16})\b", "/{id}", c.split(" ")[1].split("?")[0]) for c in calls}
    every_page = ["/queues", "/jobs", "/jobs/{id}", "/failures", "/failures/{id}", "/schedules", "/limits", "/workers"]
    assert {*every_page, "/audit"} <= pages and {"/api" + p for p in every_page} <= pages
    posts = {c.split(" {")[0] for c in calls if c.startswith("POST")}
    assert {
        "POST /api/queues/q1/pause",
        "POST /api/queues/q1/resume",
        "POST /api/jobs/retry",
        "POST /api/jobs/cancel",
    } <= posts
    assert {re.sub(r"/\d+/", "/{id}/", c) for c in posts} >= {"POST /api/jobs/{id}/retry", "POST /api/jobs/{id}/cancel"}
    assert {re.sub(r"/[0-9a-f]{16}/", "/{fp}/", c) for c in posts} >= {
        "POST /api/failures/{fp}/retry",
        "POST /api/failures/{fp}/cancel",
    }
    matched = {c: line["jobs"] for c, line in calls.items() if "KeyError" in c}
    assert matched == {  # the filter's matches among the 100 failed jobs, and none
        'POST /api/jobs/retry {"queue": "q3", "q": "KeyError"}': 25,
        'POST /api/jobs/retry {"queue": "q2", "q": "KeyError"}': 0,
    }
    found = re.search(r"^json lines: (\S+)$", proc.stdout, re.M)
    assert found is not None
    out = Path(found.group(1))
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines
    out.unlink()
