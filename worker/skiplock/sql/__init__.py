"""Loads the named SQL of ``queries/*.sql`` and the ``migrations/NNNN_*.sql`` files, rendered for one schema.

Each query starts with ``-- name: <query>`` and one description line, and is the SQL that runs, written out whole;
a statement with variants (the claim, the traced enqueues) lists them under its description and marks the parts that
vary (:mod:`skiplock.sql.template`).
``{schema}`` is rendered with ``psycopg.sql.Identifier`` (so any schema name is quoted), values stay ``%(name)s``
parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, LiteralString

from psycopg import sql

from skiplock.sql import template

_HEADER = re.compile(r"^-- name: (?P<name>\w+)\n-- (?P<doc>.+)\n(?P<variants>(?:-- variant: .*\n)*)", re.MULTILINE)
QUERY_FILES = (
    "jobs.sql",
    "claim.sql",
    "stats.sql",
    "schema.sql",
    "doctor.sql",
    "schedules.sql",
    "demo.sql",
    "drain.sql",
    "ui.sql",
    "autoscale.sql",
    "tasks.sql",
    "workflows.sql",
)


@dataclass(frozen=True)
class Statement:
    name: str
    doc: str
    text: str


def parse(source: str) -> list[Statement]:
    """Split a .sql file into named statements, each variant of a templated one rendered (text still has
    ``{schema}``)."""
    headers = list(_HEADER.finditer(source))
    if not headers:
        raise ValueError("no '-- name:' header found")
    out: list[Statement] = []
    for i, m in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(source)
        body = source[m.end() : end].strip()
        if not body:
            raise ValueError(f"query {m['name']} has no body")
        named = {m["name"]: frozenset[str](), **template.variants(m["variants"].splitlines())}
        unknown = set().union(*named.values()) - template.flags_of(body)
        if unknown:
            raise ValueError(f"query {m['name']}: variant flags {sorted(unknown)} mark no part of it")
        out.extend(Statement(name, m["doc"].strip(), template.render(body, flags)) for name, flags in named.items())
    return out


# What `compact` keeps whole (strings, quoted names, dollar-quoted bodies) and what it drops (comments, indentation).
_TOKEN = re.compile(
    r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|\$(?P<tag>\w*)\$.*?\$(?P=tag)\$"""
    r"""|(?P<br>(?:[ \t]*(?:--[^\n]*)?\n[ \t]*)+)|(?P<comment>[ \t]*--[^\n]*)""",
    re.DOTALL,
)


def compact(text: str) -> str:
    """``text`` without its ``--`` comments, indentation and blank lines: what is sent to the server (and what it
    parses, logs and shows in ``pg_stat_statements``). The files keep their comments for readers. psycopg caches a
    statement's converted ``%(name)s`` placeholders only up to 4,096 characters: compacted, every statement but the
    limited claims fits; the worker's claim converts its own once whatever its length (``store.run.positional``)."""

    def keep(m: re.Match[str]) -> str:
        return "" if m["comment"] is not None else "\n" if m["br"] is not None else m[0]

    return _TOKEN.sub(keep, text).strip()


def render(text: str, schema: str) -> LiteralString:
    composed = sql.SQL(text).format(schema=sql.Identifier(schema))  # type: ignore[arg-type]
    return composed.as_string(None)  # type: ignore[return-value]


