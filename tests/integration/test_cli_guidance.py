"""The CLI guides a new user: the task registry behind ``enqueue --task``, one error style with suggestions, exit
codes as docs/operations.md says, durations with units, payload files, positive confirmation, and help for every
subcommand and option. Through subprocess, against a real PostgreSQL (and a real worker for the registry)."""

from __future__ import annotations

import argparse
import signal
from datetime import UTC, datetime

import psycopg
import pytest

from skiplock import Queue, Settings
from skiplock.cli import build_parser
from skiplock.store.statements import Failure
from support.pg import wait_for
from support.workers import WorkerProcess

from .test_cli import run


def job_row(pg_dsn: str, schema: str, job_id: int) -> dict:
    with psycopg.connect(pg_dsn, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(f'SELECT * FROM "{schema}".jobs WHERE id = %s', (job_id,)).fetchone()
    assert row is not None
    return row


def test_a_worker_registers_its_tasks_and_enqueue_by_name_uses_their_queue_and_defaults(pg_dsn, schema):
    before = run("enqueue", "--task", "charge", "--payload", "{}", dsn=pg_dsn, schema=schema)
    assert before.returncode == 2 and "task 'charge' is not registered" in before.stderr, before
    w = WorkerProcess(pg_dsn, schema, "charges", None, app="support.raising_app:app", poll_seconds=0.2)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            registered = f'SELECT name, queue, max_attempts, app FROM "{schema}".tasks'
            rows = wait_for(lambda: conn.execute(registered).fetchall(), timeout=30, what="the worker's registration")
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()
    finally:
        w.stop()
    assert rows == [("charge", "charges", 2, "skiplock")]

    by_name = run("enqueue", "--task", "charge", "--delay", "1h", "--payload", "{}", dsn=pg_dsn, schema=schema)
    assert by_name.returncode == 0, by_name.stderr
    row = job_row(pg_dsn, schema, int(by_name.stdout.split()[0]))
    assert (row["queue"], row["task"], row["max_attempts"]) == ("charges", "charge", 2), "the task's own defaults"
    explicit = run("enqueue", "--task", "charge", "--max-attempts", "7", "--payload", "{}", dsn=pg_dsn, schema=schema)
    assert job_row(pg_dsn, schema, int(explicit.stdout.split()[0]))["max_attempts"] == 7, "a flag wins"

    elsewhere = run("enqueue", "--task", "charge", "--queue", "other", "--payload", "{}", dsn=pg_dsn, schema=schema)
    assert elsewhere.returncode == 0 and "runs on queue 'charges'" in elsewhere.stderr, elsewhere
    typo = run("enqueue", "--task", "charg", "--payload", "{}", dsn=pg_dsn, schema=schema)
    assert typo.returncode == 2 and "did you mean 'charge'?" in typo.stderr, typo
    with Queue(settings=Settings(dsn=pg_dsn, schema=schema), max_size=1) as q:
        d = q.task_defaults("charge")
        assert d is not None and (d.queue, d.options()) == ("charges", {"max_attempts": 2})
        assert q.task_defaults("nope") is None and q.task_names() == ["charge"]
        producer = q.enqueue("charges", {}, task="charge", delay=3600).id  # by name: the worker's registration
        overridden = q.enqueue("charges", {}, task="charge", delay=3600, max_attempts=5).id
    assert job_row(pg_dsn, schema, producer)["max_attempts"] == 2, "a producer by name gets the task's defaults"
    assert job_row(pg_dsn, schema, overridden)["max_attempts"] == 5, "an explicit option wins"


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [(("stat",), "did you mean 'stats'?"), (("stats", "--qeue", "x"), "did you mean --queue?")],
)
def test_a_typo_gets_one_error_style_and_a_suggestion(pg_dsn, schema, args, suggestion):
    out = run(*args, dsn=pg_dsn, schema=schema)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[-1].startswith("skiplock: error: ") and suggestion in out.stderr, out.stderr


@pytest.mark.parametrize("dsn", ["notadsn", "postgresql://u@127.0.0.1:5432/db?nonsense=1"])
def test_a_malformed_dsn_is_configuration_exit_2_not_unavailable(dsn):
    out = run("stats", dsn=dsn)
    assert out.returncode == 2, out
    assert out.stderr.startswith("skiplock: error: invalid settings: the DSN is malformed (setting dsn")
    assert "\t" not in out.stderr


def test_an_unreachable_database_is_exit_3_on_one_line():
    out = run("stats", dsn="postgresql://u@127.0.0.1:1/db")
    assert out.returncode == 3 and out.stderr.count("\n") == 1 and "\t" not in out.stderr, out


