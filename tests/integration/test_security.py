"""Least privilege (``skiplock.grant``) and secrets: a worker runs under the worker role, a producer can enqueue
but not claim, and a DSN's password never shows in any output (CLI, logs, errors, metrics, health)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo

from skiplock import AsyncQueue, Queue, Settings
from skiplock.errors import ConfigError, DatabaseUnavailableError
from skiplock.grant import ENQUEUE_COLUMNS, LEASE_COLUMNS, PRODUCER_READ_COLUMNS, apply_grants, grant_sql
from skiplock.migrate import migrate
from skiplock.settings import mask_dsn, redact
from skiplock.sql import queries_for
from skiplock.store.purge import purge_batch
from skiplock.store.statements import PurgePolicy, Statements
from support.chaos import Fleet, read_executions, setup_schema, terminate_worker_backends
from support.pg import wait_for
from support.roles import Roles, login_roles

TESTS = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- grant_sql (pure)
def test_grant_sql_quotes_every_name_and_grants_exactly_the_documented_rights():
    text = [s.as_string(None) for s in grant_sql("sk", 'p"; DROP ROLE x; --', "Worker Role", "op")]
    joined = "\n".join(text)
    assert '"p""; DROP ROLE x; --"' in joined and '"Worker Role"' in joined
    assert 'ALTER SCHEMA "sk" OWNER TO "op"' in joined
    enqueue = ", ".join(f'"{c}"' for c in ENQUEUE_COLUMNS)
    reads = ", ".join(f'"{c}"' for c in PRODUCER_READ_COLUMNS)
    assert f'GRANT INSERT ({enqueue}) ON "sk"."jobs" TO "p""; DROP ROLE x; --"' in joined
    assert f'GRANT SELECT ({reads}) ON "sk"."jobs" TO "p""; DROP ROLE x; --"' in joined
    columns = ", ".join(f'"{c}"' for c in LEASE_COLUMNS)
    assert f'GRANT UPDATE ({columns}) ON "sk"."jobs" TO "Worker Role"' in joined
    flow = 'GRANT SELECT, INSERT, UPDATE, DELETE ON "sk"."task_limits", "sk"."task_slots" TO "Worker Role"'
    assert flow in joined  # workers register their tasks' limits (slot rows) at start
    assert "DELETE" not in joined.replace(flow, "") and "CREATE" not in joined and "TRUNCATE" not in joined
    assert "GRANT USAGE ON ALL SEQUENCES" not in joined, "an identity column needs no sequence privilege"
    assert '"payload"' not in joined.replace(enqueue, ""), "only the producer's insert names the payload column"
    assert {"id", "status", "attempts", "locked_by", "last_error"}.isdisjoint(ENQUEUE_COLUMNS)
    assert {"payload", "last_error", "locked_by", "task"}.isdisjoint(PRODUCER_READ_COLUMNS)
    assert "lease_expires_at" in LEASE_COLUMNS


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "at least one role"),
        ({"producer": "a", "operator": "a"}, "cannot also be"),
        ({"worker": ""}, "not a valid role name"),
        ({"worker": "x" * 64}, "not a valid role name"),
        ({"worker": "a\x00b"}, "not a valid role name"),
    ],
)
def test_grant_sql_rejects_impossible_role_sets(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        grant_sql("sk", **kwargs)


def test_grant_sql_will_not_hand_the_public_schema_to_the_operator():
    with pytest.raises(ConfigError, match="public"):
        grant_sql("public", operator="op")


# ---------------------------------------------------------------------------------------------- roles in a database
@pytest.fixture
def roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    with login_roles(pg_dsn, schema) as made:
        yield made


def _grant(pg_dsn: str, schema: str, roles: Roles) -> list[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return apply_grants(conn, schema, producer=roles.producer, worker=roles.worker, operator=roles.operator)


def test_apply_grants_needs_existing_roles_and_a_migrated_schema(pg_dsn, schema, roles):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(ConfigError, match="do not exist"):
            apply_grants(conn, schema, worker=f"nobody_{uuid.uuid4().hex[:6]}")
        with pytest.raises(Exception, match="skiplock migrate"):
            apply_grants(conn, f"nothing_{uuid.uuid4().hex[:6]}", worker=roles.worker)


def test_a_role_without_the_right_to_grant_gets_a_clear_error(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    with (
        psycopg.connect(roles.dsn(pg_dsn, roles.producer), autocommit=True) as conn,
        pytest.raises(ConfigError, match="superuser"),
    ):
        apply_grants(conn, schema, worker=roles.producer)


def test_producer_enqueues_but_cannot_claim_finish_or_delete(pg_dsn, schema, roles):
    done = _grant(pg_dsn, schema, roles)
    assert len(done) == len(_grant(pg_dsn, schema, roles)), "grant is repeatable"
    settings = Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.producer), schema=schema)
    with Queue(settings=settings, max_size=1) as q:
        job_id = q.enqueue("q", {"n": 1}, idempotency_key="k").id
        assert q.enqueue("q", {"n": 1}, idempotency_key="k").id == job_id
        q.check_schema()
        for attempt in (
            lambda: q.claim("q", limit=1, worker="thief"),
            lambda: q.cancel(ids=[job_id]),
            lambda: q.purge(older_than_seconds=0),
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                attempt()
    with psycopg.connect(roles.dsn(pg_dsn, roles.producer)) as conn:
        for statement in (
            "DELETE FROM {}",
            "UPDATE {} SET status = 'done'",
            "ALTER TABLE {} ADD COLUMN x int",
            "TRUNCATE {}",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(sql.SQL(statement).format(sql.Identifier(schema, "jobs")))
            conn.rollback()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(sql.SQL("SELECT status FROM {}").format(sql.Identifier(schema, "jobs"))).fetchall() == [
            ("pending",)
        ]


def test_worker_role_cannot_enqueue_delete_rewrite_payloads_or_change_the_schema(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(roles.dsn(pg_dsn, roles.worker)) as conn:
        for statement in (
            sql.SQL("INSERT INTO {} (queue, payload) VALUES ('q', '{{}}')").format(jobs),
            sql.SQL("DELETE FROM {}").format(jobs),
            sql.SQL("UPDATE {} SET payload = '{{}}'").format(jobs),
            sql.SQL("UPDATE {} SET max_attempts = 1000").format(jobs),
            sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(schema, "mine")),
            sql.SQL("DROP TABLE {}").format(jobs),
        ):
            with pytest.raises((errors.InsufficientPrivilege, errors.ObjectNotInPrerequisiteState)):
                conn.execute(statement)
            conn.rollback()
        # With every migration applied, migrate is a no-op that needs no privilege; the statements above show
        # that the worker role could not apply one.
        assert migrate(conn, schema).applied == ()


def _denied(conn: psycopg.Connection, statement: sql.Composable, params: object = None) -> None:
    """The statement fails for want of a privilege, and the failed transaction is rolled back."""
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement, params)  # type: ignore[arg-type]
    conn.rollback()


def _rows(pg_dsn: str, schema: str) -> list[tuple]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT id, queue, status, attempts, locked_by, last_error FROM {} ORDER BY id").format(
                sql.Identifier(schema, "jobs")
            )
        ).fetchall()


def test_producer_inserts_only_the_enqueue_columns_and_reads_back_only_what_enqueue_needs(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    jobs = sql.Identifier(schema, "jobs")
    with Queue(settings=Settings.load(env={}, dsn=pg_dsn, schema=schema), max_size=1) as admin:
        secret = admin.enqueue("other-tenant", {"card": "4111"}).id
        admin.claim("other-tenant", limit=1, worker="w1")
    with psycopg.connect(roles.dsn(pg_dsn, roles.producer)) as conn:
        # Every enqueue column, in plain SQL: allowed (the grant is not narrower than enqueue).
        own = conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, payload, priority, max_attempts, visible_at, idempotency_key, task) "
                "VALUES ('q', '{{}}', 3, 7, now(), 'k1', 'send') RETURNING id, visible_at"
            ).format(jobs)
        ).fetchone()
        conn.commit()
        assert own is not None and own[0] > secret
        forged = {
            "id (OVERRIDING SYSTEM VALUE)": "INSERT INTO {} (id, queue, payload) OVERRIDING SYSTEM VALUE "
            "VALUES (%s, 'q', '{{}}')",
            "status": "INSERT INTO {} (queue, payload, status) VALUES ('q', '{{}}', 'done')",
            "locked_by": "INSERT INTO {} (queue, payload, locked_by) VALUES ('q', '{{}}', 'w1')",
            "attempts": "INSERT INTO {} (queue, payload, attempts) VALUES ('q', '{{}}', 4)",
            "last_error": "INSERT INTO {} (queue, payload, last_error) VALUES ('q', '{{}}', 'x')",
            "lease_expires_at": "INSERT INTO {} (queue, payload, lease_expires_at) VALUES ('q', '{{}}', now())",
            "created_at": "INSERT INTO {} (queue, payload, created_at) VALUES ('q', '{{}}', now() - interval '1 day')",
        }
        for what, statement in forged.items():
            try:
                _denied(conn, sql.SQL(statement).format(jobs), (own[0] + 1_000,) if "%s" in statement else None)
            except BaseException as exc:
                raise AssertionError(f"the producer could forge {what}") from exc
        for statement in (
            "SELECT payload FROM {}",
            "SELECT last_error FROM {}",
            "SELECT locked_by FROM {}",
            "SELECT task FROM {}",
            "SELECT * FROM {}",
            "SELECT id FROM {} FOR UPDATE",  # no row locks: a producer cannot stall a claim
            "SELECT id FROM {} FOR KEY SHARE",
            "INSERT INTO {} (queue, payload) VALUES ('q', '{{}}') RETURNING payload",
            "INSERT INTO {} (queue, payload, idempotency_key) VALUES ('q', '{{}}', 'k1') "
            "ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL AND status <> 'failed' "
            "DO UPDATE SET status = 'done'",
        ):
            _denied(conn, sql.SQL(statement).format(jobs))
        # No sequence privilege either: it cannot burn or move ids (the identity column needs none).
        _denied(conn, sql.SQL("SELECT nextval(pg_get_serial_sequence({}, 'id'))").format(sql.Literal(f"{schema}.jobs")))
        # What it may read: ids, queues, statuses and keys (enqueue's RETURNING and the idempotency look-up).
        seen = conn.execute(
            sql.SQL("SELECT id, status FROM {} WHERE queue = 'q' AND idempotency_key = 'k1'").format(jobs)
        ).fetchall()
        assert seen == [(own[0], "pending")]
    # Nothing forged landed, and the next id is still the sequence's own: other producers are unharmed.
    assert _rows(pg_dsn, schema) == [
        (secret, "other-tenant", "processing", 1, "w1", None),
        (own[0], "q", "pending", 0, None, None),
    ]
    with Queue(settings=Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.producer), schema=schema)) as q:
        assert q.enqueue("q", {"n": 2}).id == own[0] + 1
        # Batches and keys work under the column grants too (the duplicate key is skipped, not an error).
        many = q.enqueue_many("q", [{"n": 3}, {"n": 4}], idempotency_keys=["k1", "k3"], delay=60)
        assert len(many) == 1 and many[0] > own[0] + 1


async def test_the_async_producer_enqueues_under_the_column_grants(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    settings = Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.producer), schema=schema)
    async with await AsyncQueue.open(settings=settings) as q:
        first = await q.enqueue("q", {"n": 1}, idempotency_key="k", priority=5, max_attempts=3)
        again = await q.enqueue("q", {"n": 2}, idempotency_key="k")
        assert again.id == first.id
        await q.check_schema()
    assert _rows(pg_dsn, schema) == [(first.id, "q", "pending", 0, None, None)]


TOO_BIG = 6_400_000  # bytes of JSON: the size a producer once stored with plain SQL


@pytest.mark.parametrize(
    ("what", "statement"),
    [
        ("a 6.4 MB payload", "INSERT INTO {} (queue, payload) VALUES ('q', jsonb_build_object('a', repeat('x', %s)))"),
        ("max_attempts 2^31-1", "INSERT INTO {} (queue, payload, max_attempts) VALUES ('q', '{{}}', 2147483647)"),
        (
            "a 9,000-character key",
            "INSERT INTO {} (queue, payload, idempotency_key) VALUES ('q', '{{}}', repeat('k', 9000))",
        ),
        ("an empty key", "INSERT INTO {} (queue, payload, idempotency_key) VALUES ('q', '{{}}', '')"),
        ("a 201-character task", "INSERT INTO {} (queue, payload, task) VALUES ('q', '{{}}', repeat('t', 201))"),
        ("a 129-character queue", "INSERT INTO {} (queue, payload) VALUES (repeat('q', 129), '{{}}')"),
        # issue 37: every extreme of every insertable column is in test_producer_bounds.py; these three crashed,
        # stalled or duplicate-ran workers and stopped the operator's autoscaling
        ("a NaN timeout", "INSERT INTO {} (queue, payload, timeout_seconds) VALUES ('q', '{{}}', 'NaN')"),
        ("an infinite visible_at", "INSERT INTO {} (queue, payload, visible_at) VALUES ('q', '{{}}', 'infinity')"),
        (
            "a unique key held only while processing",
            "INSERT INTO {} (queue, payload, unique_key, unique_states) VALUES ('q', '{{}}', 'k', '{{processing}}')",
        ),
    ],
)
def test_a_producer_writing_plain_sql_cannot_store_what_a_worker_cannot_handle(pg_dsn, schema, roles, what, statement):
    _grant(pg_dsn, schema, roles)
    with psycopg.connect(roles.dsn(pg_dsn, roles.producer)) as conn:
        params = (TOO_BIG,) if "%s" in statement else None
        with pytest.raises(errors.CheckViolation):
            conn.execute(sql.SQL(statement).format(sql.Identifier(schema, "jobs")), params)
    assert _rows(pg_dsn, schema) == [], f"{what} was stored"


def test_a_payload_copied_compressed_from_another_table_is_measured_decompressed(pg_dsn, schema, roles):
    """Copied from a stored column, 6.4 MB of repetitive JSON reach the table compressed to ~70 kB: the CHECK
    alone measured that and let it in. The trigger of migration 0003 measures the JSON text of such values."""
    _grant(pg_dsn, schema, roles)
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(roles.dsn(pg_dsn, roles.producer)) as conn:
        conn.execute("CREATE TEMP TABLE stash (n int, p jsonb)")  # TEMP is granted to PUBLIC by default
        conn.execute(
            "INSERT INTO stash VALUES (1, jsonb_build_object('a', repeat('x', %s))), "
            "(2, jsonb_build_object('a', repeat('x', 500000)))",
            (TOO_BIG,),
        )
        stored = conn.execute("SELECT n, pg_column_size(p), pg_column_compression(p) FROM stash ORDER BY n").fetchall()
        assert stored[0][1] < 1_048_576 and stored[0][2] is not None, f"the attack needs a compressed value: {stored}"
        conn.commit()
        with pytest.raises(errors.CheckViolation) as info:
            conn.execute(sql.SQL("INSERT INTO {} (queue, payload) SELECT 'q', p FROM stash WHERE n = 1").format(jobs))
        assert info.value.diag.constraint_name == "jobs_payload_size_check"
        assert f"{TOO_BIG + 9} bytes" in (info.value.diag.message_detail or "")
        conn.rollback()
        # Stored out of line but uncompressed, a value measures its full size: the CHECK alone refuses it.
        conn.execute("CREATE TEMP TABLE raw (p jsonb)")
        conn.execute("ALTER TABLE raw ALTER p SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO raw VALUES (jsonb_build_object('a', repeat('x', %s)))", (TOO_BIG,))
        assert conn.execute("SELECT pg_column_compression(p) FROM raw").fetchone() == (None,)
        conn.commit()
        with pytest.raises(errors.CheckViolation):
            conn.execute(sql.SQL("INSERT INTO {} (queue, payload) SELECT 'q', p FROM raw").format(jobs))
        conn.rollback()
        # Under the bound, a compressed copy is still welcome: the trigger only measures, it does not forbid.
        conn.execute(sql.SQL("INSERT INTO {} (queue, payload) SELECT 'q', p FROM stash WHERE n = 2").format(jobs))
        conn.commit()
    with psycopg.connect(pg_dsn) as conn:
        sizes = conn.execute(sql.SQL("SELECT octet_length(payload::text) FROM {}").format(jobs)).fetchall()
    assert sizes == [(500_009,)]


def test_the_operator_cannot_rewrite_a_payload_past_the_bound_either(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(roles.dsn(pg_dsn, roles.operator)) as conn:
        conn.execute("CREATE TEMP TABLE stash (p jsonb)")
        conn.execute("INSERT INTO stash VALUES (jsonb_build_object('a', repeat('x', %s)))", (TOO_BIG,))
        conn.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES ('q', '{{}}')").format(jobs))
        with pytest.raises(errors.CheckViolation):
            conn.execute(sql.SQL("UPDATE {} SET payload = (SELECT p FROM stash)").format(jobs))


def test_worker_updates_only_lease_and_outcome_columns(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    jobs = sql.Identifier(schema, "jobs")
    with Queue(settings=Settings.load(env={}, dsn=pg_dsn, schema=schema), max_size=1) as admin:
        job_id = admin.enqueue("q", {"n": 1}, idempotency_key="k").id
    with psycopg.connect(roles.dsn(pg_dsn, roles.worker)) as conn:
        for column, value in (
            ("task", "'other'"),
            ("queue", "'elsewhere'"),
            ("priority", "100"),
            ("idempotency_key", "'k2'"),
            ("created_at", "now()"),
            ("max_attempts", "1000"),
        ):
            _denied(conn, sql.SQL("UPDATE {} SET {} = " + value).format(jobs, sql.Identifier(column)))
        _denied(conn, sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(jobs))
        row = conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'processing', attempts = attempts + 1, locked_by = 'w', locked_at = now(), "
                "lease_expires_at = now() + interval '30 seconds', updated_at = now() WHERE id = %s "
                "RETURNING lease_expires_at > now()"
            ).format(jobs),
            (job_id,),
        ).fetchone()
        assert row == (True,), "the lease deadline is the worker's to set"
        conn.rollback()


@pytest.fixture
def tenants(pg_dsn: str) -> Iterator[dict[str, Roles]]:
    """Two tenants, each with its own migrated schema and its own roles (the operator role owns the schema)."""
    tag = uuid.uuid4().hex[:8]
    made: dict[str, Roles] = {}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for tenant in ("a", "b"):
            name = f"t_{tenant}_{tag}"
            made[name] = Roles(f"{name}_prod", f"{name}_work", f"{name}_op", f"Pw-{tag}")
            migrate(conn, name)
            for role in (made[name].producer, made[name].worker, made[name].operator):
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(f"Pw-{tag}"))
                )
            apply_grants(
                conn, name, producer=made[name].producer, worker=made[name].worker, operator=made[name].operator
            )
    try:
        yield made
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for name, r in made.items():
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
                for role in (r.producer, r.worker, r.operator):
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_schema_is_the_tenant_boundary(pg_dsn, tenants):
    """One schema per tenant, one set of roles per schema: no role of tenant A reads, claims, finishes or enqueues
    in tenant B's schema, not even through skiplock's own queries. Within a schema, the queue is no boundary."""
    (a, ra), (b, _) = tenants.items()
    with Queue(settings=Settings.load(env={}, dsn=pg_dsn, schema=b), max_size=1) as admin_b:
        victim = admin_b.enqueue("billing", {"card": "4111"}).id
    jobs_b = sql.Identifier(b, "jobs")
    for role in (ra.producer, ra.worker, ra.operator):
        with psycopg.connect(ra.dsn(pg_dsn, role)) as conn:
            for statement in (
                sql.SQL("SELECT id FROM {}").format(jobs_b),
                sql.SQL("SELECT version FROM {}").format(sql.Identifier(b, "schema_migrations")),
                sql.SQL("UPDATE {} SET status = 'failed', last_error = 'x'").format(jobs_b),
                sql.SQL("INSERT INTO {} (queue, payload) VALUES ('billing', '{{}}')").format(jobs_b),
                sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(b, "planted")),
            ):
                _denied(conn, statement)
        with Queue(settings=Settings.load(env={}, dsn=ra.dsn(pg_dsn, role), schema=b), max_size=1) as q:
            for attempt in (
                lambda: q.claim("billing", limit=1, worker="thief"),
                lambda: q.enqueue("billing", {"x": 1}),
                q.stats,
            ):
                with pytest.raises(errors.InsufficientPrivilege):
                    attempt()
    assert _rows(pg_dsn, b) == [(victim, "billing", "pending", 0, None, None)]
    # Inside its own schema a worker role claims every queue: give each tenant its own schema, not its own queue.
    with Queue(settings=Settings.load(env={}, dsn=pg_dsn, schema=a), max_size=1) as admin_a:
        ids = {admin_a.enqueue(queue, {}).id for queue in ("mine", "someone-elses")}
    with Queue(settings=Settings.load(env={}, dsn=ra.dsn(pg_dsn, ra.worker), schema=a), max_size=1) as q:
        claimed = {j.id for queue in ("mine", "someone-elses") for j in q.claim(queue, limit=1, worker="w")}
    assert claimed == ids


def test_grant_converges_a_role_that_changes_its_part(pg_dsn, schema, roles):
    """Re-running grant is how a role loses rights: column privileges are revoked along with table privileges."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        apply_grants(conn, schema, worker=roles.producer)  # first, by mistake, as a worker
        apply_grants(conn, schema, producer=roles.producer)
        jobs = f"{schema}.jobs"
        rights = conn.execute(
            "SELECT c, has_column_privilege(%(r)s, %(t)s, c, 'UPDATE'),"
            " has_column_privilege(%(r)s, %(t)s, c, 'SELECT'), has_column_privilege(%(r)s, %(t)s, c, 'INSERT')"
            " FROM unnest(%(cols)s::text[]) AS c",
            {"r": roles.producer, "t": jobs, "cols": ["status", "payload", "id", "queue", "last_error"]},
        ).fetchall()
    assert rights == [
        ("status", False, True, False),
        ("payload", False, False, True),
        ("id", False, True, False),
        ("queue", False, True, True),
        ("last_error", False, False, False),
    ]


