"""The jobs table costs the hot path only what it must (issue 41, migration 0020): no BEFORE UPDATE row trigger (with
one, PostgreSQL locks every row an UPDATE changes before it looks at the trigger's columns, so each completion took a
row lock and wrote a lock record), and what the two moved triggers guarantee still holds for every writer."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from skiplock import Queue
from skiplock.migrate import migrate
from skiplock.settings import Settings
from skiplock.store.statements import Failure
from support.pg import drop_schema, migrate_to
from support.store import WorkerCalls

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ROW, BEFORE, UPDATE = 1, 2, 16  # pg_trigger.tgtype bits


def _fingerprints(pg_dsn: str, schema: str) -> list[tuple]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT id, status, failure_fingerprint, {s}.error_fingerprint(task, last_error) "
                "FROM {s}.jobs ORDER BY id"
            ).format(s=sql.Identifier(schema))
        ).fetchall()


def test_no_before_update_row_trigger_on_jobs(pg_dsn: str, schema: str, queue: Queue) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        triggers = conn.execute(
            "SELECT tgname, tgtype FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname",
            (f'"{schema}".jobs',),
        ).fetchall()
    names = [name for name, _ in triggers]
    assert {"jobs_payload_bound", "jobs_payload_bound_update", "jobs_failure_fingerprint"} <= set(names), names
    before_update = [name for name, kind in triggers if kind & ROW and kind & BEFORE and kind & UPDATE]
    assert before_update == [], f"these lock every row an UPDATE of jobs changes: {before_update}"


def test_a_failed_rows_fingerprint_is_stored_whoever_fails_it(pg_dsn: str, schema: str, queue: Queue) -> None:
    by_worker, by_hand, by_lease, retried = queue.enqueue_many("q", [{}, {}, {}, {}], max_attempts=1)
    jobs = {j.id: j for j in queue.claim("q", limit=4, worker="w", now=T0)}
    queue.fail([Failure(jobs[by_worker], "RuntimeError: order 42 rejected", 0.0, True)], worker="w", now=T0)
    jobs_table = sql.Identifier(schema, "jobs")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET status = 'failed', last_error = 'ValueError: bad row 7' WHERE id = %s").format(
                jobs_table
            ),
            (by_hand,),
        )
        # failed by hand, then again with another error: the second error's fingerprint
        for error in ("KeyError: a", "OSError: b"):
            conn.execute(
                sql.SQL("UPDATE {} SET status = 'failed', last_error = %s WHERE id = %s").format(jobs_table),
                (error, retried),
            )
    WorkerCalls(queue).recover_expired(queue="q", now=T0 + timedelta(days=1))
    rows = {row[0]: row for row in _fingerprints(pg_dsn, schema)}
    for job_id in (by_worker, by_hand, by_lease, retried):
        _, status, stored, expected = rows[job_id]
        assert status == "failed" and stored == expected and len(stored) == 16, rows[job_id]
    assert len({rows[i][2] for i in (by_worker, by_hand, retried)}) == 3


# ------------------------------------------------------------------------- bounds as domains (migration 0021)
# Each bound of a column the claim and the completion never write, as (column, a value outside it, its name): a
# domain constraint now, checked when the column is written, not on every row version.
DOMAIN_BOUNDS = [
    ("queue", "''", "jobs_queue_check"),
    ("payload", "jsonb_build_object('x', repeat('y', 1100000))", "jobs_payload_size_check"),
    ("task", "repeat('t', 201)", "jobs_task_check"),
    ("idempotency_key", "''", "jobs_idempotency_key_check"),
    ("unique_key", "repeat('k', 513)", "jobs_unique_key_check"),
    ("unique_states", "'{pending}'", "jobs_unique_states_check"),
    ("serial_key", "''", "jobs_serial_key_check"),
    ("max_attempts", "0", "jobs_max_attempts_bound_check"),
    ("max_attempts", "1001", "jobs_max_attempts_bound_check"),
    ("timeout_seconds", "'NaN'", "jobs_timeout_bound_check"),
    ("timeout_seconds", "0", "jobs_timeout_bound_check"),
    ("visible_at", "'infinity'", "jobs_visible_at_check"),
    ("created_at", "'0044-03-15 BC'", "jobs_created_at_check"),
    ("result", "jsonb_build_object('x', repeat('y', 1100000))", "jobs_result_size_check"),
]
TABLE_CHECKS = {"jobs_status_check", "jobs_lease_check", "jobs_attempts_check", "jobs_unique_key_states_check"}


def _table_checks(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    rows = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'", (f'"{schema}".jobs',)
    ).fetchall()
    return {name for (name,) in rows}


def _domain_checks(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, bool]]:
    """The CHECK constraints of the domains of jobs' columns: name -> (column, validated)."""
    rows = conn.execute(
        "SELECT c.conname, a.attname, c.convalidated FROM pg_constraint AS c"
        " JOIN pg_attribute AS a ON a.atttypid = c.contypid"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
        (f'"{schema}".jobs',),
    ).fetchall()
    return {name: (column, valid) for name, column, valid in rows}


