"""Counters the benchmark reads around each run: PostgreSQL commits and WAL, process CPU and memory, percentiles."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


@dataclass(frozen=True)
class DbCounters:
    commits: int
    wal_bytes: int
    next_xid: int  # write transactions started since = the delta (reading it assigns none)


def db_counters(conn: psycopg.Connection[Any]) -> DbCounters:
    """``xact_commit`` of this database (every transaction, read-only ones too), the WAL insert position and the
    next transaction id (only writing transactions take one).

    Two statements, two commits of ours: the first makes this connection flush its pending statistics (since
    PostgreSQL 15 a backend flushes them at most once a second, so the harness's own recent polls could be missing
    from the figure while being subtracted as ours); the reading statement's commit falls after the reading. So a
    later reading counts one more of ours for each reading before it, plus its own flush."""
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT pg_stat_clear_snapshot() IS NULL, "
        "(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), "
        "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint, "
        "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    ).fetchone()
    assert row is not None
    return DbCounters(int(row[1]), int(row[2]), int(row[3]))


def server_cpu_seconds(postmaster_pid: int | None) -> float | None:
    """CPU seconds of the postmaster, its live children and its reaped children (None when /proc is unreadable)."""
    if postmaster_pid is None:
        return None
    try:
        pm = psutil.Process(postmaster_pid)
        t = pm.cpu_times()
        total = float(t.user + t.system + t.children_user + t.children_system)
        for child in pm.children():
            try:
                c = child.cpu_times()
            except psutil.Error:
                continue  # exited meanwhile: counted in children_* once reaped
            total += c.user + c.system
    except psutil.Error:
        return None
    return total


def process_cpu_seconds(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process, in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    except psutil.Error:
        return math.nan


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    clean = sorted(v for v in values if v is not None and not math.isnan(v))
    if not clean:
        return math.nan
    mid = len(clean) // 2
    return clean[mid] if len(clean) % 2 else (clean[mid - 1] + clean[mid]) / 2


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts(conn: psycopg.Connection[Any], server_private: bool) -> dict[str, Any]:
    import skiplock

    settings = {}
    for name in ("shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_wal_size", "max_connections"):
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
        settings[name] = row[0] if row else None
    row = conn.execute("SELECT current_setting('server_version')").fetchone()
    commit = _git("rev-parse", "--short", "HEAD")
    # the working tree's edits matter only when it is what runs (no --ref)
    dirty = "BENCH_REF" not in os.environ and bool(_git("status", "--porcelain", "--", "worker"))
    return {
        "skiplock_source": str(Path(skiplock.__file__).parent),
        "skiplock_ref": os.environ.get("BENCH_REF", "working tree"),
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "libpq": psycopg.pq.version(),
        "skiplock": skiplock.__version__,
        "git_commit": commit + ("+dirty(worker/)" if dirty else ""),
        "postgres": row[0] if row else None,
        "postgres_server": "private (pgserver binaries, 127.0.0.1, no other clients)"
        if server_private
        else "external (shared counters may include other clients)",
        "postgres_settings": settings,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
