"""``skiplock demo``: a realistic mix of jobs drained by a few real worker processes, with live progress.

With no DSN it starts an embedded PostgreSQL (pgserver, imported lazily) whose data lives in a cache folder
and is reused between runs; ``--keep`` leaves it running and prints its DSN. It works in its own schema,
``skiplock_demo``, which it recreates each run. The commands it suggests at the end work as printed.
"""

from __future__ import annotations

import logging
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from skiplock.errors import ConfigError
from skiplock.job import Job
from skiplock.settings import Settings
from skiplock.store.run import execute
from skiplock.store.statements import Statements

DEMO_SCHEMA = "skiplock_demo"
DEMO_QUEUE = "demo"
BAR = 30
LINE_EVERY_SECONDS = 2.0
"""Progress into a file or pipe (no terminal): one plain line this often."""
STATEMENTS = Statements(Settings(schema=DEMO_SCHEMA))


def handle(job: Job) -> None:
    """The demo's handler: succeed, fail a few times first, or always fail, by the payload's kind."""
    p = job.payload
    if p["kind"] == "poison":
        raise RuntimeError(f"upstream rejected order {p['order']} (attempt {job.attempts})")
    if p["kind"] == "flaky" and job.attempts <= p["fail_times"]:
        raise ConnectionError(f"payment gateway timed out (attempt {job.attempts})")
    time.sleep(p["work_ms"] / 1000)
    # The effect is written through job.conn: it commits with the job's completion, exactly once.
    execute(job.conn, STATEMENTS.demo("demo_receipt_insert", {"job_id": job.id, "order_id": p["order"]}))


def demo_payloads(n: int, rng: random.Random) -> list[tuple[dict[str, Any], float]]:
    """(payload, delay seconds): ~80% succeed, ~10% fail 1-2 times first, ~3% always fail, ~7% delayed."""
    out = []
    for order in range(1, n + 1):
        roll = rng.random()
        work = rng.randint(1, 20)
        if roll < 0.03:
            out.append(({"kind": "poison", "order": order, "work_ms": work}, 0.0))
        elif roll < 0.13:
            out.append(({"kind": "flaky", "order": order, "fail_times": rng.randint(1, 2), "work_ms": work}, 0.0))
        elif roll < 0.20:
            out.append(({"kind": "delayed", "order": order, "work_ms": work}, rng.uniform(2, 6)))
        else:
            out.append(({"kind": "ok", "order": order, "work_ms": work}, 0.0))
    return out


@dataclass(frozen=True)
class Embedded:
    """The embedded server a demo ran on: its DSN, and the postmaster's pid (to stop a kept server)."""

    dsn: str
    pid: int | None


@contextmanager
def embedded_postgres(*, keep: bool = False) -> Iterator[Embedded]:
    """An embedded PostgreSQL whose data lives in a cache folder; stopped at the end unless ``keep``."""
    with warnings.catch_warnings():
        # platformdirs warns at pgserver's import when XDG_RUNTIME_DIR is unset (containers, CI, sudo): pgserver
        # then keeps its lock file under /tmp, which is fine for a demo. Only that warning is silenced.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set", category=UserWarning)
        try:
            import pgserver
        except ImportError:
            raise ConfigError(
                "demo: no DSN given and the embedded PostgreSQL is not installed: "
                "pip install 'skiplock[demo]' (make demo does it), or pass --dsn"
            ) from None
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    folder = Path(tempfile.gettempdir()) / f"skiplock-demo-{os.getuid()}" / "pgdata"
    folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting an embedded PostgreSQL in {folder} ...", flush=True)
    server = pgserver.get_server(folder, cleanup_mode=None if keep else "stop")  # type: ignore[attr-defined]
    try:
        yield Embedded(dsn=server.get_uri(), pid=server.get_pid())
    finally:
        server.cleanup()


