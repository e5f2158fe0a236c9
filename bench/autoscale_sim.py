"""Replay job arrival curves through skiplock's scaling policy and a KEDA-like baseline, side by side.

Both autoscalers drive the same simulated cluster, one tick per second: Poisson arrivals, a FIFO queue,
replicas with ``--concurrency`` slots that take ``--startup`` seconds to become ready, jobs of
``--service`` seconds. A removed replica drains its jobs (SIGTERM grace), so scale-downs lose nothing.

- skiplock: ``skiplock_operator.scaling.decide`` with the CRD defaults (5 s poll, 60 s scale-down window,
  activation at 1 ready job) plus the NOTIFY wake-up: at zero replicas the first arrival triggers a poll.
- keda-like: ``ceil(backlog / target)`` every 30 s, scale-down only after a 300 s cooldown, no wake-up.

Prints a table, then one JSON line per (scenario, policy): p50/p99 job wait, peak backlog, replica-seconds,
scale events. Runs in a few seconds: ``python bench/autoscale_sim.py [--seed N] [--json]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from skiplock_operator.scaling import Observation, Recommendation, ScalingSpec, decide

HOUR = 3600
Curve = Callable[[int], float]
"""Expected arrivals in second ``t`` (a rate, or a burst size at one instant)."""


def steady(t: int) -> float:
    return 20.0


def spike(t: int) -> float:
    return 200.0 if 1200 <= t < 1260 else 5.0


def ramp(t: int) -> float:
    half = HOUR / 2
    return 60.0 * (t / half if t < half else (HOUR - t) / half)


def bursty(t: int) -> float:
    return 500.0 if t % 300 == 17 else 0.0  # off the baseline's 30 s poll grid


def idle_then_burst(t: int) -> float:
    return 1000.0 if t == 3017 else 0.0


SCENARIOS: dict[str, Curve] = {
    "steady": steady,
    "spike": spike,
    "ramp": ramp,
    "bursty": bursty,
    "idle-then-burst": idle_then_burst,
}


@dataclass(frozen=True)
class Cluster:
    concurrency: int = 10
    service_seconds: int = 1
    startup_seconds: int = 5
    max_replicas: int = 20
    target: int = 10


class Skiplock:
    name = "skiplock"

    def __init__(self, cluster: Cluster) -> None:
        self.spec = ScalingSpec(max_replicas=cluster.max_replicas, target_backlog_per_replica=cluster.target)
        self.concurrency = cluster.concurrency
        self.history: tuple[Recommendation, ...] = ()
        self.next_poll = 0.0

    def due(self, t: int, current: int, arrived: int) -> bool:
        return t >= self.next_poll or (current == 0 and arrived > 0)  # NOTIFY while at zero

    def decide(self, obs: Observation, current: int, t: int) -> int:
        self.next_poll = t + self.spec.polling_interval_seconds
        d = decide(obs, current, self.spec, concurrency=self.concurrency, now=float(t), history=self.history)
        self.history = d.history
        return d.replicas


class KedaLike:
    name = "keda-like"
    POLL = 30
    COOLDOWN = 300

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.last_high = -math.inf

    def due(self, t: int, current: int, arrived: int) -> bool:
        return t % self.POLL == 0

    def decide(self, obs: Observation, current: int, t: int) -> int:
        wanted = min(self.cluster.max_replicas, math.ceil(obs.ready / self.cluster.target))
        if wanted >= current:
            self.last_high = t
            return wanted
        return wanted if t - self.last_high >= self.COOLDOWN else current


@dataclass
class Result:
    scenario: str
    policy: str
    jobs: int
    p50_wait_seconds: float
    p99_wait_seconds: float
    peak_backlog: int
    replica_seconds: int
    scale_events: int


def arrivals(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean >= 100:  # a burst: arrives exactly
        return round(mean)
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(scenario: str, curve: Curve, policy_cls: type[Skiplock | KedaLike], cluster: Cluster, seed: int) -> Result:
    rng = random.Random(seed)
    policy = policy_cls(cluster)
    queue: collections.deque[int] = collections.deque()
    finishing: collections.Counter[int] = collections.Counter()
    pods: list[int] = []  # ready-at second of each replica
    in_flight = waits_total = replica_seconds = events = peak = 0
    waits: list[float] = []
    t = 0
    while t < HOUR or queue or in_flight:
        if t > HOUR + 4 * HOUR:
            break
        arrived = arrivals(rng, curve(t)) if t < HOUR else 0
        queue.extend([t] * arrived)
        in_flight -= finishing.pop(t, 0)
        ready_pods = sum(1 for ready_at in pods if ready_at <= t)
        free = ready_pods * cluster.concurrency - in_flight
        while free > 0 and queue:
            waits.append(t - queue.popleft())
            finishing[t + cluster.service_seconds] += 1
            in_flight += 1
            free -= 1
        peak = max(peak, len(queue))
        current = len(pods)
        if policy.due(t, current, arrived):
            oldest = float(t - queue[0]) if queue else 0.0
            wanted = policy.decide(Observation(len(queue), in_flight, oldest), current, t)
            if wanted > current:
                pods.extend([t + cluster.startup_seconds] * (wanted - current))
            elif wanted < current:
                pods.sort()
                del pods[wanted:]  # the newest (or not yet ready) go first; their jobs drain
            events += wanted != current
        replica_seconds += len(pods)
        t += 1
    waits_total = len(waits)
    return Result(
        scenario,
        policy.name,
        waits_total,
        round(percentile(waits, 0.50), 1),
        round(percentile(waits, 0.99), 1),
        peak,
        replica_seconds,
        events,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--concurrency", type=int, default=Cluster.concurrency)
    parser.add_argument("--service", type=int, default=Cluster.service_seconds, help="seconds per job")
    parser.add_argument("--startup", type=int, default=Cluster.startup_seconds, help="seconds until a pod is ready")
    args = parser.parse_args(argv)
    cluster = Cluster(concurrency=args.concurrency, service_seconds=args.service, startup_seconds=args.startup)
    results = [
        simulate(name, curve, policy, cluster, args.seed)
        for name, curve in SCENARIOS.items()
        for policy in (Skiplock, KedaLike)
    ]
    if not args.json:
        header = f"{'scenario':<16} {'policy':<10} {'jobs':>7} {'p50 wait':>9} {'p99 wait':>9} {'peak':>6} "
        print(header + f"{'replica-s':>10} {'scales':>7}")
        for r in results:
            print(
                f"{r.scenario:<16} {r.policy:<10} {r.jobs:>7} {r.p50_wait_seconds:>8.1f}s {r.p99_wait_seconds:>8.1f}s "
                f"{r.peak_backlog:>6} {r.replica_seconds:>10} {r.scale_events:>7}"
            )
        print()
    for r in results:
        print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
