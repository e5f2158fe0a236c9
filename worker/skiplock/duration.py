"""Durations as people write them: ``90`` (seconds), ``1.5``, ``250ms``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w``.

The one parser of every duration a user types: the CLI's duration flags and the ``*_seconds`` settings (flags and
``SKIPLOCK_*`` environment) all take it, so ``--delay 1h`` and ``--older-than 30d`` read alike; and the one
formatter of a duration shown to them (defaults in help and docs). Pure.
"""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*$")
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}
EXAMPLES = "90, 90s, 15m, 12h or 7d"


def parse_duration(text: str) -> float:
    """Seconds of a duration (a plain number is seconds); ValueError names the accepted forms."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration like {EXAMPLES}")
    seconds = float(m[1]) * UNITS[m[2]]
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def is_duration_setting(name: str) -> bool:
    """Whether a setting is a duration (its name says seconds): it takes units too."""
    return name.endswith("_seconds")


def format_duration(seconds: float) -> str:
    """A duration as a user would type it: ``30s``, ``1h``, ``7d`` (under two minutes, in seconds)."""
    if seconds >= 120:
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds % size == 0:
                return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