def run_demo(settings: Settings, *, jobs: int, workers: int, concurrency: int, keep: bool = False) -> int:
    """Run the demo on ``settings.dsn``, or on an embedded PostgreSQL when there is none."""
    if settings.dsn:
        try:
            code = _demo(settings.dsn, jobs, workers, concurrency)
        except KeyboardInterrupt:
            print("\ndemo stopped (Ctrl-C): the workers were stopped; the demo's jobs stay in schema "
                  f"{DEMO_SCHEMA!r} until the next run", file=sys.stderr)  # fmt: skip
            return 130
        print(_hints(_dsn_argument(settings.dsn)))
        return code
    try:
        with embedded_postgres(keep=keep) as server:
            code = _demo(server.dsn, jobs, workers, concurrency)
    except KeyboardInterrupt:
        print("\ndemo stopped (Ctrl-C): the workers and the embedded PostgreSQL were stopped", file=sys.stderr)
        return 130
    if keep:
        print(f"\nthe embedded PostgreSQL keeps running: SKIPLOCK_DSN={shlex.quote(server.dsn)}")
        print(_hints(shlex.quote(server.dsn)))
        if server.pid:
            print(f"stop it with: kill {server.pid}   (or run skiplock demo again without --keep)")
    else:
        print("the embedded PostgreSQL was stopped; run skiplock demo --keep to keep it and look around afterwards")
    return code


def _dsn_argument(dsn: str) -> str:
    """How a follow-up command names the DSN the user gave, without printing a password."""
    for name in ("SKIPLOCK_DSN", "DATABASE_URL"):
        if os.environ.get(name) == dsn:
            return f'"${name}"'
    return "YOUR_DSN"  # given with --dsn: the user typed it, and it may hold a password


def _hints(dsn: str) -> str:
    cli = _cli()
    return "\n".join(
        [
            "try:",
            f"  {cli} stats --dsn {dsn} --schema {DEMO_SCHEMA}",
            f"  {cli} failed --dsn {dsn} --schema {DEMO_SCHEMA}",
            f"  {cli} show --dsn {dsn} --schema {DEMO_SCHEMA} ID      # one job and its tracebacks (an id of failed)",
        ]
    )


def _cli() -> str:
    """The skiplock command as the user can type it in their shell: bare when it is on their PATH (installed
    outside a virtualenv, or in the virtualenv they activated), else its path (``make demo`` puts ``.venv/bin`` on
    its own PATH only, so the bare name would fail when pasted)."""
    here = Path(sys.executable).parent / "skiplock"
    found = shutil.which("skiplock")
    in_venv = sys.prefix != sys.base_prefix
    activated = (
        os.environ.get("VIRTUAL_ENV") and Path(os.environ["VIRTUAL_ENV"]).resolve() == Path(sys.prefix).resolve()
    )
    if found and Path(found).resolve() == here.resolve() and (activated or not in_venv):
        return "skiplock"
    if here.exists():
        try:
            return str(here.relative_to(Path.cwd()))
        except ValueError:
            return str(here)
    return f"{shlex.quote(sys.executable)} -m skiplock"


