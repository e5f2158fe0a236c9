"""The ``skiplock`` command: contract subcommands, exit codes and user output (the only module that prints).

Exit codes: 0 success, 1 problems found or work failed, 2 bad input or configuration, 3 database unavailable
or schema not ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

from skiplock import __version__
from skiplock.errors import ConfigError, DatabaseUnavailableError, PayloadError, SchemaNotReadyError, SkiplockError
from skiplock.logs import configure_logging
from skiplock.queue import check_queue_name
from skiplock.settings import Settings

log = logging.getLogger(__name__)
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_DATABASE = 0, 1, 2, 3
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 15m, 12h or 7d")
    return float(m[1]) * _UNITS[m[2]]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("database")
    g.add_argument("--dsn", help="database DSN (else SKIPLOCK_DSN, else DATABASE_URL)")
    g.add_argument("--schema", help="schema of the jobs table (default skiplock; SKIPLOCK_SCHEMA)")
    g.add_argument("--log-format", choices=["plain", "json"], help="log line format (SKIPLOCK_LOG_FORMAT)")
    g.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (SKIPLOCK_LOG_LEVEL)")

    p = argparse.ArgumentParser(prog="skiplock", description="A job queue inside PostgreSQL (FOR UPDATE SKIP LOCKED).")
    p.add_argument("--version", action="version", version=f"skiplock {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("migrate", parents=[common], help="create or upgrade the schema (idempotent, safe concurrently)")

    e = sub.add_parser("enqueue", parents=[common], help="add one job")
    e.add_argument("--queue", required=True)
    e.add_argument("--payload", required=True, help='the job\'s JSON payload, e.g. \'{"to": "a@b.c"}\'')
    e.add_argument("--delay", type=_seconds, default=0.0, help="seconds before the job becomes visible")
    e.add_argument("--priority", type=int, default=0, help="higher runs first (-32768..32767, default 0)")
    e.add_argument(
        "--max-attempts", type=_positive_int, help="attempts before failed (default SKIPLOCK_MAX_ATTEMPTS or 5)"
    )
    e.add_argument("--idempotency-key", help="a second enqueue with the same key returns the first job")

    st = sub.add_parser("stats", parents=[common], help="health of each queue")
    st.add_argument("--queue")
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--lease", type=_seconds, help="lease used to call a processing job stalled (default SKIPLOCK_LEASE_SECONDS)"
    )

    f = sub.add_parser("failed", parents=[common], help="list failed jobs, newest first")
    f.add_argument("--queue")
    f.add_argument("--limit", type=_positive_int, default=20)
    f.add_argument("--json", action="store_true")

    for name, helptext in (("retry", "re-drive failed jobs"), ("cancel", "cancel pending or processing jobs")):
        r = sub.add_parser(name, parents=[common], help=helptext)
        r.add_argument("ids", nargs="*", type=int, help="job ids")
        r.add_argument("--queue", help="every matching job of this queue")

    pu = sub.add_parser("purge", parents=[common], help="delete done/failed jobs older than a cutoff, in batches")
    pu.add_argument("--older-than", required=True, type=parse_duration, help="e.g. 7d, 12h")
    pu.add_argument("--status", choices=["done", "failed"], action="append", help="only these (default both)")
    pu.add_argument("--queue")

    w = sub.add_parser("worker", parents=[common], help="run a worker (every flag also by SKIPLOCK_* env)")
    w.add_argument("--queue", help="queue to work (SKIPLOCK_QUEUE, default 'default')")
    w.add_argument("--handler", help="module:function to call per job (SKIPLOCK_HANDLER)")
    w.add_argument("--concurrency", type=_positive_int, help="jobs in flight at once (default 10)")
    w.add_argument("--batch", type=_positive_int, help="most jobs per claim (default 10)")
    w.add_argument("--lease", type=float, dest="lease_seconds", help="lease seconds (default 60)")
    w.add_argument("--heartbeat", type=float, dest="heartbeat_seconds", help="heartbeat seconds (default 15)")
    w.add_argument("--poll", type=float, dest="poll_seconds", help="polling fallback seconds (default 2)")
    w.add_argument("--recover", type=float, dest="recover_seconds", help="lease recovery interval (default 30)")
    w.add_argument("--grace", type=float, dest="shutdown_grace_seconds", help="drain grace seconds (default 30)")
    w.add_argument("--metrics-port", type=int, help="serve /metrics /healthz /readyz here (default off)")
    w.add_argument(
        "--no-listen",
        dest="listen",
        action="store_const",
        const=False,
        help="do not LISTEN (e.g. behind PgBouncer in transaction mode); poll only",
    )

    d = sub.add_parser("demo", parents=[common], help="run the demo (embedded PostgreSQL when no DSN is given)")
    d.add_argument("--jobs", type=_positive_int, default=3000)
    d.add_argument("--workers", type=_positive_int, default=3)
    d.add_argument("--concurrency", type=_positive_int, default=16)
    d.add_argument(
        "--keep",
        action="store_true",
        help="keep the embedded PostgreSQL running afterwards and print its DSN and follow-up commands",
    )

    dr = sub.add_parser("doctor", parents=[common], help="check schema, indexes, vacuum health and LISTEN")
    dr.add_argument("--json", action="store_true")

    gr = sub.add_parser("grant", parents=[common], help="give existing roles least-privilege rights on the schema")
    gr.add_argument("--producer", help="role that enqueues (INSERT, SELECT on jobs)")
    gr.add_argument("--worker", help="role that claims and finishes jobs (UPDATE of the lease columns only)")
    gr.add_argument("--operator", help="role that migrates, reads stats and purges (becomes the schema's owner)")
    gr.add_argument("--dry-run", action="store_true", help="print the statements, change nothing")

    op = sub.add_parser("operator", parents=[common], help="run the Kubernetes operator (needs skiplock[operator])")
    op.add_argument("--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    op.add_argument("--all-namespaces", action="store_true")
    op.add_argument("--liveness-port", type=int, default=8080)
    op.add_argument("--peering", help="kopf peering name for HA (default: none, standalone)")
    return p


def load_settings(args: argparse.Namespace, **extra: Any) -> Settings:
    flags = {k: getattr(args, k, None) for k in ("dsn", "schema", "log_format", "log_level")}
    flags.update({k: v for k, v in extra.items() if v is not None})
    return Settings.load(**flags)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "worker":
            extra = {
                k: getattr(args, k)
                for k in (
                    "queue",
                    "handler",
                    "concurrency",
                    "batch",
                    "lease_seconds",
                    "heartbeat_seconds",
                    "poll_seconds",
                    "recover_seconds",
                    "shutdown_grace_seconds",
                    "metrics_port",
                    "listen",
                )
            }
            settings = load_settings(args, **extra)
        elif args.command == "stats":
            settings = load_settings(args, lease_seconds=args.lease)
        else:
            settings = load_settings(args)
        configure_logging(settings.log_level, settings.log_format, settings.dsn)
        if getattr(args, "queue", None) is not None:
            check_queue_name(args.queue)
        return COMMANDS[args.command](args, settings)
    except (ConfigError, PayloadError, ValueError) as exc:
        print(f"skiplock: error: {_clean(exc, args)}", file=sys.stderr)
        return EXIT_USAGE
    except (DatabaseUnavailableError, SchemaNotReadyError) as exc:
        print(f"skiplock: error: {_clean(exc, args)}", file=sys.stderr)
        return EXIT_DATABASE
    except SkiplockError as exc:
        print(f"skiplock: error: {_clean(exc, args)}", file=sys.stderr)
        return EXIT_PROBLEMS
    except KeyboardInterrupt:
        return 130


def _clean(exc: BaseException, args: argparse.Namespace) -> str:
    from skiplock.settings import redact

    text = str(exc).strip().replace("\n", " ")
    for dsn in (getattr(args, "dsn", None), os.environ.get("SKIPLOCK_DSN"), os.environ.get("DATABASE_URL")):
        text = redact(text, dsn)
    return text


# ---------------------------------------------------------------------------------------------- commands
def _queue(settings: Settings) -> Any:
    from skiplock.queue import Queue

    return Queue(settings=settings, max_size=2)


def _guard_schema(q: Any, settings: Settings) -> None:
    q.check_schema()


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        report = q.migrate()
    applied = ", ".join(report.applied) or "nothing to do"
    print(f"schema {settings.schema!r} at version {report.version} ({applied})")
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    try:
        payload = json.loads(args.payload, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"--payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("--payload nests too deeply") from None
    with _queue(settings) as q:
        _guard_schema(q, settings)
        result = q.enqueue(
            args.queue,
            payload,
            delay=args.delay,
            priority=args.priority,
            max_attempts=args.max_attempts,
            idempotency_key=args.idempotency_key,
        )
    note = " (duplicate: a live job with this idempotency key exists)" if result.duplicate else ""
    print(f"{result.id}{note}")
    return EXIT_OK


def _reject_constant(name: str) -> Any:
    raise PayloadError(f"--payload contains {name}, which is not valid JSON")


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        rows = q.stats(args.queue)
    if args.json:
        print(json.dumps([vars(r) | {"backlog": r.backlog} for r in rows], indent=2))
        return EXIT_OK
    print(render_stats(rows))
    if args.queue and not rows:
        print(f"(queue {args.queue!r} has no pending, processing or failed jobs)", file=sys.stderr)
    return EXIT_OK


def render_stats(rows: Sequence[Any]) -> str:
    head = ("queue", "ready", "delayed", "processing", "stalled", "failed", "oldest_ready_s")
    body = [
        (r.queue, r.ready, r.delayed, r.processing, r.stalled, r.failed, f"{r.oldest_ready_age_seconds:.1f}")
        for r in rows
    ]
    return _table(head, body) if body else "no pending, processing or failed jobs"


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, head))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        rows = q.list_failed(args.queue, limit=args.limit)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    if not rows:
        print("no failed jobs")
        return EXIT_OK
    body = [
        (
            r["id"],
            r["queue"],
            f"{r['attempts']}/{r['max_attempts']}",
            r["updated_at"].isoformat(timespec="seconds"),
            (r["last_error"] or "").replace("\n", " ")[:100],
        )
        for r in rows
    ]
    print(_table(("id", "queue", "attempts", "failed_at", "last_error"), body))
    return EXIT_OK


def _by_selection(args: argparse.Namespace, settings: Settings, verb: str, what: str) -> int:
    """retry/cancel: act on job ids, a queue, or both; non-zero when ids were named and none matched."""
    if not args.ids and not args.queue:
        raise ConfigError(f"{args.command}: give job ids, --queue, or both")
    ids = args.ids or None
    with _queue(settings) as q:
        _guard_schema(q, settings)
        act = q.retry_failed if args.command == "retry" else q.cancel
        done = act(ids=ids, queue=args.queue)
    print(f"{verb} {len(done)} {what}" + (f": {', '.join(map(str, done[:20]))}" if done else ""))
    return EXIT_OK if done or not ids else EXIT_PROBLEMS


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    return _by_selection(args, settings, "re-queued", "failed job(s)")


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    return _by_selection(args, settings, "cancelled", "job(s)")


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        n = q.purge(older_than_seconds=args.older_than, statuses=args.status or ("done", "failed"), queue=args.queue)
    print(f"purged {n} job(s)")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from skiplock.handlers import load_handler
    from skiplock.runtime import Worker

    if not settings.handler:
        raise ConfigError("worker: --handler (or SKIPLOCK_HANDLER) is required, e.g. myapp.jobs:send_email")
    handler = load_handler(settings.handler)
    with _queue(settings) as q:
        _guard_schema(q, settings)
    return asyncio.run(_run_worker(Worker(settings, handler)))


async def _run_worker(worker: Any) -> int:
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals >= 2:
            log.warning("second signal: exiting now; leases cover unfinished jobs", extra={"action": "forced_exit"})
            os._exit(130)
        worker.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    code: int = await worker.run()
    if worker.abandoned_threads:
        logging.shutdown()
        os._exit(code)  # do not join handler threads still running: their jobs were handed back
    return code


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from skiplock.demo import run_demo

    return run_demo(settings, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency, keep=args.keep)


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from skiplock import doctor
    from skiplock.queue import check_connect

    dsn = settings.require_dsn()
    check_connect(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        checks = doctor.run_checks(conn, settings)
    print(doctor.render_json(checks) if args.json else doctor.render_text(checks), end="")
    return doctor.exit_code(checks)


def cmd_grant(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from skiplock import grant
    from skiplock.queue import check_connect

    roles = {"producer": args.producer, "worker": args.worker, "operator": args.operator}
    if args.dry_run:
        for statement in grant.grant_sql(settings.schema, **roles):
            print(statement.as_string(None) + ";")
        return EXIT_OK
    dsn = settings.require_dsn()
    check_connect(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = grant.apply_grants(conn, settings.schema, **roles)
    print(f"applied {len(done)} statement(s) on schema {settings.schema!r}")
    return EXIT_OK


def cmd_operator(args: argparse.Namespace, settings: Settings) -> int:
    try:
        import skiplock_operator
    except ImportError as exc:
        raise ConfigError(f"the operator needs the extra: pip install 'skiplock[operator]' ({exc})") from None
    code: int = skiplock_operator.run(
        namespaces=args.namespace,
        all_namespaces=args.all_namespaces,
        liveness_port=args.liveness_port,
        peering=args.peering,
        standalone=args.peering is None,
    )
    return code


COMMANDS = {
    "migrate": cmd_migrate,
    "enqueue": cmd_enqueue,
    "stats": cmd_stats,
    "failed": cmd_failed,
    "retry": cmd_retry,
    "cancel": cmd_cancel,
    "purge": cmd_purge,
    "worker": cmd_worker,
    "demo": cmd_demo,
    "doctor": cmd_doctor,
    "grant": cmd_grant,
    "operator": cmd_operator,
}
