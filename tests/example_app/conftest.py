"""The example shop (examples/app) against a real PostgreSQL, in schemas of its own for this test session.

This folder is not called tests/examples: with tests/ on the import path, that name would shadow the
repository's examples package.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from skiplock import Settings
from skiplock.migrate import migrate
from support.pg import drop_schema

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Shop:
    dsn: str
    shop_schema: str
    skiplock_schema: str
    db: ModuleType
    tasks: ModuleType
    main: ModuleType

    @property
    def settings(self) -> Settings:
        return Settings(dsn=self.dsn, schema=self.skiplock_schema)

    def one(self, query: str, *params: Any) -> Any:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(query, params).fetchone()


@pytest.fixture(scope="session")
def shop_modules(pg_dsn: str) -> Iterator[Shop]:
    """Import the example as a user would from the repository root, its schemas chosen by the environment."""
    names = {"SHOP_SCHEMA": f"shop_{uuid.uuid4().hex[:10]}", "SKIPLOCK_SCHEMA": f"sk_{uuid.uuid4().hex[:10]}"}
    saved = {k: os.environ.get(k) for k in names}
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.update(names)
    try:
        for name in ("examples.app.main", "examples.app.tasks", "examples.app.db"):
            sys.modules.pop(name, None)
        db = importlib.import_module("examples.app.db")
        tasks = importlib.import_module("examples.app.tasks")
        main = importlib.import_module("examples.app.main")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert names == {"SHOP_SCHEMA": db.SHOP_SCHEMA, "SKIPLOCK_SCHEMA": db.SKIPLOCK_SCHEMA}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, names["SKIPLOCK_SCHEMA"])
    with psycopg.connect(pg_dsn) as conn:
        db.create_tables(conn)
    try:
        yield Shop(pg_dsn, names["SHOP_SCHEMA"], names["SKIPLOCK_SCHEMA"], db, tasks, main)
    finally:
        drop_schema(pg_dsn, names["SHOP_SCHEMA"])
        drop_schema(pg_dsn, names["SKIPLOCK_SCHEMA"])


@pytest.fixture
def shop(shop_modules: Shop, monkeypatch: pytest.MonkeyPatch) -> Shop:
    """The shop with empty tables and an empty queue; DATABASE_URL set as the web app expects."""
    s = shop_modules
    with psycopg.connect(s.dsn) as conn:
        conn.execute(
            f'TRUNCATE "{s.shop_schema}".outbox, "{s.shop_schema}".order_items, "{s.shop_schema}".orders,'
            f' "{s.shop_schema}".daily_reports'
        )
        conn.execute(f'DELETE FROM "{s.skiplock_schema}".jobs')
    monkeypatch.setenv("DATABASE_URL", s.dsn)
    return s


@pytest.fixture
def testing() -> ModuleType:
    """``skiplock.testing``, imported per test: a build without it fails these tests, not the whole collection."""
    return importlib.import_module("skiplock.testing")


@dataclass
class Receiver:
    """A partner's webhook endpoint on 127.0.0.1 that answers with scripted status codes."""

    statuses: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append(
                {"path": self.path, "key": self.headers.get("Idempotency-Key"), "body": json.loads(body)}
            )
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/orders"
    monkeypatch.setenv("SHOP_WEBHOOK_URL", state.url)
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
