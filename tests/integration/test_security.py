"""Least privilege (``skiplock.grant``) and secrets: a worker runs under the worker role, a producer can enqueue
but not claim, and a DSN's password never shows in any output (CLI, logs, errors, metrics, health)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo

from skiplock import Queue, Settings
from skiplock.errors import ConfigError, DatabaseUnavailableError
from skiplock.grant import LEASE_COLUMNS, apply_grants, grant_sql
from skiplock.migrate import migrate
from skiplock.settings import mask_dsn, redact
from support.chaos import Fleet, read_executions, setup_schema, terminate_worker_backends
from support.pg import drop_schema, wait_for

TESTS = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- grant_sql (pure)
def test_grant_sql_quotes_every_name_and_grants_exactly_the_documented_rights():
    text = [s.as_string(None) for s in grant_sql("sk", 'p"; DROP ROLE x; --', "Worker Role", "op")]
    joined = "\n".join(text)
    assert '"p""; DROP ROLE x; --"' in joined and '"Worker Role"' in joined
    assert 'ALTER SCHEMA "sk" OWNER TO "op"' in joined
    assert 'GRANT SELECT, INSERT ON "sk"."jobs" TO "p""; DROP ROLE x; --"' in joined
    columns = ", ".join(f'"{c}"' for c in LEASE_COLUMNS)
    assert f'GRANT UPDATE ({columns}) ON "sk"."jobs" TO "Worker Role"' in joined
    assert "DELETE" not in joined and "CREATE" not in joined and "TRUNCATE" not in joined
    assert "payload" not in joined, "the worker must not be able to rewrite a payload"


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
@dataclass
class Roles:
    producer: str
    worker: str
    operator: str
    password: str

    def dsn(self, base: str, role: str) -> str:
        return make_conninfo(base, user=role, password=self.password)


@pytest.fixture
def roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    tag = uuid.uuid4().hex[:8]
    made = Roles(f"sk_prod_{tag}", f"sk_work_{tag}", f"sk_op_{tag}", f"Pw-{tag}-s3cr3t%x")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for role in (made.producer, made.worker, made.operator):
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(made.password))
            )
    try:
        yield made
    finally:
        drop_schema(pg_dsn, schema)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for role in (made.producer, made.worker, made.operator):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


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
    return "skiplock_queue_jobs" in bodies[0]


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
