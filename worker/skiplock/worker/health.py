"""The worker's probes, and the exporter that answers them beside /metrics.

Liveness (``/healthz``): the event loop ticks (a handler blocking the loop shows here). Readiness (``/readyz``):
the worker serves, is not draining, has a slot not stuck in a handler past its timeout, and reaches the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from skiplock.exporter import Exporter, serve
from skiplock.metrics import TableCollector
from skiplock.settings import Settings
from skiplock.store.health import TableReader

log = logging.getLogger(__name__)
TICK_SECONDS = 1.0
STALLED_SECONDS = 30.0
"""A loop that has not ticked for this long is not live."""


class Slots(Protocol):
    def stuck(self) -> int:
        """Slots held by a handler past its timeout."""
        ...


class Database(Protocol):
    @property
    def ok(self) -> bool:
        """The last call reached the database."""
        ...


@dataclass(frozen=True)
class Serving:
    """What readiness reads once the worker serves: the drain's event, the slots and the store."""

    stopping: asyncio.Event
    slots: Slots
    database: Database


class Health:
    """Answers the probes of one worker; :meth:`bind` serves them with /metrics on the metrics port."""

    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        self._settings = settings
        self._registry = registry
        self._last_tick = time.monotonic()
        self._serving: Serving | None = None

    def bind(self) -> Exporter | None:
        """Bind the metrics port now (a busy one fails before the worker opens a connection), unstarted; None
        without a port."""
        s = self._settings
        if not s.metrics_port:
            return None
        exporter = serve(self._registry, s.metrics_host, s.metrics_port, {"/healthz": self.live, "/readyz": self.ready})
        self._registry.register(TableCollector(TableReader(s), ttl=max(s.poll_seconds, 5.0)))
        log.info("metrics on :%d (/metrics, /healthz, /readyz)", exporter.port, extra={"action": "exporter_up"})
        return exporter

    def serve(self, serving: Serving) -> None:
        """The worker serves from now on: readiness reads ``serving``."""
        self._serving = serving

    async def ticker(self) -> None:
        while True:
            self._last_tick = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)

    def live(self) -> tuple[bool, str]:
        age = time.monotonic() - self._last_tick
        return (age < STALLED_SECONDS, f"event loop tick {age:.1f}s ago")

    def ready(self) -> tuple[bool, str]:
        serving = self._serving
        if serving is None:
            return False, "starting"
        if serving.stopping.is_set():
            return False, "draining"
        stuck = serving.slots.stuck()
        if stuck and stuck >= self._settings.concurrency:
            return False, f"all {stuck} slots stuck in handlers past their timeout"
        ok = serving.database.ok
        note = f"; {stuck} slot(s) stuck past their timeout" if stuck else ""
        return (ok, ("database reachable" if ok else "database unreachable") + note)
