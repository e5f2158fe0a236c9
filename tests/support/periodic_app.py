"""An app with one periodic task (every second) for the schedule tests: workers import it with --app."""

from __future__ import annotations

from skiplock import App, Job

app = App("periodic")


@app.task(name="periodic.tick", queue="ticks", every=1)
def tick(job: Job) -> None:
    return None
