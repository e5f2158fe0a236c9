"""Whether each variant of the claim earns its keep: ``.venv/bin/python bench/claim_variants.py``.

On a private server, one queue holds ``--jobs`` pending jobs. One connection claims ``--batch`` of them at a time in
a transaction it rolls back (the table stays as it was), alternating the variant the worker uses with the one it
would use without it: the single-queue pick against the round-robin over a list of one queue, and the claim that
takes no flow-limit slots against the one that looks for them (no task has a limit). Server time is the statement's
round trip on a local server. ``--generic``: every statement prepared and planned once, as a busy worker's claim
connection does (``plan_cache_mode = force_generic_plan``); else psycopg's default (prepared after five runs).
Prints one JSON line per pair and a table of medians; never fails on its figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any, LiteralString

import psycopg
from server import private_server

from skiplock import Settings
from skiplock.migrate import migrate
from skiplock.store.run import execute
from skiplock.store.statements import Claim, Statements

PAIRS = {
    # name: (the variant kept, the one used without it)
    "one": ("job_complete_and_claim_unlimited_one", "job_complete_and_claim_unlimited"),
    "unlimited": ("job_complete_and_claim_unlimited_one", "job_complete_and_claim_one"),
}


def timed_claims(conn: psycopg.Connection[Any], query: LiteralString, params: dict[str, Any], rounds: int) -> float:
    """Median seconds of ``rounds`` claims, each rolled back."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with conn.transaction(force_rollback=True):
            rows = conn.execute(query, params).fetchall()
        times.append(time.perf_counter() - start)
        if len(rows) < 2:
            raise RuntimeError(f"the claim took nothing: {query[:60]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=50, help="claims per variant per repeat")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--generic", action="store_true", help="generic plans, as a busy worker's claims")
    args = parser.parse_args()
    with private_server() as server, psycopg.connect(server.dsn, autocommit=True) as conn:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        migrate(conn, schema)
        conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, payload) SELECT %s, %s::jsonb FROM generate_series(1, %s)',
            ("q", "{}", args.jobs),
        )
        conn.execute(f'ANALYZE "{schema}".jobs')
        if args.generic:
            conn.prepare_threshold = 0
            conn.execute("SET plan_cache_mode = force_generic_plan")
        statements = Statements(Settings(schema=schema))
        call = statements.complete_and_claim((), Claim(["q"], "bench", 60.0), args.batch, None)

        def run(name: str) -> float:
            return timed_claims(conn, getattr(statements.q, name), dict(call.params), args.rounds)

        execute(conn, call)  # warm the caches; the claim is committed, a batch fewer pending jobs
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in PAIRS}
        for rep in range(args.repeat):
            for name, (kept, without) in PAIRS.items():
                if rep % 2:  # alternate which goes first
                    without_s = run(without)
                    kept_s = run(kept)
                else:
                    kept_s = run(kept)
                    without_s = run(without)
                results[name].append((kept_s, without_s))
                print(json.dumps({"pair": name, "rep": rep, "kept_ms": kept_s * 1e3, "without_ms": without_s * 1e3}))
        plans = "generic plans" if args.generic else "psycopg's default plans"
        size = f"claims of {args.batch} from {args.jobs:,} pending jobs"
        print(f"\n{size}, {plans}, median of {args.repeat} x {args.rounds}:")
        print("| variant | ms a claim | without it | without / with |")
        print("|---|---:|---:|---:|")
        for name, pairs in results.items():
            kept = statistics.median(p[0] for p in pairs)
            without = statistics.median(p[1] for p in pairs)
            print(f"| {name} ({PAIRS[name][0]}) | {kept * 1e3:.3f} | {without * 1e3:.3f} | {without / kept:.2f}x |")


if __name__ == "__main__":
    main()
