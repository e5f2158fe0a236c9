"""One run of each benchmark scenario: enqueue, drain (skiplock or the seed baseline), latency, table size.

Every function runs once and returns a flat dict of figures; ``run.py`` repeats, interleaves and takes medians.
Workers are real processes: ``python -m skiplock worker`` configured by ``SKIPLOCK_*`` (as the chart runs them),
or ``bench/seed_baseline.py`` for the seed's loop.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from meter import (
    BENCH,
    DbCounters,
    db_counters,
    peak_rss_mb,
    percentile,
    process_cpu_seconds,
    server_cpu_seconds,
)
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool
from seed_baseline import HONEST_SCHEMA, SEED_INDEX
from server import Server

from skiplock import Queue, Settings
from skiplock.migrate import migrate

QUEUE = "bench"
MANY_QUEUES = tuple(f"{QUEUE}-{k}" for k in range(50))  # the 50-queue drain: one worker serves them all
IDLE_QUEUE = f"{QUEUE}-idle"  # the drain of one busy queue by workers that also serve this empty one


def drain_queues(flow: str | None) -> list[str]:
    return list(MANY_QUEUES) if flow == "queues" else [QUEUE]


APP = "skiplock-bench"
PRODUCER_APP = "skiplock-bench-producer"
WORKER_APPS = ("skiplock-worker", "seed-baseline", "pgqueuer-bench", PRODUCER_APP)  # their exit flushes statistics
PGQ_SCHEMA = os.environ.setdefault("PGQUEUER_SCHEMA", "bench_pgqueuer")  # pgqueuer reads it once per process
ENQUEUE_CHUNK = 5000


@dataclass(frozen=True)
class Config:
    server: Server
    drain_jobs: int
    single_jobs: int
    bulk_jobs: int
    bulk_chunk: int
    prefill_rows: int
    latency_rate: float
    latency_seconds: float
    workers: int
    concurrency: int
    batch: int | None  # None: the worker's default
    poll_seconds: float
    drain_timeout: float
    settle_seconds: float = 1.2  # idle backends flush pending statistics after ~1 s (PGSTAT_MIN_INTERVAL)
    keep_schemas: bool = False
    schemas: list[str] = field(default_factory=list)

    @property
    def dsn(self) -> str:
        return self.server.dsn


def drain_config(server: Server, jobs: int, *, workers: int = 2, concurrency: int = 10) -> Config:
    """The settings of a drain of ``jobs`` alone (no enqueue, prefill or latency phase), with the worker's own batch,
    polling every 2 s, given 10 minutes (a profile or a statement count of one drain: sampler.py, hotpath_wal.py)."""
    return Config(
        server=server,
        drain_jobs=jobs,
        single_jobs=0,
        bulk_jobs=0,
        bulk_chunk=1,
        prefill_rows=0,
        latency_rate=1.0,
        latency_seconds=0.0,
        workers=workers,
        concurrency=concurrency,
        batch=None,
        poll_seconds=2.0,
        drain_timeout=600.0,
    )


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------- plumbing
def connect(cfg: Config, autocommit: bool = True) -> psycopg.Connection[Any]:
    return psycopg.connect(cfg.dsn, autocommit=autocommit, application_name=APP)


def new_schema(cfg: Config, tag: str, src: str | None = None) -> str:
    """A fresh migrated schema ``bench_<tag>_<hex>`` with the effects table the ``write`` handlers fill; ``src``
    (another worker/): migrated by that tree's ``skiplock migrate``, so an A/B of a schema change compares schemas."""
    name = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    cfg.schemas.append(name)  # dropped at the end even if the migration fails half-way
    if src is not None:
        env = _env({"SKIPLOCK_DSN": cfg.dsn, "SKIPLOCK_SCHEMA": name}, src)
        subprocess.run([sys.executable, "-m", "skiplock", "migrate"], env=env, check=True, capture_output=True)
    with connect(cfg) as conn:
        if src is None:
            migrate(conn, name)
        conn.execute(sql.SQL("CREATE TABLE {}.bench_effects (job_id bigint, attempt int)").format(sql.Identifier(name)))
    return name


def new_honest_schema(cfg: Config) -> str:
    """A fresh schema ``bench_honest_<hex>`` holding the design source's ``jobs`` table, exactly as it writes it."""
    name = f"bench_honest_{uuid.uuid4().hex[:8]}"
    with connect(cfg) as conn, conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(HONEST_SCHEMA.format(schema=sql.Identifier(name).as_string(conn)).encode())
    cfg.schemas.append(name)
    return name


