"""Instructions a worker executes per no-op job, counted by callgrind: a measure that holds on a noisy machine.

CPU seconds per job move by a third between runs on a shared 2-core VM; the instructions a worker executes for the
same drain move by a few per cent. One worker at the defaults runs under ``valgrind --tool=callgrind`` with
counting off until it is ready; then N jobs are committed at once and counted until the last one is done (the
drain is 50x slower under valgrind, so N defaults to 20,000). Threads run one at a time under valgrind, so this
counts work, not contention: compare variants with it, read throughput off ``run.py``.

    .venv/bin/python bench/instructions.py                      # the working tree's worker
    .venv/bin/python bench/instructions.py --ref 60b41ee        # and that commit's, alternated with it
    .venv/bin/python bench/instructions.py --queues             # the jobs spread over 50 queues
    .venv/bin/python bench/instructions.py --async              # an async no-op handler
    .venv/bin/python bench/instructions.py --keep-callgrind DIR  # and keep callgrind's files (callgrind_annotate)

Prints JSON lines (one per run, then the medians) and a table; needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run
import scenario

COLLECTED = re.compile(r"Collected : (\d+)")


def count(
    cfg: scenario.Config,
    jobs: int,
    src: str | None,
    flow: str | None = None,
    handler: str = "noop",
    keep: Path | None = None,
) -> int:
    """Instructions (callgrind's Ir) of one worker draining ``jobs`` no-op jobs (``flow="queues"``: spread over 50
    queues, all served by the worker; ``handler="anoop"``: an async no-op); ``keep``: where to copy callgrind's out
    file (for ``callgrind_annotate``)."""
    schema = scenario.new_schema(cfg, "instr")
    log = Path(tempfile.mkdtemp(prefix="bench-instr-")) / "worker.log"
    env = scenario._env(
        {
            "SKIPLOCK_DSN": cfg.dsn,
            "SKIPLOCK_SCHEMA": schema,
            "SKIPLOCK_QUEUES": ",".join(scenario.drain_queues(flow)),
            "SKIPLOCK_HANDLER": f"handlers:{handler}",
            "SKIPLOCK_LOG_LEVEL": "INFO",
        },
        src,
    )
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={log.parent}/cg.out"]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [*command, sys.executable, "-m", "skiplock", "worker"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    proc = scenario.Proc(worker, log, "listener connected")
    try:
        scenario.wait_ready([proc], timeout=600)
        subprocess.run(["callgrind_control", "-i", "on", str(worker.pid)], check=True, capture_output=True)
        with scenario.queue_for(cfg, schema) as q, scenario.connect(cfg, autocommit=False) as conn:
            for start in range(0, jobs, scenario.ENQUEUE_CHUNK):
                scenario.enqueue_chunk(q, conn, range(start, min(jobs, start + scenario.ENQUEUE_CHUNK)), flow)
            conn.commit()
        with scenario.connect(cfg) as mon:
            scenario.wait_drained(mon, schema, timeout=3600, queues=scenario.drain_queues(flow))
        subprocess.run(["callgrind_control", "-i", "off", str(worker.pid)], check=True, capture_output=True)
    finally:
        scenario.stop([proc])
        worker.wait(timeout=120)
    found = COLLECTED.findall(proc.output())
    claims = scenario.stopped_count(proc, "claims")
    if claims:
        print(f"  claims: {claims} ({jobs / claims:.0f} jobs a claim)", file=sys.stderr)
    if keep is not None:
        for out in log.parent.glob("cg.out*"):
            shutil.copy(out, keep)
    shutil.rmtree(log.parent, ignore_errors=True)
    if not found:
        raise scenario.BenchError("valgrind reported no instruction count:\n" + proc.output()[-2000:])
    return int(found[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="use this server, not a private one")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--repeat", type=int, default=2, help="runs per variant, alternated (default 2)")
    p.add_argument("--ref", help="also count this commit's worker/ (git ref, or a directory holding skiplock/)")
    p.add_argument("--queues", action="store_const", const="queues", help="spread the jobs over 50 queues")
    p.add_argument("--async", dest="handler", action="store_const", const="anoop", default="noop", help="async no-op")
    p.add_argument("--keep-callgrind", type=Path, metavar="DIR", help="keep each run's callgrind out file in DIR")
    a = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    variants: list[tuple[str, str | None]] = [("tree", None)]
    if a.ref:
        variants.append((a.ref, run.worker_source(a.ref)))
    per_job: dict[str, list[float]] = {name: [] for name, _ in variants}
    with run.database(a.dsn) as srv:
        size = dict(run.MODES["default"], drain_jobs=a.jobs)
        cfg = scenario.Config(
            server=srv, workers=1, concurrency=10, batch=None, poll_seconds=2.0, drain_timeout=3600.0, **size
        )
        try:
            for rep in range(a.repeat):
                for name, src in variants:
                    t = time.monotonic()
                    keep = None
                    if a.keep_callgrind is not None:
                        a.keep_callgrind.mkdir(parents=True, exist_ok=True)
                        keep = a.keep_callgrind / f"{name.replace('/', '_')}-{rep + 1}.out"
                    ir = count(cfg, a.jobs, src, a.queues, a.handler, keep)
                    per_job[name].append(ir / a.jobs)
                    record: dict[str, Any] = {"type": "run", "variant": name, "rep": rep + 1, "jobs": a.jobs}
                    print(json.dumps(record | {"instructions_per_job": round(ir / a.jobs)}), flush=True)
                    took = time.monotonic() - t
                    print(f"  [{rep + 1}/{a.repeat}] {name}: {ir / a.jobs:,.0f} ({took:.0f}s)", file=sys.stderr)
        finally:
            scenario.drop_schemas(cfg)
    for name, values in per_job.items():
        print(json.dumps({"type": "median", "variant": name, "instructions_per_job": round(statistics.median(values))}))
    shape = "50 queues" if a.queues else "one queue"
    kind = "async no-op" if a.handler == "anoop" else "no-op"
    print(f"\n| worker (one, C=10, {kind}, {shape}) | instructions/job (median) | runs |\n|---|---:|---|")
    for name, values in per_job.items():
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {name} | {statistics.median(values):,.0f} | {runs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
