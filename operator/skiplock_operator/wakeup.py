"""Scale from zero without waiting for the poll: LISTEN on a schema's channel while a queue sits at zero.

One connection per (DSN, schema), outside any pool, shared by every idle JobQueue on it. A notification
whose payload is a subscriber's queue name sets that subscriber's event; so does every (re)connect, since
notifications sent while the connection was down are lost (the poll stays the fallback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable

import psycopg
from psycopg import sql

from skiplock.settings import redact

log = logging.getLogger(__name__)


class _Channel:
    def __init__(self, dsn: str, channel: str, *, retry_cap: float) -> None:
        self.dsn, self.channel, self.retry_cap = dsn, channel, retry_cap
        self.subscribers: dict[Hashable, tuple[str, asyncio.Event]] = {}
        self.listening = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"skiplock-listen-{channel}")

    def wake_all(self) -> None:
        for _, event in self.subscribers.values():
            event.set()

    async def _run(self) -> None:
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=5,
                    application_name="skiplock-operator-listen",
                )
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.listening.set()
                    self.wake_all()
                    delay = 0.5
                    async for note in conn.notifies():
                        for queue, event in self.subscribers.values():
                            if note.payload == queue:
                                event.set()
            except psycopg.Error as exc:
                self.listening.clear()
                log.warning(
                    "LISTEN connection lost, polling only until it is back: %s",
                    redact(str(exc), self.dsn),
                    extra={"action": "listen_lost", "channel": self.channel},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_cap)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Wakeups:
    """Subscribe a JobQueue's event to its queue's notifications; unsubscribe when it has replicas again."""

    def __init__(self, *, retry_cap: float = 60.0) -> None:
        self._channels: dict[tuple[str, str], _Channel] = {}
        self._users: dict[Hashable, tuple[str, str]] = {}
        self._retry_cap = retry_cap

    def subscribed(self, user: Hashable) -> bool:
        return user in self._users

    def listening(self, user: Hashable) -> bool:
        key = self._users.get(user)
        return key is not None and self._channels[key].listening.is_set()

    async def subscribe(self, user: Hashable, dsn: str, channel: str, queue: str, event: asyncio.Event) -> None:
        """Set ``event`` when ``queue`` is notified on ``channel`` (``Settings.channel`` of the queue's schema)."""
        key = (dsn, channel)
        if self._users.get(user) == key:
            self._channels[key].subscribers[user] = (queue, event)
            return
        await self.unsubscribe(user)
        listener = self._channels.get(key)
        if listener is None:
            listener = self._channels[key] = _Channel(dsn, channel, retry_cap=self._retry_cap)
        elif listener.listening.is_set():
            event.set()  # a job may have arrived between the last poll and now: look once more
        listener.subscribers[user] = (queue, event)
        self._users[user] = key

    async def unsubscribe(self, user: Hashable) -> None:
        key = self._users.pop(user, None)
        if key is None:
            return
        channel = self._channels[key]
        channel.subscribers.pop(user, None)
        if not channel.subscribers:
            del self._channels[key]
            await channel.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._users.clear()
        for channel in channels:
            await channel.close()
