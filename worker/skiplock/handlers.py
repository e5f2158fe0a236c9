"""Load what a worker runs: a ``module:function`` handler and/or a ``module:attr`` :class:`~skiplock.app.App`."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skiplock.errors import HandlerImportError

if TYPE_CHECKING:
    from skiplock.app import App
    from skiplock.settings import Settings


@dataclass(frozen=True)
class Handler:
    spec: str
    func: Callable[..., Any]
    is_async: bool


def load_object(spec: str, what: str = "handler", shape: str = "package.module:function") -> Any:
    """Import ``package.module:attr`` (dotted attributes allowed). The current directory is importable, as with
    ``python -m``. Every failure is a :class:`HandlerImportError` that says what was wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerImportError(f"{what} {spec!r} must look like '{shape}'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or any error raised while the module body runs
        raise HandlerImportError(f"cannot import {what} module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    return target


def load_handler(spec: str) -> Handler:
    """Import a ``package.module:function`` handler."""
    target = load_object(spec)
    if not callable(target):
        raise HandlerImportError(f"handler {spec!r} is a {type(target).__name__}, not a function")
    is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - async callable objects
    )
    return Handler(spec, target, is_async)


def load_app(spec: str) -> App:
    """Import a ``package.module:attr`` that is a :class:`skiplock.App` with at least one task."""
    from skiplock.app import App

    target = load_object(spec, "app", "package.module:attribute")
    if not isinstance(target, App):
        raise HandlerImportError(f"app {spec!r} is a {type(target).__name__}, not a skiplock.App")
    if not len(target):
        raise HandlerImportError(f"app {spec!r} registers no task: decorate functions with @app.task")
    return target


def load_target(settings: Settings) -> tuple[App | None, Handler | None]:
    """What the worker runs, from ``settings.app`` and/or ``settings.handler`` (at least one is required).

    The handler is the catch-all for jobs without a task. Errors are :class:`HandlerImportError`.
    """
    if not settings.app and not settings.handler:
        raise HandlerImportError(
            "worker: give --app module:attr (a skiplock.App) and/or --handler module:function "
            "(or SKIPLOCK_APP / SKIPLOCK_HANDLER), e.g. --app myapp.tasks:app"
        )
    app = load_app(settings.app) if settings.app else None
    handler = load_handler(settings.handler) if settings.handler else None
    return app, handler
