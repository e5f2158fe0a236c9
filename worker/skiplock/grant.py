"""Least-privilege roles for one schema: producer (enqueue), worker (claim and finish), operator (stats, migrate),
ui (the web UI: read everything, retry, cancel, pause, and write its audit table).

The roles must exist (create them with ``CREATE ROLE ... LOGIN PASSWORD ...``; passwords never pass through
skiplock). :func:`grant_sql` builds the statements (every name quoted with ``psycopg.sql.Identifier``) and
:func:`apply_grants` runs them in one transaction. Run it again after each ``skiplock migrate``: it converges
(each role's table privileges, column privileges included, are revoked, then granted exactly), so a re-run is
also how a role loses a right.

- producer: ``USAGE`` on the schema, ``INSERT`` of the enqueue columns only (:data:`ENQUEUE_COLUMNS`) and
  ``SELECT`` of the columns enqueue reads back (:data:`PRODUCER_READ_COLUMNS`: ``RETURNING id, visible_at`` and
  the live job found by queue, idempotency key and status), ``SELECT`` on ``schema_migrations`` (the version
  check), ``SELECT`` on ``tasks`` (the task registry: a job enqueued by task name takes its queue and defaults). It
  cannot set ``id`` (with ``OVERRIDING SYSTEM VALUE`` or otherwise), ``status``, ``attempts``,
  ``locked_by``, ``last_error`` or the timestamps, cannot read payloads or errors, and has no ``UPDATE``: it
  cannot claim, finish or cancel (nor replace a unique job: ``unique_conflict="replace"`` needs a role with
  ``UPDATE`` of payload, priority, visible_at and updated_at, which grant does not give). The identity column
  needs no sequence privilege, so none is granted. For ``after=``, workflows and ``wait()`` it may call the
  functions of :data:`PRODUCER_FUNCTIONS`, which run as the owner: they lock the parents an enqueue names until its
  transaction ends, link and tag only the jobs the calling transaction inserted, mark one job as awaited, and read
  one job's status, result and last error line (what ``wait()`` returns or raises).
- worker: ``USAGE`` on the schema, ``SELECT`` on ``jobs`` and ``queues`` (paused queues) plus ``UPDATE`` of the
  lease and outcome columns only
  (:data:`LEASE_COLUMNS`: claim, heartbeat, complete, fail, release, lease recovery), ``SELECT`` on
  ``schema_migrations``, ``SELECT, INSERT, UPDATE`` on ``schedules`` (it registers its app's periodic
  tasks), and all of ``task_limits`` and ``task_slots`` (flow control: a worker registers its tasks' limits at
  start and takes slots when claiming), ``SELECT, INSERT, UPDATE`` on ``tasks`` (it registers each task's queue and
  defaults at start), ``SELECT`` on ``job_dependencies`` (``job.parent_results``) and ``SELECT, INSERT`` on
  ``job_steps`` (durable steps). No ``INSERT`` of jobs (so it fires no ticks: the operator does), no
  ``DELETE`` of jobs, no DDL, and the payload, task, queue, priority and key of a job cannot be changed. Within
  its schema a worker role may claim any queue: the schema is the isolation boundary (one schema per tenant,
  one worker role per schema).
- operator: owns the schema and its tables, so it can migrate (forward migrations alter the jobs table, which only
  its owner may do), read stats, retry, cancel, purge (the JobQueue's scheduled retention) and pause or resume queues
  (the ``queues`` table, from ``JobQueue.spec.paused``). Only the owner may take the migration lock
  (``schema_migrations``) and the purge lock (the ``locks`` table): no other role has a right on either. It needs no
  ``CREATE`` on the database: migrate creates the schema only when it is missing. Changing an owner needs a
  superuser, or a role that is a member of both the current owner and the operator role.
- ui (``skiplock ui``): ``USAGE`` on the schema, ``SELECT`` on ``schema_migrations``, ``jobs`` (every column: the
  job page shows payloads and errors), ``schedules``, ``task_limits``, ``task_slots``, ``job_dependencies`` and
  ``job_steps`` (a job's parents, children and steps); ``UPDATE`` of the
  columns its actions set (:data:`UI_JOB_COLUMNS`: retry and cancel a job, cancel a failed one); ``SELECT,
  INSERT, UPDATE`` on ``queues`` (pause and resume); ``SELECT, INSERT`` on ``ui_audit`` and ``UPDATE`` of its
  count and detail only (an action's progress: an audit row's actor, action and time cannot be rewritten). No
  ``INSERT`` or ``DELETE`` of jobs, no change of a payload, task, queue or key, no DDL.

Connection limits: ``connection_limits`` sets ``ALTER ROLE ... CONNECTION LIMIT n`` on the named roles, the bound
the server itself enforces whoever connects (the operator's per-server cap covers only the workers it runs). For a
worker role, :func:`recommended_connection_limit` gives what its replicas can hold: ``replicas x (concurrency +``
:data:`~skiplock.settings.WORKER_EXTRA_CONNECTIONS` ``)``; several tenants' limits should add up to less than the
server's ``max_connections`` minus its reserved connections.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from skiplock.errors import ConfigError
from skiplock.migrate import check_version, current_version
from skiplock.settings import WORKER_EXTRA_CONNECTIONS, Settings
from skiplock.store.run import execute
from skiplock.store.statements import Statements

LEASE_COLUMNS = (
    "status",
    "attempts",
    "visible_at",
    "locked_by",
    "locked_at",
    "lease_expires_at",
    "last_error",
    "errors",
    "failure_fingerprint",
    "updated_at",
    "slot",
    "result",
    "has_steps",
)
"""The columns the worker role may update: the lease and outcome of a job (its result, whether it stored durable
steps), never its content."""

ENQUEUE_COLUMNS = (
    "queue",
    "payload",
    "priority",
    "max_attempts",
    "visible_at",
    "idempotency_key",
    "task",
    "timeout_seconds",
    "unique_key",
    "unique_states",
    "serial_key",
    "serial_skip_on_retry",
)
"""The columns the producer role may insert; every other column takes its default (id, status, attempts...)."""

PRODUCER_READ_COLUMNS = (
    "id",
    "queue",
    "status",
    "visible_at",
    "idempotency_key",
    "unique_key",
    "unique_states",
)
"""The columns the producer role may read: what enqueue returns and what finds the live job of a key."""

PRODUCER_FUNCTIONS: tuple[LiteralString, ...] = (
    "jobs_lock_parents(bigint[])",
    "jobs_link(bigint[], bigint[], boolean, uuid)",
    "jobs_tag_workflow(bigint[], uuid)",
    "jobs_await(bigint)",
    "jobs_outcome(bigint)",
)
"""The functions the producer role may call (migration 0016, SECURITY DEFINER): lock the parents its enqueue names,
link the jobs its transaction inserted to them, tag them with their workflow, ask to be told when a job ends and read
that job's outcome."""

