"""The web UI's server time on a big table: ``.venv/bin/python bench/ui.py`` (or ``make bench-ui``).

Seeds a private schema (``bench_ui``) with ``generate_series``: 5,000,000 done jobs and 100,000 failed ones (one in
51 rows, their errors of 40 causes with ids, numbers, UUIDs and quoted values in them), plus a few pending and
running jobs, then VACUUM ANALYZE. Each page and API call is then timed in-process (the ASGI app with its store
on a real pool: routing, SQL, rendering; no network), ``--repeat`` times after one warm-up call; the table shows
the median and the slowest. Actions are timed on the same table, each once: one job's retry and cancel, a canary
of 10, pause and resume, a group's bulk retry and cancel, and bulk actions by filter (a retry matching 25,000
failed jobs, one matching none, a cancel of live jobs); 500 jobs a transaction, one request starts batches for
0.1 s at most, then answers 202 and the same request again goes on.

By default a private PostgreSQL (pgserver's binaries, stock settings) is started; ``--dsn`` (or
``SKIPLOCK_BENCH_DSN``) uses an existing server, where ``--keep`` leaves the seeded schema for the next run
(``--reuse`` then skips the seeding). JSON lines (one per call, then a summary) go to stdout after the table and
to ``bench/results/ui-<time>.jsonl``.

Last run (``make bench-ui`` at commit 36d88fb, a private PostgreSQL 16 of pgserver, stock settings, on the shared
2-core machine under other agents' load, seeded in 224 s): every call within 300 ms. Reads: medians 3.7-117 ms, the
slowest `GET /api/workers?after=0:w1&limit=2` at 117 ms (254 ms its slowest of 5) and `GET
/api/jobs?status=failed&q=no-such-text` at 97 ms (a 10,000-row window of failed jobs, none matching); `/api/queues`
59 ms, `/api/failures` 80 ms (20 groups over 100,000 failed jobs), a job page 13-22 ms. Actions, each timed once:
retry of one job 29 ms, cancel of one 24 ms, a canary of 10 41 ms, pause 15 ms; a group's bulk retry 140 ms and
cancel 160 ms (1,000 jobs in their first request, 202); a bulk retry by filter 123 ms (500 of its 25,000 matches in
the first request) and 172 ms when nothing matches (windows of 2,000 failed jobs until its 0.1 s ran out, 202); a
bulk cancel by filter of the 100 live jobs among the 5,000,000 done ones 104 ms. Before the bulk statement by
filter read each status through its own index, those three took 4,032, 4,141 and 1,695 ms (a plan over the primary
key, through every done job). Before the failure groups were read index-only, a plain GROUP BY over the failed jobs
took 880 ms (one heap page per failed job) and the existing `queue_stats` statement 630 ms (the same); both are why
the UI has statements of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "worker")]

from server import external_server, private_server  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from skiplock.migrate import migrate  # noqa: E402
from skiplock.settings import Settings  # noqa: E402
from skiplock.ui import UiConfig, create_app  # noqa: E402

SCHEMA = "bench_ui"
TOKEN = "bench-token-0123456789"
BUDGET_MS = 300.0

SEED = """
INSERT INTO {s}.jobs (queue, task, payload, status, attempts, max_attempts, visible_at, locked_by, last_error,
                      errors, created_at, updated_at)