def test_operator_owns_the_schema_so_it_migrates_reads_stats_and_purges(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    settings = Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.operator), schema=schema)
    with Queue(settings=settings, max_size=1) as q:
        assert q.migrate().applied == ()
        assert q.stats() == []
        assert q.purge(older_than_seconds=0) == 0
    with psycopg.connect(roles.dsn(pg_dsn, roles.operator)) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN probe int").format(sql.Identifier(schema, "jobs")))
        conn.rollback()  # a forward migration would be allowed; nothing kept


def test_the_schema_owner_migrates_without_create_on_the_database(pg_dsn, schema, roles):
    _grant(pg_dsn, schema, roles)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(
            sql.SQL("REVOKE CREATE ON DATABASE {} FROM {}").format(
                sql.Identifier(database), sql.Identifier(roles.operator)
            )
        )
    with psycopg.connect(roles.dsn(pg_dsn, roles.operator), autocommit=True) as conn:
        assert migrate(conn, schema).applied == ()


def test_a_worker_under_the_worker_role_runs_every_lease_path_and_never_shows_its_password(
    pg_dsn, schema, roles, tmp_path
):
    """Claim, complete, fail and retry, heartbeat, lease recovery and release, all as the worker role; then grep
    every log line and every scrape for the password."""
    setup_schema(pg_dsn, schema)  # effects table (business data the handler writes through job.conn)
    _grant(pg_dsn, schema, roles)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(schema, "effects"), sql.Identifier(roles.worker))
        )
    with Queue(settings=Settings.load(env={}, dsn=pg_dsn, schema=schema), max_size=2) as admin:
        ids = admin.enqueue_many("sec", [{"kind": "instant"} for _ in range(5)])
        flaky = admin.enqueue("sec", {"kind": "flaky", "fail_times": 1}).id
        doomed = admin.enqueue("sec", {"kind": "doomed"}, max_attempts=2).id
        slow = admin.enqueue("sec", {"kind": "slow", "sleep": 3}).id  # outlives the 2 s lease: heartbeats
        orphan = admin.enqueue("sec", {"kind": "instant"}, run_at=_hours_ago(pg_dsn, 2)).id
        assert [j.id for j in admin.claim("sec", limit=1, worker="ghost", now=_hours_ago(pg_dsn, 1))] == [orphan]
    worker_dsn = roles.dsn(pg_dsn, roles.worker)
    settings = {
        "lease_seconds": 2,
        "heartbeat_seconds": 0.5,
        "poll_seconds": 0.5,
        "recover_seconds": 0.5,
        "backoff_base_seconds": 0.05,
        "backoff_cap_seconds": 0.1,
        "shutdown_grace_seconds": 0.3,
        "log_format": "json",
        "log_level": "DEBUG",
    }
    scrapes: list[str] = []
    with Fleet(worker_dsn, schema, "sec", tmp_path, ["support.chaos:work"], metrics=True, **settings) as fleet:
        terminal = {*ids, flaky, doomed, slow, orphan}
        wait_for(lambda: _statuses(pg_dsn, schema, terminal) <= {"done", "failed"}, timeout=60, what="jobs finished")
        with Queue(settings=Settings.load(env={}, dsn=pg_dsn, schema=schema), max_size=1) as admin:
            assert admin.get(slow)["attempts"] == 1, "heartbeats kept the slow job's lease"
            assert admin.get(orphan)["status"] == "done" and admin.get(orphan)["attempts"] == 2
            assert admin.get(flaky)["status"] == "done" and admin.get(doomed)["status"] == "failed"
            held = admin.enqueue("sec", {"kind": "slow", "sleep": 30}).id
        wait_for(lambda: _statuses(pg_dsn, schema, {held}) == {"processing"}, timeout=30, what="a long job running")
        drained, code = fleet.drain(0)  # SIGTERM: the job goes back through the worker role's release
        assert code == 0, drained.output()
        assert '"handed back 1 unfinished job(s) without burning an attempt"' in drained.output()
        wait_for(lambda: _statuses(pg_dsn, schema, {held}) == {"processing"}, timeout=30, what="claimed again")
        # Terminated connections make the worker log database errors: those lines must be clean too.
        assert terminate_worker_backends(pg_dsn, user=roles.worker) >= 1
        proc = fleet.live()[0]
        wait_for(lambda: _scrape_ok(proc, scrapes), timeout=30, what="a scrape after the terminated connections")
    runs = [e for e in read_executions(tmp_path) if e.tag == "S" and e.job_id == held]
    assert [e.attempt for e in runs[:2]] == [1, 1][: len(runs[:2])], "the hand-back burnt no attempt"
    outputs = [p.output() for p in fleet.history] + scrapes
    text = "\n".join(outputs)
    assert "permission denied" not in text, text[-3000:]
    assert "skiplock_jobs_claimed_total" in text and '"action": "lease_recovered"' in text
    _assert_no_secret(text, roles.password)


