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
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import callgrind
import run
import scenario


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
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [*callgrind.command(log.parent / "cg.out"), sys.executable, "-m", "skiplock", "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc = scenario.Proc(worker, log, "listener connected")
    try:
        scenario.wait_ready([proc], timeout=600)
        callgrind.counting(worker.pid, True)
        with scenario.queue_for(cfg, schema) as q, scenario.connect(cfg, autocommit=False) as conn:
            for start in range(0, jobs, scenario.ENQUEUE_CHUNK):
                scenario.enqueue_chunk(q, conn, range(start, min(jobs, start + scenario.ENQUEUE_CHUNK)), flow)
            conn.commit()
        with scenario.connect(cfg) as mon:
            scenario.wait_drained(mon, schema, timeout=3600, queues=scenario.drain_queues(flow))
        callgrind.counting(worker.pid, False)
    finally:
        scenario.stop([proc])
        worker.wait(timeout=120)
    found = callgrind.collected(proc.output())
    claims = scenario.stopped_count(proc, "claims")
    if claims:
        print(f"  claims: {claims} ({jobs / claims:.0f} jobs a claim)", file=sys.stderr)
    if keep is not None:
        for out in log.parent.glob("cg.out*"):
            shutil.copy(out, keep)
    shutil.rmtree(log.parent, ignore_errors=True)
    if found is None:
        raise scenario.BenchError("valgrind reported no instruction count:\n" + proc.output()[-2000:])
    return found


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
    if not callgrind.installed():
        print(callgrind.MISSING, file=sys.stderr)
        return 2

    def keep(name: str) -> Path | None:  # the next file of this variant's runs in --keep-callgrind
        if a.keep_callgrind is None:
            return None
        a.keep_callgrind.mkdir(parents=True, exist_ok=True)
        stem = name.replace("/", "_")
        return a.keep_callgrind / f"{stem}-{len(list(a.keep_callgrind.glob(f'{stem}-*.out'))) + 1}.out"

    with run.database(a.dsn) as srv:
        size = dict(run.MODES["default"], drain_jobs=a.jobs)
        cfg = scenario.Config(
            server=srv, workers=1, concurrency=10, batch=None, poll_seconds=2.0, drain_timeout=3600.0, **size
        )
        try:
            per_job = callgrind.alternate(
                callgrind.variants(a.ref),
                a.repeat,
                lambda name, src: count(cfg, a.jobs, src, a.queues, a.handler, keep(name)) / a.jobs,
                jobs=a.jobs,
            )
        finally:
            scenario.drop_schemas(cfg)
    shape = "50 queues" if a.queues else "one queue"
    kind = "async no-op" if a.handler == "anoop" else "no-op"
    callgrind.report(f"worker (one, C=10, {kind}, {shape})", per_job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
