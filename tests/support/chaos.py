"""Fault-injection helpers: chaos handlers, a private PostgreSQL server, a supervised worker fleet, a producer,
and the end-of-run invariants (each with its figure).

Handlers are loaded by name in worker processes (``support.chaos:work`` / ``support.chaos:awork``). Every
execution is appended to a per-process file (``S``tart and ``E``nd lines) outside any transaction, so the count
survives SIGKILL, terminated connections and server restarts; the effect is written through ``job.conn`` and
commits only with the job's fenced completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import PoolTimeout

from skiplock import Job, Queue, Settings
from skiplock.errors import DatabaseUnavailableError

TESTS = Path(__file__).resolve().parents[1]
FAULT_LEASE_SECONDS, FAULT_RECOVER_SECONDS = 3.0, 0.5
FAULT_WORKER: dict[str, float] = {
    "lease_seconds": FAULT_LEASE_SECONDS,
    "heartbeat_seconds": 0.5,
    "poll_seconds": 0.5,
    "recover_seconds": FAULT_RECOVER_SECONDS,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.3,
    "shutdown_grace_seconds": 0.5,
    "concurrency": 4,
    "batch": 4,
}
"""The fault suite's worker settings: short leases and polls, quick backoffs, four slots (a test overrides what it
studies)."""
FAULT_HANDLERS = ["support.chaos:work", "support.chaos:work", "support.chaos:awork", "support.chaos:awork"]
"""Two sync and two async workers."""

WORKER_APP = "skiplock-worker"
POISON_EXIT = 17
KINDS = ("instant", "slow", "delayed", "flaky", "doomed")


# ---------------------------------------------------------------------------------------------- handlers
_exec_fd: dict[int, int] = {}


def _note(tag: str, job: Job, outcome: str = "-") -> None:
    """Append one execution line (atomic with O_APPEND for lines this short)."""
    fd = _exec_fd.get(os.getpid())
    if fd is None:
        path = Path(os.environ["CHAOS_EXEC_DIR"]) / f"exec-{os.getpid()}.log"
        fd = _exec_fd[os.getpid()] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"{tag} {job.id} {job.attempts} {os.getpid()} {time.time():.6f} {outcome}\n".encode())


def _effect_sql() -> sql.Composed:
    return sql.SQL("INSERT INTO {} (job_id, attempt, pid) VALUES (%s, %s, %s)").format(
        sql.Identifier(os.environ["SKIPLOCK_SCHEMA"], "effects")
    )


def _verdict(job: Job) -> None:
    """Raise or exit as the job's kind says; return when the attempt should succeed."""
    p = job.payload
    kind = p.get("kind")
    if kind == "poison":
        os._exit(POISON_EXIT)
    if kind == "doomed":
        raise RuntimeError(f"always fails (attempt {job.attempts})")
    if kind == "flaky" and job.attempts <= int(p.get("fail_times", 1)):
        raise ConnectionError(f"transient failure on attempt {job.attempts}")


def work(job: Job) -> None:
    """Sync chaos handler: write the effect through job.conn, then sleep as the payload says."""
    _note("S", job)
    try:
        _verdict(job)
        job.conn.execute(_effect_sql(), (job.id, job.attempts, os.getpid()))
        if job.payload.get("sleep"):
            time.sleep(float(job.payload["sleep"]))
    except BaseException:
        _note("E", job, "err")
        raise
    _note("E", job, "ok")


async def awork(job: Job) -> None:
    """Async twin of :func:`work`."""
    _note("S", job)
    try:
        _verdict(job)
        await job.conn.execute(_effect_sql(), (job.id, job.attempts, os.getpid()))
        if job.payload.get("sleep"):
            await asyncio.sleep(float(job.payload["sleep"]))
    except BaseException:
        _note("E", job, "err")
        raise
    _note("E", job, "ok")


# ---------------------------------------------------------------------------------------------- private server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _find_bindir() -> Path | None:
    for initdb in sorted(glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True):
        return Path(initdb).parent
    try:
        import pgserver
    except ImportError:
        return None
    candidate = Path(pgserver.__file__).parent / "pginstall" / "bin"
    return candidate if (candidate / "initdb").exists() else None


