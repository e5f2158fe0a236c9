"""Who may act: the bearer token (API), a login session (pages, with a CSRF token on every form), or the user
an authenticating proxy names in a trusted header (only when that header is configured)."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from skiplock.ui.config import UiConfig

READ_ONLY = (
    "the UI is read-only: no token is configured (set SKIPLOCK_UI_TOKEN or --token-file, "
    "or --trusted-user-header behind an authenticating proxy)"
)
MAX_ACTOR = 200


class Denied(Exception):
    """An action refused for want of rights: 401 (no or wrong credentials) or 403 (none can be given)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _proxy_user(request: Request, config: UiConfig) -> str | None:
    if config.trusted_user_header is None:
        return None
    user = request.headers.get(config.trusted_user_header, "").strip()
    return user[:MAX_ACTOR] or None


def api_actor(request: Request, config: UiConfig) -> str:
    """The actor of an API action: the token's name for a matching ``Authorization: Bearer``, else the trusted
    proxy's user; raises :class:`Denied` otherwise."""
    if not config.can_act:
        raise Denied(403, READ_ONLY)
    header = request.headers.get("authorization")
    if header is not None and config.token is not None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and _same(value.strip(), config.token):
            return config.token_name
        raise Denied(401, "the bearer token does not match")
    user = _proxy_user(request, config)
    if user is not None:
        return user
    if config.token is None:
        raise Denied(403, f"actions need the {config.trusted_user_header} header set by the authenticating proxy")
    raise Denied(401, "actions need the header Authorization: Bearer <token>")


def csrf_token(session: dict[str, Any]) -> str:
    """This session's CSRF token (made on first use); every form of the pages carries it."""
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(24)
        session["csrf"] = token
    return token


def check_csrf(session: dict[str, Any], form: Mapping[str, Any]) -> None:
    expected, given = session.get("csrf"), form.get("csrf")
    if not isinstance(expected, str) or not isinstance(given, str) or not _same(given, expected):
        raise Denied(403, "the form's CSRF token does not match this session: reload the page and try again")


def form_actor(request: Request, config: UiConfig, form: Mapping[str, Any]) -> str:
    """The actor of a page's form: the logged-in session, or the trusted proxy's user; the CSRF token must match."""
    if not config.can_act:
        raise Denied(403, READ_ONLY)
    check_csrf(request.session, form)
    actor = request.session.get("actor")
    if isinstance(actor, str) and config.token is not None:
        return actor
    user = _proxy_user(request, config)
    if user is not None:
        return user
    raise Denied(403, "log in with the UI token first")


def login(request: Request, config: UiConfig, form: Mapping[str, Any]) -> str:
    """Check a login form's token; on success the session records the token's name as its actor."""
    check_csrf(request.session, form)
    if config.token is None:
        raise Denied(403, READ_ONLY)
    given = form.get("token")
    if not isinstance(given, str) or not _same(given.strip(), config.token):
        raise Denied(401, "wrong token")
    request.session["actor"] = config.token_name
    request.session["csrf"] = secrets.token_urlsafe(24)  # a new session state gets a new CSRF token
    return config.token_name
