"""skiplock benchmark suite: ``make bench`` or ``.venv/bin/python bench/run.py [--quick|--full]``.

Side by side in one run: skiplock at its defaults, two ceilings (a tuned plain-SQL loop on skiplock's own table, and
the honest one: the same loop on the design source's own table and statements; see ``seed_baseline.py``), pgqueuer
(when the ``bench`` extra is installed), and the plain transactional loop.

Each case runs ``--repeat`` times (default 3), interleaved (case A, case B, ..., then again), so slow drift on a
shared machine hits every case alike; the tables show medians, and each ratio is the median over repeats of the
ratio of two runs next to each other in time (never across runs of the script). JSON
lines (settings, versions, machine facts, every run, the medians and the targets) go to stdout after the tables
and to ``bench/results/bench-<time>.jsonl``.

By default a private PostgreSQL (pgserver's binaries, stock settings) is started on 127.0.0.1 so the
server-wide counters are ours alone; ``--dsn`` (or ``SKIPLOCK_BENCH_DSN``) uses an existing server instead.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import flows
import meter
import pgqueuer_bench
import scenario
from server import Server, external_server, private_server

MODES: dict[str, dict[str, Any]] = {
    # the smoke test's size: every case once, in well under a minute
    "quick": {
        "drain_jobs": 300,
        "single_jobs": 100,
        "bulk_jobs": 2000,
        "bulk_chunk": 1000,
        "prefill_rows": 5_000,
        "latency_rate": 50.0,
        "latency_seconds": 1.0,
        "settle_seconds": 0.3,  # counters are rougher, the smoke test does not judge them
    },
    # make bench: a few minutes on a 2-core machine
    "default": {
        "drain_jobs": 20_000,
        "single_jobs": 1_000,
        "bulk_jobs": 100_000,  # 20,000 took 0.1 s: the ratios to COPY moved from 0.5x to 1x between repeats
        "bulk_chunk": 1_000,
        "prefill_rows": 200_000,
        "latency_rate": 200.0,
        "latency_seconds": 5.0,
    },
    # the sizes: 20,000-job drains, 1,000,000 finished rows, 10 s of latency
    "full": {
        "drain_jobs": 20_000,
        "single_jobs": 2_000,
        "bulk_jobs": 200_000,
        "bulk_chunk": 1_000,
        "prefill_rows": 1_000_000,
        "latency_rate": 200.0,
        "latency_seconds": 10.0,
    },
}
EXPORTED: set[str] = set()  # temp dirs holding a `git archive` of worker/, removed at exit
CEILING = "drain noop [ceiling]"  # a tuned plain-SQL loop: claim 200, pipelined completion, NOTIFY
HONEST = "drain noop [honest]"  # the same loop on the design source's table, indexes and statements
PGQUEUER = "drain noop [pgqueuer]"
HONEST_LATENCY = "latency NOTIFY [honest]"  # the plain loop on the design source's table, single INSERT + NOTIFY
PGQUEUER_LATENCY = "latency NOTIFY [pgqueuer]"
TX_CEILING = "drain write [plain tx]"  # per job: BEGIN, INSERT, UPDATE, COMMIT
FLOW_CASES = (
    "drain noop, 10% serial keys",
    "drain noop, limited task",
    "drain noop, 50 queues",
    "drain noop, 2 queues, 1 idle",
)
GROUPS = ("enqueue", "drain", "transactional", "tablesize", "latency", "scale", "workflows")
FLOW_SIZES = {"quick": (200, 2, 20), "default": (10_000, 3, 1_000), "full": (10_000, 5, 1_000)}
"""Workflow cases by mode: fan-out children, fan-out rounds per run, chain links."""
DRAIN_COLUMNS = (
    ("jobs_per_s", "jobs/s", "{:,.0f}"),
    ("vs_ceiling", "x ceiling", "{:.2f}x"),
    ("vs_honest", "x honest", "{:.2f}x"),
    ("vs_pgqueuer", "x pgqueuer", "{:.2f}x"),
    ("vs_main", "x main", "{:.2f}x"),
    ("vs_plain", "x plain", "{:.2f}x"),  # flow-control cases: paired with the plain no-op drain
    ("vs_seed", "x seed", "{:.1f}x"),
    ("vs_empty_table", "x empty table", "{:.2f}x"),
    ("worker_cpu_us_per_job", "worker CPU us/job", "{:.0f}"),
    ("pg_cpu_us_per_job", "PG CPU us/job", "{:.0f}"),
    ("pg_cpu_vs_honest", "PG CPU x honest", "{:.2f}x"),
    ("cpu_us_per_job", "CPU us/job", "{:.0f}"),
    ("commits_per_job", "commits/job", "{:.3f}"),
    ("write_tx_per_job", "write tx/job", "{:.3f}"),
    ("wal_bytes_per_job", "WAL B/job", "{:,.0f}"),
    ("wal_vs_honest", "WAL x honest", "{:.2f}x"),
    ("worker_rss_mb", "worker peak RSS MB", "{:.0f}"),
)
LATENCY_COLUMNS = (
    ("rate_per_s", "rate", "{:.0f}/s"),
    ("p50_ms", "p50 ms", "{:.1f}"),
    ("p95_ms", "p95 ms", "{:.1f}"),
    ("p99_ms", "p99 ms", "{:.1f}"),
    ("max_ms", "max ms", "{:.1f}"),
    ("p50_call_ms", "p50 from call ms", "{:.1f}"),
    ("p99_call_ms", "p99 from call ms", "{:.1f}"),
    ("worker_commits_per_job", "commits/job", "{:.2f}"),
    ("worker_write_tx_per_job", "write tx/job", "{:.2f}"),
    ("empty_claims_per_job", "empty claims/job", "{:.2f}"),
    ("p50_vs_honest", "p50 x honest", "{:.2f}x"),
    ("p99_vs_honest", "p99 x honest", "{:.2f}x"),
    ("p50_vs_pgqueuer", "p50 x pgqueuer", "{:.2f}x"),
    ("p99_vs_pgqueuer", "p99 x pgqueuer", "{:.2f}x"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description="skiplock benchmark suite (issue 7)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", const="quick", dest="mode", help="tiny sizes (smoke test)")
    size.add_argument("--full", action="store_const", const="full", dest="mode", help="20k drains, 1M-row table")
    p.add_argument("--dsn", default=os.environ.get("SKIPLOCK_BENCH_DSN"), help="use this server, not a private one")
    p.add_argument("--repeat", type=int, default=3, help="runs per case (default 3; medians reported)")
    p.add_argument("--workers", type=int, default=2, help="worker processes W (default 2)")
    p.add_argument("--concurrency", type=int, default=10, help="concurrency C of each worker (default 10)")
    p.add_argument("--big-concurrency", type=int, default=64, help="C (and batch) of the RSS case (default 64)")
    p.add_argument("--batch", type=int, help="SKIPLOCK_BATCH (default: the worker's default)")
    p.add_argument("--poll", type=float, default=2.0, help="SKIPLOCK_POLL_SECONDS (default 2)")
    p.add_argument("--jobs", type=int, help="override N of the drains")
    p.add_argument("--prefill", type=int, help="override the finished rows of the table-size case")
    p.add_argument("--only", nargs="+", choices=GROUPS, help="run only these groups")
    p.add_argument("--cases", type=re.compile, help="run only the cases whose name matches this regular expression")
    p.add_argument("--no-baseline", action="store_true", help="skip the ceiling loops and pgqueuer")
    p.add_argument("--seed", action="store_true", help="also run the seed's literal PHP loop (slow)")
    p.add_argument("--json-out", type=Path, help="JSON lines file (default bench/results/bench-<time>.jsonl)")
    p.add_argument("--keep-schemas", action="store_true", help="leave the bench_* schemas behind")
    p.add_argument(
        "--ref",
        help="benchmark the worker/ of this git commit (exported to a temp dir), or of a directory holding "
        "skiplock/ (a scratch copy), instead of the working tree: compare commits, or prototypes",
    )
    p.add_argument(
        "--compare",
        metavar="REF_OR_DIR",
        help="also run the skiplock drain and NOTIFY latency cases with this worker/ (git ref or directory), "
        "interleaved with the main ones in the same run; rows get [LABEL] and an 'x main' ratio",
    )
    p.add_argument("--compare-label", default="alt", help="label of the --compare rows (default alt)")
    p.add_argument("--replay", type=Path, help="print the tables of an earlier run's JSON lines file, run nothing")
    a = p.parse_args(argv)
    a.mode = a.mode or "default"
    if a.repeat < 1 or a.workers < 1 or a.concurrency < 1:
        p.error("--repeat, --workers and --concurrency must be >= 1")
    return a


Case = tuple[str, str, Callable[[], dict[str, Any]]]


def in_turn(cases: list[Case], rep: int, tag: str | None) -> list[Case]:
    """The cases in the order of repeat ``rep``: on every other repeat each ``--compare`` row runs before its main
    row, so neither always gets the slot right after the case before them (the 10 % serial-key drain, always run right
    after the 4-worker ceiling, was the slower of its pair in 11 of 12 pairs over four runs with no change to what it
    runs)."""
    if tag is None or rep % 2 == 0:
        return cases
    out = list(cases)
    i = 0
    while i < len(out) - 1:
        if out[i + 1][1] == out[i][1] + tag:
            out[i], out[i + 1] = out[i + 1], out[i]
            i += 2
        else:
            i += 1
    return out


def build_cases(cfg: scenario.Config, a: argparse.Namespace) -> tuple[list[Case], Callable[[], None]]:
    """The cases in run order (group, name, thunk), and a setup step (prefilled tables) to run first."""
    groups = set(a.only or GROUPS)
    peers = not a.no_baseline
    pgq = peers and pgqueuer_bench.available()
    alt = worker_source(a.compare) if a.compare else None
    tag = f" [{a.compare_label}]"
    big: dict[str, str] = {}
    cases: list[Case] = []
    big_rows = [cfg.prefill_rows] + ([10 * cfg.prefill_rows] if a.mode == "full" else [])

    def setup() -> None:
        if "tablesize" in groups:
            for rows in big_rows:
                big[f"{rows:,}"] = scenario.new_schema(cfg, "big")
                scenario.prefill(cfg, big[f"{rows:,}"], rows)

    def add(group: str, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if group in groups and (a.cases is None or a.cases.search(name)):
            cases.append((group, name, fn))

    def skiplock(name: str, handler: str = "noop", group: str = "drain", **kw: Any) -> None:
        add(group, name, lambda: scenario.drain(cfg, system="skiplock", handler=handler, **kw))
        if alt:
            add(group, name + tag, lambda: scenario.drain(cfg, system="skiplock", handler=handler, src=alt, **kw))

    add("enqueue", "enqueue", lambda: scenario.enqueue(cfg))
    skiplock("drain noop")
    if peers:
        add("drain", CEILING, lambda: scenario.drain(cfg, system="ceiling", handler="noop"))
        add("drain", HONEST, lambda: scenario.drain(cfg, system="honest", handler="noop"))
    if pgq:
        add("drain", PGQUEUER, lambda: scenario.drain(cfg, system="pgqueuer", handler="noop"))
    # the big-table drains run right after the empty-table ones, so their paired ratios compare neighbours in time
    for rows in big_rows:
        add(
            "tablesize",
            f"drain noop, {rows:,} finished rows",
            lambda rows=rows: scenario.drain(cfg, system="skiplock", handler="noop", schema=big[f"{rows:,}"]),
        )
    if a.seed:
        add("drain", "drain noop [seed]", lambda: scenario.drain(cfg, system="seed", handler="noop"))
    skiplock("drain noop async", "anoop")
    skiplock("drain noop W=4", workers=4)
    if peers:
        add("drain", CEILING + " W=4", lambda: scenario.drain(cfg, system="ceiling", handler="noop", workers=4))
        add("drain", HONEST + " W=4", lambda: scenario.drain(cfg, system="honest", handler="noop", workers=4))
    if pgq:
        add("drain", PGQUEUER + " W=4", lambda: scenario.drain(cfg, system="pgqueuer", handler="noop", workers=4))
    # flow control: what 10 % serial-keyed jobs, and a task with (non-binding) limits, cost the plain drain
    skiplock(FLOW_CASES[0], flow="serial")
    skiplock(FLOW_CASES[1], flow="limited")
    skiplock(FLOW_CASES[2], flow="queues")  # one worker serving 50 queues (round-robin claims) vs one queue
    skiplock(FLOW_CASES[3], flow="idle")  # the same jobs in one queue, the workers serving an empty one as well
    big_c = a.big_concurrency  # the RSS case
    add(
        "drain",
        f"drain noop C={big_c}",
        lambda: scenario.drain(cfg, system="skiplock", handler="noop", concurrency=big_c, batch=big_c),
    )
    skiplock("drain write", "write", "transactional")
    skiplock("drain write async", "awrite", "transactional")
    if peers:
        add("transactional", TX_CEILING, lambda: scenario.drain(cfg, system="txloop", handler="write"))
    if a.mode == "full":
        backlog = dataclasses.replace(cfg, drain_jobs=1_000_000, drain_timeout=1800.0)
        add(
            "scale", "drain noop, 1,000,000 backlog", lambda: scenario.drain(backlog, system="skiplock", handler="noop")
        )
    children, rounds, links = FLOW_SIZES[a.mode]
    add(
        "workflows",
        f"workflow fan-out {children:,} + callback",
        lambda: flows.fan_out(cfg, children=children, rounds=rounds),
    )
    add("workflows", f"workflow chain of {links:,}", lambda: flows.chain(cfg, links=links))
    add("latency", "latency NOTIFY", lambda: scenario.latency(cfg))
    if peers:
        add("latency", HONEST_LATENCY, lambda: scenario.latency(cfg, system="honest"))
    if pgq:
        add("latency", PGQUEUER_LATENCY, lambda: scenario.latency(cfg, system="pgqueuer"))
    if alt:
        add("latency", "latency NOTIFY" + tag, lambda: scenario.latency(cfg, src=alt))
    add("latency", "latency poll", lambda: scenario.latency(cfg, listen=False))
    return cases, setup


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in runs[0] if all(isinstance(r.get(k), int | float) for r in runs)]
    out: dict[str, Any] = {k: meter.median([float(r[k]) for r in runs]) for k in keys}
    for k in runs[0]:
        out.setdefault(k, runs[0][k])
    out["repeats"] = len(runs)
    return out


def main_of(name: str) -> str:
    """``drain noop C=32 [alt]`` -> ``drain noop C=32``."""
    return name.split(" [", 1)[0]


def base_of(name: str, base: str) -> str:
    """The peer case run with the same number of workers: ``drain noop W=4`` -> ``drain noop [ceiling] W=4``."""
    return base + (" W=4" if " W=4" in name else "")


def paired(runs: dict[str, list[dict[str, Any]]], case: str, base: str, key: str = "jobs_per_s") -> float | None:
    """Median over repeats of case/base, each repeat paired with the base run next to it in time (robust to drift)."""
    a, b = runs.get(case), runs.get(base)
    if not a or not b or case == base:
        return None
    ratios = [x[key] / y[key] for x, y in zip(a, b, strict=False) if x.get(key) is not None and y.get(key)]
    return meter.median(ratios) if ratios else None


def add_ratios(med: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]]) -> None:
    for name, m in med.items():
        if name.startswith("latency NOTIFY") and name != HONEST_LATENCY:
            for base, peer in ((HONEST_LATENCY, "honest"), (PGQUEUER_LATENCY, "pgqueuer")):
                if name != base:
                    m[f"p50_vs_{peer}"] = paired(runs, name, base, "p50_ms")
                    m[f"p99_vs_{peer}"] = paired(runs, name, base, "p99_ms")
        if not name.startswith("drain"):
            continue
        peer = any(name.startswith(b) for b in (CEILING, HONEST, PGQUEUER, TX_CEILING, "drain noop [seed]"))
        if name.endswith("]") and not peer:  # a --compare row against the same case of this tree
            m["vs_main"] = paired(runs, name, main_of(name))
        if main_of(name) in FLOW_CASES:
            m["vs_plain"] = paired(runs, name, "drain noop")
        elif "write" in name:
            m["vs_ceiling"] = paired(runs, name, TX_CEILING)
        elif "finished rows" in name or "backlog" in name:
            m["vs_empty_table"] = paired(runs, name, "drain noop")
        elif "C=" not in name:
            m["vs_ceiling"] = paired(runs, name, base_of(name, CEILING))
            m["vs_pgqueuer"] = paired(runs, name, base_of(name, PGQUEUER))
            honest = base_of(name, HONEST)
            m["vs_honest"] = paired(runs, name, honest)
            m["pg_cpu_vs_honest"] = paired(runs, name, honest, "pg_cpu_us_per_job")
            m["wal_vs_honest"] = paired(runs, name, honest, "wal_bytes_per_job")
        if "[seed]" not in name and "drain noop [seed]" in runs and "noop" in name:
            m["vs_seed"] = paired(runs, name, "drain noop [seed]")


def targets(med: dict[str, dict[str, Any]], big_c: int) -> list[dict[str, Any]]:
    def get(case: str, key: str) -> float | None:
        v = med.get(case, {}).get(key)
        return float(v) if isinstance(v, int | float) and not math.isnan(v) else None

    tables = [n for n in med if n.startswith("drain noop, ") and "finished rows" in n]
    rows = [
        ("drain no-op, defaults, 2 workers vs ceiling", ">= 0.8x", get("drain noop", "vs_ceiling"), 0.8, True),
        ("drain no-op vs pgqueuer", ">= 2.5x", get("drain noop", "vs_pgqueuer"), 2.5, True),
        ("drain no-op, 2 workers vs honest ceiling", ">= 0.8x", get("drain noop", "vs_honest"), 0.8, True),
        ("drain no-op, 4 workers vs honest ceiling (4)", ">= 0.8x", get("drain noop W=4", "vs_honest"), 0.8, True),
        ("PostgreSQL CPU per job vs honest ceiling", "<= 1.25x", get("drain noop", "pg_cpu_vs_honest"), 1.25, False),
        ("WAL per job vs honest ceiling", "<= 1.15x", get("drain noop", "wal_vs_honest"), 1.15, False),
        ("drain no-op, 4 workers vs 2", ">= 1x", four_vs_two(med), 1.0, True),
        ("drain no-op async vs ceiling", ">= 0.8x", get("drain noop async", "vs_ceiling"), 0.8, True),
        ("drain no-op, 4 workers vs ceiling (4)", ">= 0.8x", get("drain noop W=4", "vs_ceiling"), 0.8, True),
        ("transactional drain vs plain tx loop", ">= 0.6x", get("drain write", "vs_ceiling"), 0.6, True),
        ("worker CPU per no-op job (us)", "<= 15", get("drain noop", "worker_cpu_us_per_job"), 15.0, False),
        ("PostgreSQL CPU per no-op job (us)", "<= 35", get("drain noop", "pg_cpu_us_per_job"), 35.0, False),
        ("WAL per no-op job (B)", "<= 1,000", get("drain noop", "wal_bytes_per_job"), 1000.0, False),
        ("single enqueue vs INSERT+NOTIFY", ">= 0.9x", get("enqueue", "single_vs_plain"), 0.9, True),
        ("bulk enqueue vs COPY, a transaction per chunk", ">= 0.8x", get("enqueue", "bulk_vs_copy"), 0.8, True),
        ("bulk enqueue vs COPY, one transaction", ">= 0.8x", get("enqueue", "bulk_tx_vs_copy"), 0.8, True),
        ("latency p50 at 200/s, NOTIFY (ms)", "<= 1.5", get("latency NOTIFY", "p50_ms"), 1.5, False),
        ("latency p99 at 200/s, NOTIFY (ms)", "<= 5", get("latency NOTIFY", "p99_ms"), 5.0, False),
        ("latency p50 vs the honest plain loop", "<= 1.5x", get("latency NOTIFY", "p50_vs_honest"), 1.5, False),
        ("latency p99 vs the honest plain loop", "<= 2x", get("latency NOTIFY", "p99_vs_honest"), 2.0, False),
        ("latency p50 vs pgqueuer", "<= 1x", get("latency NOTIFY", "p50_vs_pgqueuer"), 1.0, False),
        ("latency p99 vs pgqueuer", "<= 1x", get("latency NOTIFY", "p99_vs_pgqueuer"), 1.0, False),
        *((f"{n[12:]} vs empty table", ">= 0.9x", get(n, "vs_empty_table"), 0.9, True) for n in tables),
        (
            "1,000,000 backlog vs 20,000",
            ">= 0.9x",
            get("drain noop, 1,000,000 backlog", "vs_empty_table"),
            0.9,
            True,
        ),
        ("50 queues vs one queue", ">= 0.8x", get(FLOW_CASES[2], "vs_plain"), 0.8, True),
        ("one queue of two busy vs one queue", ">= 0.8x", get(FLOW_CASES[3], "vs_plain"), 0.8, True),
        (f"worker peak RSS at C={big_c} (MB)", "<= 80", get(f"drain noop C={big_c}", "worker_rss_mb"), 80.0, False),
    ]
    out = []
    for name, goal, value, bound, at_least in rows:
        if value is None and any(w in name for w in ("backlog", "pgqueuer", "honest", "4 workers vs 2")):
            continue  # a case not run (--full only, the bench extra not installed)
        ok = None if value is None else (value >= bound if at_least else value <= bound)
        out.append({"target": name, "goal": goal, "value": value, "met": ok})
    return out


def four_vs_two(med: dict[str, dict[str, Any]]) -> float | None:
    """Throughput of 4 worker processes over 2 (medians of one run): 4 must not be slower on 2 cores."""
    two, four = med.get("drain noop", {}).get("jobs_per_s"), med.get("drain noop W=4", {}).get("jobs_per_s")
    return float(four) / float(two) if two and four else None


def fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return pattern.format(value)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)] if rows else []
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def figures(title: str, named: list[tuple[str, dict[str, Any]]], columns: tuple[tuple[str, str, str], ...]) -> str:
    """A table of named rows of figures: the columns any row has, each formatted by its pattern."""
    cols = [c for c in columns if any(m.get(c[0]) is not None for _, m in named)]
    rows = [[n] + [fmt(m.get(k), f) for k, _, f in cols] for n, m in named]
    return table([title] + [h for _, h, _ in cols], rows)


def render(med: dict[str, dict[str, Any]], tgt: list[dict[str, Any]]) -> str:
    parts = []
    drains = [(n, m) for n, m in med.items() if n.startswith("drain")]
    if drains:
        parts.append(figures("drain (median)", drains, DRAIN_COLUMNS))
    if "enqueue" in med:
        m = med["enqueue"]
        rows = [
            ["single (enqueue, 1 tx each)", fmt(m["single_jobs_per_s"], "{:,.0f}"), "1.0x"],
            [
                "bulk (enqueue_many), 1 call a chunk",
                fmt(m["bulk_jobs_per_s"], "{:,.0f}"),
                fmt(m["bulk_over_single"], "{:.1f}x"),
            ],
            [
                "bulk (enqueue_many), all in 1 call",
                fmt(m.get("bulk_tx_jobs_per_s"), "{:,.0f}"),
                fmt(m.get("bulk_tx_jobs_per_s", 0) / m["single_jobs_per_s"], "{:.1f}x"),
            ],
            [
                "plain INSERT + NOTIFY, 1 round trip (ceiling)",
                fmt(m.get("plain_single_jobs_per_s"), "{:,.0f}"),
                fmt(m.get("plain_single_jobs_per_s", 0) / m["single_jobs_per_s"], "{:.1f}x"),
            ],
            [
                "raw COPY + NOTIFY, 1 tx a chunk (ceiling)",
                fmt(m.get("copy_chunked_jobs_per_s"), "{:,.0f}"),
                fmt(m.get("copy_chunked_jobs_per_s", 0) / m["single_jobs_per_s"], "{:.1f}x"),
            ],
            [
                "raw COPY + NOTIFY, all in 1 tx (ceiling)",
                fmt(m["copy_jobs_per_s"], "{:,.0f}"),
                fmt(m["copy_jobs_per_s"] / m["single_jobs_per_s"], "{:.1f}x"),
            ],
        ]
        parts.append(table(["enqueue (median)", "jobs/s", "x single"], rows))
    lats = [
        (n + ("" if m.get("poll_seconds") is None else f" ({m['poll_seconds']:g} s)"), m)
        for n, m in med.items()
        if n.startswith("latency")
    ]
    if lats:
        parts.append(figures("latency (median)", lats, LATENCY_COLUMNS))
    flows_run = [(n, m) for n, m in med.items() if n.startswith("workflow")]
    if flows_run:
        keys = (("jobs_per_s", "{:,.0f}"), ("callback_p50_ms", "{:.1f}"), ("callback_p99_ms", "{:.1f}"))
        rows = [[n] + [fmt(m.get(k), f) for k, f in keys] for n, m in flows_run]
        parts.append(table(["workflow (median)", "jobs/s", "callback p50 ms", "callback p99 ms"], rows))
    if tgt:
        rows = [
            [
                t["target"],
                t["goal"],
                fmt(t["value"], "{:,.2f}"),
                {True: "met", False: "MISSED", None: "-"}[t["met"]],
            ]
            for t in tgt
        ]
        parts.append(table(["target", "goal", "median", ""], rows))
    return "\n\n".join(parts)


@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[Server]:
    if dsn:
        with external_server(dsn) as srv:
            yield srv
    else:
        with private_server() as srv:
            yield srv


def worker_source(ref: str) -> str:
    """A directory holding ``skiplock/``: ``ref`` itself (a scratch copy), or ``git archive <ref> worker``."""
    if (Path(ref) / "skiplock" / "__init__.py").is_file():
        return str(Path(ref).resolve())
    target = Path(tempfile.mkdtemp(prefix="bench-ref-"))
    EXPORTED.add(str(target))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    archive = subprocess.run(["git", "archive", ref, "worker"], cwd=meter.REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return str(target / "worker")


def use_ref(ref: str, argv: list[str]) -> None:
    """Re-run this script with the ref's worker/ first on PYTHONPATH (harness and workers alike)."""
    src = worker_source(ref)
    if str(Path(src).parent) in EXPORTED:  # our own export (never a scratch copy): the re-run removes it at exit
        os.environ["BENCH_REF_TMP"] = str(Path(src).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    os.environ["BENCH_REF"] = ref
    os.execv(sys.executable, [sys.executable, __file__, *argv])


def summarize(
    runs: dict[str, list[dict[str, Any]]], big_c: int
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    med = {name: medians(rs) for name, rs in runs.items()}
    add_ratios(med, runs)
    return med, targets(med, big_c)


def replay(path: Path) -> int:
    runs: dict[str, list[dict[str, Any]]] = {}
    big_c = 32
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "meta":
            big_c = record["settings"].get("big_concurrency", big_c)
        elif record["type"] == "run":
            runs.setdefault(record["case"], []).append(
                {k: v for k, v in record.items() if k not in ("type", "group", "case", "rep")}
            )
    print(render(*summarize(runs, big_c)))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.replay:
        return replay(a.replay)
    if Path(os.environ.get("BENCH_REF_TMP", "/nonexistent")).name.startswith("bench-ref-"):
        atexit.register(shutil.rmtree, os.environ["BENCH_REF_TMP"], ignore_errors=True)
    # SIGTERM unwinds like Ctrl-C, so workers, schemas and the private server are cleaned up
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if a.ref and os.environ.get("BENCH_REF") != a.ref:
        use_ref(a.ref, argv)
    size = dict(MODES[a.mode])
    if a.jobs:
        size["drain_jobs"] = a.jobs
    if a.prefill:
        size["prefill_rows"] = a.prefill
    started = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out_path = a.json_out or meter.BENCH / "results" / f"bench-{stamp}.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("")  # this run's lines only
    lines: list[dict[str, Any]] = []

    def emit(record: dict[str, Any]) -> None:
        lines.append(record)
        with out_path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    with database(a.dsn) as srv:
        cfg = scenario.Config(
            server=srv,
            workers=a.workers,
            concurrency=a.concurrency,
            batch=a.batch,
            poll_seconds=a.poll,
            drain_timeout=max(120.0, size["drain_jobs"] / 20),
            keep_schemas=a.keep_schemas,
            **size,
        )
        with scenario.connect(cfg) as conn:
            facts = meter.machine_facts(conn, srv.private)
        settings = {k: v for k, v in asdict(cfg).items() if k not in ("server", "schemas", "keep_schemas")}
        settings.update(mode=a.mode, repeat=a.repeat, big_concurrency=a.big_concurrency, baseline=not a.no_baseline)
        settings.update(compare=a.compare, compare_label=a.compare_label if a.compare else None)
        emit({"type": "meta", "settings": settings, "machine": facts})
        print(f"skiplock bench ({a.mode}): {json.dumps(settings)}", file=sys.stderr)
        cases, setup = build_cases(cfg, a)
        runs: dict[str, list[dict[str, Any]]] = {}
        try:
            t = time.monotonic()
            setup()
            if cfg.schemas:
                print(f"  prefilled {cfg.prefill_rows:,} rows in {time.monotonic() - t:.1f}s", file=sys.stderr)
            for rep in range(a.repeat):
                for group, name, fn in in_turn(cases, rep, f" [{a.compare_label}]" if a.compare else None):
                    t = time.monotonic()
                    result = fn()
                    runs.setdefault(name, []).append(result)
                    emit({"type": "run", "group": group, "case": name, "rep": rep + 1, **result})
                    brief = result.get("jobs_per_s", result.get("p50_ms", result.get("bulk_jobs_per_s")))
                    took = time.monotonic() - t
                    print(f"  [{rep + 1}/{a.repeat}] {name}: {brief:,.1f} ({took:.1f}s)", file=sys.stderr)
        finally:
            scenario.drop_schemas(cfg)
    med, tgt = summarize(runs, a.big_concurrency)
    for name, m in med.items():
        emit({"type": "median", "case": name, **m})
    for row in tgt:
        emit({"type": "target", **row})
    emit({"type": "end", "seconds": time.monotonic() - started, "load_average_at_end": list(os.getloadavg())})
    print(render(med, tgt))
    print()
    for record in lines:
        print(json.dumps(record, default=str))
    print(f"\n{len(lines)} JSON lines also in {out_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