def _demo(dsn: str, jobs: int, workers: int, concurrency: int) -> int:
    from skiplock import render
    from skiplock.queue import Queue

    settings = Settings.load(
        env={},
        dsn=dsn,
        schema=DEMO_SCHEMA,
        max_attempts=4,
        backoff_base_seconds=0.5,
        backoff_cap_seconds=3,
        backoff_jitter=0.5,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        execute(conn, STATEMENTS.demo("demo_reset"))
    with Queue(settings=settings) as q:
        logging.getLogger("skiplock.migrate").setLevel(logging.WARNING)  # the demo's own schema: no news
        q.migrate()
        with psycopg.connect(dsn, autocommit=True) as conn:
            execute(conn, STATEMENTS.demo("demo_receipts_create"))
        rng = random.Random(7)
        mix = demo_payloads(jobs, rng)
        now = [p for p, d in mix if d == 0]
        q.enqueue_many(DEMO_QUEUE, now)
        for payload, delay in mix:
            if delay:
                q.enqueue(DEMO_QUEUE, payload, delay=delay)
        kinds = {k: sum(1 for p, _ in mix if p["kind"] == k) for k in ("ok", "flaky", "poison", "delayed")}
        print(
            f"enqueued {jobs} jobs into queue {DEMO_QUEUE!r}: {kinds['ok']} ok, {kinds['flaky']} flaky "
            f"(fail 1-2 times, then succeed), {kinds['poison']} poison (always fail), {kinds['delayed']} delayed 2-6 s"
        )
        print(f"starting {workers} worker processes x concurrency {concurrency} ...", flush=True)
        procs = [_spawn_worker(dsn, settings, concurrency, i) for i in range(workers)]
        started = time.monotonic()
        try:
            code = _watch(dsn, jobs, kinds["poison"], started, procs)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            exits = [p.wait(timeout=60) for p in procs]
        elapsed = time.monotonic() - started
        print()
        print(render.stats(q.stats(DEMO_QUEUE)))
        with psycopg.connect(dsn, autocommit=True) as conn:
            status = execute(conn, STATEMENTS.status_counts())
            [receipts] = execute(conn, STATEMENTS.demo("demo_receipts_count"))
        print(
            f"\ndone {status.get('done', 0)}, failed {status.get('failed', 0)} in {elapsed:.1f}s "
            f"({status.get('done', 0) / elapsed:.0f} jobs/s); receipts written through job.conn: "
            f"{receipts['receipts']} for {receipts['orders']} orders (one per done job)"
        )
        print(f"workers drained on SIGTERM with exit codes {exits}")
        return code if all(e == 0 for e in exits) else 1


def _spawn_worker(dsn: str, settings: Settings, concurrency: int, index: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update(
        settings.replace(
            queue=DEMO_QUEUE,
            handler="skiplock.demo:handle",
            concurrency=concurrency,
            batch=concurrency,
            poll_seconds=1,
            log_level="CRITICAL",
        ).to_env()
    )
    env["SKIPLOCK_DSN"] = dsn
    env["SKIPLOCK_WORKER_ID"] = f"demo-worker-{index}"
    # Ctrl-C reaches the whole process group: the workers ignore it from their start (SIG_IGN is inherited; a SIGINT
    # while Python imports would print a traceback) and drain once, on the SIGTERM the demo sends them.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.Popen([sys.executable, "-m", "skiplock", "worker"], env=env)
    finally:
        signal.signal(signal.SIGINT, previous)


def _watch(dsn: str, total: int, poison: int, started: float, procs: list[subprocess.Popen[bytes]]) -> int:
    last_done, last_t = 0, started
    terminal, last_line = sys.stdout.isatty(), 0.0
    rate = 0.0
    deadline = started + 300
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            c = execute(conn, STATEMENTS.status_counts())
            done, failed = c.get("done", 0), c.get("failed", 0)
            t = time.monotonic()
            if t - last_t >= 0.5:
                rate = (done - last_done) / (t - last_t)
                last_done, last_t = done, t
            finished = done + failed
            filled = int(BAR * finished / total)
            line = (
                f"[{'#' * filled}{'.' * (BAR - filled)}] {finished}/{total}  done {done}  failed {failed}  "
                f"pending {c.get('pending', 0)}  processing {c.get('processing', 0)}  {rate:6.0f} jobs/s "
            )
            if terminal:  # one line redrawn in place
                sys.stdout.write("\r" + line)
                sys.stdout.flush()
            elif finished >= total or t - last_line >= LINE_EVERY_SECONDS:  # a log or a pipe: plain lines
                print(line.rstrip(), flush=True)
                last_line = t
            if finished >= total:
                return 0 if failed == poison else 1
            if all(p.poll() is not None for p in procs):
                print("\nall workers exited early", file=sys.stderr)
                return 1
            if t > deadline:
                print("\ndemo did not finish within 300 s", file=sys.stderr)
                return 1
            time.sleep(0.25)