def _hours_ago(pg_dsn: str, hours: int):
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT now() - make_interval(hours => %s)", (hours,)).fetchone()
    assert row is not None
    return row[0]


def _statuses(pg_dsn: str, schema: str, ids: set[int]) -> set[str]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT status FROM {} WHERE id = ANY(%s)").format(sql.Identifier(schema, "jobs")), (list(ids),)
        ).fetchall()
    return {r[0] for r in rows}


def _scrape_ok(proc, into: list[str]) -> bool:
    try:
        bodies = [proc.scrape(path) for path in ("/metrics", "/healthz", "/readyz")]
    except OSError:
        return False
    into.extend(bodies)
    return "skiplock_table_live_tuples" in bodies[0]  # a series read from the database at scrape


def _assert_no_secret(text: str, password: str) -> None:
    from urllib.parse import quote, unquote

    for form in {password, unquote(password), quote(password, safe="")}:
        assert form not in text, f"the password ({form!r}) leaked: ...{text[max(0, text.find(form) - 300) :][:600]}"


# ---------------------------------------------------------------------------------------------- secrets in the CLI
def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    base["PYTHONPATH"] = str(TESTS)
    base.update(env or {})
    return subprocess.run(  # noqa: PLW1510 - exit codes are asserted
        [sys.executable, "-m", "skiplock", *args], env=base, capture_output=True, text=True, timeout=timeout
    )


