"""A database outage in the worker's log: a private PostgreSQL stopped under a running worker, then started again.
The log says "database unreachable since T, retrying" and "database back after N s", once each, in skiplock's
voice: no psycopg.pool internals, no line of raw multi-line driver text, no burst of lines."""

from __future__ import annotations

import contextlib
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skiplock import Queue, Settings
from support.ci import missing
from support.pg import wait_for
from support.workers import WorkerProcess

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: ")


class PrivateServer:
    """A PostgreSQL of our own (pgserver) that the test may stop and start again."""

    def __init__(self) -> None:
        try:
            import pgserver
        except ImportError:
            missing("pgserver is not installed: pip install -e '.[test]'")
        self.folder = Path(tempfile.mkdtemp(prefix="skiplock-outage-"))
        self.srv = pgserver.get_server(self.folder, cleanup_mode="delete")  # type: ignore[attr-defined]
        self.dsn: str = self.srv.get_uri()

    def pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[import-not-found]

        pg_ctl(["-w", *args], pgdata=self.srv.pgdata, user=self.srv.system_user)

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        socket_dir = re.search(r"host=([^&]+)", self.dsn)
        assert socket_dir
        self.pg_ctl("-o", f'-h "" -k {socket_dir[1]}', "-l", str(self.srv.pgdata / "log"), "start")


@pytest.fixture
def server() -> Iterator[PrivateServer]:
    s = PrivateServer()
    yield s
    with contextlib.suppress(Exception):  # already stopped is fine
        s.stop()  # the test restarted it under pg_ctl: stop it before its files go (it was still writing pg_wal)
    s.srv.cleanup()


def test_an_outage_is_two_lines_in_skiplocks_voice(server: PrivateServer) -> None:
    settings = Settings(dsn=server.dsn, schema="outage")
    with Queue(settings=settings, max_size=1) as q:
        q.migrate()
    w = WorkerProcess(server.dsn, "outage", "q", "support.handlers:noop", poll_seconds=0.2)
    try:
        wait_for(lambda: "worker started" in w.output(), timeout=30, what="the worker to start")
        server.stop()
        wait_for(lambda: "database unreachable since" in w.output(), timeout=30, what="the outage line")
        time.sleep(3)  # the outage goes on: the pool and the listener keep failing to connect
        server.start()
        wait_for(lambda: "database back after" in w.output(), timeout=60, what="the recovery line")
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()
    finally:
        w.stop()
    log = w.output()
    lines = log.splitlines()
    print(log)
    assert all(LINE.match(x) for x in lines), "one line per event: no continuation of driver text"
    assert "psycopg.pool" not in log and "DETAIL" not in log and "\t" not in log
    assert log.count("database unreachable since") == 1 and log.count("database back after") == 1
    outage = [x for x in lines if " WARNING " in x or " ERROR " in x]
    assert len(outage) <= 6, outage
