"""``skiplock.doctor`` on a real PostgreSQL: each check passes when healthy and fails for the right reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from skiplock import Settings
from skiplock.doctor import (
    Check,
    Thresholds,
    check_autovacuum,
    check_bloat,
    check_dead_tuples,
    check_listen,
    check_naptime,
    check_schema_version,
    check_vacuum_lag,
    check_xmin_horizon,
    estimate_bloat,
    exit_code,
    expected_indexes,
    render_json,
    render_text,
    run_checks,
)
from skiplock.migrate import latest_version
from skiplock.sql import queries_for
from support.bouncer import run_pgbouncer
from support.pg import wait_for

FAST = Thresholds(listen_timeout_seconds=2.0)


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def server_autovacuum(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()
    return bool(row and row[0])


# ------------------------------------------------------------------------------------------ pure checks
def test_expected_indexes_follow_the_migrations() -> None:
    assert expected_indexes() == (
        "jobs_pkey",
        "jobs_claim_idx",
        "jobs_failed_idx",
        "jobs_idempotency_idx",
        "jobs_lease_deadline_idx",
        "jobs_cancelled_idx",
        "jobs_done_idx",
        "jobs_unique_idx",
        "jobs_serial_idx",
        "jobs_serial_running_idx",
        "jobs_failure_fingerprint_idx",
        "jobs_failed_id_idx",
        "jobs_workflow_idx",
        "jobs_waiting_idx",
    )
    later = "CREATE INDEX jobs_x_idx ON {schema}.jobs (queue);\nDROP INDEX {schema}.jobs_failed_idx;"
    assert expected_indexes(["CREATE INDEX jobs_failed_idx ON {schema}.jobs (queue);", later]) == (
        "jobs_pkey",
        "jobs_x_idx",
    )


@pytest.mark.parametrize(
    ("found", "latest", "ok", "severity"),
    [(0, 1, False, "critical"), (1, 2, False, "critical"), (2, 1, False, "warning"), (1, 1, True, "info")],
)
def test_schema_version_table(found: int, latest: int, ok: bool, severity: str) -> None:
    check = check_schema_version("s", found, latest)
    assert (check.ok, check.severity) == (ok, severity)


@pytest.mark.parametrize(
    ("reloptions", "server", "autovacuum_on", "ok", "severity"),
    [
        (["autovacuum_vacuum_scale_factor=0.01"], 0.2, True, True, "info"),
        (None, 0.2, True, False, "warning"),  # the server default is far too lazy for a queue table
        (None, 0.02, True, True, "info"),
        (["autovacuum_enabled=false"], 0.2, True, False, "critical"),
        (["autovacuum_vacuum_scale_factor=0.01"], 0.2, False, False, "critical"),
    ],
)
def test_autovacuum_table(
    reloptions: list[str] | None, server: float, autovacuum_on: bool, ok: bool, severity: str
) -> None:
    row = {
        "reloptions": reloptions,
        "autovacuum_on": autovacuum_on,
        "track_counts_on": True,
        "server_vacuum_scale_factor": server,
    }
    check = check_autovacuum("s", row)
    assert (check.ok, check.severity) == (ok, severity), check
    if not ok:
        assert check.advice


@pytest.mark.parametrize(
    ("live", "dead", "ok"),
    [(0, 0, True), (100, 900, True), (100_000, 10_000, True), (10_000, 10_000, False), (0, 50_000, False)],
)
def test_dead_tuples_table(live: int, dead: int, ok: bool) -> None:
    vacuumed = datetime(2026, 1, 1, tzinfo=UTC)
    row = {"live": live, "dead": dead, "last_autovacuum": None, "last_vacuum": vacuumed}
    assert check_dead_tuples("s", row, Thresholds()).ok is ok


VACUUM_ROW = {  # what doctor_vacuum_state returns for a table of 10,000 rows of about 100 bytes of data each
    "pages": 160, "reltuples": 10_000.0, "block_size": 8192, "fillfactor": 85, "data_width": 100.0,
    "table_bytes": 160 * 8192, "index_bytes": 400_000, "live": 10_000, "dead": 0, "vacuum_age_seconds": 30.0,
    "vacuum_trigger": 150.0, "naptime_seconds": 60.0, "table_cost_delay": None, "server_cost_delay": "2ms",
    "vacuum_phase": None,
}  # fmt: skip


@pytest.mark.parametrize(
    ("pages", "reltuples", "ratio"),
    [(160, 10_000, 0.0), (1600, 10_000, 0.9), (320, 10_000, 0.5), (160, 0, 159 / 160)],
)
def test_bloat_estimate_table(pages: int, reltuples: int, ratio: float) -> None:
    # a row: 24 header + 104 data (100 aligned to 8) + 4 line pointer = 132 bytes; a page: 8168 * 0.85 = 6942.8
    # bytes of rows, so 10,000 rows need ceil(10,000 * 132 / 6942.8) = 191 pages (160 would be too few: none spare)
    row = {**VACUUM_ROW, "pages": pages, "reltuples": float(reltuples)}
    estimate = estimate_bloat(row)
    assert estimate is not None
    needed = 191 if reltuples else 1
    assert estimate[0] == pytest.approx(max(0, pages - needed) / pages) if ratio else estimate[0] == 0
    assert estimate[1] == max(0, pages - needed) * 8192
    assert estimate_bloat({**row, "data_width": None}) is None  # never analyzed


def test_bloat_check_table() -> None:
    th = Thresholds(bloat_ratio=0.5, bloat_min_bytes=1)
    bloated = check_bloat("s", {**VACUUM_ROW, "pages": 1600, "table_bytes": 1600 * 8192}, th)
    assert (bloated.ok, bloated.severity) == (False, "warning")
    assert "pg_repack" in bloated.advice and "VACUUM (FULL)" in bloated.advice
    assert check_bloat("s", {**VACUUM_ROW, "pages": 300}, th).ok  # 36 % spare: a queue table's normal churn room
    assert check_bloat("s", {**VACUUM_ROW, "pages": 1600}, Thresholds()).ok  # 11 MB wasted: under the floor
    assert check_bloat("s", {**VACUUM_ROW, "pages": 0}, th).ok  # a new table
    assert check_bloat("s", {**VACUUM_ROW, "data_width": None}, th).severity == "info"  # no statistics: skipped


def test_vacuum_lag_table() -> None:
    th = Thresholds(dead_min=1000, vacuum_lag_naptimes=5, vacuum_lag_critical_seconds=3600)
    due = {**VACUUM_ROW, "dead": 50_000}
    assert check_vacuum_lag("s", due, th).ok  # due, but vacuumed 30 s ago: autovacuum is on it
    late = check_vacuum_lag("s", {**due, "vacuum_age_seconds": 600.0}, th)
    assert (late.ok, late.severity) == (False, "warning")
    assert "autovacuum_vacuum_cost_delay = 0" in late.advice and "cost delay 2ms" in late.detail
    assert check_vacuum_lag("s", {**due, "vacuum_age_seconds": 7200.0}, th).severity == "critical"
    assert check_vacuum_lag("s", {**due, "vacuum_age_seconds": None}, th).severity == "critical"  # never
    assert check_vacuum_lag("s", {**VACUUM_ROW, "dead": 100, "vacuum_age_seconds": None}, th).ok  # not due
    running = check_vacuum_lag("s", {**due, "vacuum_age_seconds": 600.0, "vacuum_phase": "scanning heap"}, th)
    assert "running now (scanning heap)" in running.detail


def test_naptime_table() -> None:
    th = Thresholds(dead_min=1000, naptime_seconds=15)
    churned = {**VACUUM_ROW, "live": 200_000, "dead": 500_000}  # the soak at 3,000 jobs/s, stock naptime
    slow = check_naptime("s", churned, th)
    assert (slow.ok, slow.severity) == (False, "warning") and "every 60s" in slow.detail
    assert "ALTER SYSTEM SET autovacuum_naptime = '10s'" in slow.advice and "pg_reload_conf()" in slow.advice
    assert check_naptime("s", {**churned, "naptime_seconds": 10.0}, th).ok  # visited often enough
    assert check_naptime("s", {**churned, "dead": 150_000}, th).ok  # fewer dead rows than live: it keeps up
    assert check_naptime("s", {**churned, "live": 0, "dead": 500}, th).ok  # a quiet table
    assert check_naptime("s", None, th).severity == "info"  # no statistics: skipped


def test_xmin_horizon_table() -> None:
    def row(age: float | None, xmin_age: int) -> dict[str, Any]:
        return {"holder": "pid 7", "kind": "session", "age_seconds": age, "xmin_age": xmin_age, "detail": "user=x"}

    th = Thresholds(xact_warning_seconds=300, xact_critical_seconds=3600, xmin_age_critical=1000)
    assert check_xmin_horizon([], th).ok
    assert check_xmin_horizon([row(10, 5)], th).ok
    assert check_xmin_horizon([row(301, 5)], th).severity == "warning"
    assert check_xmin_horizon([row(3601, 5)], th).severity == "critical"
    slot = check_xmin_horizon([row(None, 2000)], th)  # a replication slot has no age in seconds
    assert (slot.ok, slot.severity) == (False, "critical")
    assert "pid 7" in slot.detail


def test_listen_table() -> None:
    assert check_listen(True, 1, [5, 5, 5]).ok
    assert not check_listen(False, 1, [5, 5, 5]).ok
    pooled = check_listen(True, 1, [5, 6, 5])
    assert not pooled.ok
    assert "PgBouncer" in pooled.detail
    assert "--no-listen" in pooled.advice


def test_rendering_and_exit_code() -> None:
    good = Check("a", True, "info", "fine")
    skip = Check("b", False, "info", "skipped: x")
    warn = Check("c", False, "warning", "bad", "do this")
    assert exit_code([good, skip]) == 0
    assert exit_code([good, warn]) == 1
    text = render_text([good, skip, warn])
    assert "[      ok] a: fine" in text
    assert "[    SKIP] b" in text
    assert "[ WARNING] c: bad" in text
    assert "-> do this" in text
    assert text.endswith("1 problem(s) found\n")
    doc = json.loads(render_json([good, warn]))
    assert doc["ok"] is False
    assert doc["checks"][1] == {
        "name": "c",
        "ok": False,
        "severity": "warning",
        "detail": "bad",
        "advice": "do this",
    }


# ------------------------------------------------------------------------------------------ real database
def test_fresh_schema_is_healthy(conn: psycopg.Connection[Any], settings: Settings) -> None:
    checks = run_checks(conn, settings, thresholds=FAST)
    assert [c.name for c in checks] == [
        "schema_version",
        "indexes",
        "autovacuum",
        "dead_tuples",
        "table_bloat",
        "autovacuum_lag",
        "autovacuum_naptime",
        "xmin_horizon",
        "listen",
        "stalled_jobs",
    ]
    for check in checks:
        if check.name == "autovacuum" and not server_autovacuum(conn):  # CI's server runs with autovacuum = off
            assert (check.ok, check.severity) == (False, "critical")
            assert "whole server" in check.detail
        else:
            assert check.ok, render_text(checks)
    assert exit_code(checks) == (0 if server_autovacuum(conn) else 1)
    assert f"version {latest_version()}" in checks[0].detail


def test_unmigrated_schema_is_critical_and_skips_table_checks(pg_dsn: str, conn: psycopg.Connection[Any]) -> None:
    settings = Settings.load(env={}, dsn=pg_dsn, schema=f"absent_{uuid.uuid4().hex[:8]}")
    checks = by_name(run_checks(conn, settings, thresholds=FAST))
    assert (checks["schema_version"].ok, checks["schema_version"].severity) == (False, "critical")
    assert "skiplock migrate" in checks["schema_version"].advice
    names = ("indexes", "autovacuum", "dead_tuples", "table_bloat", "autovacuum_lag", "autovacuum_naptime")
    for name in (*names, "stalled_jobs"):
        assert (checks[name].ok, checks[name].severity) == (False, "info")
        assert checks[name].detail.startswith("skipped:")
    assert checks["listen"].ok
    assert exit_code(list(checks.values())) == 1


def test_missing_and_invalid_indexes(conn: psycopg.Connection[Any], settings: Settings, schema: str) -> None:
    conn.execute(f'DROP INDEX "{schema}".jobs_lease_deadline_idx')
    conn.execute(  # what an interrupted CREATE INDEX CONCURRENTLY leaves behind
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)",
        [f'"{schema}".jobs_failed_idx'],
    )
    check = by_name(run_checks(conn, settings, thresholds=FAST))["indexes"]
    assert (check.ok, check.severity) == (False, "critical")
    assert "missing: jobs_lease_deadline_idx" in check.detail
    assert "invalid: jobs_failed_idx" in check.detail


def test_autovacuum_reset_to_server_default(conn: psycopg.Connection[Any], settings: Settings, schema: str) -> None:
    conn.execute(f'ALTER TABLE "{schema}".jobs RESET (autovacuum_vacuum_scale_factor)')
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(queries_for(schema).doctor_autovacuum, {"table": f'"{schema}".jobs'}).fetchone()
    assert row is not None
    assert not any(o.startswith("autovacuum_vacuum_scale_factor=") for o in row["reloptions"])
    if server_autovacuum(conn) and row["server_vacuum_scale_factor"] > 0.05:
        check = by_name(run_checks(conn, settings, thresholds=FAST))["autovacuum"]
    else:  # autovacuum off, or an eager server default, would mask the table's finding: judge the table's own
        # options as a stock server (autovacuum on, scale factor 0.2) would see them
        check = check_autovacuum(schema, {**row, "autovacuum_on": True, "server_vacuum_scale_factor": 0.2})
    assert (check.ok, check.severity) == (False, "warning")
    assert "server default" in check.detail
    assert "autovacuum_vacuum_scale_factor = 0.01" in check.advice


def test_dead_tuples_after_mass_delete(conn: psycopg.Connection[Any], settings: Settings, schema: str) -> None:
    conn.execute(f'ALTER TABLE "{schema}".jobs SET (autovacuum_enabled = false)')  # keep the dead rows
    conn.execute(
        f"INSERT INTO \"{schema}\".jobs (payload, status) SELECT '{{}}', 'done' FROM generate_series(1, 12000)"
    )
    conn.execute(f'DELETE FROM "{schema}".jobs')
    th = Thresholds(listen_timeout_seconds=2.0, dead_min=10_000, dead_ratio=0.2)

    def dead_check() -> Check | None:
        conn.execute("SELECT pg_stat_force_next_flush()")  # statistics are flushed lazily (PostgreSQL 15+)
        check = by_name(run_checks(conn, settings, thresholds=th))["dead_tuples"]
        return check if not check.ok else None

    check = wait_for(dead_check, timeout=10, interval=0.2, what="dead tuples in pg_stat_user_tables")
    assert check is not None and check.severity == "warning"
    assert "12000 dead" in check.detail
    assert "VACUUM" in check.advice
    autovacuum = by_name(run_checks(conn, settings, thresholds=th))["autovacuum"]
    assert (autovacuum.ok, autovacuum.severity) == (False, "critical")


def test_long_transaction_holds_the_xmin_horizon(
    pg_dsn: str, conn: psycopg.Connection[Any], settings: Settings
) -> None:
    with psycopg.connect(pg_dsn, application_name="doctor-test-holder") as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")  # takes the snapshot: backend_xmin is set now
        pid = holder.info.backend_pid
        th = Thresholds(listen_timeout_seconds=2.0, xact_warning_seconds=0.0)
        check = by_name(run_checks(conn, settings, thresholds=th))["xmin_horizon"]
        assert (check.ok, check.severity) == (False, "warning")
        assert f"pid {pid}" in check.detail
        assert "doctor-test-holder" in check.detail
        assert "pg_terminate_backend" in check.advice
        holder.rollback()
    assert by_name(run_checks(conn, settings, thresholds=FAST))["xmin_horizon"].ok


def test_stalled_jobs(conn: psycopg.Connection[Any], settings: Settings, schema: str) -> None:
    conn.execute(
        f'INSERT INTO "{schema}".jobs (queue, payload, status, attempts, locked_by, locked_at) '
        "VALUES ('emails', '{}', 'processing', 1, 'gone:1:x', now() - interval '1 hour')"
    )
    check = by_name(run_checks(conn, settings, thresholds=FAST))["stalled_jobs"]
    assert (check.ok, check.severity) == (False, "warning")
    assert "emails=1" in check.detail


def test_listen_round_trip_fails_when_notifications_cannot_reach_this_session(
    pg_dsn: str, conn: psycopg.Connection[Any], settings: Settings
) -> None:
    """NOTIFY is per database: a sender on another database never reaches our LISTEN (as behind a pooler)."""
    other = f"doctor_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE DATABASE "{other}"')
    try:
        with psycopg.connect(pg_dsn, autocommit=True, dbname=other) as elsewhere:
            th = Thresholds(listen_timeout_seconds=0.5)
            checks = by_name(run_checks(elsewhere, settings, thresholds=th))
        assert (checks["listen"].ok, checks["listen"].severity) == (False, "warning")
        assert "no notification came back within 0.5s" in checks["listen"].detail
        assert "--no-listen" in checks["listen"].advice
    finally:
        conn.execute(f'DROP DATABASE "{other}" WITH (FORCE)')


def test_listen_off_is_not_a_problem(conn: psycopg.Connection[Any], settings: Settings) -> None:
    check = by_name(run_checks(conn, settings.replace(listen=False), thresholds=FAST))["listen"]
    assert check.ok
    assert "poll every 1s" in check.detail


def test_leaves_a_transactional_connection_as_it_was(pg_dsn: str, settings: Settings) -> None:
    with psycopg.connect(pg_dsn) as plain:
        checks = by_name(run_checks(plain, settings, thresholds=FAST))
        assert checks["schema_version"].ok and checks["listen"].ok and checks["xmin_horizon"].ok
        assert plain.autocommit is False


# ------------------------------------------------------------------------------------------ behind PgBouncer
@pytest.fixture
def pgbouncer(pg_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A real PgBouncer in front of the test database, in the pool mode of the test's parameter; yields its DSN."""
    with run_pgbouncer(pg_dsn, request.param) as dsn:
        yield dsn


