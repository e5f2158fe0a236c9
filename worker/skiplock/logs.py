"""``configure_logging()``: one line per event, plain or JSON, never a password.

The database driver speaks through skiplock here: psycopg's pool logs several lines a failed connection (some
within a millisecond, some with libpq's multi-line DETAIL and hints). :class:`DatabaseOutage` turns them, and the
worker's own connection errors, into "database unreachable since T, retrying" and "database back after N s", once
each (a reminder a minute while it lasts; "database back after N s; listener connected" when the listener's
reconnection ends it); other driver lines show only at DEBUG, on one line."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from skiplock.settings import redact

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class _Redactor(logging.Filter):
    def __init__(self, dsn: str | None) -> None:
        super().__init__()
        self.dsn = dsn

    def filter(self, record: logging.LogRecord) -> bool:
        if self.dsn:
            record.msg = redact(str(record.msg), self.dsn)
            if isinstance(record.args, tuple):
                record.args = tuple(redact(a, self.dsn) if isinstance(a, str) else a for a in record.args)
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def one_line(text: str) -> str:
    """A message on one line: the line breaks and tab indents of libpq's DETAIL and HINT become single spaces."""
    return " ".join(text.split()) if "\n" in text or "\t" in text else text


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items() if k not in ("action", "traceback"))
        line = f"{ts} {record.levelname:<7} {record.name}: {one_line(record.getMessage())}"
        if extras:
            line += f" [{extras}]"
        if tb := getattr(record, "traceback", None):  # a job's traceback: indented below its line
            line += "\n" + "\n".join("    " + x for x in str(tb).splitlines())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": one_line(record.getMessage()),
        }
        doc.update(_extras(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


_CONNECT_FAILED = re.compile(r"error connecting|reconnection attempt|connection failed|connection is bad|server closed")
REMIND_SECONDS = 60.0
"""While the database stays unreachable, a reminder this often (at the next failure past it)."""
DRIVER_LOGGER = "psycopg.pool"
_OUTAGE_LOGGER = "skiplock.database"


class DatabaseOutage(logging.Filter):
    """One line when the database becomes unreachable, one when it is back; the driver's own lines swallowed.

    It reads the records going by: a failed connection of the pool (``psycopg.pool``), of the listener
    (``listener_down``) or a transient error of a worker's call (``db_error``) starts an outage; the listener's
    reconnection (``listener_up``), the worker's first call that succeeds again (``db_recovered``) or the pool's new
    connection ends it. While it lasts, the pool logs at INFO (so that its new connection is seen), and nothing of
    it but a reminder a minute reaches the log."""

    def __init__(self) -> None:
        super().__init__()
        self.since: float | None = None
        self.reminded = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        driver = record.name.startswith("psycopg")
        action = getattr(record, "action", None)
        message = one_line(record.getMessage())
        failing = record.levelno == logging.WARNING and (
            action in ("listener_down", "db_error") or (driver and _CONNECT_FAILED.search(message) is not None)
        )
        if failing:
            return self._failing(record, message)
        back = action in ("listener_up", "db_recovered") or (driver and message.startswith("adding new connection"))
        if self.since is not None and back:
            text = f"database back after {record.created - self.since:.0f} s"
            if action == "listener_up":  # a fact of its own (its gauge, the wake-ups): it stays in the line
                text += f"; {message}"
            _rewrite(record, logging.INFO, text, "db_back")
            self.since = None
            logging.getLogger(DRIVER_LOGGER).setLevel(max(logging.WARNING, logging.getLogger().level))
            return True
        if driver:  # the pool's other lines (a discarded connection...): at DEBUG only, or an ERROR
            return record.levelno >= logging.ERROR or (
                logging.getLogger().isEnabledFor(logging.DEBUG) and record.levelno >= logging.WARNING
            )
        return True

    def _failing(self, record: logging.LogRecord, message: str) -> bool:
        if self.since is None:
            self.since = self.reminded = record.created
            logging.getLogger(DRIVER_LOGGER).setLevel(logging.INFO)
            _rewrite(
                record, logging.WARNING, f"database unreachable since {_at(self.since)}, retrying ({_reason(message)})"
            )
            return True
        if record.created - self.reminded >= REMIND_SECONDS:
            self.reminded = record.created
            gone = record.created - self.since
            _rewrite(
                record, logging.WARNING, f"database still unreachable since {_at(self.since)} ({gone:.0f} s), retrying"
            )
            return True
        return False


def _rewrite(record: logging.LogRecord, level: int, message: str, action: str = "db_down") -> None:
    record.name, record.msg, record.args, record.exc_info, record.exc_text = _OUTAGE_LOGGER, message, (), None, None
    record.levelno, record.levelname = level, logging.getLevelName(level)
    record.action = action


def _at(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reason(message: str) -> str:
    """What libpq said, without the pool's or the listener's wording around it, and bounded."""
    tail = message.rsplit("failed: ", 1)[-1].removesuffix(")").split("; reconnecting")[0]
    return " ".join(tail.split())[:200]


def configure_logging(level: str = "INFO", fmt: str = "plain", dsn: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    handler.addFilter(_Redactor(dsn))
    handler.addFilter(DatabaseOutage())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger(DRIVER_LOGGER).setLevel(max(logging.WARNING, root.level))
