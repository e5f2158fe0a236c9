"""The handler of the worker subprocess in test_prometheus_scrape.py (``skiplock worker --handler``)."""

from __future__ import annotations

import time

from skiplock import Job, NonRetryableError


def handle(job: Job) -> None:
    """``{"kind": "ok" | "retry" | "fail", "sleep": seconds}``: succeed, raise (retried), or fail for good."""
    time.sleep(float(job.payload.get("sleep", 0.01)))
    kind = job.payload.get("kind", "ok")
    if kind == "retry":
        raise RuntimeError("flaky downstream")
    if kind == "fail":
        raise NonRetryableError("bad payload")
