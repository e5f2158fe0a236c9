"""Instructions a PostgreSQL backend executes per job of a claim-and-complete loop, counted by callgrind: what the
jobs table and the statements cost inside the server, free of the noise of a shared machine.

A throw-away cluster (pgserver's binaries) holds one schema per variant. Each variant then drains N jobs in
single-user mode under ``valgrind --tool=callgrind``: a procedure claims up to 200 jobs with the design source's
claim (``FOR UPDATE SKIP LOCKED``) and completes the previous 200 by ``id = ANY``, one transaction a batch, every
statement planned generically (as a worker's prepared statements are); a second run that only seeds the jobs is
subtracted. Variants:

- ``honest``: the design source's table and claim (``seed_baseline.HONEST_SCHEMA``; claim order ``visible_at``);
- ``skiplock``: skiplock's migrated table, the same loop in skiplock's claim order, setting the lease deadline as
  skiplock's claim does;
- ``no-checks``: that table without its CHECK constraints (nor its columns' domains'); ``no-idle-indexes``: without
  the indexes a no-op job never writes (all but the primary key, claim, lease-deadline and done indexes);
- ``statement``: skiplock's own complete-and-claim (``job_complete_and_claim_unlimited_one``, the statement of a
  drain of one queue without flow limits) on its table.

Any variant may end in ``-ffN`` (``statement-ff70``): the same with the table's ``fillfactor`` set to N before seeding
(skiplock's table has 85 since 0001, the honest table PostgreSQL's default of 100).

    .venv/bin/python bench/backend_instructions.py                     # every variant, 10,000 jobs
    .venv/bin/python bench/backend_instructions.py --variants honest,statement --jobs 20000
    .venv/bin/python bench/backend_instructions.py --variants skiplock,statement --keep-callgrind /tmp/cg

Prints one JSON line a variant and a table; needs valgrind. A variant takes about a minute.
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
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from seed_baseline import HONEST_SCHEMA

from skiplock.migrate import migrate
from skiplock.sql import queries_for

COLLECTED = re.compile(r"Collected : (\d+)")
HOT_INDEXES = {"jobs_pkey", "jobs_claim_idx", "jobs_lease_deadline_idx", "jobs_done_idx"}

# The loop: claim a batch, complete the previous one, commit; generic plans as a worker's prepared statements.
LOOP = """
CREATE PROCEDURE {s}.drain() LANGUAGE plpgsql AS $p$
DECLARE ids bigint[]; prev bigint[];
BEGIN
  LOOP
    IF prev IS NOT NULL THEN UPDATE {s}.jobs SET status = 'done', updated_at = now() WHERE id = ANY(prev); END IF;
    WITH picked AS (SELECT id FROM {s}.jobs WHERE queue = 'bench' AND status = 'pending' AND visible_at <= now()
                    ORDER BY {order} LIMIT 200 FOR UPDATE SKIP LOCKED),
         u AS (UPDATE {s}.jobs j SET status = 'processing', attempts = j.attempts + 1, locked_by = 'w:1',
                      locked_at = now(), updated_at = now(){lease}
               WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING j.id, j.payload)
    SELECT array_agg(id) INTO ids FROM u;
    COMMIT;
    EXIT WHEN ids IS NULL;
    prev := ids;
  END LOOP;
END $p$
"""

# skiplock's statement in the same loop: its parameters become typed variables (psycopg sends them untyped, so the
# server reads each as the type its cast names, once).
STATEMENT_LOOP = """
CREATE PROCEDURE {s}.drain() LANGUAGE plpgsql AS $p$
DECLARE p_ids bigint[] := '{{}}'; p_attempts integer[] := '{{}}'; p_worker text := 'w:1'; p_now timestamptz;
        p_lease_seconds float8 := 30; p_leases jsonb; p_queues text[] := '{{bench}}'; p_limit integer := 200;
        r record; got bigint[]; n integer;
BEGIN
  LOOP
    got := '{{}}';
    FOR r IN {statement} LOOP
      IF r.completed IS NULL THEN got := got || r.id; END IF;
    END LOOP;
    COMMIT;
    n := cardinality(got);
    EXIT WHEN n = 0 AND cardinality(p_ids) = 0;
    p_ids := got;
    p_attempts := array_fill(1, ARRAY[n]);
  END LOOP;