def test_durations_take_units_everywhere(pg_dsn, schema):
    out = run(
        "enqueue", "--queue", "q", "--payload", "{}", "--delay", "1h", "--timeout", "90s", dsn=pg_dsn, schema=schema
    )
    assert out.returncode == 0, out.stderr
    row = job_row(pg_dsn, schema, int(out.stdout.split()[0]))
    assert 3590 < (row["visible_at"] - datetime.now(UTC)).total_seconds() <= 3600 and row["timeout_seconds"] == 90
    assert run("stats", "--lease", "2m", dsn=pg_dsn, schema=schema).returncode == 0
    bad = run("worker", "--lease", "soon", "--app", "support.raising_app:app", dsn=pg_dsn, schema=schema)
    assert bad.returncode == 2 and "'soon' is not a duration like 90, 90s, 15m" in bad.stderr
    too_long = run("enqueue", "--queue", "q", "--payload", "{}", "--timeout", "400d", dsn=pg_dsn, schema=schema)
    assert too_long.returncode == 2 and "'400d' must be a duration > 0 and <= 365d (a year)" in too_long.stderr
    shown = " ".join(run("worker", "--help").stdout.split())
    assert "(SKIPLOCK_RETAIN_DONE_SECONDS; default 7d)" in shown and "(SKIPLOCK_LEASE_SECONDS; default 60s)" in shown
    assert "604800" not in shown, "defaults are shown with units, as they are typed"


def test_payload_from_a_file_or_stdin_and_a_warning_when_not_an_object(pg_dsn, schema, tmp_path):
    f = tmp_path / "payload.json"
    f.write_text('{"order": 42}')
    from_file = run("enqueue", "--queue", "q", "--payload-file", str(f), dsn=pg_dsn, schema=schema)
    assert from_file.returncode == 0 and from_file.stderr == "", from_file
    assert job_row(pg_dsn, schema, int(from_file.stdout))["payload"] == {"order": 42}
    listed = run("enqueue", "--queue", "q", "--payload-file", "-", dsn=pg_dsn, schema=schema, stdin="[1, 2]")
    assert listed.returncode == 0 and "skiplock: warning: the payload is a JSON list, not an object" in listed.stderr
    assert job_row(pg_dsn, schema, int(listed.stdout))["payload"] == [1, 2]
    missing = run("enqueue", "--queue", "q", "--payload-file", str(tmp_path / "nope"), dsn=pg_dsn, schema=schema)
    assert missing.returncode == 2 and "cannot read --payload-file" in missing.stderr
    both = run("enqueue", "--queue", "q", "--payload", "{}", "--payload-file", str(f), dsn=pg_dsn, schema=schema)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_retry_wakes_the_workers_of_the_queue_at_once(pg_dsn, schema):
    settings = Settings(dsn=pg_dsn, schema=schema)
    with Queue(settings=settings, max_size=1) as q:
        job_id = q.enqueue("mail", {}, max_attempts=1).id
        [job] = q.claim("mail", limit=1, worker="w")
        assert q.fail([Failure.from_exception(job, RuntimeError("boom"), settings)], worker="w") == {job_id: "failed"}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(settings.channel)))
        out = run("retry", str(job_id), dsn=pg_dsn, schema=schema)
        assert out.returncode == 0 and f"re-queued 1 failed job(s): {job_id}" in out.stdout, out
        woke = list(conn.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in woke] == [(settings.channel, "mail")]


def test_stats_confirms_work_done_and_migrate_reports_once(pg_dsn, schema):
    migrated = run("migrate", dsn=pg_dsn, schema=schema)
    assert migrated.returncode == 0 and migrated.stdout.count("\n") == 1 and migrated.stderr == "", migrated
    idle = run("stats", dsn=pg_dsn, schema=schema)
    assert "no job done in the last hour" in idle.stdout and "skiplock show ID" in idle.stdout
    with Queue(settings=Settings(dsn=pg_dsn, schema=schema), max_size=1) as q:
        for _ in range(3):
            q.enqueue("mail", {})
        q.complete(q.claim("mail", limit=3, worker="w"), worker="w")
    busy = run("stats", dsn=pg_dsn, schema=schema)
    assert busy.returncode == 0 and busy.stdout.splitlines()[-1] == "done in the last hour: 3 (mail 3)", busy.stdout


def test_every_command_and_option_has_help_and_commands_come_in_a_sensible_order():
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = list(sub.choices)
    assert names[:3] == ["migrate", "worker", "enqueue"] and names.index("stats") < names.index("retry")
    for name, command in sub.choices.items():
        assert command.description and command.description.endswith("."), name
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"skiplock {name} {action.option_strings}"
    help_texts = [a.help for c in sub.choices.values() for a in c._actions if a.help]
    assert not [h for h in help_texts if h[0].isupper() and h.split()[0] not in ("PostgreSQL", "JSON", "Python")]
    out = run("enqueue", "--help")
    assert out.returncode == 0 and "--payload-file PATH" in out.stdout and "--delay DURATION" in out.stdout


@pytest.mark.parametrize("ignored", [False, True])
def test_a_worker_started_with_sigint_ignored_keeps_ignoring_it(pg_dsn, schema, ignored):
    """SIGINT, then SIGTERM: a worker that handles SIGINT takes the SIGTERM as a second signal and exits at once
    (130); one started with SIGINT ignored (a script's background job, the demo's workers) drains once (0)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    try:  # the child inherits SIG_IGN, as from a shell that starts it in the background
        w = WorkerProcess(pg_dsn, schema, "q", None, app="support.raising_app:app", poll_seconds=0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        wait_for(lambda: "worker started" in w.output(), timeout=30, what="the worker to start")
        w.signal(signal.SIGINT)
        w.signal(signal.SIGTERM)
        code = w.wait(30)
    finally:
        w.stop()
    assert code == (0 if ignored else 130), w.output()
    assert ("second signal" in w.output()) is not ignored, w.output()