@pytest.mark.parametrize(("pgbouncer", "works"), [("transaction", False), ("session", True)], indirect=["pgbouncer"])
def test_listen_check_behind_a_real_pgbouncer(pgbouncer: str, settings: Settings, works: bool) -> None:
    """Transaction pooling breaks LISTEN (the doctor says so and what to do); session pooling keeps it."""
    via_bouncer = settings.replace(dsn=pgbouncer)
    with psycopg.connect(pgbouncer, autocommit=True) as conn:
        checks = by_name(run_checks(conn, via_bouncer, thresholds=Thresholds(listen_timeout_seconds=1.0)))
    assert checks["schema_version"].ok  # everything else works through the pooler
    assert checks["listen"].ok is works, checks["listen"]
    if not works:
        assert checks["listen"].severity == "warning"
        assert "PgBouncer" in checks["listen"].detail
        assert "--no-listen" in checks["listen"].advice


# ------------------------------------------------------------------------------------------ through the CLI
def test_cli_doctor_json_and_exit_codes(pg_dsn: str, schema: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "skiplock", "doctor", "--dsn", pg_dsn, *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)

    out = doctor("--schema", schema, "--json")
    report = json.loads(out.stdout)
    assert report["checks"][0]["name"] == "schema_version"
    assert set(report["checks"][0]) == {"name", "ok", "severity", "detail", "advice"}
    assert out.returncode == (0 if report["ok"] else 1), out.stdout + out.stderr
    missing = doctor("--schema", f"absent_{uuid.uuid4().hex[:8]}")
    assert missing.returncode == 1
    assert "[CRITICAL] schema_version" in missing.stdout
    assert "skiplock migrate" in missing.stdout