UI_JOB_COLUMNS = ("status", "attempts", "visible_at", "lease_expires_at", "last_error", "updated_at")
"""The columns the ui role may update: what retrying and cancelling a job set."""

UI_AUDIT_COLUMNS = ("job_count", "detail")
"""The audit columns the ui role may update: an action's progress (its count, its keyset cursor)."""


def recommended_connection_limit(replicas: int, concurrency: int) -> int:
    """The ``CONNECTION LIMIT`` a worker role needs for ``replicas`` workers of ``concurrency`` each."""
    if replicas < 0 or concurrency < 1:
        raise ConfigError("grant: replicas must be >= 0 and concurrency >= 1")
    return replicas * (concurrency + WORKER_EXTRA_CONNECTIONS)


def parse_connection_limits(items: list[str]) -> dict[str, int]:
    """``ROLE=N`` items (the CLI's ``--connection-limit``) as a mapping; raises ConfigError."""
    out: dict[str, int] = {}
    for item in items:
        role, sep, value = item.rpartition("=")
        try:
            out[role] = int(value)
        except ValueError:
            role = ""
        if not sep or not role:
            raise ConfigError(f"grant: --connection-limit wants ROLE=N (got {item!r})")
    return out


def connection_limit_hint(worker: str) -> str:
    """The recommendation printed when the worker role gets no limit."""
    example = recommended_connection_limit(10, 4)
    return (
        f"hint: cap the worker role's connections on the server: --connection-limit {worker}=N with "
        f"N = replicas x (concurrency + {WORKER_EXTRA_CONNECTIONS}), e.g. {example} for 10 replicas of concurrency 4"
    )


