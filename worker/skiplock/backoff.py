"""Capped, jittered exponential backoff (pure; the random source is injectable)."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_seconds(
    attempts: int,
    *,
    base: float,
    cap: float,
    jitter: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before the next attempt after ``attempts`` failed ones.

    The ceiling is ``min(cap, base * 2**(attempts-1))``; ``jitter`` of it is random, so with jitter 1.0
    (full jitter) the delay is uniform in [0, ceiling] and with 0 it is the ceiling exactly.
    """
    exponent = min(max(attempts - 1, 0), 62)
    ceiling = min(cap, base * (2.0**exponent))
    return ceiling * (1.0 - jitter * rand())
