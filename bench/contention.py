"""Where 4 workers contend that 2 do not: a no-op drain with 2 and with 4 workers, in counts per job and per claim.

    .venv/bin/python bench/contention.py [--jobs 50000] [--repeat 3] [--workers 2,4] [--src other/worker ...]

Starts its own PostgreSQL (pgserver's binaries, stock settings plus ``pg_stat_statements``), then drains ``--jobs``
no-op jobs with each worker count in turn (interleaved, ``--repeat`` times; with ``--src``, each tree's worker/ in
turn too: an A/B in one run), through ``scenario.drain``, the harness ``run.py`` uses. Beside its throughput, server
CPU and WAL a job, each drain prints counts that do not depend on the machine's load: the claims a job (from the
start of the claim index, and ``after`` a position), the jobs a claim brings, the claim index entries read a job
(each one past a row another claim holds, a row already claimed or a dead version costs a heap fetch and, for a
live row, a lock test), the jobs table's heap rows fetched a job, and the shared buffers the claims touch a job.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import scenario
from server import Server, _free_port, _postmaster_of

# Statements of the drain that touch the jobs table, grouped: the claim from the index's start, the claim from a
# position (its text binds after_id), and the rest.
STATEMENTS = """
SELECT CASE WHEN query LIKE '%%after_id%%' OR query LIKE '%%(visible_at, id) >%%' THEN 'claim_after'
            WHEN query LIKE '%%FOR UPDATE SKIP LOCKED%%' THEN 'claim'
            ELSE 'other' END AS kind,
       sum(calls)::bigint, sum(rows)::bigint, sum(shared_blks_hit + shared_blks_read)::bigint,
       sum(total_exec_time)::float8, sum(wal_bytes)::bigint
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query ILIKE '%%jobs%%' AND query NOT ILIKE '%%pg_stat_statements%%'
GROUP BY 1
"""
# The claim index and the jobs table, read before and after the drain (the schema is kept until then).
INDEX = """
SELECT coalesce(sum(idx_scan), 0)::bigint, coalesce(sum(idx_tup_read), 0)::bigint,
       coalesce(sum(idx_tup_fetch), 0)::bigint
FROM pg_stat_user_indexes WHERE schemaname = %(s)s AND indexrelname = 'jobs_claim_idx'
"""
TABLE = """
SELECT t.idx_tup_fetch, io.heap_blks_hit + io.heap_blks_read, io.idx_blks_hit + io.idx_blks_read, t.n_tup_hot_upd,
       t.n_tup_upd