SECRET = "Hunter2-" + uuid.uuid4().hex[:10] + "%21"


@pytest.mark.parametrize(
    ("commands", "env", "flag"),
    [
        (
            ["stats", "migrate", "enqueue", "doctor"],
            {},
            f"postgresql://app:{SECRET}@127.0.0.1:1/app",
        ),
        (
            ["stats", "enqueue"],
            {"SKIPLOCK_DSN": f"host=127.0.0.1 port=1 user=app password={SECRET} dbname=app"},
            None,
        ),
        (["stats"], {"SKIPLOCK_DSN": f"postgresql://app:{SECRET}@127.0.0.1:1/app?password={SECRET}"}, None),
        (["stats"], {"DATABASE_URL": f"postgresql://app:{SECRET}@nonexistent.invalid:5432/app"}, None),
    ],
    ids=["flag-url", "env-keywords", "env-url-query", "database-url-wrong-host"],
)
def test_a_dead_database_error_never_shows_the_password(commands, env, flag):
    extra = ["--dsn", flag] if flag else []
    for command in commands:
        args = [command, "--queue", "q", "--payload", "{}"] if command == "enqueue" else [command]
        out = _cli(*args, *extra, env=env)
        assert out.returncode == 3, (command, out.stdout, out.stderr)
        assert "database unavailable" in out.stderr
        _assert_no_secret(out.stdout + out.stderr, SECRET)


