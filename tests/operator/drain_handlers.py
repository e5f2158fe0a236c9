"""Handlers of the scale-in test's worker processes: each run is logged (start, end, pod) to the file its payload
names, and a job with a ``barrier`` runs until that file exists (the test decides when a long job ends)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from skiplock import Job

LONGEST_SECONDS = 120.0


def _note(path: str, word: str, job: Job) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{word} {job.payload['name']} {os.environ.get('POD_NAME', '?')}\n")


def run(job: Job) -> None:
    _note(job.payload["log"], "start", job)
    barrier = job.payload.get("barrier")
    deadline = time.monotonic() + LONGEST_SECONDS
    while barrier and not Path(barrier).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _note(job.payload["log"], "end", job)
