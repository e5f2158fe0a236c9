"""``skiplock doctor``: health checks of the database a queue lives in, each with what to do about it.

The checks are small pure functions over rows (table-tested without a database); :func:`run_checks` is the
only I/O. Every check returns a :class:`Check`; a check that could not run (the schema is missing) says so
with ``ok=False`` and severity ``info``, which does not fail the run.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from skiplock.job import QueueStats
from skiplock.migrate import current_version, latest_version
from skiplock.settings import Settings, redact
from skiplock.sql import migrations, queries_for
from skiplock.store.statements import stats_from_row

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")

# Recommended storage options of the jobs table (the seed's advice, set by migration 0001).
RECOMMENDED_VACUUM_SCALE_FACTOR = 0.05


@dataclass(frozen=True)
class Check:
    """One finding. ``severity`` is how bad it is when ``ok`` is false; passed checks carry ``info``."""

    name: str
    ok: bool
    severity: Severity
    detail: str
    advice: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Thresholds:
    """Where a finding starts; every value has a reason in the runbook (docs/operations.md, `skiplock doctor`)."""

    dead_ratio: float = 0.2
    """Dead tuples over all tuples of the jobs table above which vacuum is falling behind."""

    dead_min: int = 10_000
    """Fewer dead tuples than this are never a problem, whatever the ratio (small tables)."""

    xact_warning_seconds: float = 300.0
    """A transaction (or prepared transaction) holding the xmin horizon this long is a warning."""

    xact_critical_seconds: float = 3600.0
    """... and this long is critical: dead job rows pile up and claims slow down for everyone."""

    xmin_age_critical: int = 500_000_000
    """Transaction-id age of the oldest xmin that is critical on its own (half-way to wraparound)."""

    listen_timeout_seconds: float = 2.0
    """How long the LISTEN round-trip waits for its own notification."""

    bloat_ratio: float = 0.5
    """Share of the jobs table's pages its live rows do not need above which it is bloated. A queue table always
    carries the free space of the rows churned between two vacuums (the soak benchmark's table held about as much
    free space as live rows); more than half the table is space a past backlog or a stalled vacuum left behind."""

    bloat_min_bytes: int = 64 * 2**20
    """Tables wasting less than this are never reported, whatever the ratio."""

    vacuum_lag_naptimes: float = 5.0
    """Autovacuum lags when the table's dead tuples are past its trigger and no vacuum has finished for this many
    autovacuum_naptime (5 minutes at the default 1 min): in the soak benchmark every minute without a vacuum of a
    busy jobs table added millions of dead tuples and grew the table and its indexes for good."""

    vacuum_lag_critical_seconds: float = 3600.0
    """... and lags critically past this long."""

    naptime_seconds: float = 15.0
    """Longest ``autovacuum_naptime`` (how often autovacuum visits each database) that is fine for a jobs table
    carrying more dead rows than live ones between two visits. In the soak benchmark at 3,000 jobs/s the stock
    60 s let 500,000-600,000 dead rows pile up between vacuums (more than the live ones) and the table and its
    indexes grew a tenth in two minutes; at 10 s they stayed under 70,000 (docs/performance.md, "Soak")."""


def ok(name: str, detail: str) -> Check:
    return Check(name, True, "info", detail)


def skipped(name: str, why: str) -> Check:
    return Check(name, False, "info", f"skipped: {why}")


# ------------------------------------------------------------------------------------------- pure checks
def check_schema_version(schema: str, found: int, latest: int) -> Check:
    name = "schema_version"
    if found == 0:
        return Check(
            name,
            False,
            "critical",
            f"schema {schema!r} has no skiplock tables",
            f"run 'skiplock migrate --schema {schema}' (or let the operator migrate it)",
        )
    if found < latest:
        return Check(
            name,
            False,
            "critical",
            f"schema {schema!r} is at version {found}, this skiplock needs {latest}",
            "run 'skiplock migrate' before starting workers of this version",
        )
    if found > latest:
        return Check(
            name,
            False,
            "warning",
            f"schema {schema!r} is at version {found}, newer than this skiplock ({latest})",
            "upgrade this skiplock (workers, CLI) to the version that migrated the schema",
        )
    return ok(name, f"schema {schema!r} is at version {found} (latest)")


_CREATE_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+ON\s+\{schema\}\.jobs\b",
    re.IGNORECASE,
)
_DROP_INDEX = re.compile(r"DROP\s+INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+EXISTS\s+)?(?:\{schema\}\.)?(\w+)", re.IGNORECASE)


def expected_indexes(sources: Iterable[str] | None = None) -> tuple[str, ...]:
    """Indexes of the jobs table the migrations create (and do not drop later), plus the primary key."""
    names: list[str] = ["jobs_pkey"]
    for text in sources if sources is not None else (m.text for m in migrations()):
        for line in text.splitlines():
            if line.lstrip().startswith("--"):
                continue
            if created := _CREATE_INDEX.search(line):
                names.append(created[1])
            elif dropped := _DROP_INDEX.search(line):
                names = [n for n in names if n != dropped[1]]
    return tuple(dict.fromkeys(names))


def check_indexes(schema: str, rows: Sequence[Mapping[str, Any]], expected: Sequence[str]) -> Check:
    name = "indexes"
    present = {r["name"]: bool(r["valid"]) and bool(r["ready"]) for r in rows}
    missing = [n for n in expected if n not in present]
    invalid = [n for n in expected if n in present and not present[n]]
    if missing or invalid:
        parts = []
        if missing:
            parts.append("missing: " + ", ".join(missing))
        if invalid:
            parts.append("invalid: " + ", ".join(invalid))
        return Check(
            name,
            False,
            "critical",
            f"indexes of {schema}.jobs " + "; ".join(parts),
            "claims and lease recovery scan the whole table without them: drop the invalid ones "
            "and re-create them from the migration (CREATE INDEX CONCURRENTLY)",
        )
    return ok(name, f"all {len(expected)} expected indexes of {schema}.jobs are present and valid")


def parse_reloptions(options: Sequence[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in options or ():
        key, _, value = item.partition("=")
        out[key.strip().lower()] = value.strip()
    return out


def check_autovacuum(schema: str, row: Mapping[str, Any]) -> Check:
    name = "autovacuum"
    table = f"{schema}.jobs"
    if not row["autovacuum_on"] or not row["track_counts_on"]:
        return Check(
            name,
            False,
            "critical",
            "autovacuum (or track_counts) is off for the whole server",
            "turn autovacuum and track_counts on in postgresql.conf: a queue table bloats within hours without them",
        )
    opts = parse_reloptions(row["reloptions"])
    if opts.get("autovacuum_enabled", "true").lower() in ("false", "off", "0", "no"):
        return Check(
            name,
            False,
            "critical",
            f"autovacuum is disabled on {table} (autovacuum_enabled=false)",
            f"ALTER TABLE {table} RESET (autovacuum_enabled);",
        )
    factor_text = opts.get("autovacuum_vacuum_scale_factor")
    factor = float(factor_text) if factor_text is not None else float(row["server_vacuum_scale_factor"])
    source = "table option" if factor_text is not None else "server default"
    if factor > RECOMMENDED_VACUUM_SCALE_FACTOR:
        return Check(
            name,
            False,
            "warning",
            f"{table} is vacuumed only after {factor:.0%} of its rows changed ({source})",
            f"ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_analyze_scale_factor = 0.02);  -- a queue table is updated all the time",
        )
    return ok(name, f"{table} autovacuum_vacuum_scale_factor={factor:g} ({source})")


def check_dead_tuples(schema: str, row: Mapping[str, Any] | None, th: Thresholds) -> Check:
    name = "dead_tuples"
    table = f"{schema}.jobs"
    if row is None:
        return skipped(name, f"no statistics for {table}")
    live, dead = int(row["live"] or 0), int(row["dead"] or 0)
    ratio = dead / (live + dead) if live + dead else 0.0
    last = row.get("last_autovacuum") or row.get("last_vacuum")
    when = f"last vacuum {last:%Y-%m-%d %H:%M:%S %Z}" if isinstance(last, datetime) else "never vacuumed"
    detail = f"{table}: {dead} dead / {live} live tuples ({ratio:.0%} dead), {when}"
    if dead >= th.dead_min and ratio >= th.dead_ratio:
        return Check(
            name,
            False,
            "warning",
            detail,
            "vacuum is falling behind: look for long transactions (xmin_horizon), lower the "
            "table's autovacuum_vacuum_scale_factor, purge old done jobs in batches, or run "
            f"VACUUM {table};",
        )
    return ok(name, detail)


def estimate_bloat(row: Mapping[str, Any]) -> tuple[float, int] | None:
    """(share of the table's pages its live rows do not need, bytes that share takes), or None without planner
    statistics. A row takes its 24-byte header, its data (the sum of pg_stats.avg_width, aligned to 8) and a 4-byte
    line pointer; a page holds block_size - 24 bytes of them, filled up to the table's fillfactor."""
    pages, width = int(row["pages"] or 0), row["data_width"]
    if pages <= 0 or width is None:
        return None
    row_bytes = 24 + math.ceil(float(width) / 8) * 8 + 4
    usable = (int(row["block_size"]) - 24) * int(row["fillfactor"]) / 100
    needed = max(1, math.ceil(float(row["reltuples"]) * row_bytes / usable))
    spare = max(0, pages - needed)
    return spare / pages, spare * int(row["block_size"])


def check_bloat(schema: str, row: Mapping[str, Any] | None, th: Thresholds) -> Check:
    name = "table_bloat"
    table = f"{schema}.jobs"
    if row is not None and not int(row["pages"] or 0):
        return ok(name, f"{table} takes no pages yet (or was never vacuumed nor analyzed)")
    estimate = None if row is None else estimate_bloat(row)
    if row is None or estimate is None:
        return skipped(name, f"no planner statistics for {table} yet (ANALYZE {table}; fills them)")
    ratio, wasted = estimate
    mb = 2**20
    detail = (
        f"{table}: {int(row['table_bytes']) / mb:.0f} MB, about {ratio:.0%} ({wasted / mb:.0f} MB) not needed by its "
        f"{float(row['reltuples']):.0f} rows; indexes {int(row['index_bytes']) / mb:.0f} MB"
    )
    if ratio >= th.bloat_ratio and wasted >= th.bloat_min_bytes:
        return Check(
            name,
            False,
            "warning",
            detail,
            "vacuum makes the space reusable but does not return it: once the cause is fixed (a backlog that "
            "drained, a long transaction, autovacuum lagging: see autovacuum_lag), rewrite the table in a quiet "
            f"window with pg_repack (online) or VACUUM (FULL) {table}; (locks it), and REINDEX TABLE CONCURRENTLY "
            f"{table};",
        )
    return ok(name, detail)


def check_vacuum_lag(schema: str, row: Mapping[str, Any] | None, th: Thresholds) -> Check:
    name = "autovacuum_lag"
    table = f"{schema}.jobs"
    if row is None:
        return skipped(name, f"no statistics for {table}")
    dead, trigger = int(row["dead"] or 0), float(row["vacuum_trigger"] or 0)
    age = row["vacuum_age_seconds"]
    naptime = float(row["naptime_seconds"] or 60)
    since = "never vacuumed" if age is None else f"last vacuum {float(age):.0f}s ago"
    running = f"; a vacuum is running now ({row['vacuum_phase']})" if row.get("vacuum_phase") else ""
    detail = f"{table}: {dead} dead tuples, autovacuum starts at {trigger:.0f}; {since}{running}"
    due = dead > trigger and dead >= th.dead_min
    late = age is None or float(age) >= th.vacuum_lag_naptimes * naptime
    if not (due and late):
        return ok(name, detail)
    cost = row["table_cost_delay"] if row["table_cost_delay"] is not None else row["server_cost_delay"]
    critical = age is None or float(age) >= th.vacuum_lag_critical_seconds
    return Check(
        name,
        False,
        "critical" if critical else "warning",
        f"{detail}; autovacuum is behind (naptime {naptime:g}s, cost delay {cost})",
        "let autovacuum work the jobs table at full speed: ALTER TABLE "
        f"{table} SET (autovacuum_vacuum_cost_delay = 0); on a server with busy queues "
        "lower autovacuum_naptime to 10s and raise autovacuum_max_workers; if a vacuum runs but never ends, look "
        "for what holds the xmin horizon (xmin_horizon)",
    )


def check_naptime(schema: str, row: Mapping[str, Any] | None, th: Thresholds) -> Check:
    """Autovacuum's visits against the jobs table's churn: a table holding more dead rows than live ones (and at
    least ``dead_min``) on a server whose ``autovacuum_naptime`` is longer than ``naptime_seconds`` grows with every
    visit autovacuum makes too late. A per-table setting cannot change it: the naptime is server-wide."""
    name = "autovacuum_naptime"
    table = f"{schema}.jobs"
    if row is None:
        return skipped(name, f"no statistics for {table}")
    naptime = float(row["naptime_seconds"] or 60)
    live, dead = int(row["live"] or 0), int(row["dead"] or 0)
    detail = f"autovacuum visits every {naptime:g}s; {table} holds {dead} dead / {live} live tuples"
    if naptime <= th.naptime_seconds or dead < th.dead_min or dead <= live:
        return ok(name, detail)
    return Check(
        name,
        False,
        "warning",
        f"{detail}: more dead rows pile up between two visits than the table has live ones",
        "visit busy queue tables more often (server-wide, no restart): ALTER SYSTEM SET autovacuum_naptime = "
        "'10s'; SELECT pg_reload_conf();  -- or autovacuum_naptime = 10s in postgresql.conf / your provider's "
        "parameter group",
    )


def check_xmin_horizon(rows: Sequence[Mapping[str, Any]], th: Thresholds) -> Check:
    name = "xmin_horizon"
    if not rows:
        return ok(name, "no other session, slot or prepared transaction holds back the xmin horizon")
    worst = rows[0]
    oldest_seconds = max((float(r["age_seconds"]) for r in rows if r["age_seconds"] is not None), default=0.0)
    xmin_age = max(int(r["xmin_age"] or 0) for r in rows)

    def describe(r: Mapping[str, Any]) -> str:
        age = f"{float(r['age_seconds']):.0f}s" if r["age_seconds"] is not None else "?"
        return f"{r['holder']} ({r['kind']}, open {age}, xmin age {r['xmin_age']} xids; {r['detail']})"

    detail = "oldest xmin held by " + describe(worst)
    advice = (
        "a long transaction, an abandoned replication slot or a forgotten prepared transaction stops "
        "VACUUM from removing dead job rows: end it (pg_terminate_backend(pid), "
        "pg_drop_replication_slot, ROLLBACK PREPARED), and set idle_in_transaction_session_timeout "
        "for application roles"
    )
    if oldest_seconds >= th.xact_critical_seconds or xmin_age >= th.xmin_age_critical:
        return Check(name, False, "critical", detail, advice)
    if oldest_seconds >= th.xact_warning_seconds:
        return Check(name, False, "warning", detail, advice)
    return ok(name, f"oldest transaction holding the xmin horizon is {oldest_seconds:.0f}s old ({worst['holder']})")


def check_listen(received: bool, timeout: float, pids: Sequence[int]) -> Check:
    name = "listen"
    pooled = len(set(pids)) > 1
    if received and not pooled:
        return ok(name, "LISTEN/NOTIFY round-trip works on this connection")
    problems = []
    if not received:
        problems.append(f"no notification came back within {timeout:g}s")
    if pooled:
        problems.append(f"consecutive transactions ran on different server processes {sorted(set(pids))}")
    detail = "; ".join(problems) + " (a transaction-mode pooler such as PgBouncer?)"
    return Check(
        name,
        False,
        "warning",
        detail,
        "point workers at PostgreSQL directly or at a session-mode pool, or run them with "
        "--no-listen (SKIPLOCK_LISTEN=false): they then poll every poll_seconds",
    )


def check_stalled(stats: Sequence[QueueStats], lease_seconds: float) -> Check:
    name = "stalled_jobs"
    stalled = {s.queue: s.stalled for s in stats if s.stalled}
    if stalled:
        listing = ", ".join(f"{q}={n}" for q, n in sorted(stalled.items()))
        detail = f"jobs processing past their {lease_seconds:g}s lease: {listing}"
        return Check(
            name,
            False,
            "warning",
            detail,
            "their workers stopped heartbeating (crashed, OOM-killed, partitioned): make sure "
            "workers of these queues run, they recover expired leases every recover_seconds; "
            "if leases expire while handlers still run, raise lease_seconds",
        )
    return ok(name, f"no job is processing past its {lease_seconds:g}s lease")


# ------------------------------------------------------------------------------------------- rendering
def exit_code(checks: Sequence[Check]) -> int:
    """0 when nothing needs doing, 1 when any warning or critical check failed."""
    return 1 if any(not c.ok and c.severity != "info" for c in checks) else 0


def render_text(checks: Sequence[Check]) -> str:
    lines = []
    for c in checks:
        mark = "ok" if c.ok else ("SKIP" if c.severity == "info" else c.severity.upper())
        lines.append(f"[{mark:>8}] {c.name}: {c.detail}")
        if not c.ok and c.advice:
            lines.append(f"{'':11}-> {c.advice}")
    problems = sum(1 for c in checks if not c.ok and c.severity != "info")
    lines.append(f"{problems} problem(s) found" if problems else "no problems found")
    return "\n".join(lines) + "\n"


def render_json(checks: Sequence[Check]) -> str:
    document = {"ok": exit_code(checks) == 0, "checks": [c.to_dict() for c in checks]}
    return json.dumps(document, indent=2) + "\n"


# ------------------------------------------------------------------------------------------- I/O
def run_checks(
    conn: psycopg.Connection[Any], settings: Settings, *, thresholds: Thresholds | None = None
) -> list[Check]:
    """Run every check against ``settings.schema`` on ``conn`` (switched to autocommit for the run).

    The LISTEN check opens one more short connection to ``settings.dsn`` that sends the notification.
    """
    th = thresholds or Thresholds()
    schema = settings.schema
    table = f'"{schema}".jobs'
    q = queries_for(schema)
    was_autocommit = conn.autocommit
    if not was_autocommit:
        conn.rollback()
        conn.autocommit = True  # every query its own transaction: the doctor holds back no xmin horizon
    try:
        checks: list[Check] = []
        found = current_version(conn, schema)
        checks.append(check_schema_version(schema, found, latest_version()))
        with conn.cursor(row_factory=dict_row) as cur:
            if found:
                cur.execute(q.doctor_indexes, {"table": table})
                checks.append(check_indexes(schema, cur.fetchall(), expected_indexes()))
                cur.execute(q.doctor_autovacuum, {"table": table})
                checks.append(check_autovacuum(schema, _one(cur.fetchone())))
                cur.execute(q.doctor_table_stats, {"table": table})
                checks.append(check_dead_tuples(schema, cur.fetchone(), th))
                vacuum = cur.execute(q.doctor_vacuum_state, {"table": table}).fetchone()
                checks += [check_bloat(schema, vacuum, th), check_vacuum_lag(schema, vacuum, th)]
                checks.append(check_naptime(schema, vacuum, th))
            else:
                why = f"schema {schema!r} is not migrated"
                names = ("indexes", "autovacuum", "dead_tuples", "table_bloat", "autovacuum_lag", "autovacuum_naptime")
                checks += [skipped(n, why) for n in names]
            cur.execute(q.doctor_xmin_holders, {"limit": 5})
            checks.append(check_xmin_horizon(cur.fetchall(), th))
            checks.append(_listen(conn, settings, th.listen_timeout_seconds))
            if found:
                lease = settings.lease_seconds
                cur.execute(q.queue_stats, {"queue": None, "lease_seconds": lease, "now": None})
                checks.append(check_stalled([stats_from_row(r) for r in cur.fetchall()], lease))
            else:
                checks.append(skipped("stalled_jobs", f"schema {schema!r} is not migrated"))
        return checks
    finally:
        if not was_autocommit:
            conn.autocommit = False


def _one(row: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if row is None:  # aggregate-free SELECT of settings always returns one row
        raise RuntimeError("doctor query returned no row")
    return row


def _listen(conn: psycopg.Connection[Any], settings: Settings, timeout: float) -> Check:
    """LISTEN on a private channel here, NOTIFY from a second connection, wait for it to come back."""
    if not settings.listen:
        return Check("listen", True, "info", f"skipped: listen is off, workers poll every {settings.poll_seconds:g}s")
    q = queries_for(settings.schema)
    channel = f"{settings.channel}_doctor"
    token = secrets.token_hex(8)
    with conn.cursor(row_factory=dict_row) as cur:
        pids = [int(_one(cur.execute(q.doctor_backend_pid).fetchone())["pid"]) for _ in range(3)]
    listen_sql = sql.SQL("LISTEN {}").format(sql.Identifier(channel))  # identifiers cannot be parameters
    try:
        conn.execute(listen_sql)
    except psycopg.Error as exc:  # a hot standby, or a pooler that rejects LISTEN outright
        why = redact(str(exc).strip(), settings.dsn)
        return Check(
            "listen",
            False,
            "warning",
            f"LISTEN failed on this connection: {why}",
            "point workers at the primary directly, or run them with --no-listen (SKIPLOCK_LISTEN=false)",
        )
    received = False
    try:
        try:
            with psycopg.connect(settings.require_dsn(), autocommit=True, connect_timeout=5) as sender:
                sender.execute(q.doctor_notify, {"channel": channel, "payload": token})
        except psycopg.Error as exc:
            why = redact(str(exc), settings.dsn)
            detail = f"could not open a second connection to send NOTIFY: {why}"
            return Check(
                "listen",
                False,
                "warning",
                detail,
                "check the DSN; workers need a connection for LISTEN besides their pool",
            )
        deadline = time.monotonic() + timeout
        while not received and (left := deadline - time.monotonic()) > 0:
            for note in conn.notifies(timeout=left, stop_after=1):
                received = note.channel == channel and note.payload == token
    finally:
        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
    return check_listen(received, timeout, pids)
