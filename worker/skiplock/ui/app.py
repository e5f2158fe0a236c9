"""``create_app``: the Starlette app, its store opened on first use (so it also works mounted in another app,
whose lifespan would not reach it), and the answers to errors: 400 bad input, 401/403 refused, 404/409/410."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from skiplock.settings import Settings
from skiplock.store.ui import ActionError, UiStore
from skiplock.ui import api, pages
from skiplock.ui.auth import Denied
from skiplock.ui.config import UiConfig
from skiplock.ui.params import BadRequest
from skiplock.ui.render import error_response

HERE = Path(__file__).parent
SESSION_SECONDS = 12 * 3600


class Backend:
    """The app's store, opened once on the first request that needs it."""

    def __init__(self, settings: Settings, store: UiStore | None) -> None:
        self.settings, self._store, self._owned = settings, store, store is None
        self._lock = asyncio.Lock()

    async def store(self) -> UiStore:
        if self._store is None:
            async with self._lock:
                if self._store is None:
                    self._store = await UiStore.open(self.settings)
        return self._store

    async def close(self) -> None:
        if self._owned and self._store is not None:
            await self._store.close()
            self._store = None


async def _handled(request: Request, exc: Exception) -> Response:
    if isinstance(exc, BadRequest):
        return error_response(request, 400, str(exc))
    if isinstance(exc, Denied | ActionError):
        return error_response(request, exc.status, str(exc))
    raise exc


def create_app(settings: Settings, config: UiConfig | None = None, *, store: UiStore | None = None) -> Starlette:
    """The UI as an ASGI app over ``settings``' database and schema. ``config`` says who may act (default:
    read-only, from the ``SKIPLOCK_UI_*`` environment); ``store`` lets a caller share its own ``UiStore``."""
    config = config if config is not None else UiConfig.load()
    backend = Backend(settings, store)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await backend.close()

    routes = [
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        Mount("/api", routes=api.routes()),
        *pages.routes(),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=config.session_secret,
                session_cookie="skiplock_ui",
                max_age=SESSION_SECONDS,
                same_site="strict",
            )
        ],
        exception_handlers={BadRequest: _handled, Denied: _handled, ActionError: _handled},
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.backend = backend
    app.state.settings = settings
    return app


def state(request: Request) -> tuple[UiConfig, Backend]:
    return request.app.state.config, request.app.state.backend


def mounted_path(request: Request, path: str) -> str:
    """``path`` under the prefix the app is mounted at (``root_path``)."""
    root: Any = request.scope.get("root_path", "")
    return f"{root}{path}"
