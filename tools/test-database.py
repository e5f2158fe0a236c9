"""Say which PostgreSQL `make test` uses (the password masked), as tests/conftest.py picks it."""

from __future__ import annotations

import os

from skiplock.settings import redact

dsn = os.environ.get("SKIPLOCK_TEST_DSN")
if dsn:
    print(
        f"make test: PostgreSQL at SKIPLOCK_TEST_DSN={redact(dsn, dsn)} (else a container when Docker answers, else embedded)"
    )
else:
    print(
        "make test: SKIPLOCK_TEST_DSN is not set: a PostgreSQL container when Docker answers, else an embedded one (pgserver)"
    )
