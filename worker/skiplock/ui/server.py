"""``skiplock ui``: check the schema, bind the port (a busy one is a clear error), serve the app with uvicorn."""

from __future__ import annotations

import asyncio
import errno
import socket

import uvicorn

from skiplock.errors import ConfigError
from skiplock.settings import Settings
from skiplock.store.ui import UiStore
from skiplock.ui.app import create_app
from skiplock.ui.config import UiConfig


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or a ConfigError that says why not (in use, not allowed)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use: stop what listens there or pass --port"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def _open_store(settings: Settings) -> UiStore:
    """The UI's store, once the schema is known to be migrated (else SchemaNotReadyError: exit 3)."""
    from skiplock.queue import AsyncQueue

    queue = await AsyncQueue.open(settings=settings, max_size=1)
    try:
        await queue.check_schema()
    finally:
        await queue.close()
    return await UiStore.open(settings)


def serve(settings: Settings, config: UiConfig, *, host: str, port: int) -> int:
    """Serve until interrupted; returns the exit code."""
    sock = bind(host, port)
    mode = (
        "actions need the token" if config.token else "actions by the proxy's user" if config.can_act else "read-only"
    )

    async def main() -> None:
        store = await _open_store(settings)
        app = create_app(settings, config, store=store)
        server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, server_header=False, lifespan="on")
        )
        print(f"skiplock ui: schema {settings.schema!r} on http://{host}:{sock.getsockname()[1]}/ ({mode})", flush=True)
        try:
            await server.serve(sockets=[sock])
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        sock.close()
    return 0
