"""The producer contract (issue 37, items 1 and 2): a producer writing plain SQL cannot store a value a worker, the
stats or the operator cannot handle; the client API and the CLI refuse the same values with a clear error; and where
a row outside the bounds exists all the same (a schema whose constraint was dropped), the worker fails that one job,
the stats and the operator's backlog queries still answer.

Every insertable column of the producer role (``ENQUEUE_COLUMNS``) has its extreme values here, against a real
PostgreSQL, inserted by a real producer role."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from skiplock import Queue
from skiplock.app import App
from skiplock.errors import ConfigError, EnqueueError
from skiplock.grant import ENQUEUE_COLUMNS, PRODUCER_READ_COLUMNS, apply_grants
from skiplock.job import Job
from skiplock.migrate import migrate
from skiplock.store import validation
from skiplock.store.run import execute
from skiplock.store.statements import Statements
from skiplock.worker import Worker, loops
from support.pg import await_for, drop_schema, migrate_to
from support.roles import login_roles

YEAR = 365 * 86400  # the longest timeout_seconds (one year)
REFUSED = "refused"
STORED = "stored"

# (column, SQL value, expected). Each row is one INSERT by the producer role with that column set (the others at
# their defaults, except that unique_states needs a unique_key and the reverse).
CASES: list[tuple[str, str, str]] = [
    ("queue", "''", REFUSED),
    ("queue", "repeat('q', 129)", REFUSED),
    ("queue", "repeat('q', 128)", STORED),
    ("payload", "jsonb_build_object('a', repeat('x', 1100000))", REFUSED),
    ("payload", "'null'", STORED),
    ("payload", "'[]'", STORED),
    ("payload", "NULL", REFUSED),
    ("priority", "-32768", STORED),
    ("priority", "32767", STORED),
    ("priority", "32768", REFUSED),
    ("priority", "-32769", REFUSED),
    ("max_attempts", "0", REFUSED),
    ("max_attempts", "-1", REFUSED),
    ("max_attempts", "1", STORED),
    ("max_attempts", "1000", STORED),
    ("max_attempts", "1001", REFUSED),
    ("max_attempts", "2147483647", REFUSED),
    ("visible_at", "'infinity'", REFUSED),
    ("visible_at", "'-infinity'", REFUSED),
    ("visible_at", "'0044-03-15 BC'", REFUSED),
    ("visible_at", "'294276-01-01'", REFUSED),
    ("visible_at", "'1969-12-31 23:59:59+00'", REFUSED),
    ("visible_at", "'1970-01-01 00:00:00+00'", STORED),
    ("visible_at", "'2999-12-31 23:59:59+00'", STORED),
    ("visible_at", "'3000-01-01 00:00:00+00'", REFUSED),
    ("visible_at", "now() - interval '10 years'", STORED),
    ("visible_at", "NULL", REFUSED),
    ("idempotency_key", "''", REFUSED),
    ("idempotency_key", "repeat('k', 255)", STORED),
    ("idempotency_key", "repeat('k', 256)", REFUSED),
    ("task", "''", REFUSED),
    ("task", "repeat('t', 200)", STORED),
    ("task", "repeat('t', 201)", REFUSED),
    ("timeout_seconds", "'NaN'", REFUSED),
    ("timeout_seconds", "'Infinity'", REFUSED),
    ("timeout_seconds", "'-Infinity'", REFUSED),
    ("timeout_seconds", "0", REFUSED),
    ("timeout_seconds", "-1", REFUSED),
    ("timeout_seconds", "1e-3", STORED),
    ("timeout_seconds", f"{YEAR}", STORED),
    ("timeout_seconds", f"{YEAR + 1}", REFUSED),
    ("timeout_seconds", "1e13", REFUSED),
    ("timeout_seconds", "1e300", REFUSED),
    ("timeout_seconds", "NULL", STORED),
    ("unique_key", "''", REFUSED),
    ("unique_key", "repeat('u', 512)", STORED),
    ("unique_key", "repeat('u', 513)", REFUSED),
    ("unique_key", "NULL", STORED),
    ("unique_states", "'{processing}'", REFUSED),
    ("unique_states", "'{pending}'", REFUSED),
    ("unique_states", "'{done}'", REFUSED),
    ("unique_states", "'{}'", REFUSED),
    ("unique_states", "'{pending,processing,bogus}'", REFUSED),
    ("unique_states", "'{pending,processing,NULL}'", REFUSED),
    ("unique_states", "'{{pending,processing},{done,failed}}'", REFUSED),
    ("unique_states", "'{pending,processing,pending,processing,pending,processing}'", REFUSED),
    ("unique_states", "NULL", REFUSED),  # with a unique key
    ("unique_states", "'{pending,processing}'", STORED),
    ("unique_states", "'{pending,processing,done,failed,cancelled}'", STORED),
    ("serial_key", "''", REFUSED),
    ("serial_key", "repeat('s', 255)", STORED),
    ("serial_key", "repeat('s', 256)", REFUSED),
    ("serial_skip_on_retry", "true", STORED),
    ("serial_skip_on_retry", "NULL", REFUSED),
]


def test_every_insertable_column_has_its_extreme_values_here():
    """A column the producer role may insert (a new one included) cannot be left out of this contract."""
    covered = {column for column, _, _ in CASES}
    assert set(ENQUEUE_COLUMNS) <= covered, f"no extreme values for {sorted(set(ENQUEUE_COLUMNS) - covered)}"
    for column in ENQUEUE_COLUMNS:
        outcomes = {expected for c, _, expected in CASES if c == column}
        assert REFUSED in outcomes or column in {"payload"}, f"{column}: no refused value"


@pytest.fixture(scope="module")
def producer(pg_dsn: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """One migrated schema and a producer role for every case (one role set: creating roles per case is slow)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, schema)
    with login_roles(pg_dsn, schema) as roles:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            apply_grants(conn, schema, producer=roles.producer)
        with psycopg.connect(roles.dsn(pg_dsn, roles.producer)) as conn:
            yield conn, schema