def test_worker_errors_at_start_never_show_the_password(pg_dsn, schema):
    dsn = make_conninfo(pg_dsn, password=SECRET)
    for handler, code in (("support.nosuch:fn", 2), ("support.handlers:not_callable", 2), ("bad spec", 2)):
        out = _cli(
            "worker", "--handler", handler, "--log-level", "DEBUG", env={"SKIPLOCK_DSN": dsn, "SKIPLOCK_SCHEMA": schema}
        )
        assert out.returncode == code, out.stderr
        _assert_no_secret(out.stdout + out.stderr, SECRET)
    out = _cli("worker", "--handler", "support.handlers:noop", env={"SKIPLOCK_DSN": make_conninfo(dsn, port="1")})
    assert out.returncode == 3, out.stderr
    _assert_no_secret(out.stdout + out.stderr, SECRET)


def test_cli_round_trip_with_a_password_dsn_never_prints_it(pg_dsn, schema):
    env = {
        "SKIPLOCK_DSN": make_conninfo(pg_dsn, password=SECRET),
        "SKIPLOCK_SCHEMA": schema,
        "SKIPLOCK_LOG_LEVEL": "DEBUG",
    }
    outputs = [
        _cli("enqueue", "--queue", "q", "--payload", '{"a": 1}', env=env),
        _cli("stats", env=env),
        _cli("stats", "--json", env=env),
        _cli("failed", "--json", env=env),
        _cli("doctor", "--json", env=env),
        _cli("migrate", env=env),
    ]
    assert [o.returncode for o in outputs[:4]] == [0, 0, 0, 0], [o.stderr for o in outputs]
    _assert_no_secret("\n".join(o.stdout + o.stderr for o in outputs), SECRET)


