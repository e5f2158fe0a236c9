"""Instructions a producer executes per enqueue, counted by callgrind: the client's side of a single enqueue (what a
web request pays) measured free of the noise of a shared machine.

A producer process runs under ``valgrind --tool=callgrind`` with counting off; it connects, warms up (its
statements prepared, its pool full), then counts N calls of one mode:

- ``plain``: the ceiling of ``run.py``'s enqueue case, an INSERT and its NOTIFY in one prepared statement on a
  plain autocommit connection (the payload already JSON text);
- ``pool``: ``Queue.enqueue(queue, payload)`` on the pool a ``Queue(dsn)`` makes (autocommit);
- ``userpool``: the same on a pool of the caller's (``Queue(pool=...)``, not autocommit), as ``run.py`` does;
- ``conn``: ``Queue.enqueue(..., conn=)`` in the caller's transaction (committed every 100 calls);
- ``many``: ``enqueue_many`` of 100 payloads a call (the COPY path), counted per job;
- ``many-keys``: the same with an idempotency key each (the INSERT path), per job.

    .venv/bin/python bench/enqueue_instructions.py                        # every mode, this tree
    .venv/bin/python bench/enqueue_instructions.py --ref 9f63a69          # and that commit's, alternated
    .venv/bin/python bench/enqueue_instructions.py --modes plain,pool --calls 5000

Prints JSON lines (one per run, then the medians) and a table; needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import callgrind

MODES = ("plain", "pool", "userpool", "conn", "many", "many-keys")
BATCH = 100  # payloads a call of enqueue_many; calls a transaction of ``conn``
WARM = 50
QUEUE = "bench"


# ---------------------------------------------------------------------------------------------- the producer
def producer(mode: str, dsn: str, schema: str, calls: int) -> None:
    """Warm up, say ``ready``, wait for ``go``, make ``calls`` calls, say ``done``, wait for ``exit``."""
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool

    from skiplock import Queue, Settings

    settings = Settings.load(env={}, dsn=dsn, schema=schema)
    keys = iter(range(10**9))
    closers: list[Any] = []
    if mode == "plain":
        auto = psycopg.connect(dsn, autocommit=True)
        closers.append(auto)
        insert_notify = sql.SQL(
            "WITH j AS (INSERT INTO {}.jobs (queue, payload) VALUES (%s, %s::jsonb) RETURNING id) "
            "SELECT j.id, pg_notify(%s, %s) FROM j"
        ).format(sql.Identifier(schema))
        channel = settings.channel

        def call(i: int) -> None:
            auto.execute(insert_notify, (QUEUE, f'{{"n":{i}}}', channel, QUEUE), prepare=True).fetchone()

    elif mode == "userpool":
        pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=2, open=True)
        pool.wait()
        closers.append(pool)
        q = Queue(pool=pool, settings=settings)

        def call(i: int) -> None:
            q.enqueue(QUEUE, {"n": i})

    else:
        q = Queue(settings=settings)
        closers.append(q)
        conn = psycopg.connect(dsn)
        closers.append(conn)
        if mode == "pool":

            def call(i: int) -> None:
                q.enqueue(QUEUE, {"n": i})

        elif mode == "conn":

            def call(i: int) -> None:
                q.enqueue(QUEUE, {"n": i}, conn=conn)
                if i % BATCH == BATCH - 1:
                    conn.commit()

        elif mode == "many":

            def call(i: int) -> None:
                q.enqueue_many(QUEUE, [{"n": i, "k": k} for k in range(BATCH)])

        elif mode == "many-keys":

            def call(i: int) -> None:
                q.enqueue_many(
                    QUEUE,
                    [{"n": i, "k": k} for k in range(BATCH)],
                    idempotency_keys=[str(next(keys)) for _ in range(BATCH)],
                )

        else:
            raise SystemExit(f"unknown mode {mode!r}")

    for i in range(-WARM, 0):
        call(i)
    if mode == "conn":
        conn.commit()
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(calls):
        call(i)
    print("done", flush=True)
    sys.stdin.readline()
    if mode == "conn":
        conn.commit()
    for c in reversed(closers):
        c.close()


# ---------------------------------------------------------------------------------------------- the harness
def count(dsn: str, schema: str, mode: str, calls: int, src: str | None) -> int:
    """Instructions (callgrind's Ir) of ``calls`` calls of ``mode`` by a producer on ``src`` (None: this tree)."""
    import scenario

    env = scenario._env({}, src)
    args = [sys.executable, str(Path(__file__).resolve()), "--producer", mode, "--dsn", dsn, "--schema", schema]
    proc = subprocess.Popen(
        [*callgrind.command(), *args, "--calls", str(calls)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def expect(word: str) -> None:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != word:
            proc.kill()
            _, err = proc.communicate(timeout=60)
            raise RuntimeError(f"producer ({mode}) said {line!r}, not {word!r}:\n{err[-3000:]}")

    try:
        expect("ready")
        callgrind.counting(proc.pid, True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        expect("done")
        callgrind.counting(proc.pid, False)
        _, err = proc.communicate("exit\n", timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = callgrind.collected(err)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"producer ({mode}) exited {proc.returncode} without a count:\n{err[-3000:]}")
    return found


def per_unit(mode: str, calls: int) -> int:
    """What a count is divided by: jobs for ``many*``, calls for the others."""
    return calls * BATCH if mode.startswith("many") else calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="use this server, not a private one")
    p.add_argument("--calls", type=int, default=2000, help="calls counted per run (default 2,000; many*: 200)")
    p.add_argument("--repeat", type=int, default=1, help="runs per mode and variant, alternated (default 1)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--ref", help="also count this commit's worker/ (git ref, or a directory holding skiplock/)")
    p.add_argument("--producer", help=argparse.SUPPRESS)
    p.add_argument("--schema", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.producer:
        producer(a.producer, a.dsn, a.schema, a.calls)
        return 0
    modes = [m for m in a.modes.split(",") if m]
    if bad := set(modes) - set(MODES):
        p.error(f"unknown mode(s) {', '.join(sorted(bad))}")
    if not callgrind.installed():
        print(callgrind.MISSING, file=sys.stderr)
        return 2
    import run
    import scenario

    variants = callgrind.variants(a.ref)
    results: dict[tuple[str, str], list[float]] = {}
    with run.database(a.dsn) as srv:
        cfg = scenario.drain_config(srv, 0)
        try:
            schemas = {name: scenario.new_schema(cfg, "enqi", src) for name, src in variants}
            for rep in range(a.repeat):
                for mode in modes:
                    calls = max(1, a.calls // 10) if mode.startswith("many") else a.calls
                    for name, src in variants:
                        if mode == "plain" and name != "tree":
                            continue  # the ceiling is the same SQL whatever the tree
                        t = time.monotonic()
                        value = count(srv.dsn, schemas[name], mode, calls, src) / per_unit(mode, calls)
                        results.setdefault((mode, name), []).append(value)
                        record: dict[str, Any] = {"type": "run", "mode": mode, "variant": name, "rep": rep + 1}
                        print(json.dumps(record | {"calls": calls, "instructions": round(value)}), flush=True)
                        took = time.monotonic() - t
                        print(f"  [{rep + 1}/{a.repeat}] {mode} {name}: {value:,.0f} ({took:.0f}s)", file=sys.stderr)
        finally:
            scenario.drop_schemas(cfg)
    medians = {key: statistics.median(values) for key, values in results.items()}
    plain = medians.get(("plain", "tree"))
    for (mode, name), value in medians.items():
        record = {"type": "median", "mode": mode, "variant": name, "instructions": round(value)}
        if plain and not mode.startswith("many"):
            record["x_plain"] = round(value / plain, 3)
        print(json.dumps(record))
    print("\n| mode | variant | instructions (median) | x plain | runs |\n|---|---|---:|---:|---|")
    for (mode, name), value in medians.items():
        unit = " a job" if mode.startswith("many") else " a call"
        ratio = f"{value / plain:.2f}x" if plain and not mode.startswith("many") else ""
        runs = ", ".join(f"{v:,.0f}" for v in results[(mode, name)])
        print(f"| {mode} | {name} | {value:,.0f}{unit} | {ratio} | {runs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