def drop_schemas(cfg: Config, only: str | None = None) -> None:
    """Drop the bench's schemas (``only``: that one, a drain's own, once measured)."""
    if cfg.keep_schemas:
        return
    names = [only] if only is not None else [PGQ_SCHEMA, *cfg.schemas]
    with connect(cfg) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    cfg.schemas[:] = [] if only is None else [name for name in cfg.schemas if name != only]


@contextlib.contextmanager
def queue_for(cfg: Config, schema: str) -> Iterator[Queue]:
    """A producer's ``Queue`` on its own named pool (so the harness can wait for its backend to exit)."""
    pool: ConnectionPool[Any] = ConnectionPool(
        cfg.dsn, min_size=1, max_size=2, open=True, kwargs={"application_name": PRODUCER_APP}
    )
    try:
        yield Queue(pool=pool, settings=Settings.load(env={}, dsn=cfg.dsn, schema=schema))
    finally:
        pool.close()


def prefill(cfg: Config, schema: str, rows: int) -> None:
    """``rows`` finished jobs (9 done : 1 failed), a day old, in the benchmark's own queue; then VACUUM ANALYZE."""
    with connect(cfg) as conn:
        conn.execute(
            sql.SQL(
                """INSERT INTO {}.jobs (queue, payload, status, attempts, max_attempts, visible_at, last_error,
                                        created_at, updated_at)
                SELECT %(queue)s, jsonb_build_object('n', g),
                       CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'done' END, 1, 5, now() - interval '1 day',
                       CASE WHEN g %% 10 = 0 THEN 'RuntimeError: boom' END,
                       now() - interval '1 day', now() - interval '1 day'
                FROM generate_series(1, %(rows)s) AS g"""
            ).format(sql.Identifier(schema)),
            {"queue": QUEUE, "rows": rows},
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    ready_marker: str

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _env(extra: dict[str, str], src: str | None = None) -> dict[str, str]:
    """The environment of a worker process: ours minus SKIPLOCK_*, bench/ (and ``src``, another worker/) first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src or "", str(BENCH), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def start_skiplock(
    cfg: Config,
    schema: str,
    handler: str,
    logdir: Path,
    *,
    concurrency: int,
    batch: int | None = None,
    listen: bool = True,
    src: str | None = None,
    workers: int | None = None,
    **env: str,
) -> list[Proc]:
    settings = {
        "SKIPLOCK_DSN": cfg.dsn,
        "SKIPLOCK_SCHEMA": schema,
        "SKIPLOCK_QUEUE": QUEUE,
        "SKIPLOCK_HANDLER": f"handlers:{handler}",
        "SKIPLOCK_CONCURRENCY": str(concurrency),
        **({"SKIPLOCK_BATCH": str(batch or cfg.batch)} if batch or cfg.batch else {}),
        "SKIPLOCK_POLL_SECONDS": str(cfg.poll_seconds),
        "SKIPLOCK_LISTEN": "true" if listen else "false",
        "SKIPLOCK_LOG_LEVEL": "INFO",
    }
    procs = []
    for i in range(workers or cfg.workers):
        log = logdir / f"worker-{i}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "skiplock", "worker"],
                env=_env({**settings, **env}, src),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(Proc(popen, log, "listener connected" if listen else "worker started"))
    return procs


def stopped_count(proc: Proc, name: str) -> int | None:
    """A count the worker logged as it stopped (``name=N`` on its "worker stopped" line); None from a worker that
    does not log it (an older commit under ``--compare``)."""
    found = re.findall(rf"(?:worker stopped|claim statistics).*\b{name}=(\d+)", proc.output())
    return int(found[-1]) if found else None


def start_script(
    cfg: Config, script: str, args: list[str], logdir: Path, workers: int | None = None, **env: str
) -> list[Proc]:
    """W processes of a worker script of bench/ (``--dsn`` given), each printing ``ready`` once it listens."""
    procs = []
    for i in range(workers or cfg.workers):
        log = logdir / f"{Path(script).stem}-{i}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, str(BENCH / script), "--dsn", cfg.dsn, *args],
                env=_env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(Proc(popen, log, "ready"))
    return procs


def start_seed(
    cfg: Config,
    schema: str,
    handler: str,
    logdir: Path,
    style: str = "seed",
    workers: int | None = None,
    extra: tuple[str, ...] = (),
) -> list[Proc]:
    seed_args = ["--schema", schema, "--queue", QUEUE, "--handler", handler, "--style", style, *extra]
    return start_script(cfg, "seed_baseline.py", seed_args, logdir, workers)


def start_pgqueuer(cfg: Config, logdir: Path, workers: int | None = None, extra: tuple[str, ...] = ()) -> list[Proc]:
    """pgqueuer's workers (``pgqueuer_bench.py worker``) on its schema."""
    return start_script(cfg, "pgqueuer_bench.py", ["worker", *extra], logdir, workers, PGQUEUER_SCHEMA=PGQ_SCHEMA)


def new_pgqueuer_schema(cfg: Config) -> str:
    """pgqueuer's schema, installed afresh by pgqueuer itself (dropped first if left over)."""
    import asyncio

    import pgqueuer_bench

    with connect(cfg) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(PGQ_SCHEMA)))
    asyncio.run(pgqueuer_bench.install(cfg.dsn))
    return PGQ_SCHEMA