def grant_sql(
    schema: str,
    producer: str | None = None,
    worker: str | None = None,
    operator: str | None = None,
    ui: str | None = None,
    connection_limits: Mapping[str, int] | None = None,
) -> list[sql.Composed]:
    """The statements that give each named role exactly its privileges on ``schema`` (None: leave it alone), and
    ``CONNECTION LIMIT`` per role in ``connection_limits`` (role name -> limit, -1: none; roles named here only)."""
    if producer is None and worker is None and operator is None and ui is None:
        raise ConfigError("grant: name at least one role (producer, worker, operator or ui)")
    for label, role in (("producer", producer), ("worker", worker), ("operator", operator), ("ui", ui)):
        if role is not None and (not isinstance(role, str) or not role or "\x00" in role or len(role) > 63):
            raise ConfigError(f"grant: {label} role {role!r} is not a valid role name (1..63 characters)")
    if operator is not None and operator in (producer, worker, ui):
        raise ConfigError(
            "grant: the operator owns the schema, so it cannot also be the producer, the worker or the ui role"
        )
    if operator is not None and schema == "public":
        raise ConfigError("grant: will not hand the shared 'public' schema to the operator; keep skiplock in its own")

    limits = dict(connection_limits or {})
    for role, limit in limits.items():
        if role not in (producer, worker, operator, ui):
            raise ConfigError(f"grant: a connection limit for {role!r}, which is not one of the roles named")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
            raise ConfigError(f"grant: the connection limit of {role!r} must be an integer >= -1 (-1: no limit)")

    s = sql.Identifier(schema)
    jobs = sql.Identifier(schema, "jobs")
    versions = sql.Identifier(schema, "schema_migrations")
    queues = sql.Identifier(schema, "queues")  # per-queue controls (pause): read by workers, written by operators
    schedules = sql.Identifier(schema, "schedules")  # periodic tasks: registered by workers, fired by the operator
    # Flow control: workers register their tasks' limits (and the slot rows) at start and take slots when claiming.
    flow = sql.SQL(", ").join(sql.Identifier(schema, t) for t in ("task_limits", "task_slots"))
    registry = sql.Identifier(schema, "tasks")  # task queues and defaults: registered by workers, read by producers
    audit = sql.Identifier(schema, "ui_audit")  # the web UI's actions: written by the ui role
    control = sql.Identifier(schema, "control_channel")  # its random name: read by workers (LISTEN) and the ui (NOTIFY)
    drains = sql.Identifier(schema, "drains")  # the operator's drain requests: read by the workers
    locks = sql.Identifier(schema, "locks")  # the purge lock: only the owner may take it (no other role any right)
    links = sql.SQL(", ").join(sql.Identifier(schema, t) for t in ("job_dependencies", "job_steps"))  # workflows
    functions = sql.SQL(", ").join(sql.SQL("{}.{}").format(s, sql.SQL(f)) for f in PRODUCER_FUNCTIONS)
    out: list[sql.Composed] = []
    if operator is not None:
        op = sql.Identifier(operator)
        out += [
            sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(s, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(jobs, op),  # its identity sequence follows
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(versions, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(queues, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(schedules, op),
            sql.SQL("ALTER FUNCTION {}() OWNER TO {}").format(sql.Identifier(schema, "jobs_payload_bound"), op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(schema, "task_limits"), op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(schema, "task_slots"), op),
            sql.SQL("ALTER FUNCTION {}() OWNER TO {}").format(sql.Identifier(schema, "jobs_free_slot"), op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(registry, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(audit, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(control, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(drains, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(locks, op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(schema, "job_dependencies"), op),
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(schema, "job_steps"), op),
        ]
        # The workflow functions run as their owner (SECURITY DEFINER): the schema's owner, not whoever migrated.
        for function in (
            *PRODUCER_FUNCTIONS,
            "jobs_resolve_children(bigint, text, text)",
            "jobs_ended()",
            "jobs_unlinked()",
            "jobs_failure_fingerprint()",
        ):
            out.append(sql.SQL("ALTER FUNCTION {}.{} OWNER TO {}").format(s, sql.SQL(function), op))
    out.append(sql.SQL("REVOKE ALL ON {}, {}, {}, {} FROM PUBLIC").format(jobs, versions, queues, schedules))
    out.append(sql.SQL("REVOKE ALL ON {}, {} FROM PUBLIC").format(flow, audit))
    out.append(sql.SQL("REVOKE ALL ON {}, {}, {}, {} FROM PUBLIC").format(registry, control, drains, locks))
    out.append(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(links))
    out.append(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(functions))
    members = [sql.Identifier(r) for r in dict.fromkeys(r for r in (producer, worker, ui) if r is not None)]
    for member in members:  # converge: start from nothing, then grant exactly
        out += [
            sql.SQL("REVOKE ALL ON {}, {}, {}, {} FROM {}").format(jobs, versions, queues, schedules, member),
            sql.SQL("REVOKE ALL ON {}, {} FROM {}").format(flow, audit, member),
            sql.SQL("REVOKE ALL ON {}, {}, {}, {} FROM {}").format(registry, control, drains, locks, member),
            sql.SQL("REVOKE ALL ON {} FROM {}").format(links, member),
            sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(functions, member),
            sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(s, member),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, member),
            sql.SQL("GRANT SELECT ON {} TO {}").format(versions, member),
        ]
    if producer is not None:
        p = sql.Identifier(producer)
        out += [
            sql.SQL("GRANT INSERT ({}) ON {} TO {}").format(_columns(ENQUEUE_COLUMNS), jobs, p),
            sql.SQL("GRANT SELECT ({}) ON {} TO {}").format(_columns(PRODUCER_READ_COLUMNS), jobs, p),
            sql.SQL("GRANT SELECT ON {} TO {}").format(registry, p),
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(functions, p),  # after=, workflows, wait()
        ]
    if worker is not None:
        w = sql.Identifier(worker)
        out += [
            sql.SQL("GRANT SELECT ON {} TO {}").format(jobs, w),
            sql.SQL("GRANT SELECT ON {} TO {}").format(queues, w),
            sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(_columns(LEASE_COLUMNS), jobs, w),
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(schedules, w),  # registers its schedules
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(flow, w),
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(registry, w),  # registers its tasks
            sql.SQL("GRANT SELECT ON {}, {} TO {}").format(control, drains, w),  # what the controls say
            sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(schema, "job_dependencies"), w),  # parent_results
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(sql.Identifier(schema, "job_steps"), w),  # job.step
        ]
    if ui is not None:
        u = sql.Identifier(ui)
        out += [
            sql.SQL("GRANT SELECT ON {}, {} TO {}").format(jobs, schedules, u),
            sql.SQL("GRANT SELECT ON {} TO {}").format(flow, u),
            sql.SQL("GRANT SELECT ON {} TO {}").format(links, u),  # the job page's parents, children and steps
            sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(_columns(UI_JOB_COLUMNS), jobs, u),
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(queues, u),  # pause, resume
            sql.SQL("GRANT SELECT ON {} TO {}").format(control, u),  # pause, cancel tell the workers
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(audit, u),
            sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(_columns(UI_AUDIT_COLUMNS), audit, u),
        ]
    for role, limit in limits.items():
        out.append(sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(sql.Identifier(role), sql.Literal(limit)))
    return out


def _columns(names: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(c) for c in names)


def apply_grants(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    producer: str | None = None,
    worker: str | None = None,
    operator: str | None = None,
    ui: str | None = None,
    connection_limits: Mapping[str, int] | None = None,
) -> list[str]:
    """Run :func:`grant_sql` in one transaction; returns the statements as text (for ``--dry-run`` style output).

    Raises :class:`ConfigError` when a role does not exist or the connected role may not grant, and
    :class:`SchemaNotReadyError` when the schema is not migrated. ``conn`` must not be inside a transaction.
    """
    names = [r for r in (producer, worker, operator, ui) if r is not None]
    with conn.transaction():
        statements = grant_sql(schema, producer, worker, operator, ui, connection_limits)
        s = Statements(Settings(schema=schema))
        found = execute(conn, s.roles_existing(names))
        missing = [r for r in names if r not in found]
        if missing:
            raise ConfigError(
                f"grant: role(s) {', '.join(map(repr, missing))} do not exist: create them first "
                "(CREATE ROLE name LOGIN PASSWORD ...)"
            )
        check_version(current_version(conn, schema), schema)
        for statement in statements:
            try:
                execute(conn, s.command(statement))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise ConfigError(
                    f"grant: {str(exc).strip()}: run it as a superuser, or as a role that owns the schema and is "
                    "a member of the operator role"
                ) from None
    return [statement.as_string(conn) for statement in statements]