@pytest.mark.parametrize(("column", "value", "expected"), CASES, ids=[f"{c}={v[:40]}" for c, v, _ in CASES])
def test_a_plain_sql_producer_stores_only_what_a_worker_can_handle(producer, column, value, expected):
    conn, schema = producer
    values = {"queue": "'q'", "payload": "'{}'"}
    if column == "unique_states":
        values["unique_key"] = "'k-' || gen_random_uuid()"
    elif column == "unique_key" and value != "NULL":
        values["unique_states"] = "'{pending,processing}'"
    values[column] = value
    statement = sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
        sql.Identifier(schema, "jobs"),
        sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ".join(values.values())),  # the case's literal SQL: no parameter, what a producer would type
    )
    try:
        if expected == REFUSED:
            # check (23514), not null (23502) or out of a type's range (22003, 22008): nothing stored either way
            with pytest.raises((errors.CheckViolation, errors.NotNullViolation, psycopg.DataError)):
                conn.execute(statement)
        else:
            row = conn.execute(statement).fetchone()
            assert row is not None
            # what the producer may read back loads in Python (visible_at among it)
            conn.execute(
                sql.SQL("SELECT {} FROM {} WHERE id = %s").format(
                    sql.SQL(", ").join(map(sql.Identifier, PRODUCER_READ_COLUMNS)), sql.Identifier(schema, "jobs")
                ),
                row,
            ).fetchone()
    finally:
        conn.rollback()


# --------------------------------------------------------------------------------------------- client API and CLI
@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"timeout_seconds": 1e300}, "timeout_seconds"),
        ({"timeout_seconds": YEAR + 1}, "timeout_seconds"),
        ({"timeout_seconds": math.inf}, "timeout_seconds"),
        ({"timeout_seconds": math.nan}, "timeout_seconds"),
        ({"run_at": datetime(1969, 12, 31, tzinfo=UTC)}, "run_at"),
        ({"run_at": datetime(3000, 1, 1, tzinfo=UTC)}, "run_at"),
        ({"run_at": datetime(2999, 12, 31, tzinfo=UTC), "delay": 2 * 86400}, "run_at"),
        ({"run_at": datetime.max.replace(tzinfo=UTC)}, "run_at"),
        ({"priority": 32768}, "priority"),
        ({"max_attempts": 1001}, "max_attempts"),
        ({"unique_key": "k", "unique_states": ["processing"]}, "unique_states"),
    ],
)
def test_the_client_refuses_what_the_database_would(queue: Queue, options, fragment):
    with pytest.raises(EnqueueError, match=fragment):
        queue.enqueue("q", {}, **options)
    if "timeout_seconds" not in options:  # enqueue_many takes no timeout of its own
        with pytest.raises(EnqueueError, match=fragment):
            if "unique_key" in options:
                queue.enqueue_many("q", [{}], unique_keys=["k"], unique_states=options["unique_states"])
            else:
                queue.enqueue_many("q", [{}, {}], **options)
    assert queue.stats() == [], "nothing was written"


