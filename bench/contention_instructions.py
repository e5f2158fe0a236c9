"""Instructions the server executes a job while W skiplock workers drain a backlog, counted by callgrind: 2 workers
against 4 without the noise of a shared machine.

    .venv/bin/python bench/contention_instructions.py [--jobs 5000] [--workers 2,4] [--repeat 1] [--src other/worker]

A throw-away cluster (pgserver's binaries) runs its postmaster under ``valgrind --tool=callgrind``; every process it
forks (backends, autovacuum, the background writers) is counted. For each drain: a fresh schema, W worker processes
at their defaults (``scenario.start_skiplock``) connected and idle; then every server process's counters are zeroed,
the jobs are committed in one transaction (one NOTIFY), and once they are all done each process dumps its counters.
Per job it prints the instructions of the workers' backends, of the producer and the harness's polling, and of the
rest (autovacuum, checkpointer, WAL writer), with the claims' counts read from the statistics (claims a job, jobs a
claim, claim index entries read a job). ``--src``: drain with another tree's worker/ too, interleaved (an A/B of a
claim change). Slow: the server runs some 50 times slower under valgrind.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import scenario
from server import Server, _free_port

TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.M)
INDEX = """
SELECT coalesce(sum(idx_scan), 0)::bigint, coalesce(sum(idx_tup_read), 0)::bigint
FROM pg_stat_user_indexes WHERE schemaname = %(s)s AND indexrelname = 'jobs_claim_idx'
"""


@contextlib.contextmanager
def callgrind_cluster(out: Path) -> Iterator[Server]:
    """A throw-away pgserver cluster whose postmaster runs under callgrind, each process writing ``out``/cg.<pid>."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pgserver: Any = importlib.import_module("pgserver")
        commands: Any = importlib.import_module("pgserver._commands")
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    srv: Any = pgserver.get_server(Path(tempfile.mkdtemp(prefix="bench-cg-")), cleanup_mode="delete")
    commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
    if srv.system_user is not None:
        shutil.chown(out, srv.system_user)
    port = _free_port()
    postgres = commands.POSTGRES_BIN_PATH / "postgres"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "--dump-instr=no"]
    command += [str(postgres), "-D", str(srv.pgdata), "-h", "127.0.0.1", "-p", str(port), "-k", str(srv.pgdata)]
    env = {**os.environ, "TMPDIR": str(out)}  # valgrind's temporary files, where the server's user may write
    log = (out / "postmaster.log").open("wb")
    postmaster = subprocess.Popen(command, user=srv.system_user, env=env, stdout=log, stderr=subprocess.STDOUT)
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                psycopg.connect(dsn, connect_timeout=5).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or postmaster.poll() is not None:
                    raise
                time.sleep(0.5)
        yield Server(dsn, True, postmaster.pid)
    finally:
        postmaster.send_signal(signal.SIGINT)  # fast shutdown
        with contextlib.suppress(subprocess.TimeoutExpired):
            postmaster.wait(timeout=120)
        if postmaster.poll() is None:
            postmaster.kill()
        log.close()
        srv.cleanup()


def totals(out: Path) -> dict[int, int]:
    """Instructions of each server process that has exited, by pid (callgrind writes its file at exit)."""
    found = {}
    for f in out.glob("cg.*"):
        m = TOTALS.search(f.read_text(errors="replace"))
        if m:
            found[int(f.name.split(".")[1])] = int(m.group(1))
    return found