def wait_ready(procs: list[Proc], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.ready_marker in p.output() for p in procs):
        for p in procs:
            if p.popen.poll() is not None:
                raise BenchError(f"worker exited with {p.popen.returncode}:\n{p.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise BenchError("workers not ready in time:\n" + "\n".join(p.output()[-1500:] for p in procs))
        time.sleep(0.02)


def stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(timeout=10)


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[list[Proc]]:
    try:
        yield procs
    finally:
        stop(procs)


def worker_backends(mon: psycopg.Connection[Any]) -> list[int]:
    """The pids of the workers' backends (one query)."""
    query = "SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%s)"
    return [int(r[0]) for r in mon.execute(query, (list(WORKER_APPS),)).fetchall()]


def wait_backends_gone(mon: psycopg.Connection[Any], pids: list[int], timeout: float = 15.0) -> int:
    """Wait until the workers' backends (``pids``, read before the workers were stopped) have exited: they flush
    their statistics then. A backend leaves pg_stat_activity before it flushes them, so when the server runs on this
    machine its process must be gone too (or a zombie: exit done); the commits of a drain read short otherwise, even
    below zero. Returns queries run."""
    deadline, n = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        n += 1
        row = mon.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)", (list(WORKER_APPS),)
        ).fetchone()
        if row and row[0] == 0:
            break
        time.sleep(0.05)
    while time.monotonic() < deadline and any(_exiting_postgres(pid) for pid in pids):
        time.sleep(0.01)
    return n


def settled_counters(mon: psycopg.Connection[Any], timeout: float = 5.0) -> tuple[DbCounters, int]:
    """The counters once no statistics arrive late any more: read again every 0.25 s until a reading moved by no
    more than the statements of the reading before it (two), up to ``timeout``. A drain's commits read short, even
    below zero, when a backend's statistics reached the server after the reading. Returns the last reading and
    the statements run after the first reading's own flush (each reading is two; the first one's flush came before
    it, so it counts once)."""
    deadline, last, statements = time.monotonic() + timeout, db_counters(mon), 1
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = db_counters(mon)
        statements += 2
        moved = now.commits - last.commits
        last = now
        if moved <= 2:
            break
    return last, statements


def _exiting_postgres(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.name().startswith("postgres")
    except psutil.Error:
        return False


def wait_drained(mon: psycopg.Connection[Any], schema: str, timeout: float, queues: list[str] | None = None) -> int:
    """Poll (every 50 ms, two index probes) until no job of the queues is pending or processing (pgqueuer's schema:
    until its queue table is empty; it moves each finished job to its log)."""
    ident = sql.Identifier(schema)
    query = sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = ANY(%(q)s) AND status = 'pending') "
        "OR EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = ANY(%(q)s) AND status = 'processing')"
    ).format(s=ident)
    if schema == PGQ_SCHEMA:
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.pgqueuer)").format(ident)
    deadline, n = time.monotonic() + timeout, 0
    while True:
        n += 1
        row = mon.execute(query, {"q": queues or [QUEUE]}).fetchone()
        if row and not row[0]:
            return n
        if time.monotonic() > deadline:
            raise BenchError(f"queue not drained within {timeout:.0f}s")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------- enqueue
