"""A failing task's traceback: kept in the job's error history, shown by ``skiplock show``, logged by the worker
(with the final failure; with retries only at DEBUG), and never holding a payload value."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from skiplock import Queue, Settings
from skiplock.errors import MAX_TRACEBACK_CHARS, format_traceback
from support import raising_app
from support.pg import wait_for
from support.workers import WorkerProcess

from .test_cli import run

APP_FILE = Path(raising_app.__file__).name
LINE = next(
    i for i, text in enumerate(Path(raising_app.__file__).read_text().splitlines(), 1) if 'line["price"]' in text
)
FRAME = f'{APP_FILE}", line {LINE}, in <genexpr>'
SECRET = "hunter2-card-number"


@pytest.fixture
def failed_job(pg_dsn: str, schema: str, settings: Settings) -> Iterator[tuple[int, str]]:
    """A job of ``charge`` run by a real worker (DEBUG logs) until it failed for good; its id and the worker's log."""
    with Queue(settings=settings, max_size=1) as q:
        job_id = q.enqueue("charges", {"lines": [3, 4], "card": SECRET}, task="charge", max_attempts=2).id
        w = WorkerProcess(
            pg_dsn, schema, "charges", None, app="support.raising_app:app", log_level="DEBUG", poll_seconds=0.2
        )
        try:
            wait_for(lambda: (q.get(job_id) or {}).get("status") == "failed", timeout=30, what="the job to fail")
            w.signal(signal.SIGTERM)
            assert w.wait(30) == 0, w.output()
        finally:
            w.stop()
    yield job_id, w.output()


def test_show_prints_the_file_and_line_of_each_failed_attempt(pg_dsn, schema, failed_job):
    job_id, _ = failed_job
    out = run("show", str(job_id), dsn=pg_dsn, schema=schema)
    assert out.returncode == 0, out.stderr
    assert "errors (2, oldest first):" in out.stdout, out.stdout
    history = out.stdout.split("errors (2, oldest first):")[1]
    assert "attempt 1/2 at" in history and "attempt 2/2 at" in history, history
    at = re.findall(r"attempt \d/2 at (\S+) on ", history)
    assert len(at) == 2 and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", t) for t in at), at
    assert history.count(FRAME) == 2, history
    assert history.count("TypeError: 'int' object is not subscriptable") >= 2
    assert "executor.py" not in history, "the worker's own frames that called the task are left out"

    errors = json.loads(run("show", str(job_id), "--json", dsn=pg_dsn, schema=schema).stdout)["errors"]
    assert [e["attempt"] for e in errors] == [1, 2]
    for e in errors:
        assert FRAME in e["traceback"] and e["traceback"].endswith("TypeError: 'int' object is not subscriptable")
        assert SECRET not in e["traceback"], "no payload value that the error itself does not name"


def test_the_worker_logs_the_traceback_with_the_final_failure_and_at_debug_with_a_retry(failed_job):
    _, log = failed_job
    retry = re.search(r"WARNING .*job failed, will retry.*\n((?:    .*\n)+)", log)
    final = re.search(r"ERROR .*job failed for good \(exhausted\).*\n((?:    .*\n)+)", log)
    assert retry and final, log
    for block in (retry[1], final[1]):
        assert FRAME in block and "TypeError: 'int' object is not subscriptable" in block
    assert SECRET not in log


def test_a_traceback_is_bounded_to_the_innermost_frames_and_a_few_kb():
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 10_000)
        deep(n - 1)

    try:
        deep(50)
    except ValueError as exc:
        text = format_traceback(exc)
    assert text is not None and len(text) <= MAX_TRACEBACK_CHARS
    assert text.startswith("Traceback (most recent call last, cut):") and text.rstrip().endswith("xxx")
    assert format_traceback(ValueError("never raised")) is None
