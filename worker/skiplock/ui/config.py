"""The UI's own settings: who may act (a token, or a trusted proxy's user header), and what it shows."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from skiplock.errors import ConfigError

TOKEN_ENV = "SKIPLOCK_UI_TOKEN"
TRUSTED_HEADER_ENV = "SKIPLOCK_UI_TRUSTED_USER_HEADER"
SECRET_ENV = "SKIPLOCK_UI_SESSION_SECRET"
DEFAULT_TOKEN_NAME = "token"
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class UiConfig:
    """``token``: actions need it (``Authorization: Bearer``, or the login form); None: read-only unless
    ``trusted_user_header`` names the header an authenticating proxy sets (then its value is the actor).
    ``token_name`` is who the audit table records for the token. ``hide_payloads`` shows only the size of
    payloads, results and errors. ``session_secret`` signs the login cookie (random per process by default)."""

    token: str | None = None
    token_name: str = DEFAULT_TOKEN_NAME
    trusted_user_header: str | None = None
    hide_payloads: bool = False
    session_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"the UI token must be at least {MIN_TOKEN_CHARS} characters")
        if self.trusted_user_header is not None and not self.trusted_user_header.strip():
            raise ConfigError("--trusted-user-header is empty")

    @property
    def can_act(self) -> bool:
        """Whether any action can be allowed at all (else every action answers 403)."""
        return self.token is not None or self.trusted_user_header is not None

    @classmethod
    def load(
        cls,
        *,
        env: Mapping[str, str] | None = None,
        token_file: str | None = None,
        hide_payloads: bool = False,
        trusted_user_header: str | None = None,
    ) -> UiConfig:
        """From ``--token-file`` (else ``SKIPLOCK_UI_TOKEN``), the flags, then ``SKIPLOCK_UI_*``. A token given as
        ``name:secret`` records ``name`` as the actor; a bare secret records ``token``."""
        env = os.environ if env is None else env
        raw = _read_token_file(token_file) if token_file else env.get(TOKEN_ENV) or None
        name, token = DEFAULT_TOKEN_NAME, raw
        if raw is not None and ":" in raw:
            name, token = (part.strip() for part in raw.split(":", 1))
            if not name:
                raise ConfigError("the UI token's name (before ':') is empty")
        header = trusted_user_header or env.get(TRUSTED_HEADER_ENV) or None
        secret = env.get(SECRET_ENV) or secrets.token_urlsafe(32)
        return cls(
            token=token,
            token_name=name,
            trusted_user_header=header,
            hide_payloads=hide_payloads,
            session_secret=secret,
        )


def _read_token_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --token-file {path!r}: {exc.__class__.__name__}") from None
    if not token:
        raise ConfigError(f"--token-file {path!r} is empty")
    return token