@cache
def _raw_queries() -> tuple[Statement, ...]:
    folder = resources.files(__package__).joinpath("queries")
    out: list[Statement] = []
    for filename in QUERY_FILES:
        out.extend(parse(folder.joinpath(filename).read_text(encoding="utf-8")))
    names = [s.name for s in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate query names: {sorted(dupes)}")
    return tuple(out)


class Queries:
    """One attribute per named query, rendered for one schema. A typo in a name fails at first use."""

    job_enqueue: LiteralString
    job_insert_usual: LiteralString
    job_find_by_key: LiteralString
    job_enqueue_many: LiteralString
    job_reserve_ids: LiteralString
    job_copy_many: LiteralString
    job_copy_many_plain: LiteralString
    job_find_by_keys: LiteralString
    job_enqueue_unique: LiteralString
    job_find_by_unique_key: LiteralString
    job_enqueue_many_unique: LiteralString
    job_replace_unique: LiteralString
    job_find_by_unique_keys: LiteralString
    job_enqueue_traced: LiteralString
    job_enqueue_many_traced: LiteralString
    job_copy_many_traced: LiteralString
    job_enqueue_unique_traced: LiteralString
    job_enqueue_many_unique_traced: LiteralString
    job_enqueue_by_name_traced: LiteralString
    job_enqueue_unique_by_name_traced: LiteralString
    job_enqueue_many_by_name_traced: LiteralString
    job_enqueue_many_unique_by_name_traced: LiteralString
    job_notify: LiteralString
    job_complete_and_claim: LiteralString
    job_complete_and_claim_one: LiteralString
    job_complete_and_claim_unlimited: LiteralString
    job_complete_and_claim_unlimited_one: LiteralString
    job_complete_and_claim_one_after: LiteralString
    job_complete_and_claim_unlimited_one_after: LiteralString
    job_complete: LiteralString
    job_complete_one: LiteralString
    job_confirm_done: LiteralString
    job_fail: LiteralString
    job_snooze: LiteralString
    job_release: LiteralString
    job_release_orphans: LiteralString
    job_fail_unique_blocked: LiteralString
    job_heartbeat: LiteralString
    job_recover_expired: LiteralString
    job_get: LiteralString
    job_get_many: LiteralString
    job_list_enqueued: LiteralString
    job_list_failed: LiteralString
    job_list_stalled: LiteralString
    job_retry_failed: LiteralString
    job_cancel: LiteralString
    job_cancelled_among: LiteralString
    job_purge: LiteralString
    retention_xact_lock: LiteralString
    retention_try_xact_lock: LiteralString
    queue_stats: LiteralString
    queue_done_recently: LiteralString
    queue_set_paused: LiteralString
    control_channel_read: LiteralString
    session_generic_plans: LiteralString
    session_reset_plans: LiteralString
    session_forget_plans: LiteralString
    session_control: LiteralString
    jobs_table_bytes: LiteralString
    queue_paused: LiteralString
    queue_next_due: LiteralString
    queue_waiting: LiteralString
    task_limits_register: LiteralString
    task_limits_list: LiteralString
    task_limits_next_start: LiteralString
    task_register: LiteralString
    task_find: LiteralString
    task_names: LiteralString
    job_enqueue_by_name: LiteralString
    job_enqueue_unique_by_name: LiteralString
    job_enqueue_many_by_name: LiteralString
    job_enqueue_many_unique_by_name: LiteralString
    job_replace_unique_by_name: LiteralString
    server_connection_limits: LiteralString
    session_statement_timeout: LiteralString
    schema_lock: LiteralString
    schema_exists: LiteralString
    schema_create: LiteralString
    schema_migrations_create: LiteralString
    schema_versions: LiteralString
    schema_record: LiteralString
    schema_present: LiteralString
    roles_existing: LiteralString
    doctor_indexes: LiteralString
    doctor_autovacuum: LiteralString
    doctor_table_stats: LiteralString
    doctor_xmin_holders: LiteralString
    doctor_backend_pid: LiteralString
    doctor_notify: LiteralString
    doctor_vacuum_state: LiteralString
    schedule_register: LiteralString
    schedule_due: LiteralString
    schedule_next_due: LiteralString
    schedule_fire: LiteralString
    schedule_list: LiteralString
    schedule_park: LiteralString
    schedule_delete: LiteralString
    schedule_prune: LiteralString
    schedule_now: LiteralString
    demo_reset: LiteralString
    demo_receipts_create: LiteralString
    demo_receipt_insert: LiteralString
    demo_receipts_count: LiteralString
    job_status_counts: LiteralString
    drain_requested: LiteralString
    drain_request: LiteralString
    drain_cancel: LiteralString
    drain_list: LiteralString
    drain_holdings: LiteralString
    # the operator's wait-time target (queries/autoscale.sql)
    queue_flow: LiteralString
    queue_due_soon: LiteralString
    # the web UI's statements (queries/ui.sql)
    ui_queue_stats: LiteralString
    ui_done_last_minute: LiteralString
    ui_jobs_window: LiteralString
    ui_jobs_failed_window: LiteralString
    ui_window_end: LiteralString
    ui_failed_window_end: LiteralString
    ui_job: LiteralString
    ui_job_relatives: LiteralString
    ui_failure_groups: LiteralString
    ui_failure_group: LiteralString
    ui_group_ids: LiteralString
    ui_filter_batch: LiteralString
    ui_newest_id: LiteralString
    ui_discard_failed: LiteralString
    ui_workers: LiteralString
    ui_schedules: LiteralString
    ui_table_estimate: LiteralString
    ui_audit_page: LiteralString
    ui_audit_begin: LiteralString
    ui_audit_lock: LiteralString
    ui_audit_get: LiteralString
    ui_audit_progress: LiteralString
    ui_session: LiteralString
    job_lock_parents: LiteralString
    job_link: LiteralString
    job_set_workflow: LiteralString
    job_complete_results: LiteralString
    job_complete_one_result: LiteralString
    job_await: LiteralString
    job_outcome: LiteralString
    job_parent_results: LiteralString
    job_relatives: LiteralString
    job_step_get: LiteralString
    job_step_put: LiteralString
    job_workflow_ids: LiteralString

    def __init__(self, schema: str) -> None:
        self.schema = schema
        declared = set(type(self).__annotations__)
        loaded = {s.name for s in _raw_queries()}
        if declared != loaded:
            raise ValueError(f"queries declared {sorted(declared ^ loaded)} do not match the .sql files")
        for stmt in _raw_queries():
            setattr(self, stmt.name, render(compact(stmt.text), schema))

    def __getattr__(self, name: str) -> Any:  # only called for missing attributes
        raise AttributeError(f"no query named {name!r} in skiplock/sql/queries")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


@cache
def migrations() -> tuple[Migration, ...]:
    folder = resources.files(__package__).joinpath("migrations")
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        m = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if not m:
            continue
        out.append(Migration(int(m[1]), f"{m[1]}_{m[2]}", entry.read_text(encoding="utf-8")))
    versions = [m.version for m in out]
    if versions != list(range(1, len(out) + 1)):
        raise ValueError(f"migrations must be numbered 0001.. without gaps, got {versions}")
    return tuple(out)


@cache
def queries_for(schema: str) -> Queries:
    return Queries(schema)
