"""Soak benchmark: hours of steady load on one queue, ``make bench-soak`` (``SOAK_ARGS="--minutes 60"``) or
``.venv/bin/python bench/soak.py --minutes 30``. Not a test: it prints figures and a verdict, and never fails on them.

1. A private PostgreSQL (pgserver's binaries, stock settings: autovacuum on) on 127.0.0.1, or ``--dsn``.
2. Workers (``skiplock worker`` processes, retention on with a short retention so purges run all the time) drain
   a prefilled backlog: their drain capacity in jobs/s.
3. A producer enqueues at ``--load`` (default 70 %) of that capacity, or at a fixed ``--rate`` in jobs/s (so runs
   before and after a change compare at the same load), for ``--minutes``, in batches every 100 ms:
   1 job in 20 delayed by 1-30 s, 1 in 33 failing its first attempt (retried after a short backoff), 1 in 200
   failing both of its two attempts (kept as failed, then purged).
4. Every ``--sample`` seconds (10): jobs started and enqueued per second, the pick-up time (from a job becoming
   visible to its handler's start) p50/p99, the backlog, the jobs table's and its indexes' sizes, live and dead
   tuples, (auto)vacuum and analyze runs, and WAL bytes per second.

JSON lines (settings, machine, capacity, every sample, the summary) go to ``bench/results/soak-<time>.jsonl`` and a
plot to ``soak-<time>.png`` next to it (matplotlib, in the ``bench`` extra). The summary compares the last
``--window`` minutes with the first (throughput and p99 within 10 %) and the table and index sizes after the first
retention cycle (retain_done + purge interval) with the end (bounded: less than 10 % growth).

The workers load this module by name (``PYTHONPATH=bench``, handler ``soak:handle``): it imports nothing heavy at
module level.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from skiplock import Job

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
QUEUE = "soak"
STARTS_ENV = "SOAK_STARTS_DIR"
DELAYED_EVERY, RETRIED_EVERY, DOOMED_EVERY = 20, 33, 200


# ---------------------------------------------------------------------------------------------- the handler
_fd: dict[int, int] = {}


def handle(job: Job) -> None:
    """Record ``start_time wait_ms`` (wait: from the job becoming visible to now), then fail where told to."""
    started = time.time()
    pid = os.getpid()
    if pid not in _fd:
        path = os.path.join(os.environ[STARTS_ENV], f"starts-{pid}.txt")
        _fd[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    visible = job.visible_at.timestamp() if job.visible_at is not None else started
    os.write(_fd[pid], f"{started:.6f} {(started - visible) * 1000:.3f}\n".encode())
    flag = job.payload.get("f") if isinstance(job.payload, dict) else None
    if flag == "doomed" or (flag == "retry" and job.attempts < 2):
        raise RuntimeError(f"soak: {flag} attempt {job.attempts}")


# ---------------------------------------------------------------------------------------------- configuration
@dataclass
class Config:
    minutes: float
    load: float
    rate: float | None
    naptime_seconds: float | None
    jobs_options: list[str]
    workers: int
    concurrency: int
    capacity_jobs: int
    sample_seconds: float
    window_minutes: float
    retain_done_seconds: float
    retain_failed_seconds: float
    purge_interval_seconds: float
    schema: str = "soak"
    dsn: str = ""
    out: Path = field(default_factory=Path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="length of the steady load (default 30)")
    p.add_argument("--load", type=float, default=0.7, help="fraction of the measured drain capacity (default 0.7)")
    p.add_argument(
        "--rate",
        type=float,
        help="enqueue this many jobs/s, whatever the capacity (before/after runs at the same load); overrides --load",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=int, default=10, help="slots of each worker (default 10)")
    p.add_argument("--capacity-jobs", type=int, default=20_000, help="backlog drained to measure capacity")
    p.add_argument("--sample", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument(
        "--window", type=float, default=5.0, help="minutes compared, first against last (default 5; at most 1/3 run)"
    )
    p.add_argument("--retain-done", type=float, default=60.0, help="retention of done jobs, seconds (default 60)")
    p.add_argument("--retain-failed", type=float, default=120.0, help="retention of failed jobs (default 120)")
    p.add_argument("--purge-interval", type=float, default=30.0, help="seconds between purges (default 30)")
    p.add_argument(
        "--naptime",
        type=float,
        help="set the private server's autovacuum_naptime to this many seconds (server-wide; default: stock 60)",
    )
    p.add_argument(
        "--jobs-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a storage parameter of the jobs table set after the migrations (to compare settings; repeatable),\n"
        "e.g. autovacuum_vacuum_cost_delay=2",
    )
    p.add_argument("--dsn", default=os.environ.get("SKIPLOCK_BENCH_DSN"), help="use this server, not a private one")
    p.add_argument("--replot", type=Path, help="draw the plot of an existing soak-*.jsonl and exit")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- the database
TABLE_STATS = """
SELECT pg_relation_size(c.oid) AS table_bytes,
       pg_indexes_size(c.oid) AS index_bytes,
       pg_total_relation_size(c.oid) AS total_bytes,
       s.n_live_tup AS live, s.n_dead_tup AS dead,
       s.autovacuum_count AS autovacuums, s.vacuum_count AS vacuums, s.autoanalyze_count AS autoanalyzes,
       s.n_tup_ins AS inserted, s.n_tup_upd AS updated, s.n_tup_hot_upd AS hot_updated, s.n_tup_del AS deleted,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS wal_bytes,
       (SELECT json_object_agg(i.indexrelid::regclass::text, pg_relation_size(i.indexrelid))
        FROM pg_index AS i WHERE i.indrelid = c.oid) AS indexes
FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = %(table)s::regclass
"""


AUTOVACUUM = """
SELECT json_build_object('naptime', current_setting('autovacuum_naptime'),
                         'cost_delay', current_setting('autovacuum_vacuum_cost_delay'),
                         'cost_limit', current_setting('autovacuum_vacuum_cost_limit'),
                         'jobs_reloptions', (SELECT reloptions FROM pg_class WHERE oid = %(table)s::regclass))
"""


def table_stats(conn: Any, schema: str) -> dict[str, Any]:
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        out: dict[str, Any] = cur.execute(TABLE_STATS, {"table": f'"{schema}".jobs'}).fetchone()
    out["indexes"] = {k.split(".", 1)[-1]: v for k, v in (out["indexes"] or {}).items()}
    return out


# ---------------------------------------------------------------------------------------------- workers
def start_workers(cfg: Config, starts: Path, logdir: Path) -> list[Any]:
    import scenario

    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p)
    env.update(
        {
            "SKIPLOCK_DSN": cfg.dsn,
            "SKIPLOCK_SCHEMA": cfg.schema,
            "SKIPLOCK_QUEUE": QUEUE,
            "SKIPLOCK_HANDLER": "soak:handle",
            "SKIPLOCK_CONCURRENCY": str(cfg.concurrency),
            "SKIPLOCK_BACKOFF_BASE_SECONDS": "1",
            "SKIPLOCK_BACKOFF_CAP_SECONDS": "5",
            "SKIPLOCK_RETAIN_DONE_SECONDS": str(cfg.retain_done_seconds),
            "SKIPLOCK_RETAIN_FAILED_SECONDS": str(cfg.retain_failed_seconds),
            "SKIPLOCK_RETAIN_CANCELLED_SECONDS": str(cfg.retain_done_seconds),
            "SKIPLOCK_PURGE_INTERVAL_SECONDS": str(cfg.purge_interval_seconds),
            "SKIPLOCK_LOG_LEVEL": "INFO",
            STARTS_ENV: str(starts),
        }
    )
    procs = []
    for i in range(cfg.workers):
        log = logdir / f"worker-{i}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "skiplock", "worker"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        procs.append(scenario.Proc(popen, log, "listener connected"))
    return procs


class Starts:
    """Reads the handlers' ``start wait_ms`` lines as they are appended (from where the last read stopped)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[tuple[float, float]]:
        out = []
        for path in sorted(self.folder.glob("starts-*.txt")):
            with path.open("rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written stays for the next read
            self._offsets[path] = self._offsets.get(path, 0) + len(whole)
            for line in whole.decode().splitlines():
                started, wait = line.split()
                out.append((float(started), float(wait)))
        return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# ---------------------------------------------------------------------------------------------- phases
def measure_capacity(cfg: Config, q: Any, starts: Starts) -> dict[str, Any]:
    """A warm-up drain, then ``capacity_jobs`` plain jobs drained by the (already running) workers: jobs/s from the
    first handler start to the moment none is left ready or processing (every one finished)."""

    def drain(n: int) -> tuple[float, list[float]]:
        q.enqueue_many(QUEUE, [{"n": i} for i in range(n)])
        waits: list[float] = []
        first: float | None = None
        deadline = time.monotonic() + 600
        while True:
            time.sleep(0.05)
            seen = starts.read()
            waits += [w for _, w in seen]
            if first is None and seen:
                first = min(s for s, _ in seen)
            row = {s.queue: s for s in q.stats(QUEUE)}.get(QUEUE)
            if row is None or row.ready + row.processing + row.delayed == 0:
                return time.time() - (first if first is not None else time.time()), waits
            if time.monotonic() > deadline:
                raise RuntimeError(f"capacity drain: {n} jobs not drained in 10 minutes")

    drain(max(1000, cfg.capacity_jobs // 10))  # connections, plans and caches warm
    seconds, waits = drain(cfg.capacity_jobs)
    return {
        "jobs": cfg.capacity_jobs,
        "seconds": seconds,
        "jobs_per_s": cfg.capacity_jobs / max(seconds, 1e-6),
        "p99_wait_ms": percentile(waits, 99),
    }


class Producer(threading.Thread):
    """Enqueues ``rate`` jobs/s in batches every 100 ms until stopped (the mix in the module's docstring)."""

    def __init__(self, q: Any, rate: float) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.q, self.rate = q, rate
        self.produced = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self._rng = random.Random(7)

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            while not self.stopping.wait(0.1):
                due = min(int(self.rate * (time.monotonic() - t0)) - self.produced, max(1, int(self.rate)))
                if due > 0:
                    self._enqueue(range(self.produced, self.produced + due))
                    self.produced += due
        except BaseException as exc:  # reported by the sampler, which stops the run
            self.error = exc

    def _enqueue(self, numbers: range) -> None:
        plain, delayed, retried, doomed = [], [], [], []
        for i in numbers:
            if i % DOOMED_EVERY == 7:
                doomed.append({"n": i, "f": "doomed"})
            elif i % RETRIED_EVERY == 1:
                retried.append({"n": i, "f": "retry"})
            elif i % DELAYED_EVERY == 3:
                delayed.append({"n": i})
            else:
                plain.append({"n": i})
        for payloads, options in (
            (plain, {}),
            (retried, {}),
            (delayed, {"delay": self._rng.uniform(1, 30)}),
            (doomed, {"max_attempts": 2}),
        ):
            if payloads:
                self.q.enqueue_many(QUEUE, payloads, **options)


def sample(
    cfg: Config, mon: Any, q: Any, starts: Starts, producer: Producer, prev: dict[str, Any], t0: float
) -> dict[str, Any]:
    now = time.monotonic()
    seen = starts.read()
    waits = [w for _, w in seen]
    stats = {s.queue: s for s in q.stats(QUEUE)}.get(QUEUE)
    t = table_stats(mon, cfg.schema)
    dt = now - prev["at"]
    row: dict[str, Any] = {
        "kind": "sample",
        "t_s": round(now - t0, 1),
        "started_per_s": len(seen) / dt,
        "enqueued_per_s": (producer.produced - prev["produced"]) / dt,
        "pickup_p50_ms": percentile(waits, 50),
        "pickup_p99_ms": percentile(waits, 99),
        "ready": stats.ready if stats else 0,
        "delayed": stats.delayed if stats else 0,
        "processing": stats.processing if stats else 0,
        "failed": stats.failed if stats else 0,
        **{k: t[k] for k in ("table_bytes", "index_bytes", "total_bytes", "live", "dead", "indexes")},
        "autovacuums": t["autovacuums"],
        "autoanalyzes": t["autoanalyzes"],
        "vacuums": t["vacuums"],
        "deleted_per_s": (t["deleted"] - prev["deleted"]) / dt,
        "hot_update_ratio": (t["hot_updated"] - prev["hot_updated"]) / max(1, t["updated"] - prev["updated"]),
        "wal_bytes_per_s": (t["wal_bytes"] - prev["wal_bytes"]) / dt,
        "load_average": round(os.getloadavg()[0], 2),
    }
    prev.update(at=now, produced=producer.produced, **{k: t[k] for k in ("deleted", "hot_updated", "updated")})
    prev["wal_bytes"] = t["wal_bytes"]
    return row


# ---------------------------------------------------------------------------------------------- the verdict
def median(values: list[float]) -> float | None:
    clean = sorted(v for v in values if v is not None)
    if not clean:
        return None
    mid = len(clean) // 2
    return clean[mid] if len(clean) % 2 else (clean[mid - 1] + clean[mid]) / 2


def summarize(cfg: Config, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """First window against last window (throughput and p99 within 10 %); sizes after the first retention cycle
    against the end (bounded: under 10 % growth)."""
    window = min(cfg.window_minutes * 60, cfg.minutes * 60 / 3)
    end = samples[-1]["t_s"] if samples else 0.0
    first = [s for s in samples if s["t_s"] <= window]
    last = [s for s in samples if s["t_s"] > end - window]
    cycle = cfg.retain_done_seconds + cfg.purge_interval_seconds + cfg.sample_seconds
    after_cycle = [s for s in samples if cycle <= s["t_s"] <= cycle + max(window, 2 * cfg.purge_interval_seconds)]

    def ratio(key: str, rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], agg: Any = median) -> Any:
        a, b = agg([r[key] for r in rows_a]), agg([r[key] for r in rows_b])
        return None if a in (None, 0) or b is None else b / a

    def peak(values: list[float]) -> float | None:
        clean = [v for v in values if v is not None]
        return max(clean) if clean else None

    out: dict[str, Any] = {
        "kind": "summary",
        "window_s": window,
        "first_retention_cycle_s": cycle,
        "throughput_first": median([s["started_per_s"] for s in first]),
        "throughput_last": median([s["started_per_s"] for s in last]),
        "throughput_ratio": ratio("started_per_s", first, last),
        "p99_first_ms": median([s["pickup_p99_ms"] for s in first]),
        "p99_last_ms": median([s["pickup_p99_ms"] for s in last]),
        "p99_ratio": ratio("pickup_p99_ms", first, last),
        "ready_last": median([s["ready"] for s in last]),
    }
    for key in ("table_bytes", "index_bytes", "total_bytes", "dead"):
        out[f"{key}_after_first_cycle"] = peak([s[key] for s in after_cycle])
        out[f"{key}_end"] = peak([s[key] for s in last])
        out[f"{key}_growth"] = ratio(key, after_cycle, last, peak) if after_cycle else None
    out["autovacuums"] = samples[-1]["autovacuums"] - samples[0]["autovacuums"] if samples else 0
    out["flat_throughput"] = out["throughput_ratio"] is not None and abs(out["throughput_ratio"] - 1) <= 0.10
    out["flat_p99"] = out["p99_ratio"] is not None and out["p99_ratio"] <= 1.10
    out["bounded"] = all(
        out[f"{k}_growth"] is not None and out[f"{k}_growth"] <= 1.10 for k in ("table_bytes", "index_bytes")
    )
    return out


def render(summary: dict[str, Any], capacity: dict[str, Any], rate: float) -> str:
    def f(x: Any, pattern: str = "{:.1f}") -> str:
        return "-" if x is None else pattern.format(x)

    mb = "{:.1f} MB"
    lines = [
        f"capacity {f(capacity['jobs_per_s'])} jobs/s; load {f(rate)} jobs/s",
        f"{'':28} {'first':>12} {'last':>12} {'ratio':>8}",
        f"{'started jobs/s':28} {f(summary['throughput_first']):>12} {f(summary['throughput_last']):>12} "
        f"{f(summary['throughput_ratio'], '{:.2f}'):>8}",
        f"{'pick-up p99 ms':28} {f(summary['p99_first_ms']):>12} {f(summary['p99_last_ms']):>12} "
        f"{f(summary['p99_ratio'], '{:.2f}'):>8}",
    ]
    for key, label in (("table_bytes", "table"), ("index_bytes", "indexes"), ("total_bytes", "total")):
        a, b = summary[f"{key}_after_first_cycle"], summary[f"{key}_end"]
        lines.append(
            f"{label + ' (after 1st purge cycle)':28} {f(a and a / 2**20, mb):>12} {f(b and b / 2**20, mb):>12} "
            f"{f(summary[f'{key}_growth'], '{:.2f}'):>8}"
        )
    lines.append(f"autovacuums of the jobs table: {summary['autovacuums']}")
    lines.append(
        "verdict: throughput "
        + ("flat" if summary["flat_throughput"] else "NOT flat")
        + ", p99 "
        + ("flat" if summary["flat_p99"] else "NOT flat")
        + ", table and indexes "
        + ("bounded" if summary["bounded"] else "NOT bounded")
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the plot
def plot(jsonl: Path, png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return False
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    samples = [r for r in rows if r.get("kind") == "sample"]
    head = next((r for r in rows if r.get("kind") == "settings"), {})
    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 2, figsize=(13, 11), sharex=True)
    series: list[tuple[Any, str, list[tuple[str, str, float]]]] = [
        (axes[0][0], "jobs/s", [("started_per_s", "started", 1), ("enqueued_per_s", "enqueued", 1)]),
        (axes[0][1], "pick-up ms", [("pickup_p50_ms", "p50", 1), ("pickup_p99_ms", "p99", 1)]),
        (axes[1][0], "MB", [("table_bytes", "jobs table", 2**20), ("index_bytes", "its indexes", 2**20)]),
        (axes[1][1], "tuples", [("live", "live", 1), ("dead", "dead", 1)]),
        (axes[2][0], "runs (cumulative)", [("autovacuums", "autovacuum", 1), ("autoanalyzes", "autoanalyze", 1)]),
        (axes[2][1], "WAL MB/s", [("wal_bytes_per_s", "WAL", 2**20)]),
    ]
    for ax, unit, keys in series:
        for key, label, scale in keys:
            ax.plot(t, [None if s[key] is None else s[key] / scale for s in samples], label=label)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    for ax in axes[2]:
        ax.set_xlabel("minutes")
    cycle = head.get("retain_done_seconds", 0) + head.get("purge_interval_seconds", 0)
    for ax in axes.flat:
        ax.axvline(cycle / 60, color="grey", linestyle=":", linewidth=1)
    fig.suptitle(
        f"skiplock soak: {head.get('minutes')} min at {head.get('rate_per_s', 0):.0f} jobs/s "
        + ("(fixed rate)" if head.get("rate") is not None else f"({head.get('load', 0):.0%} of capacity)")
        + f", retention {head.get('retain_done_seconds')} s "
        f"(dotted: first purge cycle), {head.get('machine', {}).get('git_commit', '')}"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------- main
@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[Any]:
    from server import external_server, private_server

    with external_server(dsn) if dsn else private_server() as server:
        yield server


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.rate is not None and a.rate <= 0:
        raise SystemExit("--rate: jobs/s must be more than 0")
    if a.naptime is not None and (a.dsn or a.naptime < 1):
        raise SystemExit("--naptime: at least 1 s, and only on the private server (not --dsn: it is server-wide)")
    if a.replot:
        return 0 if plot(a.replot, a.replot.with_suffix(".png")) else 1
    sys.path.insert(0, str(BENCH))
    import meter
    import psycopg
    import scenario
    from psycopg import sql
    from psycopg_pool import ConnectionPool

    from skiplock import Queue, Settings
    from skiplock.migrate import migrate

    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"soak-{stamp}.jsonl"
    with database(a.dsn) as server:
        cfg = Config(
            minutes=a.minutes,
            load=a.load,
            rate=a.rate,
            naptime_seconds=a.naptime,
            jobs_options=a.jobs_option,
            workers=a.workers,
            concurrency=a.concurrency,
            capacity_jobs=a.capacity_jobs,
            sample_seconds=a.sample,
            window_minutes=a.window,
            retain_done_seconds=a.retain_done,
            retain_failed_seconds=a.retain_failed,
            purge_interval_seconds=a.purge_interval,
            schema=f"soak_{stamp.lower()}",
            dsn=server.dsn,
            out=out,
        )
        logdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
        (logdir / "starts").mkdir()
        starts = Starts(logdir / "starts")
        with psycopg.connect(cfg.dsn, autocommit=True) as mon, out.open("w") as sink:
            if cfg.naptime_seconds is not None:
                mon.execute(sql.SQL("ALTER SYSTEM SET autovacuum_naptime = {}").format(f"{cfg.naptime_seconds:g}s"))
                mon.execute("SELECT pg_reload_conf()")
            migrate(mon, cfg.schema)
            for option in cfg.jobs_options:
                name, _, value = option.partition("=")
                mon.execute(
                    sql.SQL("ALTER TABLE {}.jobs SET ({} = {})").format(
                        sql.Identifier(cfg.schema), sql.Identifier(name.strip()), sql.Literal(value.strip())
                    )
                )

            def emit(row: dict[str, Any]) -> None:
                sink.write(json.dumps(row, default=str) + "\n")
                sink.flush()

            settings_row = {k: v for k, v in asdict(cfg).items() if k not in ("dsn", "out")}
            pool: ConnectionPool[Any] = ConnectionPool(cfg.dsn, min_size=1, max_size=2, open=True)
            q = Queue(pool=pool, settings=Settings.load(env={}, dsn=cfg.dsn, schema=cfg.schema))
            procs = start_workers(cfg, logdir / "starts", logdir)
            try:
                scenario.wait_ready(procs)
                capacity = measure_capacity(cfg, q, starts)
                rate = cfg.rate if cfg.rate is not None else capacity["jobs_per_s"] * cfg.load
                settings_row["autovacuum"] = mon.execute(AUTOVACUUM, {"table": f'"{cfg.schema}".jobs'}).fetchone()
                emit({"kind": "settings", **settings_row, "rate_per_s": rate,
                      "machine": meter.machine_facts(mon, server.private)})  # fmt: skip
                emit({"kind": "capacity", **capacity})
                print(f"capacity {capacity['jobs_per_s']:.0f} jobs/s; soaking at {rate:.0f} jobs/s "
                      f"for {cfg.minutes:g} min -> {out}", flush=True)  # fmt: skip
                producer = Producer(q, rate)
                t0 = time.monotonic()
                t = table_stats(mon, cfg.schema)
                prev = {"at": t0, "produced": 0, **{k: t[k] for k in ("deleted", "hot_updated", "updated")}}
                prev["wal_bytes"] = t["wal_bytes"]
                producer.start()
                samples = []
                end = t0 + cfg.minutes * 60
                while time.monotonic() < end:
                    time.sleep(max(0.0, min(cfg.sample_seconds, end - time.monotonic())))
                    if producer.error is not None:
                        raise RuntimeError("the producer failed") from producer.error
                    for p in procs:
                        if p.popen.poll() is not None:
                            raise RuntimeError(f"a worker exited with {p.popen.returncode}:\n{p.output()[-3000:]}")
                    row = sample(cfg, mon, q, starts, producer, prev, t0)
                    samples.append(row)
                    emit(row)
                    print(
                        f"{row['t_s'] / 60:5.1f} min  {row['enqueued_per_s']:6.0f} in "
                        f"{row['started_per_s']:6.0f} out/s  p99 "
                        f"{row['pickup_p99_ms'] or 0:7.1f} ms  ready {row['ready']:6d}  table "
                        f"{row['table_bytes'] / 2**20:6.1f} MB  indexes {row['index_bytes'] / 2**20:6.1f} MB  "
                        f"dead {row['dead']:7d}  autovacuums {row['autovacuums']}",
                        flush=True,
                    )
                producer.stopping.set()
                producer.join(timeout=30)
            finally:
                scenario.stop(procs)
                pool.close()
            summary = summarize(cfg, samples)
            emit(summary)
            mon.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(cfg.schema)))
    print(render(summary, capacity, rate))
    png = out.with_suffix(".png")
    if plot(out, png):
        print(f"plot: {png}")
    print(f"json lines: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
