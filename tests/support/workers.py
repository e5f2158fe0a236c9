"""Start real ``skiplock worker`` processes for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import psycopg

TESTS = Path(__file__).resolve().parents[1]


def make_effects_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".effects (job_id bigint, attempt int)')


class WorkerProcess:
    def __init__(self, dsn: str, schema: str, queue: str, handler: str | None, **settings: Any) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
        env.update(
            {
                "SKIPLOCK_DSN": dsn,
                "SKIPLOCK_SCHEMA": schema,
                "SKIPLOCK_QUEUE": queue,
                "PYTHONPATH": str(TESTS),
            }
        )
        if handler is not None:  # else an app (settings app=...) names the tasks
            env["SKIPLOCK_HANDLER"] = handler
        for key, value in settings.items():
            env[f"SKIPLOCK_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
        self.log = tempfile.NamedTemporaryFile(prefix="skiplock-worker-", suffix=".log", delete=False)  # noqa: SIM115
        # the log goes when the worker is stopped (its text is kept), or at exit at the latest: no file is left
        self._remove_log = weakref.finalize(self, _remove, self.log)
        self._text: str | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "skiplock", "worker"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        if self._text is not None:
            return self._text
        return Path(self.log.name).read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Kill the worker if it still runs; its log file goes (:meth:`output` still returns the text)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self._text is None:
            self._text = self.output()
            self._remove_log()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def _remove(log: Any) -> None:
    log.close()
    Path(log.name).unlink(missing_ok=True)
