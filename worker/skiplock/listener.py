"""A dedicated LISTEN connection that sets a wake-up event; polling stays the fallback.

Behind PgBouncer in transaction mode LISTEN is accepted but notifications never arrive: after every connect the
listener proves itself with a NOTIFY sent from *another* connection (a NOTIFY on its own connection would come
back through the same server session even behind PgBouncer) and, when nothing comes back, says so, reports
itself disconnected and stops (the worker keeps polling).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping

import psycopg
from psycopg import sql

from skiplock.backoff import backoff_seconds
from skiplock.settings import redact

log = logging.getLogger(__name__)
PROBE_TIMEOUT = 3.0
PROBE_RETRY_SECONDS = 60.0


class Listener:
    def __init__(
        self,
        dsn: str,
        channel: str,
        queue: str | Collection[str],
        wake: Callable[[], None],
        on_state: Callable[[bool], None] = lambda up: None,
        on_notify: Callable[[], None] = lambda: None,
        application_name: str = "skiplock",
        on_unsupported: Callable[[], None] = lambda: None,
        also: Mapping[str, tuple[Collection[str], Callable[[], None]]] | None = None,
    ) -> None:
        """``also`` listens on more channels over the same connection: channel -> (payloads, callback)."""
        self._also = {ch: (frozenset(words), fn) for ch, (words, fn) in (also or {}).items()}
        self._application_name = application_name
        self._on_unsupported = on_unsupported
        self._dsn = dsn
        self._channel = channel
        self._queues = frozenset([queue] if isinstance(queue, str) else queue)
        self._wake = wake
        self._on_state = on_state
        self._on_notify = on_notify
        self.connected = False
        self.unsupported = False
        self.last_notification = 0.0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting with capped backoff. A failed self-probe (PgBouncer in transaction
        mode, or a server too slow to answer it) means polling only, and a new probe later, with backoff."""
        failures = 0
        probes_failed = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name=self._application_name
                ) as conn:
                    for channel in (self._channel, *self._also):
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    if await self._probe(conn):
                        probes_failed = failures = 0
                        self.unsupported = False
                        self._set(True)
                        self._wake()  # anything enqueued while we were away
                        await self._listen(conn)
                        continue
                probes_failed += 1
                self.unsupported = True
                self._set(False)
                self._on_unsupported()
                retry = backoff_seconds(probes_failed, base=PROBE_RETRY_SECONDS, cap=600.0, jitter=0.2)
                if probes_failed == 1:
                    log.warning(
                        "LISTEN does not deliver notifications on this connection (PgBouncer in transaction mode, "
                        "or a slow server?): polling only; probing again in %.0fs",
                        retry,
                        extra={"action": "listen_unsupported"},
                    )
                await asyncio.sleep(retry)
            except asyncio.CancelledError:
                self._set(False)
                raise
            except (psycopg.Error, OSError) as exc:
                self._set(False)
                failures += 1
                delay = backoff_seconds(failures, base=0.5, cap=30.0, jitter=0.5)
                log.warning(
                    "listener lost its connection (%s); reconnecting in %.1fs, polling meanwhile",
                    redact(str(exc).strip(), self._dsn),
                    delay,
                    extra={"action": "listener_down"},
                )
                await asyncio.sleep(delay)

    async def _listen(self, conn: psycopg.AsyncConnection[object]) -> None:
        """The proven connection: wake on every notification for our queues until it drops (raises)."""
        async for note in conn.notifies():
            if note.channel != self._channel:
                words, callback = self._also.get(note.channel, ((), None))
                if callback is not None and note.payload in words:
                    callback()
            elif note.payload in self._queues:
                self.last_notification = time.time()
                self._on_notify()
                self._wake()

    async def _probe(self, conn: psycopg.AsyncConnection[object]) -> bool:
        token = f"probe:{uuid.uuid4().hex}"
        async with await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, application_name=self._application_name, connect_timeout=5
        ) as sender:
            await sender.execute("SELECT pg_notify(%s, %s)", (self._channel, token))
        async for note in conn.notifies(timeout=PROBE_TIMEOUT):
            if note.payload == token:
                return True
        return False

    def _set(self, up: bool) -> None:
        if up != self.connected:
            self.connected = up
            self._on_state(up)
            log.info(
                "listener %s",
                "connected" if up else "disconnected",
                extra={"action": "listener_up" if up else "listener_down", "channel": self._channel},
            )
