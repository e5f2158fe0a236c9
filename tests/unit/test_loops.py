"""The worker process's runtime: its event loop (the ``event_loop`` knob: uvloop's by default, asyncio's on request,
a clear error when uvloop is asked for and missing) and its cyclic collector."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from skiplock import Settings
from skiplock.errors import ConfigError
from skiplock.worker import loops


async def running_loop() -> str:
    return loops.name(asyncio.get_running_loop())


def test_auto_runs_on_uvloop_where_it_is_installed_and_asyncio_on_the_standard_loop():
    assert Settings(dsn="postgresql://x@h/d").event_loop == "auto"
    assert loops.run(running_loop(), "auto") == "uvloop"
    assert loops.run(running_loop(), "uvloop") == "uvloop"
    assert loops.run(running_loop(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_an_explicit_uvloop_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert loops.run(running_loop(), "auto") == "asyncio"
    main = running_loop()
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        loops.run(main, "uvloop")
    assert main.cr_frame is None, "the coroutine was closed, not left unawaited"


def test_an_unknown_loop_is_refused_by_the_settings():
    with pytest.raises(ConfigError, match="event_loop must be one of auto, uvloop, asyncio"):
        Settings(dsn="postgresql://x@h/d", event_loop="trio")


def test_the_worker_process_freezes_what_it_holds_at_start_and_collects_young_objects_less_often():
    probe = (
        "import gc; from skiplock.cli import GC_YOUNG_THRESHOLD, tune_gc; before = gc.get_threshold(); tune_gc(); "
        "print(gc.get_freeze_count() > 1000, gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:]), before[0])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "700"]
