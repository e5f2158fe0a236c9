"""The one object the seams of a worker share to wake each other (:class:`Wakeup`), and the worker's listener.

The seams are built in dependency order, each given the ones it calls: store -> completer -> executors -> leases ->
claimer -> listener. Three calls go the other way (the completer asks whether a claim is coming and wakes the claim
loop when a job that held back another was written; the leases wake it for recovered jobs; the slots tell it when
they free): they go through this object, created first by the lifecycle and handed to each seam's constructor. It
holds no job and owns no seam: events and a few flags, each written by one party.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from skiplock.listener import Channels, Listener
from skiplock.metrics import WorkerMetrics
from skiplock.settings import Settings
from skiplock.store.run import aexecute
from skiplock.store.statements import Statements
from skiplock.worker.pools import APPLICATION_NAME

log = logging.getLogger(__name__)
CONTROL_WORDS = ("cancel", "pause")
"""Payloads of the control channel (its name is read from the schema's ``control_channel`` table): what the
workers recheck."""
CONTROL_FOLD_SECONDS = 0.25
"""Control notifications this soon after the last one that was passed on are folded into one, passed on when the
interval ends: a burst costs one recheck (two at most), a flood about four a second, whoever sends it."""


class Wakeup:
    """Wake-ups between the seams of one worker (see the module)."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        """The drain started (or, until idle, nothing is left): the claim loop ends, no buffered job starts."""
        self.freed = asyncio.Event()
        """Set whenever the claim loop should look at its room again: slots freed, a hurry, a stop, pauses read."""
        self.work = asyncio.Event()
        """Work may be due (NOTIFY, recovered jobs, a job that held back another was written)."""
        self.source = "notify"
        """What set :attr:`work` last (the wake-up counter's label)."""
        self.paused_changed = asyncio.Event()
        """The control channel said a queue was paused or resumed, or a drain was requested: the claimer looks."""
        self.cancels_changed = asyncio.Event()
        """The control channel announced a cancel: the leases check the held jobs."""
        self.forced = False
        """A second stop request: the drain stops waiting for running jobs."""
        self.hurried = 0
        """Claims made early because done jobs waited (see :meth:`hurry`)."""
        self._gathering = False  # the claim loop waits for room for a whole batch
        self._claiming = False  # a claim statement is in flight
        self._hurry = False  # the completer asked for a claim now
        self._control_next = 0.0  # monotonic time before which control notifications are folded
        self._control_later: asyncio.TimerHandle | None = None  # the folded ones, passed on at _control_next

    # ------------------------------------------------------------------ told by the seams
    def wake(self, source: str = "notify") -> None:
        """Work may be due: the claim loop claims now (``source``: notify, recovered, completed)."""
        self.source = source
        self.work.set()

    def control(self) -> None:
        """A notification on the control channel (cancel, pause): the leases and the claimer look again, at once
        if none was passed on for :data:`CONTROL_FOLD_SECONDS`, else once when that interval ends."""
        if self._control_later is not None:
            return  # folded into the one already due
        wait = self._control_next - time.monotonic()
        if wait > 0:
            self._control_later = asyncio.get_running_loop().call_later(wait, self._control_now)
        else:
            self._control_now()

    def _control_now(self) -> None:
        self._control_later = None
        self._control_next = time.monotonic() + CONTROL_FOLD_SECONDS
        self.cancels_changed.set()
        self.paused_changed.set()

    def stop(self, *, force: bool = False) -> bool:
        """A stop request: the first starts the drain (True), a second (or ``force``) forces it (False)."""
        if self.stopping.is_set() or force:
            self.forced = True
        if not self.stopping.is_set():
            self.stopping.set()
            self.work.set()
        self.freed.set()
        return not self.forced

    def hurry(self) -> bool:
        """Asked by the completer once done jobs waited long enough for a claim to carry them: if the claim loop is
        only waiting for room for a whole batch, it claims now (a smaller batch, and one statement instead of a claim
        and a flush). True as well while a claim is in flight (the next one comes soon after)."""
        if self.stopping.is_set():
            return False
        if self._gathering and not self._hurry:
            self._hurry = True
            self.hurried += 1
            self.freed.set()
        return self._gathering or self._claiming

    # ------------------------------------------------------------------ the claim loop's side
    def gathering(self, on: bool) -> None:
        self._gathering = on
        if on:
            self._hurry = False

    def claiming(self, on: bool) -> None:
        self._claiming = on

    @property
    def hurried_now(self) -> bool:
        """The completer asked for a claim while the loop gathered room."""
        return self._hurry


def listener(
    settings: Settings,
    queues: Sequence[str],
    wakeup: Wakeup,
    metrics: WorkerMetrics,
    statements: Statements,
    on_up: Callable[[], None] = lambda: None,
) -> Listener:
    """The worker's LISTEN connection: NOTIFY on its queues wakes the claim loop, the control channel (same
    connection, its name read there at each connection) wakes the leases and the claimer; its state is exported,
    and ``on_up`` is told each time it is connected (the database answers)."""

    warned = False

    async def control(conn: psycopg.AsyncConnection[Any]) -> Channels:
        nonlocal warned
        try:
            name = await aexecute(conn, statements.control_channel())
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable) as exc:
            # wake-ups must not be lost with the controls: listen to the queues, let heartbeats and polls find controls
            if not warned:
                warned = True
                log.warning(
                    "cannot read the control channel's name (%s; run `skiplock grant` after `skiplock migrate`): "
                    "cancels, pauses and drains are seen by heartbeats and polls only",
                    type(exc).__name__,
                    extra={"action": "control_channel_unreadable"},
                )
            return {}
        return {name: (CONTROL_WORDS, wakeup.control)}

    def state(up: bool) -> None:
        metrics.listener_connected.set(1 if up else 0)
        if up:
            metrics.listener_enabled.set(1)  # a later probe proved it after all
            on_up()

    return Listener(
        settings.require_dsn(),
        settings.channel,
        queues,
        lambda: wakeup.wake("notify"),
        application_name=APPLICATION_NAME,
        on_state=state,
        on_notify=lambda: metrics.last_notification.set(time.time()),
        on_unsupported=lambda: metrics.listener_enabled.set(0),
        also=control,
    )
