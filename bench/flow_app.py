"""Tasks of the flow-control drain cases (``SKIPLOCK_APP=flow_app:app``, with the catch-all ``handlers`` too).

``bench.limited`` carries a global concurrency limit above what the workers run at once and a rate limit above
what they reach, so neither binds: the drain measures what the slot rows cost a claim, not the limit itself.
"""

from __future__ import annotations

from skiplock import App, Job

app = App()


@app.task(name="bench.limited", queue="bench", global_concurrency=1000, rate_limit="10000/s")
def limited(job: Job) -> None:
    return None
