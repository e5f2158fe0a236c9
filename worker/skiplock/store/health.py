"""The jobs table's health (live and dead tuples, size, last vacuum) for the worker's table gauges: one statement,
read on a lazily opened connection of its own (scrapes run in the exporter's thread, not the worker's loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from skiplock.settings import Settings
from skiplock.sql import queries_for
from skiplock.store.call import Call, Result
from skiplock.store.run import execute


@dataclass(frozen=True)
class TableHealth:
    schema: str
    live: float
    dead: float
    size_bytes: float
    last_vacuum: float  # Unix time of the last (auto)vacuum, 0 when never


def table_health(settings: Settings) -> Call[TableHealth | None]:
    def read(r: Result) -> TableHealth | None:
        if not r.rows:
            return None
        t = r.rows[0]
        last = max((v for v in (t["last_autovacuum"], t["last_vacuum"]) if v is not None), default=None)
        return TableHealth(
            settings.schema,
            float(t["live"] or 0),
            float(t["dead"] or 0),
            float(t["total_bytes"] or 0),
            last.timestamp() if last else 0.0,
        )

    return Call(queries_for(settings.schema).doctor_table_stats, {"table": f'"{settings.schema}".jobs'}, read)


class TableReader:
    """Calls :func:`table_health` on its own connection, opened at the first read and again after a failure."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: psycopg.Connection[Any] | None = None

    def __call__(self) -> TableHealth | None:
        s = self._settings
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                s.require_dsn(), autocommit=True, connect_timeout=5, application_name="skiplock-worker"
            )
        try:
            return execute(self._conn, table_health(s))
        except psycopg.Error:
            self._conn.close()
            self._conn = None
            raise