FROM pg_stat_user_tables AS t JOIN pg_statio_user_tables AS io USING (relid)
WHERE t.schemaname = %(s)s AND t.relname = 'jobs'
"""


PGSERVER_BIN = Path(importlib.util.find_spec("pgserver").origin).parent / "pginstall" / "bin"  # type: ignore[union-attr]


@contextlib.contextmanager
def private_server_with_statements(bin_dir: Path) -> Iterator[Server]:
    """A throw-away cluster of ``bin_dir``'s PostgreSQL on 127.0.0.1 that loads pg_stat_statements when that build
    has it (pgserver's does not: ``--pg-bin``), run as the ``postgres`` user when this runs as root."""
    user = "postgres" if os.geteuid() == 0 else None
    pgdata = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    if user is not None:
        shutil.chown(pgdata, user)
    run = functools.partial(subprocess.run, check=True, capture_output=True, user=user)
    run([str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust", "--encoding=utf8"])
    port = _free_port()
    options = f"-h 127.0.0.1 -p {port} -k {pgdata}"
    pg_ctl = str(bin_dir / "pg_ctl")
    start = [pg_ctl, "-D", str(pgdata), "-w", "-l", str(pgdata / "bench.log"), "start", "-o"]
    try:
        run([*start, options + " -c shared_preload_libraries=pg_stat_statements"])
    except subprocess.CalledProcessError:
        run([*start, options])  # a build without the extension: no per-statement figures
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        yield Server(dsn, True, _postmaster_of(dsn))
    finally:
        with contextlib.suppress(Exception):
            run([pg_ctl, "-D", str(pgdata), "-w", "-m", "fast", "stop"])
        shutil.rmtree(pgdata, ignore_errors=True)


WAITS = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
WHERE state = 'active' AND pid <> pg_backend_pid() AND application_name IN ('skiplock-worker', 'seed-baseline')
"""


class WaitSampler(threading.Thread):
    """What the workers' active backends wait on (pg_stat_activity, every few milliseconds) while it runs."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.seen, self.samples = dsn, collections.Counter[str](), 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopping.wait(0.002):
                rows = conn.execute(WAITS).fetchall()
                if rows:
                    self.samples += 1
                    self.seen.update(r[0] for r in rows)

    def shares(self) -> dict[str, float]:
        """Backends seen in each state, per sample that saw any active."""
        return {k: v / self.samples for k, v in self.seen.most_common()} if self.samples else {}


def has_statements(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone()
    return bool(row and row[0])


def counts(conn: psycopg.Connection[Any], schema: str) -> tuple[int, ...]:
    index = conn.execute(INDEX, {"s": schema}).fetchone()
    table = conn.execute(TABLE, {"s": schema}).fetchone()
    assert index is not None and table is not None
    return (*index, *table)


def one_drain(
    cfg: scenario.Config, conn: psycopg.Connection[Any], system: str, workers: int, src: str | None
) -> dict[str, Any]:
    """One drain of ``cfg.drain_jobs`` no-op jobs by ``workers`` processes of ``system`` (skiplock, or a plain loop:
    ``ceiling`` on skiplock's table, ``honest`` on the design source's), with its counts a job and a claim."""
    n = cfg.drain_jobs
    schema = scenario.new_honest_schema(cfg) if system == "honest" else scenario.new_schema(cfg, "drain", src)
    statements = has_statements(conn)
    if statements:
        conn.execute("SELECT pg_stat_statements_reset()")
    before = counts(conn, schema)
    sampler = WaitSampler(cfg.dsn)
    sampler.start()
    try:
        figures = scenario.drain(cfg, system=system, handler="noop", schema=schema, src=src, workers=workers)
    finally:
        sampler.stopping.set()
        sampler.join()
    scenario.settled_counters(conn)  # the workers' last statistics have arrived
    after = counts(conn, schema)
    d = [b - a for a, b in zip(before, after, strict=True)]
    by_kind = {row[0]: row[1:] for row in conn.execute(STATEMENTS).fetchall()} if statements else {}
    scenario.drop_schemas(cfg, schema)
    claims = by_kind.get("claim", (0, 0, 0, 0.0, 0))
    after_claims = by_kind.get("claim_after", (0, 0, 0, 0.0, 0))
    calls = claims[0] + after_claims[0]
    extra = 1 if system == "skiplock" else 0  # skiplock's claim returns a row per claimed job plus the completed ids
    jobs = (claims[1] - extra * claims[0]) + (after_claims[1] - extra * after_claims[0])
    return figures | {
        "workers": workers,
        "src": system if system != "skiplock" else src or "this tree",
        "claims_per_kjob": calls / n * 1000,
        "after_share": after_claims[0] / calls if calls else 0.0,
        "jobs_per_claim": jobs / calls if calls else 0.0,
        "after_jobs_per_claim": (after_claims[1] - after_claims[0]) / after_claims[0] if after_claims[0] else 0.0,
        "start_jobs_per_claim": (claims[1] - extra * claims[0]) / claims[0] if claims[0] else 0.0,
        "claim_blocks_per_job": (claims[2] + after_claims[2]) / n,
        "claim_exec_us_per_job": (claims[3] + after_claims[3]) * 1000 / n,
        "claim_wal_per_job": (claims[4] + after_claims[4]) / n,
        "index_scans_per_kjob": d[0] / n * 1000,
        "index_entries_per_job": d[1] / n,
        "index_fetches_per_job": d[2] / n,
        "heap_fetches_per_job": d[3] / n,
        "heap_blocks_per_job": d[4] / n,
        "index_blocks_per_job": d[5] / n,
        "hot_share": d[6] / d[7] if d[7] else 0.0,
        "waits": sampler.shares(),
    }


COLUMNS = [
    ("jobs_per_s", "jobs/s", "{:,.0f}"),
    ("pg_cpu_us_per_job", "PG us/job", "{:.1f}"),
    ("worker_cpu_us_per_job", "wk us/job", "{:.1f}"),
    ("wal_bytes_per_job", "WAL B/job", "{:.0f}"),
    ("commits_per_job", "commits/job", "{:.4f}"),
    ("claims_per_kjob", "claims/kjob", "{:.2f}"),
    ("after_share", "after", "{:.2f}"),
    ("jobs_per_claim", "jobs/claim", "{:.1f}"),
    ("start_jobs_per_claim", "start j/c", "{:.1f}"),
    ("after_jobs_per_claim", "after j/c", "{:.1f}"),
    ("index_entries_per_job", "idx entries/job", "{:.2f}"),
    ("heap_fetches_per_job", "heap fetch/job", "{:.2f}"),
    ("claim_blocks_per_job", "claim bufs/job", "{:.2f}"),
    ("heap_blocks_per_job", "heap bufs/job", "{:.2f}"),
    ("index_blocks_per_job", "idx bufs/job", "{:.2f}"),
    ("claim_exec_us_per_job", "claim us/job", "{:.1f}"),
    ("claim_wal_per_job", "claim WAL/job", "{:.0f}"),
    ("hot_share", "HOT", "{:.2f}"),
]


def table(runs: list[dict[str, Any]]) -> str:
    keys = sorted({(r["src"], r["workers"]) for r in runs}, key=lambda k: (k[0], k[1]))
    head = "| tree | W | " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for src, w in keys:
        rs = [r for r in runs if r["src"] == src and r["workers"] == w]
        cells = []
        for key, _, fmt in COLUMNS:
            vals = [r[key] for r in rs if r.get(key) is not None]
            cells.append(fmt.format(statistics.median(vals)) if vals else "-")
        lines.append(f"| {Path(src).parent.name if src.startswith('/') else src} | {w} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", default="2,4", help="worker counts, comma separated")
    p.add_argument("--pg-bin", type=Path, default=PGSERVER_BIN, help="PostgreSQL's bin/ (one with pg_stat_statements)")
    p.add_argument("--systems", default="skiplock", help="skiplock, ceiling, honest; comma separated")
    p.add_argument("--src", action="append", default=[], help="another tree's worker/ (A/B); repeatable")
    a = p.parse_args(argv)
    counts_w = [int(w) for w in a.workers.split(",")]
    srcs: list[str | None] = [None, *[str(Path(s).resolve()) for s in a.src]]
    systems = [(x, src) for x in a.systems.split(",") for src in (srcs if x == "skiplock" else [None])]
    runs: list[dict[str, Any]] = []
    with private_server_with_statements(a.pg_bin) as srv, psycopg.connect(srv.dsn, autocommit=True) as conn:
        loaded = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
        if loaded and "pg_stat_statements" in str(loaded[0]):
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        else:
            print("no pg_stat_statements in this build (--pg-bin): claims and buffers a job read as 0", flush=True)
        cfg = scenario.drain_config(srv, a.jobs)
        try:
            for i in range(a.repeat):
                for system, src in systems:
                    for w in counts_w:
                        run = one_drain(cfg, conn, system, w, src) | {"repeat": i}
                        runs.append(run)
                        print(json.dumps(run, default=str), flush=True)
        finally:
            scenario.drop_schemas(cfg)
    print(f"\nmedians of {a.repeat} interleaved repeats, {a.jobs:,} no-op jobs\n")
    print(table(runs))
    print("\nthe workers' active backends, per sample that saw any (median): CPU or what they wait on")
    for src, w in sorted({(r["src"], r["workers"]) for r in runs}):
        rs = [r["waits"] for r in runs if r["src"] == src and r["workers"] == w]
        keys = sorted({k for x in rs for k in x}, key=lambda k: -statistics.median(x.get(k, 0.0) for x in rs))
        line = ", ".join(f"{k} {statistics.median(x.get(k, 0.0) for x in rs):.2f}" for k in keys[:8])
        print(f"- {src} W={w}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