def enqueue(cfg: Config) -> dict[str, Any]:
    """Single jobs (one transaction each) against a plain INSERT and NOTIFY in one statement (one round trip, as
    skiplock's ``enqueue`` makes); ``enqueue_many`` against raw COPY of the
    same rows, like for like: in chunks, each a transaction of its own (a call of ``enqueue_many``; a COPY and a
    NOTIFY), and all the jobs in one transaction (one call of ``enqueue_many``; one COPY and a NOTIFY).

    Each call of skiplock alternates with its plain counterpart (job by job, chunk by chunk), each timed alone: both
    see the same table and the same load, so a burst of noise on this shared machine lands on both sides (timed one
    after the other, the ratio to COPY moved from 0.66x to 0.94x between repeats)."""
    schema = new_schema(cfg, "enq")
    ident = sql.Identifier(schema)
    chunks = [range(s, min(cfg.bulk_jobs, s + cfg.bulk_chunk)) for s in range(0, cfg.bulk_jobs, cfg.bulk_chunk)]
    # the single-enqueue ceiling: the INSERT and its NOTIFY in one statement, one round trip, in autocommit
    insert_notify = sql.SQL(
        "WITH j AS (INSERT INTO {}.jobs (queue, payload) VALUES (%s, %s::jsonb) RETURNING id) "
        "SELECT j.id, pg_notify(%s, %s) FROM j"
    ).format(ident)
    copy_sql = sql.SQL("COPY {}.jobs (queue, payload) FROM STDIN").format(ident)
    channel = Settings(schema=schema).channel
    spent = dict.fromkeys(("single", "plain_single", "bulk", "copy_chunked", "bulk_tx", "copy"), 0.0)
    with queue_for(cfg, schema) as q, connect(cfg, autocommit=False) as conn, connect(cfg) as auto:

        def plain_single(i: int) -> None:  # the single-enqueue ceiling: INSERT and NOTIFY in one round trip
            auto.execute(insert_notify, (QUEUE, f'{{"n":{i}}}', channel, QUEUE), prepare=True).fetchone()

        def raw_copy(numbers: range) -> None:  # the bulk ceiling: COPY and NOTIFY in one transaction
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                for i in numbers:
                    copy.write_row((QUEUE, f'{{"n":{i}}}'))
            conn.execute("SELECT pg_notify(%s, %s)", (channel, QUEUE), prepare=True)
            conn.commit()

        def timed(key: str, call: Any, *args: Any) -> None:
            t = time.perf_counter()
            call(*args)
            spent[key] += time.perf_counter() - t

        q.enqueue(QUEUE, {"warm": True})
        plain_single(-1)
        for i in range(cfg.single_jobs):
            timed("single", lambda i: q.enqueue(QUEUE, {"n": i}), i)
            timed("plain_single", plain_single, i)
        for numbers in chunks:
            timed("bulk", lambda ns: q.enqueue_many(QUEUE, [{"n": i} for i in ns]), numbers)
            timed("copy_chunked", raw_copy, numbers)
        timed("bulk_tx", lambda ns: q.enqueue_many(QUEUE, [{"n": i} for i in ns]), range(cfg.bulk_jobs))
        timed("copy", raw_copy, range(cfg.bulk_jobs))
    with connect(cfg) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(ident)).fetchone()
    expected = 2 + 2 * cfg.single_jobs + 4 * cfg.bulk_jobs
    if not row or row[0] != expected:
        raise BenchError(f"enqueue: {row and row[0]} rows, expected {expected}")
    jobs = {"single": cfg.single_jobs, "plain_single": cfg.single_jobs}
    out: dict[str, Any] = {f"{k}_jobs_per_s": jobs.get(k, cfg.bulk_jobs) / v for k, v in spent.items()}
    out["bulk_over_single"] = out["bulk_jobs_per_s"] / out["single_jobs_per_s"]
    out["single_vs_plain"] = out["single_jobs_per_s"] / out["plain_single_jobs_per_s"]
    out["bulk_vs_copy"] = out["bulk_jobs_per_s"] / out["copy_chunked_jobs_per_s"]
    out["bulk_tx_vs_copy"] = out["bulk_tx_jobs_per_s"] / out["copy_jobs_per_s"]
    out["jobs"] = expected
    return out


