"""Replicas for a wait-time target (``spec.scaling.targetWaitSeconds``): pure math, no I/O, no clock.

A JobQueue promises a wait ("a job starts within 30 s"), not a backlog per replica. With ``S`` the mean service
time, ``lambda`` the rate at which jobs become ready, ``W`` the target and ``T`` the pod start-up time:

- keep up: Little's law, ``lambda * S`` slots busy on average, plus :data:`HEADROOM`;
- clear: the ready backlog, plus the delayed jobs and cron ticks that come due within ``T`` (pre-scaling), must be
  done within the target; new pods only claim after ``T``, so they have ``W - T`` (at least one service time);
- never fewer slots than the jobs in flight hold.

``ceil(slots / concurrency)`` replicas, with a dead band (:func:`replicas`): replicas are added only when the
current ones no longer keep the promise (less than :data:`SCALE_UP_HEADROOM` spare over Little's law, or a
predicted wait above :data:`WAIT_MARGIN` of the target), and removed only down to a count that leaves
:data:`SCALE_DOWN_HEADROOM` spare, so the noise of the estimates does not move the replicas on a steady load. Then
the usual clamps (min/max, the connection budget) and the stabilization window of
:func:`skiplock_operator.scaling.decide`. :class:`Estimator` turns what each poll reads (jobs enqueued and done
since the last poll, jobs in flight) into the arrival rate and the service time.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

HEADROOM = 0.2
"""Spare share over Little's law when replicas change: queues build up well before a server is 100 % busy."""
SCALE_UP_HEADROOM = 0.1
"""Replicas are added when the current ones leave less than this share spare over Little's law (plus the backlog)."""
SCALE_DOWN_HEADROOM = 0.4
"""Replicas are removed only down to a count that leaves this share spare: one fewer must still keep up with room."""
WAIT_MARGIN = 0.5
"""Replicas stay only while the wait they predict is at most this share of the target: the estimates are noisy
(a service time read from polls seconds apart can be off by half), and the target is a promise."""
ARRIVAL_WINDOW_SECONDS = 15.0
"""The shortest stretch the arrival rate is counted over: long enough to smooth Poisson noise at a 5 s poll, short
enough that one burst stops counting as a rate once it is served (the backlog term covers the burst itself)."""
SERVICE_WINDOW_SECONDS = 60.0
"""The shortest stretch the service time is estimated over (it changes slowly: it can take the longer look)."""
SERVICE_TIMES_IN_WINDOW = 3.0
"""Both windows stretch to this many service times: jobs of 90 s are not measured over 15 s."""
SERVICE_SAMPLE_JOBS = 50
"""The service time's stretch also grows until it saw this many jobs done (a few jobs say little)."""
MAX_WINDOW_SECONDS = 900.0
"""The longest stretch either is counted over (and how far back the estimator keeps its samples)."""
DEFAULT_SERVICE_SECONDS = 1.0
"""Service time assumed before any job of the queues ran (a fresh queue)."""


@dataclass(frozen=True)
class Load:
    """What the wait-target policy knows besides the backlog."""

    arrival_rate: float = 0.0
    """Jobs a second that became ready lately (enqueued without a delay)."""
    service_seconds: float = DEFAULT_SERVICE_SECONDS
    """Mean run time of one job."""
    due_soon: int = 0
    """Delayed jobs and cron ticks that come due within the pod start-up time."""


def slots(
    ready: int,
    processing: int,
    load: Load,
    target_seconds: float,
    startup_seconds: float,
    headroom: float = HEADROOM,
) -> float:
    """Job slots the queues need now (fractional; the caller rounds up per replica)."""
    s = max(load.service_seconds, 1e-3)
    keep_up = load.arrival_rate * s * (1 + headroom)
    window = max(target_seconds - startup_seconds, s)
    clear = (ready + load.due_soon) * s / window
    return max(float(processing), keep_up) + clear


def replicas(
    ready: int,
    processing: int,
    load: Load,
    target_seconds: float,
    startup_seconds: float,
    concurrency: int,
    current: int | None = None,
) -> int:
    """Replicas for the target: ``ceil(slots / concurrency)``. With ``current``, a dead band: ``current`` stays
    while it keeps the promise (:func:`keeps_promise`), and gives way only to fewer replicas that leave
    :data:`SCALE_DOWN_HEADROOM` spare; when it does not keep it, at least one replica more."""

    def needed(headroom: float) -> int:
        wanted = slots(ready, processing, load, target_seconds, startup_seconds, headroom)
        return math.ceil(wanted / concurrency - 1e-9)

    if current is None:
        return needed(HEADROOM)
    if keeps_promise(ready, processing, load, target_seconds, concurrency, current):
        return min(current, needed(SCALE_DOWN_HEADROOM))
    return max(needed(HEADROOM), current + 1)


