"""Unique jobs: the checks of the unique options and the key a job is made unique by (pure, no I/O).

A unique job carries a key built from its task, the part of its payload it is unique by, and (with a period) the
period it falls in, plus the statuses in which that key is held: a partial unique index of the jobs table keeps
one job per key among the rows in those statuses, so two producers racing insert one job between them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

UNIQUE_STATES = ("pending", "processing", "done", "failed", "cancelled")
REQUIRED_STATES = frozenset({"pending", "processing"})
"""A job waiting or running always holds its key (a retry moves it between the two; it must not collide)."""
CONFLICT_MODES = ("skip", "replace")
UNIQUE_KEY_MAX = 512
"""Longest unique key (the database checks it too)."""


def unique_problem(
    unique_for: Any, unique_by: Any, unique_states: Any, unique_conflict: Any, *, explicit_key: bool = False
) -> str | None:
    """Why these unique options are wrong, or None. ``explicit_key``: the caller gives the key itself."""
    problems = []
    if unique_for is not None and (
        not isinstance(unique_for, int | float)
        or isinstance(unique_for, bool)
        or not math.isfinite(unique_for)
        or unique_for <= 0
    ):
        problems.append(f"unique_for must be a number of seconds > 0 (got {unique_for!r})")
    if unique_by is not None and unique_by != "payload":
        keys = unique_by
        if (
            isinstance(keys, str | bytes)
            or not isinstance(keys, Sequence)
            or not keys
            or not all(isinstance(k, str) and k for k in keys)
        ):
            problems.append(f'unique_by must be "payload" or a non-empty list of payload keys (got {unique_by!r})')
    uniqueness = explicit_key or unique_for is not None or unique_by is not None
    if unique_states is not None:
        if not uniqueness:
            problems.append("unique_states needs unique_for or unique_by")
        elif (
            isinstance(unique_states, str)
            or not isinstance(unique_states, Sequence)
            or not set(unique_states) <= set(UNIQUE_STATES)
            or not set(unique_states) >= REQUIRED_STATES
        ):
            problems.append(
                f"unique_states must list statuses of {list(UNIQUE_STATES)} including pending and processing "
                f"(got {unique_states!r})"
            )
    if unique_conflict is not None:
        if not uniqueness:
            problems.append("unique_conflict needs unique_for or unique_by")
        elif unique_conflict not in CONFLICT_MODES:
            problems.append(f"unique_conflict must be one of {list(CONFLICT_MODES)} (got {unique_conflict!r})")
    return "; ".join(problems) or None


def states_for(unique_for: float | None, unique_states: Sequence[str] | None) -> list[str]:
    """The statuses holding the key: as given; else pending and processing, plus done with a period (at most one
    job per period, even once it ran)."""
    if unique_states is not None:
        return [s for s in UNIQUE_STATES if s in unique_states]
    return ["pending", "processing", "done"] if unique_for is not None else ["pending", "processing"]


def unique_key(
    task: str, payload: Any, *, unique_by: str | Sequence[str] | None, unique_for: float | None, now: float
) -> str:
    """``<task>:<digest of what the job is unique by>`` plus ``@<period number>`` with a period (periods are
    aligned to the Unix epoch, by the producer's clock). ``unique_by`` keys missing from the payload count as
    null; a payload that is not an object cannot be unique by keys (:class:`ValueError`)."""
    if unique_by is None:
        part: Any = None
    elif unique_by == "payload":
        part = payload
    else:
        if not isinstance(payload, Mapping):
            raise ValueError(f"unique_by names payload keys, but the payload is a {type(payload).__name__}")
        part = {k: payload.get(k) for k in unique_by}
    text = json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    key = f"{task}:{digest}"
    return key if unique_for is None else f"{key}@{math.floor(now / unique_for)}"