# ---------------------------------------------------------------------------------------------- drain
def drain(
    cfg: Config,
    *,
    system: str,
    handler: str,
    concurrency: int | None = None,
    batch: int | None = None,
    schema: str | None = None,
    src: str | None = None,
    workers: int | None = None,
    env: dict[str, str] | None = None,
    flow: str | None = None,
) -> dict[str, Any]:
    """Start W idle workers, commit N jobs in one transaction, time the drain and read the counters.

    ``flow``: ``serial`` gives every tenth job a serial key (200 keys), ``limited`` makes every job one of a task
    with a global concurrency and a rate limit that do not bind (flow_app.py): the cost of flow control;
    ``queues`` spreads the jobs over 50 queues, all served by each worker; ``idle``: the workers serve an empty
    queue besides the jobs' one.

    Throughput runs from the enqueue commit (skiplock wakes by NOTIFY) or from the first claim (the seed polls
    every second; its nap is not charged) to the last completion, both read from the jobs' timestamps. The ceiling
    loops (``ceiling``, ``txloop``) wake by NOTIFY too and are timed from the commit.
    """
    if system == "pgqueuer":
        return drain_pgqueuer(cfg, workers=workers)
    n = cfg.drain_jobs
    concurrency = concurrency or cfg.concurrency
    own = schema is None  # a drained table left behind gets vacuumed during a later case's run: dropped once measured
    schema = schema or (new_honest_schema(cfg) if system == "honest" else new_schema(cfg, "drain", src))
    ident = sql.Identifier(schema)
    logdir = Path(tempfile.mkdtemp(prefix="bench-drain-"))
    with connect(cfg) as conn:
        if system in ("seed", "tuned"):
            conn.execute(SEED_INDEX.format(schema=ident.as_string(conn)))
        conn.execute("CHECKPOINT")  # every run starts with the same full-page-image debt
    if system == "skiplock":
        app = {"SKIPLOCK_APP": "flow_app:app"} if flow == "limited" else {}
        if flow == "queues":
            app = {"SKIPLOCK_QUEUES": ",".join(MANY_QUEUES)}
        elif flow == "idle":
            app = {"SKIPLOCK_QUEUES": f"{QUEUE},{IDLE_QUEUE}"}
        procs = start_skiplock(
            cfg,
            schema,
            handler,
            logdir,
            concurrency=concurrency,
            batch=batch,
            src=src,
            workers=workers,
            **(env or {}),
            **app,
        )
    else:
        procs = start_seed(cfg, schema, handler, logdir, style=system, workers=workers)
    with running(procs), connect(cfg) as mon:
        wait_ready(procs)
        time.sleep(cfg.settle_seconds)  # startup chatter settles and its statistics are flushed
        ours = 0  # transactions of this harness between the two counter reads
        before = db_counters(mon)
        ours += 1
        with contextlib.ExitStack() as stack:
            conn = stack.enter_context(connect(cfg, autocommit=False))
            first_id: int | None = None
            if system == "honest":  # the design source's INSERT and NOTIFY, on its own table
                first_id = enqueue_honest(conn, schema, n)
            else:
                q = stack.enter_context(queue_for(cfg, schema))
                for start in range(0, n, ENQUEUE_CHUNK):
                    ids = enqueue_chunk(q, conn, range(start, min(n, start + ENQUEUE_CHUNK)), flow)
                    first_id = ids[0] if first_id is None else first_id
            # the clock just before COMMIT, on the same connection: read afterwards on another connection it
            # could come after a fast drain on a loaded machine
            t_commit_row = conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::float8, "
                "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint"
            ).fetchone()
            assert t_commit_row is not None
            enqueue_wal = int(t_commit_row[1]) - before.wal_bytes
            conn.commit()
            ours += 1
        pg_cpu0 = server_cpu_seconds(cfg.server.postmaster_pid)
        cpu0 = {p.popen.pid: process_cpu_seconds(p.popen.pid) for p in procs}
        ours += wait_drained(mon, schema, cfg.drain_timeout, drain_queues(flow))
        pg_cpu1, worker_cpu, rss, after, queries = stop_and_measure(cfg, procs, mon, cpu0)
        ours += queries
        row = mon.execute(
            sql.SQL(
                "SELECT extract(epoch FROM min(locked_at))::float8, extract(epoch FROM max(updated_at))::float8, "
                "count(*) FILTER (WHERE status = 'done'), count(*), max(attempts) "
                "FROM {}.jobs WHERE queue = ANY(%(q)s) AND id >= %(first)s"
            ).format(ident),
            {"q": drain_queues(flow), "first": first_id},
        ).fetchone()
    assert row is not None and t_commit_row is not None
    first_claim, last_done, done, total, max_attempts = row
    if done != n or total != n:
        raise BenchError(f"drain: {done} of {total} jobs done, expected {n}")
    started = float(first_claim) if system in ("seed", "tuned") else float(t_commit_row[0])
    seconds = float(last_done) - started
    commits = after.commits - before.commits - ours
    write_tx = after.next_xid - before.next_xid - 1  # minus the enqueue transaction
    shutil.rmtree(logdir, ignore_errors=True)
    if own:
        drop_schemas(cfg, schema)
    return _drain_figures(
        n, seconds, worker_cpu, pg_cpu0, pg_cpu1, commits, write_tx, after, before, enqueue_wal, rss
    ) | {"max_attempts_seen": max_attempts}


