"""The ``skiplock`` command: contract subcommands, exit codes and user output (the only module that prints).

Exit codes: 0 success, 1 problems found or work failed, 2 bad input or configuration, 3 database unavailable
or schema not ready.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import gc
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from skiplock import __version__, duration, render
from skiplock.errors import ConfigError, DatabaseUnavailableError, PayloadError, SchemaNotReadyError, SkiplockError
from skiplock.job import TIMEOUT_SECONDS_MAX
from skiplock.knobs import KNOBS, Knob
from skiplock.logs import configure_logging
from skiplock.settings import Settings, redact
from skiplock.store.tasks import suggest
from skiplock.store.validation import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY_SECONDS,
    PRIORITY_RANGE,
    check_queue_name,
    task_name_problem,
    timeout_problem,
)

log = logging.getLogger(__name__)
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_DATABASE = 0, 1, 2, 3


def parse_duration(text: str) -> float:
    """A duration flag: ``90``, ``250ms``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> seconds (>= 0)."""
    try:
        return duration.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a duration > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not within 0..65535")
    return value


class Parser(argparse.ArgumentParser):
    """argparse with one error style for every command (``skiplock: error: ...``, exit 2) and a suggestion for a
    misspelt command or option."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"skiplock: error: {message}{self._suggestion(message)}\n")

    def _suggestion(self, message: str) -> str:
        if m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
            choices = re.findall(r"'([^']*)'", m[2]) or [c.strip() for c in m[2].split(",")]
            close = difflib.get_close_matches(m[1], choices, n=1)
            return f" (did you mean {close[0]!r}?)" if close else ""
        if m := re.search(r"unrecognized arguments: (.*)", message):
            parsers = [self] + [
                sub for a in self._actions if isinstance(a, argparse._SubParsersAction) for sub in a.choices.values()
            ]
            options = sorted({o for parser in parsers for a in parser._actions for o in a.option_strings})
            for word in m[1].split():
                close = difflib.get_close_matches(word.split("=")[0], options, n=1) if word.startswith("-") else []
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