def test_settings_and_errors_mask_the_password():
    dsn = f"postgresql://app:{SECRET}@127.0.0.1:1/app"
    settings = Settings.load(env={}, dsn=dsn)
    _assert_no_secret(repr(settings) + str(settings.to_env()) + settings.masked_dsn, SECRET)
    assert mask_dsn(f"user=a password='{SECRET} x' host=h").count("***") == 1
    assert redact(f"boom {dsn} and {SECRET}", dsn).count(SECRET) == 0
    with pytest.raises(DatabaseUnavailableError) as info:
        Queue(dsn=dsn, connect_timeout=2)
    _assert_no_secret(str(info.value) + repr(info.value), SECRET)


async def test_unique_jobs_and_schedules_under_least_privilege_roles(pg_dsn, schema, roles):
    """The producer enqueues unique jobs (skip) but may not replace; a worker role registers its schedules but
    cannot insert their ticks; the operator role (the owner) fires them."""
    from skiplock import App
    from skiplock.store.schedules import fire_due, register
    from skiplock.store.statements import Statements

    _grant(pg_dsn, schema, roles)
    settings = Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.producer), schema=schema)
    with Queue(settings=settings, max_size=1) as q:
        first = q.enqueue("q", {"n": 1}, unique_key="u1", unique_states=["pending", "processing"])
        assert q.enqueue("q", {"n": 2}, unique_key="u1", unique_states=["pending", "processing"]).id == first.id
        many = q.enqueue_many(
            "q", [{"n": 3}, {"n": 4}], unique_keys=["u1", "u2"], unique_states=["pending", "processing"]
        )
        assert [r.duplicate for r in many.results] == [True, False]
        with pytest.raises(errors.InsufficientPrivilege):
            q.enqueue(
                "q", {"n": 5}, unique_key="u1", unique_states=["pending", "processing"], unique_conflict="replace"
            )
    app = App("least", schema=schema)
    app.task(name="least.tick", queue="q", every=3600)(lambda job: None)
    q = Statements(Settings(schema=schema))
    async with await psycopg.AsyncConnection.connect(roles.dsn(pg_dsn, roles.worker), autocommit=True) as conn:
        await register(conn, q, app.schedules)
        await conn.execute(sql.SQL("UPDATE {} SET next_run_at = now()").format(sql.Identifier(schema, "schedules")))
        with pytest.raises(errors.InsufficientPrivilege):
            await fire_due(conn, q, channel="skiplock_jobs")
    async with await psycopg.AsyncConnection.connect(roles.dsn(pg_dsn, roles.operator), autocommit=True) as conn:
        fired, _ = await fire_due(conn, q, channel="skiplock_jobs")
    assert [(f.name, f.job_id is not None) for f in fired] == [("least.tick", True)]


