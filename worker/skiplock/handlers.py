"""Load a ``module:function`` handler, and tell whether it is a coroutine function."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skiplock.errors import HandlerImportError


@dataclass(frozen=True)
class Handler:
    spec: str
    func: Callable[..., Any]
    is_async: bool


def load_handler(spec: str) -> Handler:
    """Import ``package.module:function``. The current directory is importable, as with ``python -m``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerImportError(f"handler {spec!r} must look like 'package.module:function'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or any error raised while the module body runs
        raise HandlerImportError(f"cannot import handler module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise HandlerImportError(f"handler {spec!r} is a {type(target).__name__}, not a function")
    is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - async callable objects
    )
    return Handler(spec, target, is_async)