END $p$
"""
PARAMS = ("ids", "attempts", "worker", "now", "lease_seconds", "leases", "queues", "limit")
SKIPLOCK_ORDER, LEASE = "priority DESC, visible_at, id", ",\n lease_expires_at = now() + interval '30 seconds'"


def _drop(conn: psycopg.Connection[Any], schema: str, kind: str, keep: Callable[[str], bool]) -> None:
    """Drop the CHECK constraints (``kind`` "c": the table's and its columns' domains') or the indexes ("i") of
    ``schema``.jobs that ``keep`` refuses."""
    jobs = f"{schema}.jobs"
    if kind == "c":
        rows = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'", (jobs,)
        ).fetchall()
        for (name,) in rows:
            if not keep(name):
                table, constraint = sql.Identifier(schema, "jobs"), sql.Identifier(name)
                conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, constraint))
        domains = conn.execute(
            "SELECT t.typname, c.conname FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid"
            " JOIN pg_constraint AS c ON c.contypid = t.oid WHERE a.attrelid = %s::regclass AND t.typtype = 'd'",
            (jobs,),
        ).fetchall()
        for domain, name in domains:
            if not keep(name):
                conn.execute(
                    sql.SQL("ALTER DOMAIN {} DROP CONSTRAINT {}").format(
                        sql.Identifier(schema, domain), sql.Identifier(name)
                    )
                )
    else:
        rows = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
            (jobs,),
        ).fetchall()
        for (name,) in rows:
            if not keep(name):
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))


def statement_loop(schema: str) -> str:
    text = str(queries_for(schema).job_complete_and_claim_unlimited_one).rstrip().rstrip(";")
    for name in PARAMS:
        text = text.replace(f"%({name})s", f"p_{name}")
    assert "%(" not in text, "a parameter of the statement has no variable here"
    return STATEMENT_LOOP.format(s=schema, statement=text.replace("%%", "%"))


FILLFACTOR = re.compile(r"-ff(\d+)$")


def prepare(conn: psycopg.Connection[Any], variant: str) -> None:
    """Create the variant's schema, table and ``drain()`` procedure (``-ffN``: with that fillfactor)."""
    s = "v_" + variant.replace("-", "_")
    fill = FILLFACTOR.search(variant)
    base = variant if fill is None else variant[: fill.start()]
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))
    if base == "honest":
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(s)))
        conn.execute(HONEST_SCHEMA.format(schema=s))
        conn.execute(LOOP.format(s=s, order="visible_at", lease=""))
    else:
        migrate(conn, s)
        if base == "no-checks":
            _drop(conn, s, "c", lambda name: False)
        elif base == "no-idle-indexes":
            _drop(conn, s, "i", lambda name: name in HOT_INDEXES)
        conn.execute(statement_loop(s) if base == "statement" else LOOP.format(s=s, order=SKIPLOCK_ORDER, lease=LEASE))
    if fill is not None:
        table, value = sql.Identifier(s, "jobs"), sql.Literal(int(fill.group(1)))
        conn.execute(sql.SQL("ALTER TABLE {} SET (fillfactor = {})").format(table, value))


def count(postgres: Path, pgdata: Path, user: str | None, out: Path, schema: str, jobs: int, loop: bool) -> int:
    """Instructions of a single-user backend seeding ``jobs`` jobs and, with ``loop``, draining them."""
    script = (
        f"TRUNCATE {schema}.jobs\n"
        f"INSERT INTO {schema}.jobs (queue, payload) SELECT 'bench', jsonb_build_object('i', g) "
        f"FROM generate_series(1, {jobs}) AS g\n"
        f"VACUUM ANALYZE {schema}.jobs\nCHECKPOINT\n"
        + (f"SET plan_cache_mode = force_generic_plan\nCALL {schema}.drain()\n" if loop else "")
    )
    callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    command = [*callgrind, str(postgres), "--single", "-D", str(pgdata), "postgres"]
    env = {**os.environ, "TMPDIR": str(pgdata)}  # valgrind's temporary files, where the server's user may write
    done = subprocess.run(command, input=script, text=True, capture_output=True, user=user, env=env, check=False)
    found = COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None or "ERROR" in done.stdout:
        raise SystemExit(f"{schema}: the backend failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return int(found.group(1))


@contextlib.contextmanager
def cluster() -> Iterator[tuple[Any, Any]]:
    """A throw-away pgserver cluster, running: (its server object, pgserver's commands module)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        pgserver: Any = importlib.import_module("pgserver")
        commands: Any = importlib.import_module("pgserver._commands")
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    srv = pgserver.get_server(Path(tempfile.mkdtemp(prefix="bench-backend-")), cleanup_mode="delete")
    try:
        yield srv, commands
    finally:
        srv.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--variants", default="honest,skiplock,no-checks,no-idle-indexes,statement")
    parser.add_argument("--keep-callgrind", type=Path, metavar="DIR", help="copy each variant's callgrind.out here")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    variants = args.variants.split(",")
    results: dict[str, int] = {}
    with cluster() as (srv, commands):
        with psycopg.connect(srv.get_uri("postgres"), autocommit=True) as conn:
            for variant in variants:
                prepare(conn, variant)
        commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
        postgres = commands.POSTGRES_BIN_PATH / "postgres"
        out = Path(srv.pgdata) / "callgrind.out"
        for variant in variants:
            schema = "v_" + variant.replace("-", "_")
            seeded = count(postgres, srv.pgdata, srv.system_user, out, schema, args.jobs, loop=False)
            drained = count(postgres, srv.pgdata, srv.system_user, out, schema, args.jobs, loop=True)
            if args.keep_callgrind is not None:
                args.keep_callgrind.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out, args.keep_callgrind / f"callgrind.{variant}.out")
            results[variant] = round((drained - seeded) / args.jobs)
            print(
                json.dumps({"variant": variant, "jobs": args.jobs, "instructions_per_job": results[variant]}),
                flush=True,
            )
    base = results.get("honest")
    print("\n| variant | instructions a job | x honest |\n|---|---:|---:|")
    for variant, value in results.items():
        ratio = f"{value / base:.2f}x" if base else "-"
        print(f"| {variant} | {value:,} | {ratio} |")


if __name__ == "__main__":
    main()
