"""A statement ready to run: :class:`Call` (query, parameters, and how the rows become the result)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    """What a statement returned: its rows (dicts, or tuples for a ``Call`` with ``tuples``) and its row count."""

    rows: list[Any]
    rowcount: int


@dataclass(frozen=True)
class Call(Generic[T]):
    """One statement to run: the query, its parameters, and how the result becomes the return value."""

    query: Any
    params: dict[str, Any] | None
    read: Callable[[Result], T]
    tuples: bool = False  # rows as tuples (the hot claim), not dicts
    binary: bool = False  # rows in binary format (the hot claim: see docs/adr on the claim)