class PrivatePostgres:
    """A throw-away PostgreSQL on a free port that a test may stop, restart or crash (never the shared one)."""

    def __init__(self) -> None:
        bindir = _find_bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries (Debian postgresql or pgserver) to start a private server")
        self.bindir = bindir
        self.run_as: list[str] = []
        self.base = Path(tempfile.mkdtemp(prefix="skiplock-chaos-pg-"))
        if os.geteuid() == 0:  # initdb refuses root: run the server as an unprivileged system user
            user = next((u for u in ("postgres", "pgserver") if _user_exists(u)), None)
            if user is None:
                raise RuntimeError("running as root and no 'postgres' user to run a private server as")
            self.run_as = ["runuser", "-u", user, "--"]
            shutil.chown(self.base, user)
        self.data = self.base / "data"
        self.logfile = self.base / "server.log"
        self.port = free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.restarts = 0

    def _pg(self, tool: str, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [*self.run_as, str(self.bindir / tool), *args],
            check=True,
            capture_output=True,
            timeout=timeout,
        )

    def init(self) -> PrivatePostgres:
        self._pg("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        return self.start()

    def start(self) -> PrivatePostgres:
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.data} -c fsync=off -c full_page_writes=off -c max_connections=300"
        )
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60", "-o", options, "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> float:
        """Stop (``fast``: sessions terminated; ``immediate``: a crash, recovery at start) and start; the downtime."""
        t0 = time.monotonic()
        self.stop(mode)
        self.start()
        self.restarts += 1
        return time.monotonic() - t0

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def terminate_worker_backends(dsn: str, user: str | None = None) -> int:
    """pg_terminate_backend every worker connection (application_name skiplock-worker) of this database, or
    only those of one role (on a shared server, never touch other tests' workers)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database() AND pid <> pg_backend_pid() "
            "AND (%s::text IS NULL OR usename = %s::text)",
            (WORKER_APP, user, user),
        ).fetchone()
    return int(row[0]) if row else 0


def setup_schema(dsn: str, schema: str) -> None:
    from skiplock.migrate import migrate

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, schema)
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL, "
                "at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(schema, "effects"))
        )


# ---------------------------------------------------------------------------------------------- fleet
@dataclass
class Proc:
    slot: int
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def scrape(self, path: str = "/metrics") -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as resp:
            body: bytes = resp.read()
        return body.decode()


class Fleet:
    """Worker processes restarted when they die (as Kubernetes would), unless a slot is held on purpose."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        queue: str,
        workdir: Path,
        handlers: list[str],
        *,
        metrics: bool = False,
        env: dict[str, str] | None = None,
        argv: tuple[str, ...] = (sys.executable, "-m", "skiplock", "worker"),
        **settings: Any,
    ) -> None:
        self.argv = argv
        self.dsn, self.schema, self.queue, self.workdir = dsn, schema, queue, workdir
        self.handlers = handlers
        self.metrics = metrics
        self.extra_env = env or {}
        self.settings = settings
        self.procs: dict[int, Proc] = {}
        self.history: list[Proc] = []
        self.exits: Counter[int] = Counter()
        self.restarts = 0
        self.held: set[int] = set()
        self._generation = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="fleet-supervisor", daemon=True)

    def __enter__(self) -> Fleet:
        for slot in range(len(self.handlers)):
            self._spawn(slot)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _spawn(self, slot: int) -> Proc:
        self._generation += 1
        name = f"chaos-{slot}-{self._generation}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
        env.update(
            {
                "SKIPLOCK_DSN": self.dsn,
                "SKIPLOCK_SCHEMA": self.schema,
                "SKIPLOCK_QUEUE": self.queue,
                "SKIPLOCK_HANDLER": self.handlers[slot],
                "SKIPLOCK_WORKER_ID": name,
                "CHAOS_EXEC_DIR": str(self.workdir),
                "PYTHONPATH": str(TESTS),
            }
        )
        port = 0
        if self.metrics:
            port = free_port()
            env.update({"SKIPLOCK_METRICS_PORT": str(port), "SKIPLOCK_METRICS_HOST": "127.0.0.1"})
        for key, value in self.settings.items():
            env[f"SKIPLOCK_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
        env.update(self.extra_env)
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen([*self.argv], env=env, stdout=out, stderr=subprocess.STDOUT)
        proc = Proc(slot, name, popen, log, port)
        self.procs[slot] = proc
        self.history.append(proc)
        return proc

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                for slot, proc in list(self.procs.items()):
                    code = proc.popen.poll()
                    if code is None or slot in self.held:
                        continue
                    self.exits[code] += 1
                    self.restarts += 1
                    self._spawn(slot)

    # faults
    def kill_random(self, rng: random.Random) -> Proc:
        with self._lock:
            victim = rng.choice([p for p in self.procs.values() if p.alive])
            victim.popen.send_signal(signal.SIGKILL)
            return victim

    def drain(self, slot: int, timeout: float = 60) -> tuple[Proc, int]:
        """SIGTERM one worker and wait for its exit (its slot restarts afterwards); returns its exit code."""
        with self._lock:
            self.held.add(slot)
            proc = self.procs[slot]
        proc.popen.send_signal(signal.SIGTERM)
        try:
            code = proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=10)
            with self._lock:
                self.held.discard(slot)
            raise AssertionError(
                f"worker {proc.name} did not exit within {timeout}s of SIGTERM:\n{proc.output()[-4000:]}"
            ) from None
        with self._lock:
            self.exits[code] += 1
            self.restarts += 1
            self._spawn(slot)
            self.held.discard(slot)
        return proc, code

    def live(self) -> list[Proc]:
        with self._lock:
            return [p for p in self.procs.values() if p.alive]

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        procs = list(self.procs.values())
        for p in procs:
            if p.alive:
                p.popen.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(timeout=10)

    def unexpected_exits(self, expected: set[int]) -> dict[int, int]:
        return {code: n for code, n in self.exits.items() if code not in expected}


