"""The event loop a worker runs on (the ``event_loop`` knob): uvloop's by default where it is installed (a
dependency of skiplock on Linux and macOS), else asyncio's.

uvloop's loop is written in C: the claim loop, the hand-back of handler threads' results and every async job's task
cost fewer instructions on it (bench/HISTORY.md, "Behind the code"). ``asyncio`` keeps the standard library's loop,
for a handler library that needs it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from skiplock.errors import ConfigError

T = TypeVar("T")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``choice`` names (``auto``: uvloop when importable); None for asyncio's own."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("event_loop is uvloop, but uvloop is not installed (pip install uvloop)") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: the loop a worker says it runs on (its start line)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names."""
    try:
        factory = loop_factory(choice)
    except BaseException:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
