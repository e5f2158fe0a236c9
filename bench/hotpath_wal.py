"""Where a no-op drain spends PostgreSQL's time and WAL, per statement: skiplock beside the honest plain loop.

    .venv/bin/python bench/hotpath_wal.py --dsn postgresql://postgres@127.0.0.1:PORT/postgres [--jobs 20000]

Needs a server that loads ``pg_stat_statements`` (``shared_preload_libraries``) and is private to the run: each drain
resets the statistics, and every statement of the server is counted. For each system (skiplock at its defaults,
``seed_baseline.py --style honest``) it drains ``--jobs`` jobs with ``--workers`` processes (``scenario.drain``,
the same harness as ``run.py``) and prints, for each statement of the drain that touched the jobs table, its calls,
the execution time, WAL records and WAL bytes per job, and the shared buffers it hit or read per job; then the
same as JSON lines. Read with ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of the statements it names.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg
import scenario
from server import external_server

STATEMENTS = """
SELECT calls, rows, total_exec_time, wal_records, wal_bytes, shared_blks_hit + shared_blks_read AS blocks,
       regexp_replace(left(query, 400), '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query ILIKE '%%jobs%%' AND query NOT ILIKE '%%pg_stat_statements%%'
ORDER BY total_exec_time DESC
"""


def profile(conn: psycopg.Connection[Any], jobs: int) -> list[dict[str, Any]]:
    out = []
    for calls, rows, ms, wal_records, wal_bytes, blocks, query in conn.execute(STATEMENTS).fetchall():
        out.append(
            {
                "calls": int(calls),
                "rows": int(rows),
                "exec_us_per_job": float(ms) * 1000 / jobs,
                "wal_records_per_job": int(wal_records) / jobs,
                "wal_bytes_per_job": float(wal_bytes) / jobs,
                "blocks_per_job": int(blocks) / jobs,
                "query": query,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True, help="a private server loading pg_stat_statements")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    lines: list[dict[str, Any]] = []
    with external_server(a.dsn) as srv, psycopg.connect(a.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cfg = scenario.drain_config(srv, a.jobs, workers=a.workers)
        try:
            for system in ("skiplock", "honest"):
                conn.execute("SELECT pg_stat_statements_reset()")
                figures = scenario.drain(cfg, system=system, handler="noop")
                for row in profile(conn, a.jobs):
                    lines.append({"type": "statement", "system": system, **row})
                lines.append({"type": "drain", "system": system, **figures})
        finally:
            scenario.drop_schemas(cfg)
    for system in ("skiplock", "honest"):
        print(f"\n{system}: per job, statements that touched the jobs table (most execution time first)")
        print("| calls | exec us | WAL records | WAL B | blocks | statement |\n|---:|---:|---:|---:|---:|---|")
        for s in (x for x in lines if x["type"] == "statement" and x["system"] == system):
            if s["exec_us_per_job"] >= 0.05 or s["wal_bytes_per_job"] >= 1:
                print(
                    f"| {s['calls']:,} | {s['exec_us_per_job']:.2f} | {s['wal_records_per_job']:.2f} "
                    f"| {s['wal_bytes_per_job']:.0f} | {s['blocks_per_job']:.1f} | {s['query'][:110]} |"
                )
    print()
    for line in lines:
        print(json.dumps(line, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