# ---------------------------------------------------------------------------------------------- workload
def job_spec(kind: str, rng: random.Random) -> tuple[dict[str, Any], float, int | None]:
    """(payload, delay, max_attempts) of one job of a kind."""
    if kind == "slow":
        return {"kind": kind, "sleep": round(rng.uniform(1.0, 2.5), 2)}, 0.0, None
    if kind == "delayed":
        return {"kind": kind}, round(rng.uniform(0.3, 3.0), 2), None
    if kind == "flaky":
        return {"kind": kind, "fail_times": rng.randint(1, 3)}, 0.0, None
    if kind == "doomed":
        return {"kind": kind}, 0.0, 3
    if kind == "poison":
        return {"kind": kind}, 0.0, 3
    return {"kind": "instant"}, 0.0, None


class Producer:
    """Enqueues a steady mixed stream from a thread, retrying through database faults (idempotency keys make
    a retry after an unknown commit outcome harmless)."""

    def __init__(self, settings: Settings, queue: str, rng: random.Random, max_attempts: int) -> None:
        self.settings = settings
        self.queue = queue
        self.rng = rng
        self.max_attempts = max_attempts
        self.keys: set[str] = set()
        self.errors = 0
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: Queue | None = None

    def enqueue(self, kinds: list[str]) -> None:
        """Enqueue one job per kind, retrying each until it is known to be in the table."""
        for kind in kinds:
            payload, delay, attempts = job_spec(kind, self.rng)
            self._n += 1
            key = f"job-{self._n}"
            payload["key"] = key
            while True:
                try:
                    if self._queue is None:
                        self._queue = Queue(settings=self.settings, max_size=2, connect_timeout=3)
                    self._queue.enqueue(
                        self.queue,
                        payload,
                        delay=delay,
                        max_attempts=attempts or self.max_attempts,
                        idempotency_key=key,
                    )
                    break
                except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, DatabaseUnavailableError):
                    self.errors += 1
                    time.sleep(0.1)
            self.keys.add(key)

    def start(self, per_tick: int, tick: float, mix: dict[str, float]) -> None:
        def run() -> None:
            names, weights = zip(*mix.items(), strict=True)
            while not self._stop.is_set():
                self.enqueue(self.rng.choices(names, weights, k=per_tick))
                self._stop.wait(tick)

        self._thread = threading.Thread(target=run, name="producer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._queue is not None:
            self._queue.close()


# ---------------------------------------------------------------------------------------------- invariants
@dataclass
class Execution:
    tag: str
    job_id: int
    attempt: int
    pid: int
    at: float
    outcome: str


def read_executions(workdir: Path) -> list[Execution]:
    out: list[Execution] = []
    for path in sorted(workdir.glob("exec-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 6:
                continue  # a line torn by SIGKILL mid-write cannot happen with one write(2), but be safe
            tag, job_id, attempt, pid, at, outcome = parts
            out.append(Execution(tag, int(job_id), int(attempt), int(pid), float(at), outcome))
    out.sort(key=lambda e: e.at)
    return out


HANDED_BACK = re.compile(r"handed back (\d+) unfinished job")
FAILED_HERE = re.compile(r"job failed.*job_id=(\d+) attempt=(\d+)")


@dataclass
class Drained:
    """A worker stopped with SIGTERM: what it had in flight, and what its log says it handed back."""

    pid: int
    in_flight: list[tuple[int, int]]
    exit_code: int
    handed_back_logged: int
    failed_here: set[tuple[int, int]] = field(default_factory=set)
    """(job, attempt) pairs whose failure this worker recorded (e.g. its connection was terminated)."""

    @classmethod
    def from_log(cls, pid: int, in_flight: list[tuple[int, int]], exit_code: int, log: str) -> Drained:
        logged = sum(int(m) for m in HANDED_BACK.findall(log))
        failed = {(int(a), int(b)) for a, b in FAILED_HERE.findall(log)}
        return cls(pid, in_flight, exit_code, logged, failed)


def snapshot_in_flight(dsn: str, schema: str, worker_name: str) -> list[tuple[int, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, attempts FROM {} WHERE status = 'processing' AND locked_by LIKE %s").format(
                sql.Identifier(schema, "jobs")
            ),
            (worker_name + ":%",),
        ).fetchall()
    return [(int(r[0]), int(r[1])) for r in rows]


@dataclass
class Invariant:
    name: str
    ok: bool
    figure: str

    def line(self) -> str:
        return f"invariant {'PASS' if self.ok else 'FAIL'} {self.name}: {self.figure}"


def job_rows(dsn: str, schema: str) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT id, payload, status, attempts, max_attempts, last_error, updated_at FROM {} ORDER BY id"
            ).format(sql.Identifier(schema, "jobs"))
        ).fetchall()


def effect_rows(dsn: str, schema: str) -> list[tuple[int, int, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT job_id, attempt, pid FROM {}").format(sql.Identifier(schema, "effects"))
        ).fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def all_terminal(dsn: str, schema: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with psycopg.connect(dsn, connect_timeout=3) as conn:
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE status IN ('waiting', 'pending', 'processing')").format(
                        sql.Identifier(schema, "jobs")
                    )
                ).fetchone()
        except psycopg.OperationalError:
            return False
        return bool(row) and row[0] == 0

    return check


def check_invariants(
    dsn: str,
    schema: str,
    workdir: Path,
    *,
    produced: set[str],
    last_fault: float,
    terminal_bound: float,
    drained: list[Drained],
) -> list[Invariant]:
    jobs = job_rows(dsn, schema)
    effects = effect_rows(dsn, schema)
    execs = read_executions(workdir)
    starts = [e for e in execs if e.tag == "S"]
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for e in starts:
        by_job[e.job_id].append(e)
    eff_by_job: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for eff in effects:
        eff_by_job[eff[0]].append(eff)
    out: list[Invariant] = []
    statuses = Counter(j["status"] for j in jobs)
    kinds = Counter(j["payload"]["kind"] for j in jobs)

    # nothing lost: every key the producer was told is enqueued is in the table, and no key twice while live
    keys = Counter(j["payload"]["key"] for j in jobs)
    missing = produced - set(keys)
    out.append(
        Invariant(
            "nothing lost at enqueue",
            not missing,
            f"{len(produced)} enqueued, {len(jobs)} rows, {len(missing)} missing "
            f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})",
        )
    )

    # every job terminal, nothing processing
    open_jobs = statuses.get("pending", 0) + statuses.get("processing", 0)
    out.append(
        Invariant(
            "nothing left pending or processing",
            open_jobs == 0,
            f"done {statuses.get('done', 0)}, failed {statuses.get('failed', 0)}, pending {statuses.get('pending', 0)}"
            f", processing {statuses.get('processing', 0)}",
        )
    )
    last_update = max((j["updated_at"].timestamp() for j in jobs), default=last_fault)
    settle = last_update - last_fault
    out.append(
        Invariant(
            "terminal within lease + recovery (+ work) of the last fault",
            open_jobs == 0 and settle <= terminal_bound,
            f"last job terminal {settle:.1f}s after the last fault (bound {terminal_bound:.1f}s)",
        )
    )

    # each succeeding job done with exactly one committed effect, from its final attempt
    succeeding = [j for j in jobs if j["payload"]["kind"] not in ("doomed", "poison")]
    not_done = [j["id"] for j in succeeding if j["status"] != "done"]
    wrong_effects = [j["id"] for j in succeeding if len(eff_by_job.get(j["id"], [])) != 1]
    stale = [
        j["id"]
        for j in succeeding
        if len(eff_by_job.get(j["id"], [])) == 1 and eff_by_job[j["id"]][0][1] != j["attempts"]
    ]
    out.append(
        Invariant(
            "each succeeding job done with exactly one committed effect",
            not not_done and not wrong_effects and not stale,
            f"{len(succeeding)} jobs: {len(succeeding) - len(not_done)} done, {len(wrong_effects)} with != 1 effect"
            f", {len(stale)} effect not from the final attempt"
            + (
                f" (first ids {sorted(set(not_done + wrong_effects + stale))[:10]})"
                if not_done or wrong_effects
                else ""
            ),
        )
    )

    # always-failing jobs failed after max_attempts with last_error set, no effect
    doomed = [j for j in jobs if j["payload"]["kind"] in ("doomed", "poison")]
    bad_doomed = [
        j["id"]
        for j in doomed
        if j["status"] != "failed"
        or j["attempts"] != j["max_attempts"]
        or not j["last_error"]
        or eff_by_job.get(j["id"])
    ]
    lease_expired = sum(1 for j in doomed if "lease expired" in (j["last_error"] or ""))
    poison = [j for j in doomed if j["payload"]["kind"] == "poison"]
    poison_ok = sum(1 for j in poison if "lease expired" in (j["last_error"] or "") and j["status"] == "failed")
    out.append(
        Invariant(
            "always-failing jobs failed with attempts = max_attempts and last_error",
            not bad_doomed and poison_ok == len(poison),
            f"{len(doomed)} jobs, {len(bad_doomed)} wrong, {lease_expired} ended by an expired lease"
            + (f" ({poison_ok} of {len(poison)} poison jobs failed by an expired lease)" if poison else ""),
        )
    )

    # at least once: executions >= effects, per job; duplicate ratio
    under = [j["id"] for j in jobs if len(by_job.get(j["id"], [])) < len(eff_by_job.get(j["id"], []))]
    never_ran = [j["id"] for j in jobs if j["status"] == "done" and not by_job.get(j["id"])]
    minimum = 0
    for j in jobs:
        kind = j["payload"]["kind"]
        if kind in ("doomed", "poison"):
            minimum += j["max_attempts"]
        elif kind == "flaky":
            minimum += int(j["payload"]["fail_times"]) + 1
        else:
            minimum += 1
    extra = len(starts) - minimum
    out.append(
        Invariant(
            "executions >= effects (at-least-once)",
            not under and not never_ran and len(starts) >= len(effects),
            f"{len(starts)} executions, {len(effects)} effects, minimum needed {minimum}, "
            f"{extra} extra executions caused by faults (duplicate ratio {extra / max(minimum, 1):.2%})",
        )
    )

    # graceful shutdown hands jobs back without burning an attempt
    handed_back = finished_in_drain = 0
    burnt: list[int] = []
    for d in drained:
        for job_id, attempt in d.in_flight:
            runs = by_job.get(job_id, [])
            mine = [e for e in runs if e.pid == d.pid and e.attempt == attempt]
            if not mine:
                continue
            later = [e for e in runs if e.at > mine[-1].at and e.pid != d.pid]
            ended = [
                e for e in execs if e.tag == "E" and e.pid == d.pid and e.job_id == job_id and e.attempt == attempt
            ]
            committed_here = any(eff[2] == d.pid and eff[1] == attempt for eff in eff_by_job.get(job_id, []))
            failed_here = (job_id, attempt) in d.failed_here or (ended and ended[-1].outcome == "err")
            if committed_here or failed_here:
                finished_in_drain += 1
            elif later:
                if later[0].attempt == attempt:
                    handed_back += 1
                else:
                    burnt.append(job_id)
    logged = sum(d.handed_back_logged for d in drained)
    bad_exit = [d.exit_code for d in drained if d.exit_code != 0]
    out.append(
        Invariant(
            "graceful shutdown burns no attempt",
            not burnt and not bad_exit and (not drained or handed_back + finished_in_drain > 0),
            f"{len(drained)} drains (exit codes {[d.exit_code for d in drained]}), "
            f"{sum(len(d.in_flight) for d in drained)} jobs in flight: {finished_in_drain} finished during the drain, "
            f"{handed_back} handed back and rerun with the same attempt ({logged} per worker logs), {len(burnt)} burnt"
            + (f" (ids {burnt[:10]})" if burnt else ""),
        )
    )
    return out


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        yield server.init()
    finally:
        server.cleanup()
