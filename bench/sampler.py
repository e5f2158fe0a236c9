"""Profile skiplock workers while they drain, with py-spy (``pip install py-spy``).

    .venv/bin/python bench/sampler.py [--jobs 20000] [--handler noop] [--concurrency 10] [--dsn ...]

Two workers drain N jobs (as in ``run.py``); py-spy samples worker 0 on CPU only and worker 1 with idle frames
too (wall time: where a job waits), each with thread names. Writes the collapsed stacks (``*.txt``, feed them to
flamegraph.pl or speedscope) and prints the top functions by self and inclusive samples.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import meter
import scenario
from psycopg import sql
from run import database

# Where a sample goes: the first bucket whose marker is in its stack (most specific first).
BUCKETS = (
    ("claim + completions (AsyncQueue.complete_and_claim: one statement)", ("AsyncQueue.complete_and_claim",)),
    ("lone completion flush (Completer.flush)", ("Completer.flush", "AsyncQueue.complete")),
    ("heartbeat / recovery (Leases)", ("Leases.beat", "Leases.recover")),
    ("listener", ("Listener.run",)),
    ("handler thread: inbox, lazy job.conn, handler, fenced unit", ("ThreadExecutor._thread",)),
    (
        "results back on the loop (ThreadExecutor.collect, call_soon_threadsafe)",
        ("ThreadExecutor.collect", "call_soon_threadsafe"),
    ),
    ("async handler unit: lazy job.conn, handler", ("AsyncExecutor._runner",)),
    ("per-job bookkeeping: start, routing, metrics", ("Worker._start_jobs", "Worker._on_result", "Slots.")),
    ("pool maintenance", ("psycopg_pool",)),
    ("event loop: select / scheduling", ("EpollSelector.select", "BaseEventLoop._run_once")),
)


def bucket_of(frames: list[str]) -> str:
    text = ";".join(frames)
    for name, markers in BUCKETS:
        if any(m in text for m in markers):
            return name
    return "other"


def thread_of(frame: str) -> str:
    name = frame.split(": ", 1)[-1]
    return "skiplock-handler_*" if name.startswith("skiplock-handler") else name


def collapse(path: Path) -> tuple[int, collections.Counter[str], collections.Counter[str], collections.Counter[str]]:
    """Total samples, self samples per frame, inclusive samples per frame, samples per thread and per bucket."""
    total, own, incl, groups = 0, collections.Counter[str](), collections.Counter[str](), collections.Counter[str]()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        groups["thread " + thread_of(frames[0])] += n
        groups["bucket " + bucket_of(frames)] += n
        own[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames[1:]}:
            incl[frame] += n
        if any("_exec_command" in f for f in frames):
            groups["any BEGIN/COMMIT/ROLLBACK command (_exec_command)"] += n
    return total, own, incl, groups


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({where.rsplit('/', 1)[-1]})" if where else name


def report(label: str, path: Path, top: int) -> str:
    total, own, incl, groups = collapse(path)
    if not total:
        return f"{label}: no samples"
    lines = [f"== {label}: {total} samples ({path.name})"]
    lines += [f"{n / total:6.1%}  {g}" for g, n in sorted(groups.items(), key=lambda kv: (kv[0][:6], -kv[1]))]
    lines.append(f"-- top {top} by self samples")
    lines += [f"{n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    lines.append(f"-- top {top} by inclusive samples")
    lines += [f"{n / total:6.1%}  {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--handler", default="noop")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = a.out or meter.BENCH / "results" / f"profile-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    with database(a.dsn) as srv:
        cfg = scenario.drain_config(srv, a.jobs, concurrency=a.concurrency)
        schema = scenario.new_schema(cfg, "prof")
        logdir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
        procs = scenario.start_skiplock(cfg, schema, a.handler, logdir, concurrency=a.concurrency)
        try:
            with scenario.running(procs), scenario.connect(cfg) as mon, scenario.queue_for(cfg, schema) as q:
                scenario.wait_ready(procs)
                spies = []
                for proc, idle in zip(procs, (False, True), strict=True):
                    name = f"{a.handler}-c{a.concurrency}-{'wall' if idle else 'cpu'}.txt"
                    cmd = [spy, "record", "--pid", str(proc.popen.pid), "--rate", str(a.rate), "--format", "raw"]
                    cmd += ["--threads", "--nonblocking", "-o", str(out / name)] + (["--idle"] if idle else [])
                    spies.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out / name))
                time.sleep(1.0)  # py-spy attaches
                t = time.monotonic()
                with scenario.connect(cfg, autocommit=False) as conn:
                    for start in range(0, a.jobs, 5000):
                        q.enqueue_many(
                            scenario.QUEUE, [{"n": i} for i in range(start, min(a.jobs, start + 5000))], conn=conn
                        )
                    conn.commit()
                scenario.wait_drained(mon, schema, cfg.drain_timeout)
                seconds = time.monotonic() - t
                for spy_proc, _ in spies:
                    spy_proc.send_signal(signal.SIGINT)
                for spy_proc, _ in spies:
                    spy_proc.wait(timeout=60)
                done = mon.execute(
                    sql.SQL("SELECT count(*) FROM {}.jobs WHERE status = 'done'").format(sql.Identifier(schema))
                ).fetchone()
        finally:
            scenario.drop_schemas(cfg)
            shutil.rmtree(logdir, ignore_errors=True)
    print(f"drained {done and done[0]} jobs in {seconds:.1f}s ({a.jobs / seconds:,.0f} jobs/s incl. py-spy overhead)")
    for (spy_proc, path), label in zip(
        spies, ("worker 0, on-CPU", "worker 1, wall (idle frames included)"), strict=True
    ):
        if not path.exists():
            err = spy_proc.stderr.read().decode() if spy_proc.stderr else ""
            print(f"{label}: py-spy wrote nothing: {err[-500:]}")
            continue
        print(report(label, path, a.top))
    print(f"collapsed stacks in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
