"""Wake a JobQueue's autoscaler on NOTIFY: the worker's own :class:`skiplock.listener.Listener`, shared.

One listener per (DSN, channel, queue), shared by every JobQueue that polls that queue; a notification
(and every reconnect, since notifications sent while it was down are lost) sets the subscribers' events.
The autoscaler debounces them, and its poll stays the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Iterable

from psycopg.conninfo import make_conninfo

from skiplock.listener import Listener

log = logging.getLogger(__name__)
ListenKey = tuple[str, str, str]
CONNECT_TIMEOUT_SECONDS = 5


class _Shared:
    def __init__(self, dsn: str, channel: str, queue: str) -> None:
        self.events: dict[Hashable, asyncio.Event] = {}
        self.listener = Listener(
            dsn=make_conninfo(dsn, connect_timeout=CONNECT_TIMEOUT_SECONDS),
            channel=channel,
            queue=queue,
            wake=self.wake,
            application_name="skiplock-operator-listen",
        )
        self.task = asyncio.create_task(self._run(), name=f"skiplock-listen-{channel}-{queue}")

    async def _run(self) -> None:
        """The listener, ending quietly on anything but cancellation (kopf re-raises task errors at exit)."""
        try:
            await self.listener.run()
        except Exception as exc:
            log.warning("LISTEN stopped (%s): polling only", type(exc).__name__, extra={"action": "listen_stopped"})

    def wake(self) -> None:
        for event in self.events.values():
            event.set()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


class Wakeups:
    """Subscribe a JobQueue's event to its queues' notifications; unsubscribe when it stops listening."""

    def __init__(self) -> None:
        self._shared: dict[ListenKey, _Shared] = {}
        self._users: dict[Hashable, frozenset[ListenKey]] = {}

    def subscribed(self, user: Hashable) -> bool:
        return user in self._users

    def listening(self, user: Hashable) -> bool:
        keys = self._users.get(user, frozenset())
        return bool(keys) and all(self._shared[k].listener.connected for k in keys)

    async def subscribe(
        self, user: Hashable, dsn: str, channel: str, queues: Iterable[str], event: asyncio.Event
    ) -> None:
        """Set ``event`` when one of ``queues`` is notified on ``channel`` (``Settings.channel``)."""
        wanted = frozenset((dsn, channel, q) for q in queues)
        current = self._users.get(user, frozenset())
        if wanted == current:
            return
        for key in current - wanted:
            await self._leave(user, key)
        for key in wanted - current:
            shared = self._shared.get(key)
            if shared is None:
                shared = self._shared[key] = _Shared(*key)
            elif shared.listener.connected:
                event.set()  # a job may have arrived between the last poll and now: look once more
            shared.events[user] = event
        self._users[user] = wanted

    async def _leave(self, user: Hashable, key: ListenKey) -> None:
        shared = self._shared.get(key)
        if shared is None:
            return
        shared.events.pop(user, None)
        if not shared.events:
            del self._shared[key]
            await shared.close()

    async def unsubscribe(self, user: Hashable) -> None:
        for key in self._users.pop(user, frozenset()):
            await self._leave(user, key)

    async def close(self) -> None:
        shared = list(self._shared.values())
        self._shared.clear()
        self._users.clear()
        for item in shared:
            await item.close()
