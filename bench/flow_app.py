"""Tasks of the flow-control drain cases (``SKIPLOCK_APP=flow_app:app``, with the catch-all ``handlers`` too).

``bench.limited`` carries a global concurrency limit above what the workers run at once, which never binds, and a
rate limit of 10,000 starts a second, the largest a rate limit may be. A machine whose plain drain is slower than
that measures what the slot rows cost a claim; on a faster one the rate binds, and the case shows how close the
drain comes to the pace the limit allows (20,000 jobs: 10,000 at once, the rest a second later), and what each
job's slot rows cost PostgreSQL (its CPU a job).
"""

from __future__ import annotations

from skiplock import App, Job

app = App()


@app.task(name="bench.limited", queue="bench", global_concurrency=1000, rate_limit="10000/s")
def limited(job: Job) -> None:
    return None
