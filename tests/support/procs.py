"""Functions run in child processes (spawn needs them importable)."""

from __future__ import annotations

import multiprocessing as mp

from skiplock import Queue, Settings


def claim_all(dsn: str, schema: str, queue_name: str, worker: str, out: mp.Queue) -> None:
    """Claim until the queue is empty, report the ids."""
    settings = Settings.load(env={}, dsn=dsn, schema=schema)
    got: list[int] = []
    with Queue(settings=settings, max_size=1) as q:
        while True:
            jobs = q.claim(queue_name, limit=7, worker=worker)
            if not jobs:
                break
            got.extend(j.id for j in jobs)
    out.put(got)
