"""The SkiplockError tree. Every error a user can cause has a clear message; none carries a password."""

from __future__ import annotations

import traceback
from pathlib import Path


class SkiplockError(Exception):
    """Base of every error skiplock raises on purpose."""


class ConfigError(SkiplockError):
    """Bad settings, flags or environment: the process should exit non-zero at startup."""


class EnqueueError(SkiplockError, ValueError):
    """A bad enqueue argument (queue, task, delay, run_at, priority, attempts, key, unknown option) or payload.

    The one type every enqueue raises for bad input, sync or async, by task or by name. Nothing was written.
    """


class PayloadError(EnqueueError):
    """A payload that is not JSON-serialisable, not finite, nested too deeply, or too large (an EnqueueError)."""


class DatabaseUnavailableError(SkiplockError):
    """The database cannot be reached (wrong DSN, server down). The message has the password masked."""


class SchemaNotReadyError(SkiplockError):
    """The schema is missing or older than this version expects: run ``skiplock migrate``."""


class HandlerImportError(ConfigError):
    """The ``module:function`` handler cannot be imported or is not callable."""


class LeaseLostError(SkiplockError):
    """The job's lease was taken back (recovered, cancelled or re-claimed) before completion; work rolled back."""


class JobFailedError(SkiplockError):
    """A waited-for job ended ``failed`` or ``cancelled`` (or no longer exists): ``status`` and its ``last_error``."""

    def __init__(self, job_id: int, status: str, last_error: str | None) -> None:
        super().__init__(f"job {job_id} ended {status}: {last_error or 'no error recorded'}")
        self.job_id = job_id
        self.status = status
        self.last_error = last_error


class ResultError(SkiplockError):
    """A task returned a value that cannot be stored as its result (not JSON, too large): the attempt fails."""


class NonRetryableError(Exception):
    """Raise from a handler to fail the job at once, without further attempts."""


class Snooze(Exception):
    """Raise from a handler to run the job again in ``seconds`` without using up an attempt (its ``job.conn``
    writes are rolled back). Counted as ``snoozed``, never as a failure."""

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < 10**9:
            raise ValueError(f"Snooze needs a number of seconds within [0, 1e9) (got {seconds!r})")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = float(seconds)


MAX_ERROR_CHARS = 4000
"""Longest error text stored in a job (``last_error``)."""


def format_error(exc: BaseException) -> str:
    """``"<Type>: <message>"``, bounded and storable (no NUL, valid UTF-8)."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the failure
        message = "<unprintable exception>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    text = text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 20] + " ...[truncated]"
    return text


MAX_TRACEBACK_CHARS = 3000
"""Longest traceback kept in a job's error history (the tail: the innermost frames and the error)."""
TRACEBACK_FRAMES = 10
"""Frames kept of a traceback: the innermost ones, where the error was raised."""
_WORKER_CODE = str(Path(__file__).resolve().parent / "worker")


def format_traceback(exc: BaseException) -> str | None:
    """Where ``exc`` was raised: the innermost frames (file, line, function and source line; never a local
    variable, so no payload value beyond what the error's own message says) and ``<Type>: <message>``, bounded to
    :data:`MAX_TRACEBACK_CHARS`. The worker's own frames that called the task are left out. None: never raised."""
    if exc.__traceback__ is None:
        return None
    try:
        te = traceback.TracebackException.from_exception(exc, limit=-TRACEBACK_FRAMES, capture_locals=False)
        while len(te.stack) > 1 and te.stack[0].filename.startswith(_WORKER_CODE):
            del te.stack[0]
        text = "".join(te.format())
    except Exception:  # a broken __str__ or frame must not lose the failure
        return None
    text = text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8").rstrip("\n")
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "Traceback (most recent call last, cut):\n  ...\n" + text[-(MAX_TRACEBACK_CHARS - 50) :]
    return text
