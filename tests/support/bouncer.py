"""A real PgBouncer in front of the test database (for LISTEN and pooling behaviour behind it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

from psycopg.conninfo import conninfo_to_dict

from support.chaos import _user_exists
from support.ci import missing
from support.pg import _connects, wait_for


@contextlib.contextmanager
def run_pgbouncer(pg_dsn: str, pool_mode: str, pool_size: int = 2) -> Iterator[str]:
    """Start PgBouncer in ``pool_mode`` (transaction, session) in front of ``pg_dsn``; yields its DSN."""
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if not binary:
        missing("pgbouncer not installed (apt-get install -y --no-install-recommends pgbouncer)")
    server = conninfo_to_dict(pg_dsn)
    host = str(server.get("host") or "")
    if not host or host.startswith("/"):
        missing("PgBouncer here needs a PostgreSQL over TCP (set SKIPLOCK_TEST_DSN, as CI does)")
    folder = tempfile.mkdtemp(prefix="skiplock-pgbouncer-")
    os.chmod(folder, 0o777)  # PgBouncer refuses root: it runs as another user and writes its log here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = " ".join(
        f"{key}={server[key]}" for key in ("host", "port", "dbname", "user", "password") if server.get(key)
    )
    ini = os.path.join(folder, "pgbouncer.ini")
    with open(ini, "w", encoding="utf-8") as f:
        f.write(
            f"[databases]\n* = {target}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
            f"unix_socket_dir =\nauth_type = any\npool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n"
            f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n"
        )
    command = [binary, ini]
    if os.getuid() == 0:
        user = next((u for u in ("postgres", "nobody") if _user_exists(u)), None)
        if user is None:
            missing("running as root and no unprivileged user (postgres or nobody) to run PgBouncer as")
        command += ["-u", user]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    dsn = f"postgresql://{server.get('user', 'postgres')}@127.0.0.1:{port}/{server.get('dbname', 'postgres')}"
    try:
        wait_for(lambda: _connects(dsn), timeout=10, interval=0.1, what="PgBouncer to accept connections")
        yield dsn
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
