"""Answers: JSON (orjson; times as ISO 8601) for the API, Jinja2 templates (autoescaped) for the pages."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from skiplock.ui.auth import csrf_token
from skiplock.ui.params import STATUSES

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")


def _default(value: Any) -> Any:
    if isinstance(value, set | tuple):
        return list(value)
    return str(value)


class Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=_default, option=orjson.OPT_NON_STR_KEYS)


def json_error(status: int, message: str) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Json({"error": message, "status": status}, status_code=status, headers=headers)


def error_response(request: Request, status: int, message: str) -> Response:
    """A page's error: the message in the layout (the API answers JSON itself)."""
    return page(request, "message.html", {"title": f"Error {status}", "message": message}, status=status)


def ago(value: Any) -> str:
    """A time as a short age ("3 s ago", "in 2 min"); empty for none."""
    if not isinstance(value, datetime):
        return "" if value is None else str(value)
    seconds = (datetime.now(UTC) - value).total_seconds()
    future, s = seconds < 0, abs(seconds)
    text = (
        f"{s:.0f} s"
        if s < 90
        else f"{s / 60:.0f} min"
        if s < 5400
        else f"{s / 3600:.0f} h"
        if s < 172800
        else f"{s / 86400:.0f} d"
    )
    return f"in {text}" if future else f"{text} ago"


def when(value: Any) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else ""


def number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


templates.env.filters.update(ago=ago, when=when, number=number)
templates.env.globals["statuses"] = STATUSES


def page(request: Request, name: str, context: dict[str, Any], *, status: int = 200) -> Response:
    config = request.app.state.config
    flash = request.session.pop("flash", None)
    resume = request.session.pop("continue", None)
    base = {
        "config": config,
        "csrf": csrf_token(request.session),
        "actor": request.session.get("actor"),
        "flash": flash,
        "resume": resume,
        "root": request.scope.get("root_path", ""),
    }
    return templates.TemplateResponse(request, name, base | context, status_code=status)
