"""Replay job traces through skiplock's two scaling modes and a KEDA-like baseline, side by side.

Every policy drives the same simulated cluster, one tick per second: jobs arrive (some delayed: enqueued ahead
with a due time), wait in one FIFO queue, and run on replicas with ``--concurrency`` slots each.

- **Pod start-up is modelled explicitly**: a replica added at second ``t`` claims its first job at
  ``t + --startup`` (8 s by default: image cached, process start, readiness). Nothing claims before that.
- Scale-in: skiplock's modes remove the replicas holding the fewest jobs, which stop claiming at once and go when
  their jobs finish, or after ``scaleInDrainSeconds`` (300 s) cutting what still runs (busy-pod-safe scale-in).
  The KEDA-like baseline removes the newest replicas (the ReplicaSet's choice, blind to the work they hold) and
  cuts what is still running after the 30 s termination grace. A cut job goes back to the queue and runs again.
- backlog: ``skiplock_operator.scaling.decide`` as it ships (target 10 ready jobs per replica, 5 s poll, 60 s
  scale-down window, NOTIFY wake-up at zero, a poll when the next delayed job comes due).
- wait-target: the same ``decide`` with ``targetWaitSeconds`` (``--target``, 10 s) and ``podStartupSeconds``
  (``--pod-startup``, 10 s: a little above the simulated start-up), so it wakes ``podStartupSeconds`` before a
  delayed job comes due and starts a worker for it. Its arrival rate and service time are estimated from what a
  poll sees (jobs enqueued and done since the last poll, jobs in flight), with the operator's own estimator.
- keda-like: ``ceil(ready / 10)`` every 30 s, scale-down only after a 300 s cooldown, no wake-up.

Traces (one hour each): steady (20 jobs/s of 1 s), bursty (500 jobs of 1 s every 5 min, off the 30 s poll grid),
delayed-heavy (batches of 50 jobs of 2 s due every 7 minutes, each enqueued 10 minutes ahead, plus 0.2 jobs/s),
delayed-from-zero (20 jobs due every 15 minutes, enqueued 10 minutes ahead, nothing else: zero replicas before),
long-jobs (a job of 90 s every 10 s on average, in waves: the scale-in case).

Prints a table, then one JSON line per (trace, policy): jobs, p50/p99 wait (ready or due -> started), the worst
start delay of a delayed job after its due time, replica-seconds, scale events, jobs cut.
``python bench/autoscale_sim.py [--seed N] [--json]`` runs in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from skiplock_operator.scaling import Observation, Recommendation, ScalingSpec, decide
from skiplock_operator.waittarget import Estimator

HOUR = 3600
DRAIN_SECONDS = 300
GRACE_SECONDS = 30


@dataclass(frozen=True)
class Job:
    enqueued: int
    due: int
    service: int

    @property
    def delayed(self) -> bool:
        return self.due > self.enqueued


Trace = Callable[[int, random.Random], list[Job]]
"""The jobs enqueued in second ``t``."""


def poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def steady(t: int, rng: random.Random) -> list[Job]:
    return [Job(t, t, 1)] * poisson(rng, 20.0)


def bursty(t: int, rng: random.Random) -> list[Job]:
    return [Job(t, t, 1)] * (500 if t % 300 == 17 else 0)


def delayed_heavy(t: int, rng: random.Random) -> list[Job]:
    jobs = [Job(t, t, 2)] * poisson(rng, 0.2)
    if t % 420 == 0:  # a batch due in 10 minutes (reminders, retries at a set time)
        jobs += [Job(t, t + 600 + 13, 2)] * 50
    return jobs


def delayed_from_zero(t: int, rng: random.Random) -> list[Job]:
    return [Job(t, t + 600 + 13, 2)] * 20 if t % 900 == 0 else []  # nothing else: zero replicas before each


def long_jobs(t: int, rng: random.Random) -> list[Job]:
    wave = 0.25 if (t // 600) % 2 == 0 else 0.02
    return [Job(t, t, 90)] * poisson(rng, wave)


TRACES: dict[str, Trace] = {
    "steady": steady,
    "bursty": bursty,
    "delayed-heavy": delayed_heavy,
    "delayed-from-zero": delayed_from_zero,
    "long-jobs": long_jobs,
}


@dataclass(frozen=True)
class Cluster:
    concurrency: int = 10
    startup_seconds: int = 8
    max_replicas: int = 20
    target: int = 10
    target_wait_seconds: float = 10.0
    pod_startup_seconds: float = 10.0


@dataclass
class View:
    """What a poll reads from the jobs table at second ``t``."""

    ready: int
    processing: int
    oldest: float
    arrived: int
    """Jobs enqueued without a delay since the previous poll."""
    done: int
    """Jobs finished since the previous poll."""
    due: list[int]
    """Due times of the delayed jobs still waiting, sorted."""


class Backlog:
    """skiplock's backlog mode, as it ships."""

    name = "backlog"
    safe_scale_in = True

    def __init__(self, cluster: Cluster) -> None:
        self.spec = ScalingSpec(max_replicas=cluster.max_replicas, target_backlog_per_replica=cluster.target)
        self.concurrency = cluster.concurrency
        self.history: tuple[Recommendation, ...] = ()
        self.next_poll = 0.0

    def wake_before_due(self) -> float:
        return 0.0  # the autoscaler polls when a delayed job comes due

    def due(self, t: int, current: int, arrived_now: int, next_due: int | None) -> bool:
        at_due = next_due is not None and t >= next_due - self.wake_before_due()
        return t >= self.next_poll or (current == 0 and arrived_now > 0) or at_due  # NOTIFY at zero

    def observe(self, t: int, view: View) -> Observation:
        return Observation(view.ready, view.processing, view.oldest)

    def decide(self, t: int, view: View, current: int) -> int:
        self.next_poll = t + self.spec.polling_interval_seconds
        d = decide(
            self.observe(t, view), current, self.spec, concurrency=self.concurrency, now=float(t), history=self.history
        )
        self.history = d.history
        return d.replicas


