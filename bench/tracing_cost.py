"""What tracing costs a job when no tracer provider is configured: ``.venv/bin/python bench/tracing_cost.py``.

While a tracer provider is set, the worker calls ``tracing.start(job)`` before and ``tracing.end(...)`` after every
job's handler (with none, it only reads ``tracing.state.tracer``); a direct call with no provider must stay a cheap
check: this times a million pairs against an empty loop and counts the memory blocks they
keep (``sys.getallocatedblocks``). It prints one JSON line and a table. Not a test: it never fails on its figures.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any

from skiplock import Job, tracing

N = 1_000_000


def empty(job: Job) -> None:
    for _ in range(N):
        pass


def traced(job: Job) -> None:
    start, end = tracing.start, tracing.end
    for _ in range(N):
        span = start(job)
        end(span, job, "done", None)


def sending(job: Job) -> None:
    for _ in range(N):
        with tracing.sending("q", {}) as sent:
            sent.jobs(1)


def best_of(fn: Any, job: Job, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(job)
        best = min(best, time.perf_counter() - t0)
    return best


def blocks(fn: Any, job: Job) -> int:
    """Memory blocks allocated and still held after N more calls (``sys.getallocatedblocks``): 0 when nothing
    is kept per job."""
    fn(job)  # warm: caches, the countdown's first look
    gc.collect()
    before = sys.getallocatedblocks()
    fn(job)
    gc.collect()
    return sys.getallocatedblocks() - before


def main() -> int:
    job = Job(id=1, queue="q", payload={}, attempts=1, max_attempts=5)
    base = best_of(empty, job)
    per_job = (best_of(traced, job) - base) / N * 1e9
    per_enqueue = (best_of(sending, job) - base) / N * 1e9
    row = {
        "kind": "tracing_off",
        "python": sys.version.split()[0],
        "opentelemetry_api": tracing.trace is not None,
        "start_end_ns_per_job": round(per_job, 1),
        "sending_ns_per_enqueue": round(per_enqueue, 1),
        "blocks_kept_after_1m_jobs": blocks(traced, job),
        "recheck_every_jobs": tracing.RECHECK_JOBS,
    }
    print(json.dumps(row))
    print(f"{'no tracer provider':40} {'ns':>8}")
    print(f"{'start + end, a job (worker)':40} {per_job:8.1f}")
    print(f"{'sending(), an enqueue (producer)':40} {per_enqueue:8.1f}")
    print(f"memory blocks kept after {N:,} jobs: {row['blocks_kept_after_1m_jobs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