def one_drain(cfg: scenario.Config, out: Path, workers: int, src: str | None, n: int) -> dict[str, Any]:
    """W workers start, drain ``n`` jobs (none: they only start and stop) and stop: the instructions of their
    backends, and of the other server processes that ended meanwhile (autovacuum, the producer's, the harness's)."""
    schema = scenario.new_schema(cfg, "drain", src)
    logdir = Path(tempfile.mkdtemp(prefix="bench-cg-drain-"))
    with scenario.connect(cfg) as conn:
        conn.execute("CHECKPOINT")
    before = totals(out)
    with scenario.connect(cfg) as mon:
        procs = scenario.start_skiplock(
            cfg, schema, "noop", logdir, concurrency=cfg.concurrency, src=src, workers=workers
        )
        with scenario.running(procs):
            scenario.wait_ready(procs, timeout=300)
            time.sleep(2.0)
            pids = scenario.worker_backends(mon)
            index0 = mon.execute(INDEX, {"s": schema}).fetchone()
            if n:
                with scenario.connect(cfg, autocommit=False) as conn, scenario.queue_for(cfg, schema) as q:
                    for start in range(0, n, scenario.ENQUEUE_CHUNK):
                        scenario.enqueue_chunk(q, conn, range(start, min(n, start + scenario.ENQUEUE_CHUNK)), None)
                    conn.commit()
                scenario.wait_drained(mon, schema, 3600)
            time.sleep(1.0)
            index1 = mon.execute(INDEX, {"s": schema}).fetchone()
            pids = sorted(set(pids) | set(scenario.worker_backends(mon)))  # and any the workers opened meanwhile
        scenario.wait_backends_gone(mon, pids, timeout=120)
    time.sleep(2.0)
    after = totals(out)
    shutil.rmtree(logdir, ignore_errors=True)
    scenario.drop_schemas(cfg, schema)
    assert index0 is not None and index1 is not None
    new = {pid: v for pid, v in after.items() if pid not in before}
    return {
        "workers_ir": sum(v for pid, v in new.items() if pid in pids),
        "other_ir": sum(v for pid, v in new.items() if pid not in pids),
        "claim_index_entries": index1[1] - index0[1],
    }


def measure(cfg: scenario.Config, out: Path, workers: int, src: str | None) -> dict[str, Any]:
    """A drain of ``cfg.drain_jobs`` less the same workers started and stopped with no job: a job's instructions in
    the workers' backends (claims and completions); the other processes' (autovacuum's, the producer's) as they are."""
    n = cfg.drain_jobs
    idle = one_drain(cfg, out, workers, src, 0)
    full = one_drain(cfg, out, workers, src, n)
    return {
        "workers": workers,
        "src": src or "this tree",
        "jobs": n,
        "instructions_per_job": (full["workers_ir"] - idle["workers_ir"]) / n,
        "idle_instructions": idle["workers_ir"],
        "other_instructions_per_job": full["other_ir"] / n,
        "claim_index_entries_per_job": full["claim_index_entries"] / n,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5_000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workers", default="2,4")
    p.add_argument("--src", action="append", default=[], help="another tree's worker/ (A/B); repeatable")
    p.add_argument("--no-this-tree", action="store_true", help="only the --src trees")
    a = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    srcs: list[str | None] = [*([None] if not a.no_this_tree else []), *[str(Path(s).resolve()) for s in a.src]]
    out = Path(tempfile.mkdtemp(prefix="bench-cg-out-"))
    runs = []
    with callgrind_cluster(out) as srv:
        cfg = scenario.drain_config(srv, a.jobs)
        try:
            for i in range(a.repeat):
                for src in srcs:
                    for w in (int(x) for x in a.workers.split(",")):
                        run = measure(cfg, out, w, src) | {"repeat": i}
                        runs.append(run)
                        print(json.dumps(run), flush=True)
        finally:
            scenario.drop_schemas(cfg)
    shutil.rmtree(out, ignore_errors=True)
    print("\n| tree | W | workers' backends: instructions a job | other processes | claim index entries a job |")
    print("|---|---:|---:|---:|---:|")
    for r in runs:
        src = Path(r["src"]).parent.name if r["src"].startswith("/") else r["src"]
        print(
            f"| {src} | {r['workers']} | {r['instructions_per_job']:,.0f} | {r['other_instructions_per_job']:,.0f} "
            f"| {r['claim_index_entries_per_job']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