def _former_advisory_key(kind: str, schema: str) -> int:
    """The advisory keys skiplock serialized migrations and purges on before issue 37, item 8: public hashes of the
    schema name (kept here only to show that holding them changes nothing now)."""
    digest = hashlib.blake2b(f"skiplock.{kind}:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def test_no_other_role_can_hold_the_migration_or_the_purge_lock(pg_dsn, schema, roles):
    """Issue 37, item 8: any role could take the advisory keys of migrations and purges and hold them: another
    tenant's producer kept a JobQueue `MigrationPending` with no Deployment, and stopped its purge. The locks are now
    a table lock of schema_migrations and a row lock in `locks`, which only the owner may take."""
    _grant(pg_dsn, schema, roles)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # 0011 is a no-op: forgotten, it is pending again, so the owner's migrate below takes the migration lock
        conn.execute(sql.SQL("DELETE FROM {} WHERE version = 11").format(sql.Identifier(schema, "schema_migrations")))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, payload, status, updated_at) VALUES ('q', '{{}}', 'done', now() - "
                "interval '30 days')"
            ).format(sql.Identifier(schema, "jobs"))
        )
    q = queries_for(schema)
    squatters = [psycopg.connect(roles.dsn(pg_dsn, r), autocommit=True) for r in (roles.producer, roles.worker)]
    try:
        squatters[0].execute(
            "SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)",
            (_former_advisory_key("migrate", schema), _former_advisory_key("retention", schema)),
        )
        # The owner migrates and purges all the same (before the fix: the migration waited for the squatter, and a
        # scheduled purge found its lock taken).
        s = Statements(Settings(schema=schema))
        policy = PurgePolicy.retention(Settings(schema=schema))
        with psycopg.connect(pg_dsn, autocommit=True, options="-c lock_timeout=3s") as owner:
            assert migrate(owner, schema).applied == ("0011_reserved",)
            assert purge_batch(owner, s, policy, 100, wait=False) == {"done": 1}
            assert purge_batch(owner, s, policy, 100, wait=True) == {}
        # And neither role of the schema can take the locks that replaced the keys.
        for squatter in squatters:
            for statement in (q.schema_lock, q.retention_xact_lock, q.retention_try_xact_lock):
                with pytest.raises(errors.InsufficientPrivilege), squatter.transaction():
                    squatter.execute(statement)
    finally:
        for squatter in squatters:
            squatter.close()


