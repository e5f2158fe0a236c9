"""What the workflow trigger (``jobs_ended``, migration 0016) costs a plain job inside PostgreSQL: the time of the
claim-like and completion-like UPDATE of N plain rows with the trigger enabled and disabled, alternated.

    .venv/bin/python bench/trigger_cost.py --dsn postgresql://localhost/db [--rows 50000] [--repeat 6]

Prints one JSON line per run, then a table of the medians (µs per row update)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import psycopg
from psycopg import sql

from skiplock.migrate import migrate

SCHEMA = "bench_trigger_cost"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=6)
    a = p.parse_args()
    jobs = sql.Identifier(SCHEMA, "jobs")
    per_row: dict[str, list[float]] = {"enabled": [], "disabled": []}
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        migrate(conn, SCHEMA)
        try:
            for rep in range(a.repeat):
                for mode in ("enabled", "disabled") if rep % 2 == 0 else ("disabled", "enabled"):
                    conn.execute(sql.SQL("TRUNCATE {}").format(jobs))
                    conn.execute(
                        sql.SQL("INSERT INTO {} (payload) SELECT '{{}}'::jsonb FROM generate_series(1, %s)").format(
                            jobs
                        ),
                        [a.rows],
                    )
                    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(jobs))
                    verb = sql.SQL("ENABLE" if mode == "enabled" else "DISABLE")
                    conn.execute(sql.SQL("ALTER TABLE {} {} TRIGGER jobs_ended").format(jobs, verb))
                    t = time.perf_counter()
                    conn.execute(
                        sql.SQL("UPDATE {} SET status = 'processing', locked_by = 'w', locked_at = now()").format(jobs)
                    )
                    conn.execute(sql.SQL("UPDATE {} SET status = 'done', locked_at = NULL").format(jobs))
                    us = (time.perf_counter() - t) / (2 * a.rows) * 1e6
                    per_row[mode].append(us)
                    print(
                        json.dumps({"type": "run", "trigger": mode, "rep": rep + 1, "us_per_row_update": round(us, 3)})
                    )
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    print("\n| jobs_ended trigger | µs per row update (median) | runs |\n|---|---:|---|")
    for mode, values in per_row.items():
        print(f"| {mode} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
