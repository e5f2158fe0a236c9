"""Instructions a worker executes to pick up one job at a time, counted by callgrind: the CPU behind pick-up latency.

``run.py``'s latency case times pick-ups at 200 jobs/s, which on a shared 2-core machine moves with whatever else
runs. This counts the work instead: one worker process under ``valgrind --tool=callgrind`` (counting off until it
is ready), then ``--jobs`` single jobs, each enqueued (one INSERT and NOTIFY in autocommit) only after the last one
is done, so every job is a whole pick-up: a notification, a claim of one job, the handler, the completion. The
count covers the whole window, so what the worker does on timers meanwhile is in it (at the defaults, a poll every
2 s; ``--poll`` raises it). Threads run one at a time under valgrind: this counts work, not waiting.

    .venv/bin/python bench/pickup_instructions.py                       # the working tree's worker and the honest loop
    .venv/bin/python bench/pickup_instructions.py --ref c995b43         # and that commit's worker, alternated
    .venv/bin/python bench/pickup_instructions.py --keep-callgrind /tmp/cg   # keep callgrind's files

Prints JSON lines (one per run, then the medians) and a table; needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import callgrind
import run
import scenario
from psycopg import sql

HONEST = "honest"
DONE_TIMEOUT = 120.0  # seconds for one job under valgrind (about 50x slower than native)


def _start(cfg: scenario.Config, variant: str, src: str | None, schema: str, logdir: Path) -> scenario.Proc:
    """The worker (skiplock at its defaults, a no-op handler; or the honest loop) under callgrind, not counting."""
    log = logdir / "worker.log"
    if variant == HONEST:
        argv = [str(scenario.BENCH / "seed_baseline.py"), "--dsn", cfg.dsn, "--schema", schema]
        argv += ["--queue", scenario.QUEUE, "--handler", "noop", "--style", "honest"]
        env, ready = scenario._env({}), "ready"
    else:
        argv = ["-m", "skiplock", "worker"]
        settings = {
            "SKIPLOCK_DSN": cfg.dsn,
            "SKIPLOCK_SCHEMA": schema,
            "SKIPLOCK_QUEUE": scenario.QUEUE,
            "SKIPLOCK_HANDLER": "handlers:noop",
            "SKIPLOCK_POLL_SECONDS": str(cfg.poll_seconds),
            "SKIPLOCK_LOG_LEVEL": "INFO",
        }
        env, ready = scenario._env(settings, src), "listener connected"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [*callgrind.command(logdir / "cg.out"), sys.executable, *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return scenario.Proc(popen, log, ready)


@contextmanager
def _producer(cfg: scenario.Config, variant: str, schema: str) -> Iterator[Callable[[], int]]:
    if variant == HONEST:
        with scenario.connect(cfg) as conn:
            enqueue = scenario.plain_enqueue(conn, schema)
            yield lambda: enqueue({"t": time.time()})
        return
    with scenario.queue_for(cfg, schema) as q:
        yield lambda: q.enqueue(scenario.QUEUE, {"t": time.time()}).id


def count(cfg: scenario.Config, variant: str, src: str | None, jobs: int, keep: Path | None = None) -> int:
    """Instructions (callgrind's Ir) of one worker picking up ``jobs`` jobs one after another (``keep``: copy the
    callgrind file into that directory, for ``callgrind_annotate --inclusive=yes``)."""
    schema = scenario.new_honest_schema(cfg) if variant == HONEST else scenario.new_schema(cfg, "pickup", src)
    logdir = Path(tempfile.mkdtemp(prefix="bench-pickup-"))
    proc = _start(cfg, variant, src, schema, logdir)
    status = sql.SQL("SELECT status FROM {}.jobs WHERE id = %s").format(sql.Identifier(schema))
    try:
        scenario.wait_ready([proc], timeout=600)
        with _producer(cfg, variant, schema) as enqueue, scenario.connect(cfg) as mon:
            enqueue()  # the first pick-up (connections, plans) is not counted
            _wait_all_done(mon, schema)
            callgrind.counting(proc.popen.pid, True)
            for _ in range(jobs):
                job = enqueue()
                deadline = time.monotonic() + DONE_TIMEOUT
                while (row := mon.execute(status, (job,)).fetchone()) is None or row[0] != "done":
                    if time.monotonic() > deadline:
                        raise scenario.BenchError(f"job {job} not done in {DONE_TIMEOUT:.0f} s: {row}")
                    time.sleep(0.005)
            callgrind.counting(proc.popen.pid, False)
    finally:
        scenario.stop([proc])
        proc.popen.wait(timeout=120)
        scenario.drop_schemas(cfg, only=schema)
    found = callgrind.collected(proc.output())
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for out in logdir.glob("cg.out*"):
            shutil.copyfile(out, keep / f"callgrind.{variant.replace('/', '_')}.{out.name}")
    shutil.rmtree(logdir, ignore_errors=True)
    if found is None:
        raise scenario.BenchError("valgrind reported no instruction count:\n" + proc.output()[-2000:])
    return found


def _wait_all_done(mon: Any, schema: str) -> None:
    query = sql.SQL("SELECT count(*) FROM {}.jobs WHERE status <> 'done'").format(sql.Identifier(schema))
    deadline = time.monotonic() + DONE_TIMEOUT
    while mon.execute(query).fetchone()[0]:
        if time.monotonic() > deadline:
            raise scenario.BenchError("the warm-up job was not done in time")
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="use this server, not a private one")
    p.add_argument("--jobs", type=int, default=200, help="jobs picked up one after another (default 200)")
    p.add_argument("--repeat", type=int, default=2, help="runs per variant, alternated (default 2)")
    p.add_argument("--ref", help="also count this commit's worker/ (git ref, or a directory holding skiplock/)")
    p.add_argument("--poll", type=float, default=2.0, help="the worker's poll interval, s (default 2: the default)")
    p.add_argument("--no-honest", action="store_true", help="leave out the honest loop")
    p.add_argument("--keep-callgrind", type=Path, metavar="DIR", help="copy each run's callgrind files here")
    a = p.parse_args(argv)
    if not callgrind.installed():
        print(callgrind.MISSING, file=sys.stderr)
        return 2
    variants = callgrind.variants(a.ref) + ([] if a.no_honest else [(HONEST, None)])
    with run.database(a.dsn) as srv:
        cfg = scenario.Config(
            server=srv,
            workers=1,
            concurrency=10,
            batch=None,
            poll_seconds=a.poll,
            drain_timeout=3600.0,
            **run.MODES["default"],
        )
        try:
            per_job = callgrind.alternate(
                variants,
                a.repeat,
                lambda name, src: count(cfg, name, src, a.jobs, a.keep_callgrind) / a.jobs,
                jobs=a.jobs,
            )
        finally:
            scenario.drop_schemas(cfg)
    callgrind.report(f"worker (one process, a job at a time, poll {a.poll:g} s)", per_job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
