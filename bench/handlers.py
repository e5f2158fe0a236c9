"""Handlers the benchmark's workers load by name (``PYTHONPATH=bench``, ``SKIPLOCK_HANDLER=handlers:noop``).

- ``noop`` / ``anoop``: do nothing, so completion joins the worker's batch (the fast path).
- ``write`` / ``awrite``: one INSERT through ``job.conn``, so completion is fenced in the handler's transaction.
- ``record_start``: append ``job_id enqueue_ts start_ts`` to a per-process file (latency); no database use.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from skiplock import Job

EFFECTS_TABLE = "bench_effects"
_lock = threading.Lock()
_fds: dict[int, int] = {}  # pid -> file descriptor of this process's starts file


def _effect_sql() -> str:
    return f'INSERT INTO "{os.environ["SKIPLOCK_SCHEMA"]}".{EFFECTS_TABLE} (job_id, attempt) VALUES (%s, %s)'


def noop(job: Job) -> None:
    return None


async def anoop(job: Job) -> None:
    return None


def flowstep(job: Job) -> float | None:
    """A workflow's job (bench/flows.py): nothing, or, for the callback (``stamp``), the time it started as its
    result."""
    return time.time() if job.payload.get("stamp") else None


def write(job: Job) -> None:
    job.conn.execute(_effect_sql(), (job.id, job.attempts))


async def awrite(job: Job) -> None:
    await job.conn.execute(_effect_sql(), (job.id, job.attempts))


def _latency_fd() -> int:
    pid = os.getpid()
    with _lock:
        if pid not in _fds:
            path = os.path.join(os.environ["BENCH_LATENCY_DIR"], f"starts-{pid}.txt")
            _fds[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return _fds[pid]


def record_start(job: Job) -> None:
    started = time.time()
    payload: Any = job.payload
    os.write(_latency_fd(), f"{job.id} {payload['t']!r} {started!r}\n".encode())