def stop_and_measure(
    cfg: Config, procs: list[Proc], mon: psycopg.Connection[Any], cpu0: dict[int, float]
) -> tuple[float | None, float, float, DbCounters, int]:
    """At the end of a drain: server CPU, the workers' CPU since ``cpu0`` and their peak RSS, then stop them and read
    the database counters once their backends are gone. Returns those and the queries this ran on ``mon``."""
    pg_cpu1 = server_cpu_seconds(cfg.server.postmaster_pid)
    worker_cpu = sum(process_cpu_seconds(pid) - c for pid, c in cpu0.items())
    rss = max(peak_rss_mb(p.popen.pid) for p in procs)
    pids = worker_backends(mon)
    stop(procs)
    queries = wait_backends_gone(mon, pids)
    after, reads = settled_counters(mon)
    return pg_cpu1, worker_cpu, rss, after, queries + 1 + reads  # + the pids' query


def _drain_figures(
    n: int,
    seconds: float,
    worker_cpu: float,
    pg_cpu0: float | None,
    pg_cpu1: float | None,
    commits: int,
    write_tx: int,
    after: Any,
    before: Any,
    enqueue_wal: int,
    rss: float,
) -> dict[str, Any]:
    pg = (pg_cpu1 - pg_cpu0) / n * 1e6 if pg_cpu0 is not None and pg_cpu1 is not None else None
    return {
        "jobs": n,
        "seconds": seconds,
        "jobs_per_s": n / seconds,
        "worker_cpu_us_per_job": worker_cpu / n * 1e6,
        "pg_cpu_us_per_job": pg,
        # both on the same cores: on a machine with fewer cores than busy processes, throughput follows this sum
        "cpu_us_per_job": worker_cpu / n * 1e6 + pg if pg is not None else None,
        "commits_per_job": commits / n,
        "write_tx_per_job": write_tx / n,
        "wal_bytes_per_job": (after.wal_bytes - before.wal_bytes - enqueue_wal) / n,
        "worker_rss_mb": rss,
    }


def drain_pgqueuer(cfg: Config, *, workers: int | None = None) -> dict[str, Any]:
    """The same drain with pgqueuer: its own fresh schema, W worker processes (asyncpg, uvloop, batch 100, no-op),
    N jobs enqueued in one transaction through its API, timed from that commit to its last log entry."""
    import asyncio

    import pgqueuer_bench

    n = cfg.drain_jobs
    ident = sql.Identifier(new_pgqueuer_schema(cfg))
    logdir = Path(tempfile.mkdtemp(prefix="bench-pgq-"))
    procs = start_pgqueuer(cfg, logdir, workers)
    with running(procs), connect(cfg) as mon:
        wait_ready(procs)
        time.sleep(cfg.settle_seconds)
        ours = 0
        before = db_counters(mon)
        ours += 1
        wal0 = before.wal_bytes
        t_commit = asyncio.run(pgqueuer_bench.enqueue(cfg.dsn, n))
        ours += 2  # its transaction and the connection's
        enqueue_wal = db_counters(mon).wal_bytes - wal0
        ours += 2
        pg_cpu0 = server_cpu_seconds(cfg.server.postmaster_pid)
        cpu0 = {p.popen.pid: process_cpu_seconds(p.popen.pid) for p in procs}
        ours += wait_drained(mon, PGQ_SCHEMA, cfg.drain_timeout)
        pg_cpu1, worker_cpu, rss, after, queries = stop_and_measure(cfg, procs, mon, cpu0)
        ours += queries
        row = mon.execute(
            sql.SQL(
                "SELECT extract(epoch FROM max(created))::float8, count(*) FROM {}.pgqueuer_log "
                "WHERE status = 'successful'"
            ).format(ident)
        ).fetchone()
    shutil.rmtree(logdir, ignore_errors=True)
    assert row is not None
    if row[1] != n:
        raise BenchError(f"pgqueuer: {row[1]} jobs logged successful, expected {n}")
    commits = after.commits - before.commits - ours
    write_tx = after.next_xid - before.next_xid - 1
    seconds = float(row[0]) - t_commit
    return _drain_figures(n, seconds, worker_cpu, pg_cpu0, pg_cpu1, commits, write_tx, after, before, enqueue_wal, rss)


