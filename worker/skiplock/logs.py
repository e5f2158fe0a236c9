"""``configure_logging()``: one line per event, plain or JSON, never a password."""

from __future__ import annotations

import json
import logging
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


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items() if k not in ("action", "traceback"))
        line = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}"
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
            "message": record.getMessage(),
        }
        doc.update(_extras(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "plain", dsn: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    handler.addFilter(_Redactor(dsn))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("psycopg.pool").setLevel(max(logging.WARNING, root.level))