def _bounded(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` within ``low..high`` (the enqueue bounds the database checks too)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not low <= value <= high:  # NaN compares false
            what = "" if kind is int else "a finite number "
            raise argparse.ArgumentTypeError(f"{text!r} must be {what}>= {low:g} and <= {high:g}")
        return value

    return parse


def _delay(text: str) -> float:
    """A duration (units allowed) of at most the enqueue bound."""
    value = parse_duration(text)
    if not 0 <= value <= MAX_DELAY_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a duration >= 0 and <= {duration.format_duration(MAX_DELAY_SECONDS)}"
        )
    return value


def _timeout(text: str) -> float:
    """A duration (units allowed) within the timeout bound the database checks too."""
    value = _positive_duration(text)
    if timeout_problem(value, "the timeout"):
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a duration > 0 and <= {duration.format_duration(TIMEOUT_SECONDS_MAX)} (a year)"
        )
    return value


def _add_common(parser: argparse.ArgumentParser, *, after: bool) -> None:
    """The options every command takes, before or after the command name. Given after the command (``after``),
    an option is only set when present, so ``skiplock --dsn URL migrate`` keeps the value given before."""
    default = argparse.SUPPRESS if after else None
    g = parser.add_argument_group("common options (before or after the command)")
    for k in KNOBS:
        if k.common and k.flag:
            g.add_argument(k.flag, dest=k.name, default=default, choices=k.choices or None, help=_help(k))
            if k.name == "dsn":
                g.add_argument(
                    "--dsn-file",
                    dest="dsn_file",
                    default=default,
                    metavar="PATH",
                    help="read the DSN from this file (e.g. a mounted Secret), so it does not show in the process list",
                )


def _help(k: Knob) -> str:
    shown = duration.format_duration(k.default) if _is_duration(k) and k.default else k.default
    default = "" if k.default in (None, "", ()) or k.type is bool else f"; default {shown}"
    text = k.help.rstrip(".")
    if text.split()[0] not in PROPER_NOUNS:
        text = text[:1].lower() + text[1:]
    return f"{text} ({k.env}{default})".replace("%", "%%")


PROPER_NOUNS = frozenset({"PostgreSQL", "Python", "PgBouncer", "Kubernetes"})


def _is_duration(k: Knob) -> bool:
    return k.duration or (k.type is float and duration.is_duration_setting(k.name))


def _add_knob_flags(parser: argparse.ArgumentParser) -> None:
    """The worker's flags, one per knob of the table that has one (dest = the setting's name)."""
    for k in KNOBS:
        if k.flag is None or k.common:
            continue
        if k.type is bool:
            parser.add_argument(k.flag, dest=k.name, action="store_const", const=False, help=_help(k))
        else:
            kind: Callable[[str], Any] = (
                parse_duration if _is_duration(k) else {int: int, float: float}.get(k.type, str)
            )
            metavar = "DURATION" if _is_duration(k) else None
            parser.add_argument(
                k.flag, dest=k.name, type=kind, choices=k.choices or None, metavar=metavar, help=_help(k)
            )


JSON_HELP = "print JSON for machines instead of the table"
QUEUE_FILTER = "only this queue (default: every queue)"


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    _add_common(common, after=True)

    p = Parser(
        prog="skiplock",
        description="A job queue inside PostgreSQL (FOR UPDATE SKIP LOCKED). Every command takes the common options "
        "before or after its name; durations take units (90, 90s, 15m, 12h, 7d).",
        epilog="exit codes: 0 success, 1 problems found or nothing matched, 2 bad input or configuration, "
        "3 database unavailable or schema not ready",
    )
    p.add_argument("--version", action="version", version=f"skiplock {__version__}")
    _add_common(p, after=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    def command(name: str, summary: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, parents=[common], help=summary, description=summary[:1].upper() + summary[1:] + ".", **kw
        )

    # set up and run
    command("migrate", "create or upgrade the schema (idempotent, safe to run from many pods at once)")

    w = command("worker", "run a worker: claim jobs and run their tasks (every flag also as a SKIPLOCK_* variable)")
    _add_knob_flags(w)

    e = command("enqueue", "add one job, by task name (no task code is imported)")
    e.add_argument(
        "--queue",
        help="queue of the job (default: the queue the task's workers registered; for a job without --task, "
        "SKIPLOCK_QUEUE or 'default')",
    )
    e.add_argument(
        "--task", help="task name of the job, as registered with @app.task; its registered queue and defaults apply"
    )
    body = e.add_mutually_exclusive_group(required=True)
    body.add_argument("--payload", help='the job\'s JSON payload, e.g. \'{"to": "a@b.c"}\'')
    body.add_argument("--payload-file", metavar="PATH", help="read the JSON payload from this file ('-': stdin)")
    e.add_argument(
        "--after",
        type=int,
        action="append",
        metavar="ID",
        help="run only once this job is done (repeatable: every parent); a parent that fails or is cancelled "
        "cancels this job, unless --on-parent-failure run",
    )
    e.add_argument(
        "--on-parent-failure",
        choices=["cancel", "run"],
        help="with --after: cancel this job when a parent fails (default), or run it once every parent is final",
    )
    e.add_argument(
        "--delay",
        type=_delay,
        default=0.0,
        metavar="DURATION",
        help="wait this long before the job is visible (e.g. 1h)",
    )
    e.add_argument(
        "--priority",
        type=_bounded(int, *PRIORITY_RANGE),
        help="higher runs first (-32768..32767; default: the task's, else 0)",
    )
    e.add_argument(
        "--max-attempts",
        type=_bounded(int, 1, MAX_ATTEMPTS_LIMIT),
        help="attempts before the job is failed (1..1000) (default: the task's, else SKIPLOCK_MAX_ATTEMPTS or 5)",
    )
    e.add_argument("--idempotency-key", help="a second enqueue with the same key returns the first job")
    e.add_argument(
        "--timeout",
        type=_timeout,
        dest="timeout_seconds",
        metavar="DURATION",
        help="longest run of one attempt (up to a year; default none)",
    )
    e.add_argument("--serial-key", help="jobs sharing this key run one at a time, in enqueue order (e.g. user:42)")
    e.add_argument(
        "--serial-skip-on-retry",
        action="store_true",
        default=None,
        help="while this job waits for a retry, later jobs of its serial key may run",
    )

    u = e.add_argument_group("unique jobs (the task's own unique options are not seen: give them here)")
    u.add_argument(
        "--unique-by", help="unique by the whole payload ('payload') or these payload keys (a,b); needs --task"
    )
    u.add_argument(
        "--unique-for",
        type=_positive_duration,
        metavar="DURATION",
        help="unique within periods of this long (e.g. 1h); needs --task",
    )
    u.add_argument("--unique-key", help="unique by this key, as given (instead of --unique-by/--unique-for)")
    u.add_argument(
        "--unique-states",
        help="statuses holding the key, comma-separated (default pending,processing; plus done with --unique-for)",
    )
    u.add_argument("--unique-conflict", choices=["skip", "replace"], help="on a duplicate (default skip)")

    # look
    st = command("stats", "health of each queue: ready, delayed, running, stalled, failed, done in the last hour")
    st.add_argument("--queue", help=QUEUE_FILTER)
    st.add_argument("--json", action="store_true", help=JSON_HELP)
    st.add_argument(
        "--lease",
        type=_positive_duration,
        metavar="DURATION",
        help="lease used to call a processing job stalled (default SKIPLOCK_LEASE_SECONDS)",
    )

    sh = command("show", "one job: payload, status, lease, timestamps, and each failed attempt with its traceback")
    sh.add_argument("id", type=int, help="job id")
    sh.add_argument("--json", action="store_true", help="print the job as JSON")

    f = command("failed", "failed jobs, newest first")
    f.add_argument("--queue", help=QUEUE_FILTER)
    f.add_argument("--limit", type=_positive_int, default=20, help="list at most this many (default 20)")
    f.add_argument("--json", action="store_true", help=JSON_HELP)
    f.add_argument("--group", action="store_true", help="failures grouped by fingerprint (task and normalised error)")

    sl = command("stalled", "running jobs past their lease deadline (exit 1 if any)")
    sl.add_argument("--queue", help=QUEUE_FILTER)
    sl.add_argument("--limit", type=_positive_int, default=100, help="list at most this many (default 100)")
    sl.add_argument("--json", action="store_true", help=JSON_HELP)

    lim = command("limits", "registered task limits, and jobs held back by flow control")
    lim.add_argument("--json", action="store_true", help=JSON_HELP)

    sc = command("schedules", "periodic tasks: list them with their next run, register an app's, or remove some")
    sc.add_argument(
        "action",
        nargs="?",
        choices=["list", "sync", "remove"],
        default="list",
        help="list (default): every schedule and its next run; sync: register the schedules of --app; "
        "remove: the schedules named",
    )
    sc.add_argument("names", nargs="*", help="remove: the schedules (task names) to remove")
    sc.add_argument(
        "--app", dest="schedules_app", metavar="MODULE:ATTR", help="sync: the app whose schedules to register"
    )
    sc.add_argument("--prune", action="store_true", help="sync: also remove the app's schedules it no longer defines")
    sc.add_argument("--json", action="store_true", help=JSON_HELP)

    # act
    for name, helptext in (
        ("retry", "re-drive failed jobs with a fresh set of attempts (workers are woken at once)"),
        ("cancel", "cancel pending or running jobs"),
    ):
        r = command(name, helptext)
        r.add_argument("ids", nargs="*", type=int, help="job ids")
        r.add_argument("--queue", help="every matching job of this queue")
        if name == "cancel":
            r.add_argument("--task", help="only jobs of this task")
            r.add_argument("--workflow", metavar="ID", help="every job of this workflow that has not ended")
        else:
            r.add_argument("--include-cancelled", action="store_true", help="re-drive cancelled jobs too")

    for name, helptext in (
        ("pause", "stop claiming from a queue (running jobs finish)"),
        ("resume", "claim from a paused queue again"),
    ):
        pa = command(name, helptext)
        pa.add_argument("queue", help="queue name")

    pu = command("purge", "delete finished jobs older than a cutoff, in batches")
    pu.add_argument(
        "--older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="age of the jobs to delete, e.g. 7d or 12h",
    )
    pu.add_argument(
        "--status",
        choices=["done", "failed", "cancelled"],
        action="append",
        help="only jobs of this status (repeatable; default done and failed)",
    )
    pu.add_argument("--queue", help=QUEUE_FILTER)

    # operate
    dr = command("doctor", "check schema, indexes, vacuum health and LISTEN (exit 1 when a check fails)")
    dr.add_argument("--json", action="store_true", help="print the checks as JSON")

    gr = command("grant", "give existing roles least-privilege rights on the schema")
    gr.add_argument("--producer", metavar="ROLE", help="role that enqueues (INSERT, SELECT on jobs)")
    gr.add_argument(
        "--worker", metavar="ROLE", help="role that claims and finishes jobs (UPDATE of the lease columns only)"
    )
    gr.add_argument(
        "--operator", metavar="ROLE", help="role that migrates, reads stats and purges (becomes the schema's owner)"
    )
    gr.add_argument(
        "--ui",
        metavar="ROLE",
        help="role of `skiplock ui`: reads everything, retries, cancels, pauses, writes ui_audit",
    )
    gr.add_argument(
        "--connection-limit",
        action="append",
        default=[],
        metavar="ROLE=N",
        help="set the role's CONNECTION LIMIT (repeatable; -1: none); a worker role needs replicas x (concurrency + 7)",
    )
    gr.add_argument("--dry-run", action="store_true", help="print the statements, change nothing")

    ui = command("ui", "serve the web UI (needs skiplock[ui]; read-only without a token)")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=_port, default=8080, help="port to listen on (default 8080)")
    ui.add_argument("--token-file", metavar="PATH", help="the token actions need (default: SKIPLOCK_UI_TOKEN)")
    ui.add_argument("--hide-payloads", action="store_true", help="show only the size of payloads, results, errors")
    ui.add_argument("--trusted-user-header", metavar="NAME", help="behind an authenticating proxy: its user header")

    op = command("operator", "run the Kubernetes operator (needs skiplock[operator])")
    op.add_argument("--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    op.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    op.add_argument("--liveness-port", type=_port, default=8080, help="port of the /healthz probe (default 8080)")
    op.add_argument("--peering", help="kopf peering name for HA (default: none, standalone)")

    d = command("demo", "run the demo: a job mix drained by a few workers (embedded PostgreSQL when no DSN is given)")
    d.add_argument("--jobs", type=_positive_int, default=3000, help="jobs to enqueue (default 3000)")
    d.add_argument("--workers", type=_positive_int, default=3, help="worker processes (default 3)")
    d.add_argument("--concurrency", type=_positive_int, default=16, help="jobs in flight per worker (default 16)")
    d.add_argument(
        "--keep",
        action="store_true",
        help="keep the embedded PostgreSQL running afterwards and print its DSN and follow-up commands",
    )
    return p


WORKER_KNOBS = tuple(k.name for k in KNOBS if k.flag is not None and not k.common)
"""Settings the worker's own flags set (the common ones are read for every command)."""


def read_dsn_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            dsn = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --dsn-file {path!r}: {exc.__class__.__name__}: {exc.args[-1]}") from None
    if not dsn:
        raise ConfigError(f"--dsn-file {path!r} is empty")
    return dsn


def load_settings(args: argparse.Namespace, **extra: Any) -> Settings:
    """Flags (common ones, then the command's), then the SKIPLOCK_* environment, then defaults."""
    flags = {k.name: getattr(args, k.name, None) for k in KNOBS if k.common}
    if getattr(args, "dsn_file", None):
        if flags["dsn"]:
            raise ConfigError("give --dsn or --dsn-file, not both")
        flags["dsn"] = read_dsn_file(args.dsn_file)
    flags.update({k: v for k, v in extra.items() if v is not None})
    return Settings.from_env(**flags)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings: Settings | None = None
    try:
        if args.command == "worker":
            settings = load_settings(args, **{name: getattr(args, name) for name in WORKER_KNOBS})
        elif args.command == "stats":
            settings = load_settings(args, lease_seconds=args.lease)
        else:
            settings = load_settings(args)
        configure_logging(settings.log_level, settings.log_format, settings.dsn)
        if getattr(args, "queue", None) is not None:
            check_queue_name(args.queue)
        return COMMANDS[args.command](args, settings)
    except (ConfigError, PayloadError, ValueError) as exc:
        print(f"skiplock: error: {_clean(exc, args, settings)}", file=sys.stderr)
        return EXIT_USAGE
    except (DatabaseUnavailableError, SchemaNotReadyError) as exc:
        print(f"skiplock: error: {_clean(exc, args, settings)}", file=sys.stderr)
        return EXIT_DATABASE
    except SkiplockError as exc:
        print(f"skiplock: error: {_clean(exc, args, settings)}", file=sys.stderr)
        return EXIT_PROBLEMS
    except KeyboardInterrupt:
        return 130


def warn(message: str) -> None:
    """A warning of a command (the one style: ``skiplock: warning: ...`` on stderr)."""
    print(f"skiplock: warning: {message}", file=sys.stderr)


def _clean(exc: BaseException, args: argparse.Namespace, settings: Settings | None = None) -> str:
    text = " ".join(str(exc).split())  # one line: libpq's DETAIL and tab-indented hints joined
    dsns = (
        settings and settings.dsn,
        getattr(args, "dsn", None),
        *(os.environ.get(n) for n in ("SKIPLOCK_DSN", "DATABASE_URL")),
    )
    for dsn in dsns:
        text = redact(text, dsn or None)
    return text


# ---------------------------------------------------------------------------------------------- commands
def _queue(settings: Settings) -> Any:
    from skiplock.queue import Queue

    return Queue(settings=settings, max_size=2)


def _guard_schema(q: Any, settings: Settings) -> None:
    q.check_schema()


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    logging.getLogger("skiplock.migrate").setLevel(logging.WARNING)  # the line below reports it, once
    with _queue(settings) as q:
        report = q.migrate()
    applied = ", ".join(report.applied) or "nothing to do"
    print(f"schema {settings.schema!r} at version {report.version} ({applied})")
    return EXIT_OK


def read_payload(args: argparse.Namespace) -> Any:
    """The JSON payload of ``--payload`` or ``--payload-file PATH|-`` (a warning when it is not an object)."""
    where = "--payload"
    text = args.payload
    if args.payload_file is not None:
        where = f"--payload-file {args.payload_file}"
        try:
            if args.payload_file == "-":
                text = sys.stdin.read()
            else:
                with open(args.payload_file, encoding="utf-8") as f:
                    text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise PayloadError(f"cannot read {where}: {exc.__class__.__name__}: {exc.args[-1]}") from None
    try:
        payload = json.loads(text, parse_constant=lambda name: _reject_constant(name, where))
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise PayloadError(f"{where} nests too deeply") from None
    if not isinstance(payload, dict):
        kind = "null" if payload is None else type(payload).__name__
        warn(f'the payload is a JSON {kind}, not an object: tasks usually read job.payload["key"]')
    return payload


def task_queue(q: Any, args: argparse.Namespace, settings: Settings) -> tuple[str, dict[str, Any]]:
    """The queue and the defaults of a job enqueued by ``skiplock enqueue``: a task's as its workers registered
    them (explicit flags win); a task no worker registered needs ``--queue``; no task: ``--queue`` or the default."""
    if not args.task:
        return args.queue or settings.queue, {}
    if problem := task_name_problem(args.task):
        raise ConfigError(problem)
    registered = q.task_defaults(args.task)
    if registered is None:
        if args.queue:
            return args.queue, {}
        close = suggest(args.task, q.task_names())
        hint = f"did you mean {close!r}? " if close else ""
        raise ConfigError(
            f"task {args.task!r} is not registered in schema {settings.schema!r} (no worker running it has started): "
            f"{hint}give its queue with --queue, or start a worker of its app first (it registers the task's queue "
            "and defaults)"
        )
    if args.queue and args.queue != registered.queue:
        warn(f"task {args.task!r} runs on queue {registered.queue!r}; enqueued on {args.queue!r} as --queue says")
    return args.queue or registered.queue, registered.options()


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    payload = read_payload(args)
    unique = _unique_options(args, payload)
    with _queue(settings) as q:
        _guard_schema(q, settings)
        queue, defaults = task_queue(q, args, settings)
        explicit = {"priority": args.priority, "max_attempts": args.max_attempts}
        options = defaults | {k: v for k, v in explicit.items() if v is not None}
        result = q.enqueue(
            queue,
            payload,
            task=args.task,
            delay=args.delay,
            priority=options.get("priority"),
            max_attempts=options.get("max_attempts"),
            idempotency_key=args.idempotency_key,
            timeout_seconds=args.timeout_seconds,
            **unique,
            serial_key=args.serial_key,
            serial_skip_on_retry=args.serial_skip_on_retry
            if args.serial_skip_on_retry is not None
            else options.get("serial_skip_on_retry"),
            after=args.after,
            on_parent_failure=args.on_parent_failure,
        )
    note = " (duplicate: a job with this key exists)" if result.duplicate else ""
    print(f"{result.id}{note}")
    return EXIT_OK


def _unique_options(args: argparse.Namespace, payload: Any) -> dict[str, Any]:
    """The unique options of ``skiplock enqueue`` (none unless a --unique-* flag is given)."""
    import time

    from skiplock.unique import states_for, unique_key, unique_problem

    by = None if args.unique_by is None else "payload" if args.unique_by == "payload" else args.unique_by.split(",")
    states = None if args.unique_states is None else [x.strip() for x in args.unique_states.split(",")]
    explicit = args.unique_key is not None
    if not explicit and by is None and args.unique_for is None:
        if states is not None or args.unique_conflict is not None:
            raise ConfigError("--unique-states and --unique-conflict need --unique-by, --unique-for or --unique-key")
        return {}
    if explicit and (by is not None or args.unique_for is not None):
        raise ConfigError("give --unique-key, or --unique-by/--unique-for, not both")
    if problem := unique_problem(args.unique_for, by, states, args.unique_conflict, explicit_key=explicit):
        raise ConfigError(problem)
    if not explicit and not args.task:
        raise ConfigError("--unique-by and --unique-for need --task (the key starts with the task name)")
    try:
        key = args.unique_key or unique_key(
            args.task, payload, unique_by=by, unique_for=args.unique_for, now=time.time()
        )
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    out = {"unique_key": key, "unique_states": states_for(args.unique_for, states)}
    return out | ({"unique_conflict": args.unique_conflict} if args.unique_conflict else {})


def cmd_schedules(args: argparse.Namespace, settings: Settings) -> int:
    from skiplock.handlers import load_app

    if args.action == "sync" and not args.schedules_app:
        raise ConfigError("schedules sync: give --app module:attr (the app whose periodic tasks to register)")
    if args.action == "remove" and not args.names:
        raise ConfigError("schedules remove: name the schedules (task names) to remove")
    app = load_app(args.schedules_app) if args.action == "sync" else None
    with _queue(settings) as queue:
        _guard_schema(queue, settings)
        if app is not None:
            queue.register_schedules(app.schedules)
            print(f"registered {len(app.schedules)} schedule(s) of app {app.name!r}")
            if args.prune:
                gone = queue.prune_schedules(app.name, [s.name for s in app.schedules])
                print(f"removed {len(gone)} schedule(s) no longer defined" + "".join(f"\n  {n}" for n in gone))
            return EXIT_OK
        if args.action == "remove":
            removed = queue.remove_schedules(args.names)
            for name in args.names:
                print(f"{name}: {'removed' if name in removed else 'no such schedule'}")
            return EXIT_OK if removed == set(args.names) else EXIT_PROBLEMS
        rows = queue.schedules()
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return EXIT_OK
    if not rows:
        print("no schedules (workers register their app's periodic tasks at start; or: skiplock schedules sync)")
        return EXIT_OK
    print(render.schedules(rows))
    return EXIT_OK


def cmd_limits(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        limits, waiting = q.limits(), q.waiting()
    if args.json:
        print(json.dumps({"limits": limits, "waiting": waiting}, indent=2, default=str))
        return EXIT_OK
    rate = "{}/{:g}s".format
    body = [
        (r["task"], r["global_concurrency"] or "-", r["running"],
         rate(r["rate_limit"], r["rate_period_seconds"]) if r["rate_limit"] else "-", r["recent_starts"],
         r["registered_by"] or "-")
        for r in limits
    ]  # fmt: skip
    head = ("task", "global_concurrency", "running", "rate_limit", "recent_starts", "registered_by")
    print(render.table(head, body) if body else "no task limits registered (workers register them at start)")
    held = [(r["queue"], r["serial_key"], r["concurrency"], r["rate"]) for r in waiting]
    if held:
        print()
        print(render.table(("queue", "waiting_serial_key", "waiting_concurrency", "waiting_rate"), held))
    return EXIT_OK


def _reject_constant(name: str, where: str = "--payload") -> Any:
    raise PayloadError(f"{where} contains {name}, which is not valid JSON")


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        rows = q.stats(args.queue)
        done = None if args.json else q.done_recently(args.queue, seconds=3600, cap=DONE_CAP)
    if args.json:
        print(json.dumps([vars(r) | {"backlog": r.backlog} for r in rows], indent=2, default=str))
        return EXIT_OK
    if args.queue and not rows:
        print(f"queue {args.queue!r} has no pending, processing or failed jobs")
    else:
        print(render.stats(rows))
    print(render.done_recently(done or {}, DONE_CAP))
    return EXIT_OK


DONE_CAP = 10_000
"""``stats`` counts the jobs done in the last hour up to this many (from the done index: a bounded read)."""


def cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    if args.group:
        return _failed_groups(args, settings)
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
    print(render.table(("id", "queue", "attempts", "failed_at", "last_error"), body))
    return EXIT_OK


def _failed_groups(args: argparse.Namespace, settings: Settings) -> int:
    """``failed --group``: the UI's failure groups (the fingerprint index), largest first."""
    from skiplock.store.ui import UiStore

    async def groups() -> list[dict[str, Any]]:
        store = await UiStore.open(settings, max_size=1)
        try:
            return (await store.failure_groups(queue=args.queue, task=None, after=None, limit=args.limit)).rows
        finally:
            await store.close()

    with _queue(settings) as q:
        _guard_schema(q, settings)
    rows = asyncio.run(groups())
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    if not rows:
        print("no failed jobs")
        return EXIT_OK
    body = [
        (
            r["fingerprint"],
            r["jobs"],
            r["task"] or "",
            r["first_seen"].isoformat(timespec="seconds"),
            r["last_seen"].isoformat(timespec="seconds"),
            (r["normalised"] or "")[:80],
        )
        for r in rows
    ]
    print(render.table(("fingerprint", "jobs", "task", "first_seen", "last_seen", "error"), body))
    return EXIT_OK


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    try:
        from skiplock.ui.config import UiConfig
        from skiplock.ui.server import serve
    except ImportError as exc:
        raise ConfigError(f"the UI needs the extra: pip install 'skiplock[ui]' ({exc})") from None
    config = UiConfig.load(
        token_file=args.token_file, hide_payloads=args.hide_payloads, trusted_user_header=args.trusted_user_header
    )
    return serve(settings, config, host=args.host, port=args.port)


def _by_selection(args: argparse.Namespace, settings: Settings, verb: str, what: str) -> int:
    """retry/cancel: act on job ids, a queue, or both; exit 1 when nothing matched (by ids or by queue alike).
    Named jobs left unchanged are reported with their status (a finished job is never changed)."""
    workflow = getattr(args, "workflow", None)
    if not args.ids and not args.queue and not workflow:
        also = ", or --workflow" if args.command == "cancel" else ""
        raise ConfigError(f"{args.command}: give job ids, --queue, or both{also}")
    ids = args.ids or None
    with _queue(settings) as q:
        _guard_schema(q, settings)
        if workflow:
            try:
                ids = [*(ids or ()), *q.workflow_jobs(workflow)]
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if workflow and not ids:
            done = []
        elif args.command == "retry":
            done = q.retry_failed(ids=ids, queue=args.queue, include_cancelled=args.include_cancelled)
        else:
            done = q.cancel(ids=ids, queue=args.queue, task=args.task)
        left = sorted(set(ids or ()) - set(done))
        found = q.statuses(left) if left else {}
    print(f"{verb} {len(done)} {what}" + (f": {', '.join(map(str, done[:20]))}" if done else ""))
    for job_id in left:
        status = found.get(job_id)
        print(f"job {job_id}: " + (f"{status}, left unchanged" if status else "no such job"), file=sys.stderr)
    return EXIT_OK if done else EXIT_PROBLEMS


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    return _by_selection(args, settings, "re-queued", "failed job(s)")


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    return _by_selection(args, settings, "cancelled", "job(s)")


def cmd_stalled(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        rows = q.list_stalled(args.queue, limit=args.limit)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    elif not rows:
        print("no stalled jobs")
    else:
        body = [
            (
                r["id"],
                r["queue"],
                r["task"] or "-",
                r["locked_by"],
                (r["lease_expires_at"] or r["locked_at"]).isoformat(timespec="seconds"),
                f"{r['attempts']}/{r['max_attempts']}",
            )
            for r in rows
        ]
        print(render.table(("id", "queue", "task", "locked_by", "lease_expired_at", "attempts"), body))
    return EXIT_PROBLEMS if rows else EXIT_OK


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        q.pause(args.queue)
    print(f"queue {args.queue!r} paused: running jobs finish, nothing new is claimed (skiplock resume {args.queue})")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        q.resume(args.queue)
    print(f"queue {args.queue!r} resumed")
    return EXIT_OK


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        row = q.get(args.id)
        if row is not None:
            row |= q.relatives(args.id)
    if row is None:
        print(f"skiplock: no job {args.id}", file=sys.stderr)
        return EXIT_PROBLEMS
    if args.json:
        print(json.dumps(row, indent=2, default=str))
        return EXIT_OK
    print(render.job(row))
    return EXIT_OK


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    with _queue(settings) as q:
        _guard_schema(q, settings)
        n = q.purge(older_than_seconds=args.older_than, statuses=args.status or ("done", "failed"), queue=args.queue)
    print(f"purged {n} job(s)")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from skiplock.handlers import load_target

    app, handler = load_target(settings)
    with _queue(settings) as q:
        _guard_schema(q, settings)
    from skiplock.worker import loops

    tune_gc()
    return loops.run(_run_worker(build_worker(settings, app, handler)), settings.event_loop)


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between the cyclic collector's young collections in a worker process (Python's default: 700). A
draining worker allocates a few objects a job (its ``Job``, entry and result) that live for milliseconds: at 700,
most of them are still alive at a collection and are traversed there, and again one generation up. At 20,000 a
collection comes every few thousand jobs, while only the few hundred jobs in flight are alive (ADR 0007 gives the
instructions it saves). Cyclic garbage a handler leaves is collected as before, a little later."""


def tune_gc() -> None:
    """The worker process's collector, once the app is imported: what exists now (modules, the app, settings) lives
    as long as the process, so it is frozen out of every collection; young collections run less often."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def build_worker(settings: Settings, app: Any, handler: Any) -> Any:
    from skiplock.worker import Worker

    return Worker(app, settings=settings, handler=handler)


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

    # A worker started with SIGINT ignored (a background job of a script, the demo's workers) keeps ignoring it.
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            loop.add_signal_handler(sig, on_signal, sig)
    code: int = await worker.run()
    if getattr(worker, "abandoned_threads", None):
        logging.shutdown()
        os._exit(code)  # do not join handler threads still running: their jobs were handed back
    return code


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from skiplock.demo import run_demo

    return run_demo(settings, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency, keep=args.keep)


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from skiplock import doctor
    from skiplock.store.run import check_connect

    dsn = settings.require_dsn()
    check_connect(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        checks = doctor.run_checks(conn, settings)
    print(doctor.render_json(checks) if args.json else doctor.render_text(checks), end="")
    return doctor.exit_code(checks)


def cmd_grant(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from skiplock import grant
    from skiplock.store.run import check_connect

    roles = {"producer": args.producer, "worker": args.worker, "operator": args.operator, "ui": args.ui}
    limits = grant.parse_connection_limits(args.connection_limit)
    if args.dry_run:
        for statement in grant.grant_sql(settings.schema, **roles, connection_limits=limits):
            print(statement.as_string(None) + ";")
        return EXIT_OK
    dsn = settings.require_dsn()
    check_connect(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = grant.apply_grants(conn, settings.schema, **roles, connection_limits=limits)
    print(f"applied {len(done)} statement(s) on schema {settings.schema!r}")
    if args.worker and args.worker not in limits:
        print(grant.connection_limit_hint(args.worker))
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
    "limits": cmd_limits,
    "failed": cmd_failed,
    "retry": cmd_retry,
    "cancel": cmd_cancel,
    "show": cmd_show,
    "stalled": cmd_stalled,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "purge": cmd_purge,
    "worker": cmd_worker,
    "demo": cmd_demo,
    "doctor": cmd_doctor,
    "grant": cmd_grant,
    "operator": cmd_operator,
    "schedules": cmd_schedules,
    "ui": cmd_ui,
}