def _insert_sql(schema: str, column: str, value: str) -> sql.Composed:
    values = {"queue": "'q'", "payload": "'{}'", column: value}
    return sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
        sql.Identifier(schema, "jobs"),
        sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ".join(values.values())),
    )


def test_the_table_keeps_only_the_checks_the_hot_path_must_meet(pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        table, domains = _table_checks(conn, schema), _domain_checks(conn, schema)
    assert table == TABLE_CHECKS
    assert {name: column for name, (column, _) in domains.items()} == {name: col for col, _, name in DOMAIN_BOUNDS}
    assert all(valid for _, valid in domains.values()), domains


@pytest.mark.parametrize(("column", "value", "name"), DOMAIN_BOUNDS)
def test_each_bound_refuses_an_insert_and_an_update_under_its_own_name(
    pg_dsn: str, schema: str, column: str, value: str, name: str
) -> None:
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as inserted:
            conn.execute(_insert_sql(schema, column, value))
        row = conn.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES ('q', '{{}}') RETURNING id").format(jobs))
        job_id = row.fetchone()[0]  # type: ignore[index]
        with pytest.raises(psycopg.errors.CheckViolation) as updated:
            conn.execute(
                sql.SQL("UPDATE {} SET {} = {} WHERE id = %s").format(jobs, sql.Identifier(column), sql.SQL(value)),
                (job_id,),
            )
    for error in (inserted.value, updated.value):
        assert error.diag.constraint_name == name and name in str(error), str(error)


def test_a_unique_key_needs_its_states(pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation) as refused:
        conn.execute(_insert_sql(schema, "unique_key", "'k'"))
    assert refused.value.diag.constraint_name == "jobs_unique_key_states_check"


def test_columns_load_as_their_base_types_and_jobs_as_before(pg_dsn: str, schema: str, queue: Queue) -> None:
    """A domain's column is described by its base type (RowDescription), so psycopg loads every column as before."""
    queue.enqueue(
        "q", {"a": [1, 2]}, task="t", idempotency_key="i", timeout_seconds=5.5, serial_key="s", max_attempts=3
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        cur = conn.execute(
            sql.SQL(
                "SELECT queue, payload, result, task, idempotency_key, unique_key, unique_states, serial_key,"
                " max_attempts, timeout_seconds, visible_at, created_at FROM {}"
            ).format(sql.Identifier(schema, "jobs"))
        )
        described = {d.name: d.type_code for d in cur.description}
        base = dict(
            conn.execute("SELECT typname, oid::int FROM pg_type WHERE typnamespace = 'pg_catalog'::regnamespace")
        )
    assert described == {
        "queue": base["text"], "payload": base["jsonb"], "result": base["jsonb"], "task": base["text"],
        "idempotency_key": base["text"], "unique_key": base["text"], "unique_states": base["_text"],
        "serial_key": base["text"], "max_attempts": base["int4"], "timeout_seconds": base["float8"],
        "visible_at": base["timestamptz"], "created_at": base["timestamptz"],
    }  # fmt: skip
    (job,) = queue.claim("q", limit=1, worker="w")
    assert job.payload == {"a": [1, 2]} and job.task == "t" and job.idempotency_key == "i"
    assert job.timeout_seconds == 5.5 and job.serial_key == "s" and job.max_attempts == 3
    assert isinstance(job.created_at, datetime) and isinstance(job.visible_at, datetime)


def test_copy_enqueue_and_conflict_arbiters_work_on_the_domains(pg_dsn: str, schema: str, queue: Queue) -> None:
    many = queue.enqueue_many("q", [{"i": i} for i in range(300)], task="t", max_attempts=2)
    assert len(many) == 300
    first = queue.enqueue("q", {}, idempotency_key="same")
    again = queue.enqueue("q", {}, idempotency_key="same")
    assert again.id == first.id and again.duplicate
    held = queue.enqueue("q", {}, unique_key="u")
    assert queue.enqueue("q", {}, unique_key="u").id == held.id
    keyed = queue.enqueue_many("q", [{}, {}], unique_keys=["u", "v"])
    assert keyed.duplicates == [0]
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        copy_in = sql.SQL("COPY {} (queue, payload) FROM STDIN").format(jobs)
        with pytest.raises(psycopg.errors.CheckViolation) as refused, conn.cursor().copy(copy_in) as copy:
            copy.write_row(("", "{}"))
        stored = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(jobs)).fetchone()
    assert refused.value.diag.constraint_name == "jobs_queue_check"
    assert stored == (300 + 1 + 1 + 1,)


VIEWS = {
    "recent": "SELECT id, queue, task, payload ->> 'n' AS n, visible_at FROM {s}.jobs WHERE status <> 'done'",
    "recent_q": "SELECT * FROM {s}.recent WHERE queue = 'q'",
}


def test_the_migration_moves_a_populated_table_and_its_views(pg_dsn: str) -> None:
    """From 0020, with rows and views on jobs: every row is kept as it was and rechecked against each bound; a row
    stored before a bound existed (outside jobs_task_check, added NOT VALID by 0002) leaves that bound NOT VALID and
    is still claimed and completed, as the hot path no longer re-checks columns it does not write."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    jobs = sql.Identifier(schema, "jobs")
    warnings: list[str] = []
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            migrate_to(conn, schema, 20)
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT jobs_task_check").format(jobs))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, payload, task, idempotency_key, serial_key, unique_key, unique_states,"
                    " timeout_seconds, max_attempts) SELECT 'q', jsonb_build_object('n', g), 't', 'i' || g,"
                    " CASE WHEN g % 7 = 0 THEN 's' || g END, CASE WHEN g % 5 = 0 THEN 'u' || g END,"
                    " CASE WHEN g % 5 = 0 THEN '{{pending,processing}}'::text[] END, g % 3 + 1, 3"
                    " FROM generate_series(1, 2000) AS g"
                ).format(jobs)
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, payload, task, status, result) VALUES ('q', '{{}}', repeat('x', 300),"
                    " 'pending', NULL), ('q', '{{}}', 't', 'done', '{{\"ok\": true}}')"
                ).format(jobs)
            )
            for name, text in VIEWS.items():
                view = sql.SQL("CREATE VIEW {v} AS " + text)
                conn.execute(view.format(v=sql.Identifier(schema, name), s=sql.Identifier(schema)))
            conn.execute(sql.SQL("GRANT SELECT ON {} TO PUBLIC").format(sql.Identifier(schema, "recent_q")))
            conn.execute(sql.SQL("COMMENT ON VIEW {} IS 'pending work'").format(sql.Identifier(schema, "recent")))
            rows_query = sql.SQL("SELECT row_to_json(j)::text FROM {} AS j ORDER BY id").format(jobs)
            views_query = (
                "SELECT relname, relacl::text, obj_description(oid, 'pg_class') FROM pg_class"
                " WHERE relnamespace = %s::regnamespace AND relkind = 'v' ORDER BY relname"
            )
            conn.execute(sql.SQL("ANALYZE {}").format(jobs))
            rows_before = conn.execute(rows_query).fetchall()
            views_before = conn.execute(views_query, (f'"{schema}"',)).fetchall()
            seen_before = conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier(schema, "recent_q"))
            ).fetchall()

            conn.add_notice_handler(
                lambda d: warnings.append(d.message_primary or "") if d.severity == "WARNING" else None
            )
            assert migrate(conn, schema).applied[0] == "0021_column_domains"
            assert conn.execute(rows_query).fetchall() == rows_before
            assert conn.execute(views_query, (f'"{schema}"',)).fetchall() == views_before
            seen_after = conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier(schema, "recent_q"))
            ).fetchall()
            assert seen_after == seen_before
            table, domains = _table_checks(conn, schema), _domain_checks(conn, schema)
            queue_stats = conn.execute(
                "SELECT count(*) FROM pg_stats WHERE schemaname = %s AND tablename = 'jobs' AND attname = 'queue'",
                (schema,),
            ).fetchone()
        assert queue_stats == (1,), "the statistics the type change dropped are gathered again"
        assert table == TABLE_CHECKS
        assert {name for name, (_, valid) in domains.items() if not valid} == {"jobs_task_check"}
        assert len(warnings) == 1 and "jobs_task_check" in warnings[0], warnings

        settings = Settings.load(env={}, dsn=pg_dsn, schema=schema, lease_seconds=30)
        with Queue(settings=settings, max_size=2) as queue:
            assert queue.enqueue("q", {}, idempotency_key="i5").duplicate
            assert queue.enqueue("q", {}, unique_key="u10").duplicate
            claimed = queue.claim("q", limit=3000, worker="w")
            assert len(claimed) == 2001 and any(len(j.task or "") == 300 for j in claimed)
            queue.complete(claimed, worker="w")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            counts = dict(
                conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(jobs)).fetchall()
            )
        assert counts == {"done": 2002}
    finally:
        drop_schema(pg_dsn, schema)


def test_the_migration_runs_again_when_its_record_is_removed(pg_dsn: str, schema: str) -> None:
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE VIEW {} AS SELECT queue FROM {}").format(sql.Identifier(schema, "v"), jobs))
        conn.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES ('q', '{{}}')").format(jobs))
        conn.execute(sql.SQL("DELETE FROM {} WHERE version = 21").format(sql.Identifier(schema, "schema_migrations")))
        assert migrate(conn, schema).applied == ("0021_column_domains",)
        table, domains = _table_checks(conn, schema), _domain_checks(conn, schema)
        seen = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, "v"))).fetchall()
    assert table == TABLE_CHECKS and len(domains) == len({name for _, _, name in DOMAIN_BOUNDS})
    assert all(valid for _, valid in domains.values()) and seen == [("q",)]


# ------------------------------------------------------------------------------- fillfactor (migration 0022)
def _options(conn: psycopg.Connection[Any], schema: str, relation: str = "jobs") -> list[str]:
    row = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (f'"{schema}".{relation}',)
    ).fetchone()
    assert row is not None
    return sorted(row[0] or [])


def test_the_jobs_table_leaves_room_for_a_jobs_new_versions(pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        options = _options(conn, schema)
        pkey = _options(conn, schema, "jobs_pkey")
    assert "fillfactor=60" in options and pkey == ["fillfactor=50"]
    assert "autovacuum_vacuum_cost_delay=0" in options and "autovacuum_vacuum_scale_factor=0.01" in options


def test_the_fillfactor_migration_keeps_a_populated_tables_rows_and_runs_again(pg_dsn: str) -> None:
    """From 0021 with rows (pending, claimed, done): every row is kept where it was (no rewrite), the other storage
    parameters stay, the jobs are claimed and completed after it, and it runs again when its record is removed."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    jobs = sql.Identifier(schema, "jobs")
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            migrate_to(conn, schema, 21)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, payload, status, locked_by, locked_at, attempts) SELECT 'q',"
                    " jsonb_build_object('n', g), CASE WHEN g % 3 = 0 THEN 'processing' ELSE 'pending' END,"
                    " CASE WHEN g % 3 = 0 THEN 'w' END, CASE WHEN g % 3 = 0 THEN now() END, (g % 3 = 0)::integer"
                    " FROM generate_series(1, 3000) AS g"
                ).format(jobs)
            )
            rows_query = sql.SQL("SELECT ctid::text, row_to_json(j)::text FROM {} AS j ORDER BY id").format(jobs)
            before = conn.execute(rows_query).fetchall()
            node = sql.SQL("SELECT pg_relation_filenode({}::regclass)").format(sql.Literal(f'"{schema}".jobs'))
            filenode = conn.execute(node).fetchone()
            assert "fillfactor=85" in _options(conn, schema) and _options(conn, schema, "jobs_pkey") == []
            assert migrate(conn, schema).applied == ("0022_jobs_fillfactor",)
            assert conn.execute(rows_query).fetchall() == before
            assert conn.execute(node).fetchone() == filenode, "the table was rewritten"
            assert "fillfactor=60" in _options(conn, schema) and _options(conn, schema, "jobs_pkey") == [
                "fillfactor=50"
            ]
            assert "autovacuum_vacuum_cost_delay=0" in _options(conn, schema)
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE version = 22").format(sql.Identifier(schema, "schema_migrations"))
            )
            assert migrate(conn, schema).applied == ("0022_jobs_fillfactor",)
            assert "fillfactor=60" in _options(conn, schema)

        settings = Settings.load(env={}, dsn=pg_dsn, schema=schema, lease_seconds=30)
        with Queue(settings=settings, max_size=2) as queue:
            claimed = queue.claim("q", limit=5000, worker="w2")
            assert len(claimed) == 2000
            queue.complete(claimed, worker="w2")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            counts = dict(
                conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(jobs)).fetchall()
            )
        assert counts == {"done": 2000, "processing": 1000}
    finally:
        drop_schema(pg_dsn, schema)


def test_the_fillfactor_migration_waits_for_its_lock_at_most_5_seconds(pg_dsn: str) -> None:
    """A transaction holding a lock that conflicts with ALTER TABLE ... SET (here: SHARE UPDATE EXCLUSIVE, as a
    VACUUM or ANALYZE holds) makes the migration fail after 5 s, changing nothing; it applies once the lock is gone."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn, psycopg.connect(pg_dsn) as holder:
            migrate_to(conn, schema, 21)
            holder.execute(
                sql.SQL("LOCK TABLE {} IN SHARE UPDATE EXCLUSIVE MODE").format(sql.Identifier(schema, "jobs"))
            )
            with pytest.raises(psycopg.errors.LockNotAvailable):
                migrate(conn, schema)
            assert "fillfactor=85" in _options(conn, schema) and _options(conn, schema, "jobs_pkey") == []
            holder.rollback()
            assert migrate(conn, schema).applied == ("0022_jobs_fillfactor",)
            assert "fillfactor=60" in _options(conn, schema) and _options(conn, schema, "jobs_pkey") == [
                "fillfactor=50"
            ]
    finally:
        drop_schema(pg_dsn, schema)
