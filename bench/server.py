"""The PostgreSQL the benchmark runs against: a private server on 127.0.0.1 (default) or one given by DSN.

A private server (pgserver's PostgreSQL binaries, stock settings, its own data directory) has no other clients,
so server-wide counters (``pg_stat_database.xact_commit``, ``pg_current_wal_lsn()``) and the CPU of every
postgres process belong to the benchmark alone. With ``--dsn`` those figures include other clients' work.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import socket
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg


@dataclass(frozen=True)
class Server:
    dsn: str
    private: bool
    postmaster_pid: int | None  # readable /proc of the postmaster, or None (remote, or not ours to read)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _postmaster_of(dsn: str) -> int | None:
    """The postmaster's pid when the server runs on this machine and its /proc is readable."""
    with psycopg.connect(dsn, autocommit=True) as conn:  # the backend must live while we look at it
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        try:
            parent = psutil.Process(int(row[0])).parent()
            if parent is None:
                return None
            parent.cpu_times()
            return int(parent.pid)
        except (psutil.Error, OSError):
            return None


@contextlib.contextmanager
def private_server() -> Iterator[Server]:
    """Init a throw-away cluster with pgserver, then run it on 127.0.0.1:<free port> (TCP, like a real worker)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        pgserver: Any = importlib.import_module("pgserver")
        _commands: Any = importlib.import_module("pgserver._commands")

    logging.getLogger("pgserver").setLevel(logging.CRITICAL)  # its own cleanup retries a stop we already did

    srv: Any = pgserver.get_server(Path(tempfile.mkdtemp(prefix="bench-pg-")), cleanup_mode="delete")
    pgdata: Path = srv.pgdata
    user = srv.system_user
    _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    port = _free_port()
    _commands.pg_ctl(
        ["-w", "-o", f"-h 127.0.0.1 -p {port} -k {pgdata}", "-l", str(pgdata / "bench.log"), "start"],
        pgdata=pgdata,
        user=user,
        timeout=60,
    )
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        yield Server(dsn, True, _postmaster_of(dsn))
    finally:
        with contextlib.suppress(Exception):
            _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
        srv.cleanup()


@contextlib.contextmanager
def external_server(dsn: str) -> Iterator[Server]:
    yield Server(dsn, False, _postmaster_of(dsn))