class WaitTarget(Backlog):
    name = "wait-target"

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.spec = replace(
            self.spec, target_wait_seconds=cluster.target_wait_seconds, pod_startup_seconds=cluster.pod_startup_seconds
        )
        self.flow = Estimator()

    def wake_before_due(self) -> float:
        return self.spec.pod_startup_seconds

    def observe(self, t: int, view: View) -> Observation:
        self.flow.observe(float(t), view.arrived, view.done, view.processing)
        horizon = t + self.spec.pod_startup_seconds
        load = self.flow.load(due_soon=sum(1 for d in view.due if d <= horizon))
        return Observation(view.ready, view.processing, view.oldest, load)


class KedaLike:
    name = "keda-like"
    safe_scale_in = False
    POLL = 30
    COOLDOWN = 300

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.last_high = -math.inf

    def due(self, t: int, current: int, arrived_now: int, next_due: int | None) -> bool:
        return t % self.POLL == 0

    def decide(self, t: int, view: View, current: int) -> int:
        wanted = min(self.cluster.max_replicas, math.ceil(view.ready / self.cluster.target))
        if wanted >= current:
            self.last_high = t
            return wanted
        return wanted if t - self.last_high >= self.COOLDOWN else current


POLICIES: tuple[type[Backlog] | type[KedaLike], ...] = (Backlog, WaitTarget, KedaLike)


@dataclass
class Pod:
    ready_at: int
    jobs: list[tuple[int, Job]] = field(default_factory=list)
    """(ends at, job) of what it runs."""
    leaving_since: int | None = None


