"""An app with a task that fails deep inside a helper (the traceback tests): ``total`` subscripts an int."""

from __future__ import annotations

from typing import Any

from skiplock import App, Job

app = App()


def total(order: dict[str, Any]) -> int:
    return sum(line["price"] for line in order["lines"])  # a line is an int here: TypeError


@app.task(name="charge", queue="charges", max_attempts=2, backoff_base_seconds=0.05, backoff_cap_seconds=0.1)
def charge(job: Job) -> None:
    total(job.payload)
