"""Replicas for a wait-time target (``spec.scaling.targetWaitSeconds``): pure math, no I/O, no clock.

A JobQueue promises a wait ("a job starts within 30 s"), not a backlog per replica. With ``S`` the mean service
time, ``lambda`` the rate at which jobs become ready, ``W`` the target and ``T`` the pod start-up time:

- keep up: Little's law, ``lambda * S`` slots busy on average, plus :data:`HEADROOM`;
- clear: the ready backlog, plus the delayed jobs and cron ticks that come due within ``T`` (pre-scaling), must be
  done within the target; new pods only claim after ``T``, so they have ``W - T`` (at least one service time);
- never fewer slots than the jobs in flight hold.

``ceil(slots / concurrency)`` replicas, then the usual clamps (min/max, the connection budget) and the
stabilization window of :func:`skiplock_operator.scaling.decide`. :class:`Estimator` turns what each poll reads
(jobs enqueued and done since the last poll, jobs in flight) into the arrival rate and the service time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

HEADROOM = 0.2
"""Spare share over Little's law: queues build up well before a server is 100 % busy."""
ARRIVAL_WINDOW_SECONDS = 15.0
"""The arrival rate is the jobs of this last stretch: long enough to smooth Poisson noise at a 5 s poll, short
enough that one burst stops counting as a rate once it is served (the backlog term covers the burst itself)."""
DEFAULT_SERVICE_SECONDS = 1.0
"""Service time assumed before any job of the queues finished (a fresh queue)."""


@dataclass(frozen=True)
class Load:
    """What the wait-target policy knows besides the backlog."""

    arrival_rate: float = 0.0
    """Jobs a second that became ready lately (enqueued without a delay)."""
    service_seconds: float = DEFAULT_SERVICE_SECONDS
    """Mean run time of one job."""
    due_soon: int = 0
    """Delayed jobs and cron ticks that come due within the pod start-up time."""


def slots(ready: int, processing: int, load: Load, target_seconds: float, startup_seconds: float) -> float:
    """Job slots the queues need now (fractional; the caller rounds up per replica)."""
    s = max(load.service_seconds, 1e-3)
    keep_up = load.arrival_rate * s * (1 + HEADROOM)
    window = max(target_seconds - startup_seconds, s)
    clear = (ready + load.due_soon) * s / window
    return max(float(processing), keep_up) + clear


def replicas(
    ready: int, processing: int, load: Load, target_seconds: float, startup_seconds: float, concurrency: int
) -> int:
    return math.ceil(slots(ready, processing, load, target_seconds, startup_seconds) / concurrency - 1e-9)


def predicted_wait(ready: int, processing: int, load: Load, replicas: int, concurrency: int) -> float | None:
    """Seconds a job enqueued now waits with ``replicas`` serving: the ready backlog ahead of it, drained by the
    slots that are not busy keeping up with new arrivals. None when those replicas cannot keep up (or are 0 with
    work waiting): the wait then grows until the autoscaler adds replicas."""
    capacity = replicas * concurrency
    if capacity <= 0:
        return 0.0 if ready == 0 else None
    spare = capacity - load.arrival_rate * load.service_seconds
    if spare <= 0:
        return None
    if ready == 0 and processing < capacity:
        return 0.0
    return ready * load.service_seconds / spare


class Estimator:
    """Arrival rate and service time over the last :data:`ARRIVAL_WINDOW_SECONDS`, from what each poll reads: jobs
    enqueued ready and jobs done since the previous poll, and the jobs in flight now. The service time follows
    from Little's law on the workers: jobs in flight (averaged over the polls) over the completion rate."""

    def __init__(self, window: float = ARRIVAL_WINDOW_SECONDS) -> None:
        self.window = window
        self.samples: deque[tuple[float, int, int, int]] = deque()
        self.started: float | None = None
        self.service = DEFAULT_SERVICE_SECONDS

    def observe(self, now: float, arrived: int, done: int, processing: int) -> None:
        """Counts since the previous call (the first call only starts the clock)."""
        if self.started is None:
            self.started = now
            return
        self.samples.append((now, arrived, done, processing))
        while self.samples and self.samples[0][0] <= now - self.window:
            self.samples.popleft()
        finished = sum(x[2] for x in self.samples)
        if finished:  # else the last estimate stands (nothing finished lately says nothing new)
            in_flight = sum(x[3] for x in self.samples) / len(self.samples)
            self.service = max(in_flight / (finished / self.span(now)), 1e-3)

    def span(self, now: float) -> float:
        return min(self.window, now - self.started) if self.started is not None else 0.0

    def load(self, now: float, due_soon: int = 0) -> Load:
        span = self.span(now)
        rate = sum(x[1] for x in self.samples) / span if span > 0 else 0.0
        return Load(rate, self.service, due_soon)