def enqueue_honest(conn: psycopg.Connection[Any], schema: str, n: int) -> int:
    """N jobs into the design source's table and a NOTIFY on the schema's channel, in the caller's transaction; the
    first job's id."""
    row = conn.execute(
        sql.SQL(
            "WITH j AS (INSERT INTO {}.jobs (queue, payload) SELECT %(q)s, jsonb_build_object('n', g) "
            "FROM generate_series(1, %(n)s) g RETURNING id) SELECT min(id) FROM j"
        ).format(sql.Identifier(schema)),
        {"q": QUEUE, "n": n},
    ).fetchone()
    conn.execute("SELECT pg_notify(%s, %s)", (Settings(schema=schema).channel, QUEUE))
    assert row is not None
    return int(row[0])


def plain_enqueue(conn: psycopg.Connection[Any], schema: str) -> Any:
    """A producer of single jobs on the design source's table: INSERT and NOTIFY in one statement; returns the id."""
    query = sql.SQL(
        "WITH j AS (INSERT INTO {}.jobs (queue, payload) VALUES (%s, %s) RETURNING id) "
        "SELECT j.id, pg_notify(%s, %s) FROM j"
    ).format(sql.Identifier(schema))
    channel = Settings(schema=schema).channel

    def enqueue_one(payload: dict[str, Any]) -> int:
        row = conn.execute(query, (QUEUE, Jsonb(payload), channel, QUEUE), prepare=True).fetchone()
        assert row is not None
        return int(row[0])

    return enqueue_one


def enqueue_chunk(q: Queue, conn: psycopg.Connection[Any], numbers: range, flow: str | None) -> list[int]:
    """One chunk of a drain's jobs: plain, 10 % serial-keyed (keys spread over 200 values), a limited task's, or
    spread evenly over 50 queues."""
    if flow == "queues":
        ids = []
        for k, queue in enumerate(MANY_QUEUES):
            ids += q.enqueue_many(queue, [{"n": i} for i in numbers if i % len(MANY_QUEUES) == k], conn=conn)
        return sorted(ids)
    if flow == "limited":
        return q.enqueue_many(QUEUE, [{"n": i} for i in numbers], conn=conn, task="bench.limited")
    if flow != "serial":
        return q.enqueue_many(QUEUE, [{"n": i} for i in numbers], conn=conn)
    keyed = [i for i in numbers if i % 10 == 0]
    ids = q.enqueue_many(QUEUE, [{"n": i} for i in numbers if i % 10], conn=conn)
    for i in keyed:
        ids.append(q.enqueue(QUEUE, {"n": i}, conn=conn, serial_key=f"k{i // 10 % 200}").id)
    return sorted(ids)


# ---------------------------------------------------------------------------------------------- latency
@contextlib.contextmanager
def single_producer(cfg: Config, system: str, schema: str) -> Iterator[Callable[[dict[str, Any]], int]]:
    """Enqueue one job a transaction, in autocommit, returning its id: skiplock's ``Queue.enqueue``, the design
    source's INSERT and NOTIFY in one statement (``honest``), or pgqueuer's synchronous ``enqueue``."""
    if system == "skiplock":
        with queue_for(cfg, schema) as q:
            yield lambda payload: q.enqueue(QUEUE, payload).id
        return
    import pgqueuer_bench

    with connect(cfg) as conn:
        yield plain_enqueue(conn, schema) if system == "honest" else pgqueuer_bench.producer(conn)


