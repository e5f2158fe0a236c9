"""The handler the browser tests' real worker runs (``ui.handlers:until_fixed``)."""

from __future__ import annotations

import os
import uuid

from skiplock import Job


def until_fixed(job: Job) -> None:
    """Fail (an order rejected upstream) until the test "fixes the cause": a row in the schema's ``fixed`` table."""
    row = job.conn.execute(f'SELECT count(*) FROM "{os.environ["SKIPLOCK_SCHEMA"]}".fixed').fetchone()
    if not row or not row[0]:
        raise RuntimeError(f"upstream rejected order {job.payload['order']} (request {uuid.uuid4()})")