def test_the_client_keeps_the_bounds_of_the_database():
    assert validation.TIMEOUT_SECONDS_MAX == YEAR
    assert (datetime(1970, 1, 1, tzinfo=UTC), datetime(3000, 1, 1, tzinfo=UTC)) == validation.VISIBLE_AT_RANGE


def test_a_task_cannot_declare_a_timeout_a_worker_cannot_keep():
    app = App()
    for bad in (math.nan, math.inf, 1e300):
        with pytest.raises(ConfigError, match="timeout_seconds"):

            @app.task(name=f"t{bad}", timeout_seconds=bad)
            def handler(job: Job) -> None: ...


def _cli(pg_dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skiplock", *args, "--dsn", pg_dsn, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (("--timeout", "1e300"), "--timeout"),
        (("--timeout", "nan"), "--timeout"),
        (("--timeout", "0"), "--timeout"),
        (("--priority", "40000"), "--priority"),
        (("--delay", "1e300"), "--delay"),
        (("--max-attempts", "1001"), "--max-attempts"),
    ],
)
def test_the_cli_refuses_out_of_bound_options_with_a_clear_error(pg_dsn, schema, flags, fragment):
    out = _cli(pg_dsn, schema, "enqueue", "--payload", "{}", *flags)
    assert out.returncode == 2, out
    assert fragment in out.stderr and "Traceback" not in out.stderr, out.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "jobs"))).fetchone() == (
            0,
        )


# --------------------------------------------------------------------------------- rows outside the bounds anyway
def _unbound(pg_dsn: str, schema: str) -> psycopg.Connection[Any]:
    """The owner's connection to a schema whose producer bounds were dropped (as a database restored from an old
    dump, or edited by hand, could be): the rows below can then be stored, and everything else must cope."""
    conn = psycopg.connect(pg_dsn, autocommit=True)
    for domain, name in (
        ("job_timeout_seconds", "jobs_timeout_bound_check"),
        ("job_visible_at", "jobs_visible_at_check"),
        ("job_unique_states", "jobs_unique_states_check"),
    ):  # the columns' bounds live on their domains (migration 0021)
        conn.execute(
            sql.SQL("ALTER DOMAIN {} DROP CONSTRAINT IF EXISTS {}").format(
                sql.Identifier(schema, domain), sql.Identifier(name)
            )
        )
    return conn


def _insert(conn: psycopg.Connection[Any], schema: str, columns: dict[str, str]) -> int:
    values = {"queue": "'q'", "payload": "'{}'", **columns}
    row = conn.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
            sql.Identifier(schema, "jobs"),
            sql.SQL(", ").join(map(sql.Identifier, values)),
            sql.SQL(", ".join(values.values())),
        )
    ).fetchone()
    assert row is not None
    return int(row[0])