def latency(cfg: Config, *, listen: bool = True, src: str | None = None, system: str = "skiplock") -> dict[str, Any]:
    """Idle workers; a producer enqueues single jobs at a fixed rate; from the enqueue's commit (the call returned:
    it runs in autocommit) to the handler's start, per job, and from the enqueue call to the start.

    ``system`` ``honest``: the plain loop on the design source's table (seed_baseline.py ``--style honest``), its
    pick-up time taken as its claim returns; the producer's INSERT and NOTIFY are one statement in autocommit.
    ``pgqueuer``: its workers (pgqueuer_bench.py, a no-op entrypoint that records its start), its producer's
    ``enqueue``.

    Also counts the workers' commits per job over the window beyond the producer's own (each LISTEN backend commits
    once for each notification it receives, besides the claims), and the claims that found nothing.
    """
    logdir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    starts = logdir / "starts"
    starts.mkdir()
    n = max(1, round(cfg.latency_rate * cfg.latency_seconds))
    if system == "pgqueuer":
        schema = new_pgqueuer_schema(cfg)
        procs = start_pgqueuer(cfg, logdir, extra=("--record", str(starts)))
    elif system == "honest":
        schema = new_honest_schema(cfg)
        procs = start_seed(cfg, schema, "noop", logdir, style="honest", extra=("--record", str(starts)))
    else:
        schema = new_schema(cfg, "lat", src)
        procs = start_skiplock(
            cfg,
            schema,
            "record_start",
            logdir,
            concurrency=cfg.concurrency,
            listen=listen,
            src=src,
            BENCH_LATENCY_DIR=str(starts),
        )
    with running(procs), connect(cfg) as mon:
        wait_ready(procs)
        with single_producer(cfg, system, schema) as enqueue_one:
            warm = enqueue_one({"t": time.time(), "warm": True})  # warm the producer's connection
            wait_drained(mon, schema, cfg.poll_seconds + 30)
            time.sleep(cfg.settle_seconds)
            before = db_counters(mon)
            committed: dict[int, float] = {}  # job id -> the time its enqueue returned
            t0 = time.perf_counter()
            for i in range(n):
                delay = t0 + i / cfg.latency_rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                job_id = enqueue_one({"t": time.time()})
                committed[job_id] = time.time()
            produced = n / (time.perf_counter() - t0)
        ours = 2 + wait_drained(mon, schema, cfg.poll_seconds + 30)  # + the pids' query
        pids = worker_backends(mon)
        stop(procs)
        ours += wait_backends_gone(mon, pids)
        after, reads = settled_counters(mon)
        ours += reads
    worker_commits = after.commits - before.commits - ours - n  # each enqueue is one commit of the producer
    worker_write_tx = after.next_xid - before.next_xid - n
    # Claims that found nothing, as each worker counts them over its life (a few at start-up too). Not read off the
    # server's commits: each notification a LISTEN backend receives costs it a transaction of its own.
    counts = [stopped_count(p, "empty_claims") for p in procs]
    empty = None if None in counts else sum(c for c in counts if c is not None)
    lat_ms: list[float] = []  # from the commit
    call_ms: list[float] = []  # from the call
    for path in starts.glob("starts-*.txt"):
        for line in path.read_text().splitlines():
            job, enqueued, started = line.split()
            if int(job) != warm:
                lat_ms.append((float(started) - committed[int(job)]) * 1000)
                call_ms.append((float(started) - float(enqueued)) * 1000)
    shutil.rmtree(logdir, ignore_errors=True)
    lat_ms.sort()
    call_ms.sort()
    if len(lat_ms) != n:
        raise BenchError(f"latency: {len(lat_ms)} handler starts recorded, expected {n}")
    return {
        "jobs": n,
        "rate_per_s": produced,
        "p50_ms": percentile(lat_ms, 50),
        "p95_ms": percentile(lat_ms, 95),
        "p99_ms": percentile(lat_ms, 99),
        "max_ms": lat_ms[-1],
        "p50_call_ms": percentile(call_ms, 50),
        "p99_call_ms": percentile(call_ms, 99),
        "worker_commits_per_job": worker_commits / n,
        "worker_write_tx_per_job": worker_write_tx / n,
        "empty_claims_per_job": None if empty is None else empty / n,
        "poll_seconds": None if listen else cfg.poll_seconds,
    }
