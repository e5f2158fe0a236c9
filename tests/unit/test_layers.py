"""SQL runs only from the data-access layer (skiplock.store), the migrator and the doctor: no other module of the
package calls a connection's or cursor's execute, opens a cursor or a COPY."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGES = [
    Path(__file__).parents[2] / "worker" / "skiplock",
    Path(__file__).parents[2] / "operator" / "skiplock_operator",
]
RUNS_SQL = re.compile(r"\.execute\(|\.cursor\(|\bcur\.copy\(|\.executemany\(")
ALLOWED = {"skiplock/store", "skiplock/migrate.py", "skiplock/doctor.py"}
KNOWN = {
    # Not SQL of skiplock's own: LISTEN/UNLISTEN and NOTIFY of the listener (its connection is the LISTEN itself)
    "skiplock/listener.py",
    # the worker's pools: the liveness ping (SELECT 1) of a checkout; the executor: BEGIN on a handler's connection
    "skiplock/worker/pools.py",
    "skiplock/worker/executor.py",
    # job.conn's proxy for handlers (what application code calls)
    "skiplock/job.py",
}


def _offenders() -> set[str]:
    found = set()
    for root in PACKAGES:
        for path in root.rglob("*.py"):
            rel = str(path.relative_to(root.parent))
            if any(rel == a or rel.startswith(a + "/") for a in ALLOWED):
                continue
            if RUNS_SQL.search(path.read_text(encoding="utf-8")):
                found.add(rel)
    return found


def test_no_module_outside_the_store_runs_sql_but_the_known_ones():
    assert _offenders() - KNOWN == set(), "run SQL through skiplock.store (statements + run)"


def test_the_known_exceptions_still_run_sql_or_leave_the_list():
    assert KNOWN - _offenders() == set(), "no longer runs SQL: drop it from KNOWN"