@dataclass
class Result:
    trace: str
    policy: str
    jobs: int
    p50_wait_seconds: float
    p99_wait_seconds: float
    worst_due_to_start_seconds: float | None
    replica_seconds: int
    scale_events: int
    jobs_cut: int


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Sim:
    def __init__(self, trace: Trace, policy: Backlog | KedaLike, cluster: Cluster, seed: int) -> None:
        self.trace, self.policy, self.cluster = trace, policy, cluster
        self.rng = random.Random(seed)
        self.queue: deque[Job] = deque()
        self.delayed: list[Job] = []
        self.pods: list[Pod] = []
        self.waits: list[float] = []
        self.due_delays: list[float] = []
        self.arrived = self.done = self.replica_seconds = self.events = self.cut = 0

    def run(self) -> tuple[int, list[float], list[float], int, int, int]:
        t = 0
        while t < HOUR or self.queue or self.delayed or any(p.jobs for p in self.pods):
            if t > 3 * HOUR:
                break
            self.tick(t)
            t += 1
        return len(self.waits), self.waits, self.due_delays, self.replica_seconds, self.events, self.cut

    def tick(self, t: int) -> None:
        new = self.trace(t, self.rng) if t < HOUR else []
        now_ready = [j for j in new if not j.delayed]
        self.queue.extend(now_ready)
        self.arrived += len(now_ready)
        self.delayed.extend(j for j in new if j.delayed)
        self.delayed.sort(key=lambda j: j.due)
        next_due = self.delayed[0].due if self.delayed else None  # the operator polls when it comes due
        while self.delayed and self.delayed[0].due <= t:
            self.queue.append(self.delayed.pop(0))
        self.finish(t)
        self.dispatch(t)
        current = sum(1 for p in self.pods if p.leaving_since is None)
        if self.policy.due(t, current, len(now_ready), next_due):
            wanted = self.policy.decide(t, self.view(t), current)
            if wanted != current:
                self.events += 1
                self.scale(t, current, wanted)
            self.dispatch(t)  # a replica that is ready at once (none here) would claim now
        self.replica_seconds += len(self.pods)

    def view(self, t: int) -> View:
        running = sum(len(p.jobs) for p in self.pods)
        oldest = float(t - self.queue[0].due) if self.queue else 0.0
        view = View(len(self.queue), running, oldest, self.arrived, self.done, [j.due for j in self.delayed])
        self.arrived = self.done = 0
        return view

    def finish(self, t: int) -> None:
        for pod in self.pods:
            done = [(end, job) for end, job in pod.jobs if end <= t]
            self.done += len(done)
            pod.jobs = [(end, job) for end, job in pod.jobs if end > t]
        limit = DRAIN_SECONDS if self.policy.safe_scale_in else GRACE_SECONDS
        kept = []
        for pod in self.pods:
            if pod.leaving_since is not None and (not pod.jobs or t - pod.leaving_since >= limit):
                self.cut += len(pod.jobs)
                self.queue.extendleft(job for _, job in pod.jobs)  # handed back: runs again
                continue
            kept.append(pod)
        self.pods = kept

    def dispatch(self, t: int) -> None:
        for pod in self.pods:
            if pod.ready_at > t or pod.leaving_since is not None:
                continue
            while self.queue and len(pod.jobs) < self.cluster.concurrency:
                job = self.queue.popleft()
                self.waits.append(float(t - job.due))
                if job.delayed:
                    self.due_delays.append(float(t - job.due))
                pod.jobs.append((t + job.service, job))

    def scale(self, t: int, current: int, wanted: int) -> None:
        if wanted > current:
            self.pods.extend(Pod(t + self.cluster.startup_seconds) for _ in range(wanted - current))
            return
        staying = [p for p in self.pods if p.leaving_since is None]
        if self.policy.safe_scale_in:  # the fewest jobs held go first
            order = sorted(staying, key=lambda p: (len(p.jobs), -p.ready_at))
        else:  # the ReplicaSet's pick: the newest first, whatever they run
            order = sorted(staying, key=lambda p: -p.ready_at)
        for pod in order[: current - wanted]:
            pod.leaving_since = t


def simulate(
    name: str, trace: Trace, policy_cls: type[Backlog] | type[KedaLike], cluster: Cluster, seed: int
) -> Result:
    jobs, waits, due_delays, replica_seconds, events, cut = Sim(trace, policy_cls(cluster), cluster, seed).run()
    return Result(
        name,
        policy_cls.name,
        jobs,
        round(percentile(waits, 0.50), 1),
        round(percentile(waits, 0.99), 1),
        max(due_delays) if due_delays else None,
        replica_seconds,
        events,
        cut,
    )


def table(results: list[Result]) -> str:
    head = "| trace | policy | jobs | p50 wait | p99 wait | worst due -> start | replica-s | scale events | jobs cut |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        due = "-" if r.worst_due_to_start_seconds is None else f"{r.worst_due_to_start_seconds:.0f} s"
        lines.append(
            f"| {r.trace} | {r.policy} | {r.jobs} | {r.p50_wait_seconds:.1f} s | {r.p99_wait_seconds:.1f} s | {due} "
            f"| {r.replica_seconds} | {r.scale_events} | {r.jobs_cut} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--concurrency", type=int, default=Cluster.concurrency)
    parser.add_argument("--startup", type=int, default=Cluster.startup_seconds, help="seconds until a pod claims")
    parser.add_argument("--target", type=float, default=Cluster.target_wait_seconds, help="targetWaitSeconds")
    parser.add_argument("--pod-startup", type=float, default=Cluster.pod_startup_seconds, help="podStartupSeconds")
    parser.add_argument("--only", choices=sorted(TRACES), help="one trace")
    args = parser.parse_args(argv)
    cluster = Cluster(
        concurrency=args.concurrency,
        startup_seconds=args.startup,
        target_wait_seconds=args.target,
        pod_startup_seconds=args.pod_startup,
    )
    traces = {args.only: TRACES[args.only]} if args.only else TRACES
    results = [
        simulate(name, trace, policy, cluster, args.seed) for name, trace in traces.items() for policy in POLICIES
    ]
    if not args.json:
        print(table(results))
        print()
    for r in results:
        print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