def test_workflows_under_least_privilege_roles(pg_dsn, schema, roles):
    """Issue 39 under `skiplock grant`: the producer role enqueues with after= and waits for a result through the
    owner's functions only (it still cannot lock or update a job by itself); the worker role stores results and
    durable steps and reads its parents' results; neither can link a job another transaction inserted, nor resolve
    a parent's children by hand."""
    from skiplock import App, Job
    from skiplock.testing import run_jobs

    _grant(pg_dsn, schema, roles)
    app = App("least_flow", schema=schema)

    @app.task(name="lf.add", queue="lf")
    def add(job: Job) -> int:
        return int(job.step("sum", lambda: job.payload["a"] + job.payload["b"]))

    @app.task(name="lf.total", queue="lf")
    def total(job: Job) -> int:
        return sum(job.parent_results.values())

    producer = Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.producer), schema=schema)
    with Queue(settings=producer, max_size=1) as q:
        a = q.enqueue("lf", {"a": 1, "b": 2}, task="lf.add")
        b = q.enqueue("lf", {"a": 3, "b": 4}, task="lf.add")
        c = q.enqueue("lf", {}, task="lf.total", after=[a.id, b.id])
        other = q.enqueue("lf", {"a": 0, "b": 0}, task="lf.add")
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(roles.dsn(pg_dsn, roles.producer), autocommit=True) as conn:
        linked = conn.execute(
            sql.SQL("SELECT linked FROM {}.jobs_link(%s, %s, false, NULL)").format(sql.Identifier(schema)),
            ([a.id], [other.id]),
        ).fetchone()
        assert linked == (0,), "a job another transaction inserted is never linked"
        for statement, params in (
            (sql.SQL("SELECT {}.jobs_resolve_children(%s, 'failed', 'x')").format(sql.Identifier(schema)), (a.id,)),
            (sql.SQL("SELECT id FROM {} WHERE id = %s FOR UPDATE").format(jobs), (a.id,)),
            (sql.SQL("UPDATE {} SET awaited = true WHERE id = %s").format(jobs), (a.id,)),
            (sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, "job_dependencies")), None),
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement, params)
    worker = Settings.load(env={}, dsn=roles.dsn(pg_dsn, roles.worker), schema=schema)
    report = run_jobs(app, settings=worker)
    assert sorted(report.done) == sorted([a.id, b.id, c.id, other.id])
    with Queue(settings=producer, max_size=1) as q:
        assert q.wait(c.id, timeout=10) == 10
        assert q.wait(a.id, timeout=10) == 3