def test_bloat_and_autovacuum_lag_after_most_rows_are_deleted(
    conn: psycopg.Connection[Any], settings: Settings, schema: str
) -> None:
    """A table that once held a large backlog: 60,000 jobs, 90 % deleted, then VACUUM ANALYZE keeps its pages (free
    for reuse, not returned): the estimate sees the spare space. With autovacuum off on the table and fresh dead
    rows nobody vacuums, autovacuum lags."""
    table = f'"{schema}".jobs'
    conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    conn.execute(
        f"INSERT INTO {table} (payload, status) "
        "SELECT jsonb_build_object('order', g, 'note', repeat('x', 80)), 'done' FROM generate_series(1, 60000) AS g"
    )
    conn.execute(f"DELETE FROM {table} WHERE id % 10 <> 0")
    conn.execute(f"VACUUM ANALYZE {table}")
    th = Thresholds(listen_timeout_seconds=2.0, bloat_min_bytes=1, dead_min=10_000)
    bloat = by_name(run_checks(conn, settings, thresholds=th))["table_bloat"]
    assert (bloat.ok, bloat.severity) == (False, "warning"), bloat
    ratio = float(bloat.detail.split("about ")[1].split("%")[0])
    assert 80 <= ratio < 100, bloat.detail
    assert check_bloat(schema, None, th).severity == "info"

    conn.execute(f"UPDATE {table} SET attempts = attempts + 1")  # 6,000 dead rows
    conn.execute(f"UPDATE {table} SET attempts = attempts + 1")  # 12,000, past the trigger (50 + 0.01 * 6,000)

    def lag() -> Check | None:
        conn.execute("SELECT pg_stat_force_next_flush()")
        check = by_name(run_checks(conn, settings, thresholds=th))["autovacuum_lag"]
        return check if not check.ok else None

    th = Thresholds(listen_timeout_seconds=2.0, dead_min=10_000, vacuum_lag_naptimes=0)
    check = wait_for(lag, timeout=10, interval=0.2, what="dead tuples past the autovacuum trigger")
    assert check is not None and check.severity == "warning", check  # vacuumed moments ago: not critical
    assert "autovacuum starts at 110" in check.detail
    assert "autovacuum_vacuum_cost_delay = 0" in check.advice