def _statuses(conn: psycopg.Connection[Any], schema: str) -> dict[int, tuple[str, str | None]]:
    rows = conn.execute(
        sql.SQL("SELECT id, status, last_error FROM {}").format(sql.Identifier(schema, "jobs"))
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_timeout_the_worker_cannot_keep_fails_that_job_only(pg_dsn, schema, settings, kind, loop):
    """NaN, infinite and huge timeouts (issue 37: `call_later(nan)` killed the process; a huge one overflowed the
    heartbeat and every lease of the worker expired): each such job fails without running, the others run, the
    worker stops cleanly."""
    pytest.importorskip(loop)
    with _unbound(pg_dsn, schema) as conn:
        bad = [
            _insert(conn, schema, {"task": "'t'", "timeout_seconds": v})
            for v in ("'NaN'", "'Infinity'", "1e300", "1e13", "-5")
        ]
        good = [_insert(conn, schema, {"task": "'t'", "timeout_seconds": "30"}) for _ in range(3)]
        good += [_insert(conn, schema, {"task": "'t'"}) for _ in range(3)]
    app = App()
    ran: list[int] = []
    if kind == "sync":

        @app.task(name="t", queue="q")
        def t(job: Job) -> None:
            ran.append(job.id)
    else:

        @app.task(name="t", queue="q")
        async def t(job: Job) -> None:  # type: ignore[misc]
            ran.append(job.id)

    async def run() -> None:
        worker = Worker(app, settings=settings.replace(poll_seconds=0.2, concurrency=4))
        async with worker:
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                await await_for(
                    lambda: all(s != "pending" and s != "processing" for s, _ in _statuses(c, schema).values()),
                    timeout=20,
                    what="every job finished",
                )
        # leaving the context stopped the worker: it did not hang on a job

    loops.run(run(), loop)
    with psycopg.connect(pg_dsn) as c:
        found = _statuses(c, schema)
    assert sorted(ran) == sorted(good), "every good job ran once, no bad one ran"
    for job_id in bad:
        status, error = found[job_id]
        assert status == "failed" and error is not None and "timeout_seconds" in error, found[job_id]
    assert {found[i][0] for i in good} == {"done"}


def test_two_pending_holders_of_one_unique_key_do_not_stop_the_queue(pg_dsn, schema, settings):
    """Issue 37: two rows with one unique key and unique_states {processing} both insert (outside the unique index
    while pending); the claim that takes both hit UniqueViolation, retried as transient: nothing ran again. Now the
    worker fails the one that cannot hold the key and runs every other job."""
    with _unbound(pg_dsn, schema) as conn:
        dup = [
            _insert(conn, schema, {"task": "'t'", "unique_key": "'k'", "unique_states": "'{processing}'"})
            for _ in range(2)
        ]
        others = [_insert(conn, schema, {"task": "'t'", "queue": f"'{q}'"}) for q in ("q", "r") for _ in range(5)]
    app = App()

    @app.task(name="t", queue="q")
    def t(job: Job) -> None:
        return None

    async def run() -> None:
        worker = Worker(app, settings=settings.replace(poll_seconds=0.2, concurrency=8, queues=("q", "r")))
        async with worker:
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                await await_for(
                    lambda: all(s in ("done", "failed") for s, _ in _statuses(c, schema).values()),
                    timeout=20,
                    what="every job finished",
                )

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as c:
        found = _statuses(c, schema)
    assert {found[i][0] for i in others} == {"done"}
    assert sorted(found[i][0] for i in dup) == ["done", "failed"], found
    failed = next(found[i] for i in dup if found[i][0] == "failed")
    assert failed[1] is not None and "unique" in failed[1]


def test_a_heartbeat_survives_any_timeout(pg_dsn, schema, settings, queue: Queue):
    """The heartbeat computed `updated_at + timeout`: past about 1e13 s that overflowed ("timestamp out of range")
    and every lease of the worker expired. Whatever a timeout holds, the leases are renewed (100 s after the claim,
    by the heartbeat's clock: past none of these timeouts)."""
    timeouts = [1e300, math.inf, math.nan, 1e13, None, float(YEAR)]
    ids = [queue.enqueue("q", {"n": n}).id for n in range(len(timeouts))]
    jobs = queue.claim("q", limit=len(ids), worker="w")
    assert sorted(j.id for j in jobs) == sorted(ids)
    later = datetime.now(UTC) + timedelta(seconds=100)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        held = execute(conn, Statements(settings).heartbeat(jobs, "w", [30.0] * len(jobs), later, timeouts))
        assert held == set(ids)
        deadlines = conn.execute(
            sql.SQL("SELECT lease_expires_at - %s FROM {} WHERE status = 'processing'").format(
                sql.Identifier(schema, "jobs")
            ),
            (later,),
        ).fetchall()
    assert len(deadlines) == len(ids)
    assert all(d[0] == timedelta(seconds=30) for d in deadlines), deadlines


def test_stats_and_the_operators_backlog_queries_answer_with_infinite_visible_at(pg_dsn, schema, settings, queue):
    """Issue 37, item 2: one row with visible_at 'infinity' made the operator's backlog query fail ("cannot subtract
    infinite timestamps": the JobQueue kept its replicas, 0 with 50 ready jobs) and `skiplock stats` exit with a
    traceback. The queries answer, and the ready jobs are counted."""
    with _unbound(pg_dsn, schema) as conn:
        for value in ("'infinity'", "'-infinity'", "'0044-03-15 BC'", "'294276-01-01'"):
            _insert(conn, schema, {"visible_at": value})
    for n in range(5):
        queue.enqueue("q", {"n": n})
    (stats,) = queue.stats()
    assert (stats.ready, stats.delayed) == (7, 2), stats
    assert math.isfinite(stats.oldest_ready_age_seconds) and stats.next_due is not None
    s = Statements(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        due = execute(conn, s.queue_next_due(["q"]))
        assert due is not None and math.isfinite(due)
        soon, first = execute(conn, s.queue_due_soon(["q"], 60.0, 600.0))
        assert soon == 0 and first is not None and math.isfinite(first)
        arrived, _, cursor = execute(conn, s.queue_flow(["q"], None))
        execute(conn, s.queue_flow(["q"], cursor))
        assert arrived == 0
    out = _cli(pg_dsn, schema, "stats", "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout)


def test_the_migration_repairs_rows_written_before_the_bounds(pg_dsn):
    """Rows stored before migration 0015 are brought inside the bounds (a constraint added NOT VALID would still
    refuse the claim that updates them: the queue would stop) and each repaired row says so in last_error."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            migrate_to(conn, schema, 14)
            nan = _insert(conn, schema, {"timeout_seconds": "'NaN'"})
            huge = _insert(conn, schema, {"timeout_seconds": "1e300"})
            early = _insert(conn, schema, {"visible_at": "'-infinity'"})
            late = _insert(conn, schema, {"visible_at": "'infinity'"})
            holder = _insert(conn, schema, {"unique_key": "'k'", "unique_states": "'{processing}'"})
            duplicate = _insert(conn, schema, {"unique_key": "'k'", "unique_states": "'{processing}'"})
            done = _insert(conn, schema, {"unique_key": "'d'", "unique_states": "'{done}'"})
            fine = _insert(conn, schema, {"timeout_seconds": "60"})
            report = migrate(conn, schema)
            assert report.applied[0].startswith("0015_")
            rows = {
                r[0]: r[1:]
                for r in conn.execute(
                    sql.SQL(
                        "SELECT id, status, timeout_seconds, visible_at, unique_key, unique_states, last_error FROM {}"
                    ).format(sql.Identifier(schema, "jobs"))
                )
            }
            invalid = conn.execute(  # on the table or, since migration 0021, on the columns' domains
                "SELECT conname FROM pg_constraint WHERE NOT convalidated"
                " AND (conrelid = %s::regclass"
                "      OR contypid IN (SELECT oid FROM pg_type WHERE typnamespace = %s::regnamespace))"
                " AND conname IN ('jobs_timeout_bound_check', 'jobs_visible_at_check', 'jobs_unique_states_check')",
                (f'"{schema}".jobs', f'"{schema}"'),
            ).fetchall()
    finally:
        drop_schema(pg_dsn, schema)
    assert invalid == [], "the new bounds hold for every row"
    assert rows[nan][1] is None and "timeout_seconds" in rows[nan][5]
    assert rows[huge][1] == YEAR and "timeout_seconds" in rows[huge][5]
    assert rows[early][2] == datetime(1970, 1, 1, tzinfo=UTC) and "visible_at" in rows[early][5]
    assert rows[late][2] < datetime(3000, 1, 1, tzinfo=UTC) and "visible_at" in rows[late][5]
    assert rows[holder][0] == "pending" and rows[holder][4] == ["pending", "processing"]
    assert rows[duplicate][0] == "failed" and rows[duplicate][3] is None and "unique" in rows[duplicate][5]
    assert rows[done][4] == ["pending", "processing", "done"]
    assert rows[fine][5] is None and rows[fine][1] == 60


def test_a_claim_takes_rows_whose_times_python_cannot_read(pg_dsn, schema, queue: Queue):
    """'-infinity' and BC dates cannot be read by Python: the claim that returned one failed, its jobs leased and
    stranded until the orphan hand-back, and claimed again. The claim returns them within the bounds."""
    with _unbound(pg_dsn, schema) as conn:
        conn.execute(
            sql.SQL("ALTER DOMAIN {} DROP CONSTRAINT IF EXISTS jobs_created_at_check").format(
                sql.Identifier(schema, "job_created_at")
            )
        )
        odd = [_insert(conn, schema, {"visible_at": v}) for v in ("'-infinity'", "'0044-03-15 BC'")]
        odd.append(_insert(conn, schema, {"created_at": "'infinity'"}))
    fine = queue.enqueue("q", {}).id
    jobs = queue.claim("q", limit=10, worker="w")
    assert sorted(j.id for j in jobs) == sorted([*odd, fine])
    floor = datetime(1970, 1, 1, tzinfo=UTC)
    assert all(j.visible_at is not None and j.visible_at >= floor for j in jobs)
    assert all(j.created_at is not None and j.created_at <= datetime(3000, 1, 1, tzinfo=UTC) for j in jobs)
