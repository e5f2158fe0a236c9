"""A dedicated LISTEN connection that sets a wake-up event; polling stays the fallback.

Behind PgBouncer in transaction mode LISTEN is accepted but notifications never arrive: after every connect the
listener proves itself with a NOTIFY sent from *another* connection (a NOTIFY on its own connection would come
back through the same server session even behind PgBouncer) and, when nothing comes back, says so, reports
itself disconnected and stops (the worker keeps polling).

A lost connection is retried at once and then every second at most (polling covers the gap, but every second
without the listener is a second of pick-up latency); the connection has a connect timeout and TCP keepalives, so
a server that vanished without closing is noticed. A probe that once succeeded and now gets no answer (a server
still recovering from a restart) is repeated a second later, not after the minute a PgBouncer gets.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from skiplock.backoff import backoff_seconds
from skiplock.settings import redact

log = logging.getLogger(__name__)
Channels = Mapping[str, tuple[Collection[str], Callable[[], None]]]
"""More channels on the listener's connection: channel -> (the payloads that count, the callback)."""
PROBE_TIMEOUT = 3.0
PROBE_RETRY_SECONDS = 60.0
"""First retry of a probe that never succeeded (PgBouncer in transaction mode): doubled up to ten minutes."""
PROBE_RETRY_PROVEN_SECONDS = 1.0
"""Retry of a probe that succeeded before on this DSN: notifications work here, the server was slow."""
RECONNECT_BASE_SECONDS = 0.2
RECONNECT_CAP_SECONDS = 1.0
CONNECTION_DEFAULTS: dict[str, str] = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
"""Options of the listener's connections, each unless the DSN sets it: a dead server is noticed in ~25 s."""


def connection_options(dsn: str) -> dict[str, str]:
    """The :data:`CONNECTION_DEFAULTS` the DSN does not set itself."""
    given = conninfo_to_dict(dsn)
    return {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}


def reconnect_delay(failures: int) -> float:
    """Pause before reconnecting after ``failures`` failed attempts in a row (1 = the connection just dropped)."""
    return backoff_seconds(failures, base=RECONNECT_BASE_SECONDS, cap=RECONNECT_CAP_SECONDS, jitter=0.5)


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
        also: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Channels]] | None = None,
    ) -> None:
        """``also`` names more channels to listen on over the same connection: it is asked on each connection,
        given it (a channel name kept in the database is read there, and a changed one followed at the next)."""
        self._resolve = also
        self._also: dict[str, tuple[frozenset[str], Callable[[], None]]] = {}
        self._application_name = application_name
        self._on_unsupported = on_unsupported
        self._dsn = dsn
        self._conninfo = make_conninfo(dsn, **connection_options(dsn))
        self._channel = channel
        self._queues = frozenset([queue] if isinstance(queue, str) else queue)
        self._wake = wake
        self._on_state = on_state
        self._on_notify = on_notify
        self.connected = False
        self.unsupported = False
        self.last_notification = 0.0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting at once, then every second at most. A failed self-probe (PgBouncer in
        transaction mode, or a server too slow to answer it) means polling only, and a new probe later: a second
        later if a probe succeeded before, else with a backoff from a minute."""
        failures = 0
        probes_failed = 0
        proven = False
        while True:
            try:
                async with await self._connect() as conn:
                    failures = 0
                    more = await self._resolve(conn) if self._resolve is not None else {}
                    self._also = {ch: (frozenset(words), fn) for ch, (words, fn) in more.items()}
                    for channel in (self._channel, *self._also):
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    if await self._probe(conn):
                        probes_failed = 0
                        proven = True
                        self.unsupported = False
                        self._set(True)
                        self._wake()  # anything enqueued while we were away
                        await self._listen(conn)
                        continue
                probes_failed += 1
                self._set(False)
                if proven:
                    if probes_failed == 1:
                        log.warning(
                            "the listener's probe got no answer within %.0fs (a server still recovering?); "
                            "polling meanwhile, probing again every %.0fs",
                            PROBE_TIMEOUT,
                            PROBE_RETRY_PROVEN_SECONDS,
                            extra={"action": "listener_probe_failed"},
                        )
                    await asyncio.sleep(PROBE_RETRY_PROVEN_SECONDS)
                    continue
                self.unsupported = True
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
                delay = reconnect_delay(failures)
                log.warning(
                    "listener lost its connection (%s); reconnecting in %.1fs, polling meanwhile",
                    redact(str(exc).strip(), self._dsn),
                    delay,
                    extra={"action": "listener_down"},
                )
                await asyncio.sleep(delay)

    async def _listen(self, conn: psycopg.AsyncConnection[object]) -> None:
        """The proven connection: wake on every notification for our queues until it drops (raises). The socket is
        read by a reader callback of the loop, which wakes the claim loop in the same loop step (``conn.notifies()``
        resumes a task, and adds and removes a reader, for every notification). Nothing else uses this connection
        meanwhile."""
        async for note in conn.notifies(timeout=0):  # what arrived while the probe ran
            self._notified(note.channel, note.payload)
        loop = asyncio.get_running_loop()
        pgconn, fd, encoding = conn.pgconn, conn.fileno(), conn.info.encoding
        dropped: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                pgconn.consume_input()
                while (note := pgconn.notifies()) is not None:
                    self._notified(note.relname.decode(encoding), note.extra.decode(encoding))
            except Exception as exc:  # the connection dropped (or a callback failed): run() decides
                loop.remove_reader(fd)
                if not dropped.done():
                    dropped.set_exception(exc)

        loop.add_reader(fd, readable)
        try:
            readable()  # what libpq already read
            await dropped
        finally:
            loop.remove_reader(fd)

    def _notified(self, channel: str, payload: str) -> None:
        if channel != self._channel:
            words, callback = self._also.get(channel, ((), None))
            if callback is not None and payload in words:
                callback()
        elif payload in self._queues:
            self.last_notification = time.time()
            self._on_notify()
            self._wake()

    async def _probe(self, conn: psycopg.AsyncConnection[object]) -> bool:
        token = f"probe:{uuid.uuid4().hex}"
        async with await self._connect() as sender:
            await sender.execute("SELECT pg_notify(%s, %s)", (self._channel, token))
        async for note in conn.notifies(timeout=PROBE_TIMEOUT):
            if note.payload == token:
                return True
        return False

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        return await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, application_name=self._application_name
        )

    def _set(self, up: bool) -> None:
        if up != self.connected:
            self.connected = up
            self._on_state(up)
            log.info(
                "listener %s",
                "connected" if up else "disconnected",
                extra={"action": "listener_up" if up else "listener_down", "channel": self._channel},
            )
