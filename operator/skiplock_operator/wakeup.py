"""Wake a JobQueue's autoscaler on NOTIFY: the worker's own :class:`skiplock.listener.Listener`, shared.

One listener, hence one connection, per (DSN, channel), shared by every JobQueue that polls a queue of that
channel: it listens for the union of their queues, and a notification of any of them (and every reconnect, since
notifications sent while it was down are lost) sets the subscribers' events. When the union changes the listener
restarts with the new set (its reconnect wakes everyone once). The autoscaler debounces the wake-ups, and its
poll stays the fallback. These connections count in the database server's connection cap (:meth:`open_to`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Iterable

from skiplock.listener import Listener
from skiplock_operator.database import server_key

log = logging.getLogger(__name__)
ListenKey = tuple[str, str]


class _Shared:
    def __init__(self, dsn: str, channel: str, queues: frozenset[str], connect_dsn: str) -> None:
        self.events: dict[Hashable, asyncio.Event] = {}
        self.queues: dict[Hashable, frozenset[str]] = {}
        self.dsn, self.channel, self.serving, self.connect_dsn = dsn, channel, queues, connect_dsn
        self.listener = Listener(
            dsn=connect_dsn,  # the Listener adds its connect timeout and keepalives unless the DSN sets them
            channel=channel,
            queue=sorted(queues),
            wake=self.wake,
            application_name="skiplock-operator-listen",
        )
        self.task = asyncio.create_task(self._run(), name=f"skiplock-listen-{channel}")

    def wanted(self) -> frozenset[str]:
        return frozenset().union(*self.queues.values())

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
        self._users: dict[Hashable, ListenKey] = {}

    def __len__(self) -> int:
        """Listening connections."""
        return len(self._shared)

    def open_to(self, server: str) -> int:
        """Listening connections to ``server`` (:func:`skiplock_operator.database.server_key`)."""
        return sum(1 for dsn, _ in self._shared if server_key(dsn) == server)

    def subscribed(self, user: Hashable) -> bool:
        return user in self._users

    def listening(self, user: Hashable) -> bool:
        key = self._users.get(user)
        return key is not None and self._shared[key].listener.connected

    async def subscribe(
        self,
        user: Hashable,
        dsn: str,
        channel: str,
        queues: Iterable[str],
        event: asyncio.Event,
        *,
        connect_dsn: str | None = None,
    ) -> None:
        """Set ``event`` when one of ``queues`` is notified on ``channel`` (``Settings.channel``). ``connect_dsn``:
        what the listener dials (``dsn`` with its resolved ``hostaddr``, so it resolves nothing itself)."""
        key, wanted = (dsn, channel), frozenset(queues)
        current = self._users.get(user)
        if current is not None and current != key:
            await self.unsubscribe(user)
        shared = self._shared.get(key)
        if shared is not None and shared.queues.get(user) == wanted and connect_dsn in (None, shared.connect_dsn):
            return
        if shared is not None:
            shared.queues[user], shared.events[user] = wanted, event
            if connect_dsn and connect_dsn != shared.connect_dsn:  # the host's address changed: dial the new one
                shared.connect_dsn = connect_dsn
                await self._restart(key)
            elif not shared.wanted() <= shared.serving:  # a queue more: listen for the new set
                await self._restart(key)
            elif shared.listener.connected:
                event.set()  # a job may have arrived between the last poll and now: look once more
        else:
            shared = self._shared[key] = _Shared(dsn, channel, wanted, connect_dsn or dsn)
            shared.queues[user], shared.events[user] = wanted, event
        self._users[user] = key

    async def _restart(self, key: ListenKey) -> None:
        old = self._shared[key]
        new = self._shared[key] = _Shared(old.dsn, old.channel, old.wanted(), old.connect_dsn)
        new.queues, new.events = old.queues, old.events
        await old.close()

    async def unsubscribe(self, user: Hashable) -> None:
        key = self._users.pop(user, None)
        shared = self._shared.get(key) if key is not None else None
        if shared is None or key is None:
            return
        shared.events.pop(user, None)
        shared.queues.pop(user, None)
        if not shared.events:
            del self._shared[key]
            await shared.close()

    async def close(self) -> None:
        shared = list(self._shared.values())
        self._shared.clear()
        self._users.clear()
        for item in shared:
            await item.close()