def keeps_promise(
    ready: int, processing: int, load: Load, target_seconds: float, concurrency: int, current: int
) -> bool:
    """Whether ``current`` replicas serve the target as they are: they keep up with the arrivals with
    :data:`SCALE_UP_HEADROOM` spare, and start the ready backlog and the work due soon well within the target
    (:data:`WAIT_MARGIN`)."""
    capacity = current * concurrency
    if capacity < max(processing, load.arrival_rate * load.service_seconds * (1 + SCALE_UP_HEADROOM)):
        return False
    wait = predicted_wait(ready + load.due_soon, processing, load, current, concurrency)
    return wait is not None and wait <= target_seconds * WAIT_MARGIN


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


@dataclass(frozen=True)
class Sample:
    """One poll: when, jobs enqueued ready and jobs done since the previous poll, jobs in flight now."""

    at: float
    arrived: int
    done: int
    processing: int


class Estimator:
    """Arrival rate and service time from what each poll reads (:class:`Sample`).

    - The arrival rate: jobs enqueued ready over the last :data:`ARRIVAL_WINDOW_SECONDS`, or
      :data:`SERVICE_TIMES_IN_WINDOW` service times when that is longer (few long jobs are counted over long).
    - The service time, by Little's law on the workers over the last :data:`SERVICE_WINDOW_SECONDS` (or
      :data:`SERVICE_TIMES_IN_WINDOW` service times): the job-seconds run (jobs in flight, integrated over time)
      over the jobs served, counted as the jobs done plus half the change in the jobs in flight. Counting only
      the jobs done overstates the service time while the load rises (jobs start long before any finishes);
      the half-change puts the window's edges right on average. When nothing ran, the last estimate stands.
    """

    def __init__(
        self,
        arrival_window: float = ARRIVAL_WINDOW_SECONDS,
        service_window: float = SERVICE_WINDOW_SECONDS,
        max_window: float = MAX_WINDOW_SECONDS,
    ) -> None:
        self.arrival_window = arrival_window
        self.service_window = service_window
        self.max_window = max_window
        self.samples: deque[Sample] = deque()
        self.rate = 0.0
        self.service = DEFAULT_SERVICE_SECONDS

    def observe(self, now: float, arrived: int, done: int, processing: int) -> None:
        """Counts since the previous call (the first call's counts only start the clock)."""
        if not self.samples:
            arrived = done = 0
        self.samples.append(Sample(now, arrived, done, processing))
        while self.samples[0].at < now - self.max_window:
            self.samples.popleft()
        stretch = SERVICE_TIMES_IN_WINDOW * self.service
        self.service = self.service_time(self.since(now - max(self.service_window, stretch), SERVICE_SAMPLE_JOBS))
        self.rate = self.arrival_rate(self.since(now - max(self.arrival_window, stretch)))

    def since(self, start: float, done: int = 0) -> list[Sample]:
        """The samples of the stretch from ``start`` (further back while fewer than ``done`` jobs were done in it):
        the last one at or before it (the stretch's edge) onwards."""
        samples = list(self.samples)
        first, seen = len(samples) - 1, 0
        while first > 0 and (samples[first].at > start or seen < done):
            seen += samples[first].done
            first -= 1
        return samples[first:]

    def arrival_rate(self, stretch: list[Sample]) -> float:
        span = stretch[-1].at - stretch[0].at
        return sum(s.arrived for s in stretch[1:]) / span if span > 0 else self.rate

    def service_time(self, stretch: list[Sample]) -> float:
        busy = sum((a.processing + b.processing) / 2 * (b.at - a.at) for a, b in itertools.pairwise(stretch))
        served = sum(s.done for s in stretch[1:]) + (stretch[-1].processing - stretch[0].processing) / 2
        if served <= 0:  # nothing ran: the last estimate stands
            return self.service
        return max(busy / served, 1e-3)

    def load(self, due_soon: int = 0) -> Load:
        return Load(self.rate, self.service, due_soon)