SELECT 'q' || (i %% 4), 'task' || (i %% 10),
       jsonb_build_object('order', i, 'customer', 'c' || (i %% 997), 'note', 'a payload of a realistic size'),
       CASE WHEN i %% 51 = 0 THEN 'failed' ELSE 'done' END,
       CASE WHEN i %% 51 = 0 THEN 5 ELSE 1 END, 5,
       t, 'worker-' || (i %% 8),
       CASE WHEN i %% 51 = 0 THEN
           CASE (i / 51) %% 4
               WHEN 0 THEN 'RuntimeError: upstream rejected order ' || i || ' (cause ' || ((i / 51) %% 10) || ')'
               WHEN 1 THEN 'KeyError: ''customer-' || (i %% 997) || ''' in batch ' || ((i / 51) %% 10)
               WHEN 2 THEN 'ConnectionError: timeout after ' || (i %% 30) || '.5 s talking to ' || md5(i::text)::uuid
                           || ' shard ' || ((i / 51) %% 10)
               ELSE 'ValueError: bad amount ' || (i %% 1000) || ' at 0x' || to_hex(i) || ' case ' || ((i / 51) %% 10)
           END
       END,
       CASE WHEN i %% 51 = 0 THEN jsonb_build_array(jsonb_build_object('attempt', 5, 'at', t, 'error', 'x',
                                                                       'worker', 'worker-' || (i %% 8)))
            ELSE '[]'::jsonb END,
       t, t + interval '2 seconds'
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT now() - interval '7 days' + (i * interval '7 days') / %(rows)s AS t) AS ts
"""

LIVE = """
INSERT INTO {s}.jobs (queue, task, payload, status, locked_by, locked_at, lease_expires_at, attempts)
SELECT 'q' || (i %% 4), 'task' || (i %% 10), jsonb_build_object('order', -i),
       CASE WHEN i <= 50 THEN 'processing' ELSE 'pending' END,
       CASE WHEN i <= 50 THEN 'worker-' || (i %% 8) END, CASE WHEN i <= 50 THEN now() END,
       CASE WHEN i <= 50 THEN now() + interval '30 seconds' END, CASE WHEN i <= 50 THEN 1 ELSE 0 END
FROM generate_series(1, 2000) AS i
"""


def seed(dsn: str, done: int, failed: int) -> float:
    rows = done + failed
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        migrate(conn, SCHEMA)
        s = sql.Identifier(SCHEMA)
        conn.execute(sql.SQL(SEED).format(s=s), {"rows": rows})  # type: ignore[arg-type]
        conn.execute(sql.SQL(LIVE).format(s=s), {})  # type: ignore[arg-type]
        # what a worker's failure does to a row: set last_error, which stores its fingerprint (the trigger of 0009)
        conn.execute(sql.SQL("UPDATE {}.jobs SET last_error = last_error WHERE status = 'failed'").format(s))
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(s))
    return time.monotonic() - started


def counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = sql.SQL("SELECT status, count(*) FROM {}.jobs GROUP BY 1").format(sql.Identifier(SCHEMA))
        return {r[0]: r[1] for r in conn.execute(q).fetchall()}


def timed(client: TestClient, method: str, url: str, repeat: int, **kw: Any) -> dict[str, Any]:
    client.request(method, url, **kw)  # warm-up (plans, pool, caches)
    times, status = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        r = client.request(method, url, **kw)
        times.append((time.perf_counter() - t) * 1000)
        status = r.status_code
    return {"call": f"{method} {url}", "status": status, "median_ms": statistics.median(times), "max_ms": max(times)}


def timed_once(client: TestClient, method: str, url: str, **kw: Any) -> dict[str, Any]:
    t = time.perf_counter()
    r = client.request(method, url, **kw)
    ms = (time.perf_counter() - t) * 1000
    return {"call": f"{method} {url}", "status": r.status_code, "median_ms": ms, "max_ms": ms, "body": r.json()}


def run(dsn: str, repeat: int) -> list[dict[str, Any]]:
    settings = Settings.load(env={}, dsn=dsn, schema=SCHEMA)
    app = create_app(settings, UiConfig(token=TOKEN, token_name="bench"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    out: list[dict[str, Any]] = []
    with TestClient(app) as c:
        groups = c.get("/api/failures?limit=100").json()["groups"]
        big = groups[0]["fingerprint"]
        sample = groups[0]["sample_id"]
        some_done = c.get("/api/jobs?status=done&limit=1").json()["jobs"][0]["id"]
        since = (datetime.now(UTC) - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
        reads = [
            "/api/queues",
            "/queues",
            "/api/queues?after=q1&limit=2",
            "/api/jobs",
            "/jobs",
            "/api/jobs?status=failed",
            "/jobs?status=failed",
            "/api/jobs?status=done&queue=q1",
            "/api/jobs?status=pending",
            "/api/jobs?q=timeout",
            "/api/jobs?q=no-such-text",
            "/api/jobs?status=failed&q=no-such-text",
            "/api/jobs?task=task3&status=failed",
            f"/api/jobs?since={since}&limit=200",
            f"/api/jobs/{sample}",
            f"/jobs/{sample}",
            f"/jobs/{some_done}",
            "/api/failures",
            "/failures",
            f"/api/failures/{big}",
            f"/failures/{big}",
            "/api/schedules",
            "/schedules",
            "/api/limits",
            "/limits",
            "/api/workers",
            "/workers",
            "/api/workers?after=0:w1&limit=2",
            "/api/audit",
            "/audit",
        ]
        out += [timed(c, "GET", url, repeat) for url in reads]
        out.append(timed(c, "POST", "/api/queues/q1/pause", repeat, headers=auth))
        out.append(timed(c, "POST", "/api/queues/q1/resume", repeat, headers=auth))
        failed_ids = [j["id"] for j in c.get("/api/jobs?status=failed&limit=20").json()["jobs"]]
        out.append(timed_once(c, "POST", f"/api/jobs/{failed_ids[0]}/retry", headers=auth))
        out.append(timed_once(c, "POST", f"/api/failures/{big}/retry", headers=auth, json={"canary": 10}))
        small = next((g for g in reversed(groups) if 1000 <= g["jobs"] <= 5000), None)
        if small is not None:
            row = timed_once(c, "POST", f"/api/failures/{small['fingerprint']}/retry", headers=auth)
            row["jobs"] = row["body"]["action"]["job_count"]
            out.append(row)
        pending = c.get("/api/jobs?status=pending&limit=1").json()["jobs"][0]["id"]
        out.append(timed_once(c, "POST", f"/api/jobs/{pending}/cancel", headers=auth))
        other = next(g for g in groups if g["fingerprint"] not in (big, small and small["fingerprint"]))
        bulks = [
            (f"/api/failures/{other['fingerprint']}/cancel", None),
            ("/api/jobs/retry", {"queue": "q3", "q": "KeyError"}),  # 25,000 failed jobs match
            ("/api/jobs/retry", {"queue": "q2", "q": "KeyError"}),  # none match: every failed job is read
            ("/api/jobs/cancel", {"queue": "q1", "task": "task3"}),  # live jobs among 5,000,000 done ones
        ]
        for url, body in bulks:
            row = timed_once(c, "POST", url, headers=auth, json=body)
            row["jobs"] = row["body"]["action"]["job_count"]
            if body is not None:
                row["call"] += " " + json.dumps(body)
            out.append(row)
        out.append(timed(c, "GET", "/api/audit", repeat))
    for row in out:
        row.pop("body", None)
        row["within_budget"] = row["median_ms"] < BUDGET_MS and row["status"] < 500
    return out


def render(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["call"]) for r in rows)
    lines = [
        f"| {'call'.ljust(width)} | status | median ms | max ms |",
        f"|{'-' * (width + 2)}|--------|-----------|--------|",
    ]
    for r in rows:
        extra = f" ({r['jobs']} jobs in this call)" if "jobs" in r else ""
        call = (r["call"] + extra).ljust(width)
        lines.append(f"| {call} | {r['status']:>6} | {r['median_ms']:>9.1f} | {r['max_ms']:>6.1f} |")
    return "\n".join(lines)


@contextmanager
def database(dsn: str | None) -> Iterator[str]:
    if dsn:
        with external_server(dsn) as srv:
            yield srv.dsn
    else:
        with private_server() as srv:
            yield srv.dsn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("SKIPLOCK_BENCH_DSN"), help="use this server, not a private one")
    p.add_argument("--done", type=int, default=5_000_000, help="done jobs to seed (default 5,000,000)")
    p.add_argument("--failed", type=int, default=100_000, help="failed jobs to seed (default 100,000)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per read (default 5; medians reported)")
    p.add_argument("--keep", action="store_true", help="leave the bench_ui schema behind (with --dsn)")
    p.add_argument("--reuse", action="store_true", help="use the bench_ui schema a --keep run left (no seeding)")
    a = p.parse_args(argv)
    if a.done % 50 or a.failed * 50 != a.done:
        p.error("the seed keeps one failed job in 51 rows: --done must be 50 x --failed")
    with database(a.dsn) as dsn:
        seconds = 0.0 if a.reuse else seed(dsn, a.done, a.failed)
        table = counts(dsn)
        rows = run(dsn, a.repeat)
        if not a.keep:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    summary = {
        "kind": "summary",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "table": table,
        "seed_seconds": round(seconds, 1),
        "repeat": a.repeat,
        "budget_ms": BUDGET_MS,
        "slowest_median_ms": max(r["median_ms"] for r in rows),
        "all_within_budget": all(r["within_budget"] for r in rows),
    }
    print(f"jobs table: {table} (seeded in {seconds:.0f} s)\n")
    print(render(rows))
    lines = [json.dumps({"kind": "call", **r}) for r in rows] + [json.dumps(summary)]
    print("\n" + "\n".join(lines))
    out = HERE / "results" / f"ui-{datetime.now(UTC):%Y%m%dT%H%M%S}.jsonl"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"json lines: {out}")
    return 0 if summary["all_within_budget"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
