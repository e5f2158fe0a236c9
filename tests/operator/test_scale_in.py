"""Busy-pod-safe scale-in, end to end: the real operator on the emulator, real worker processes as the pods.

The emulator has no controllers, so the test plays the Deployment controller's part: it creates pod objects (with
the env the Deployment's template gives them, the worker id being the pod name) and starts a worker process for
each; when the replicas drop, it deletes the pods Kubernetes would pick (lowest pod-deletion-cost first) and stops
their workers with SIGTERM, as the kubelet does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import kmock
import psycopg

from skiplock import AsyncQueue
from skiplock_operator.scalein import DELETION_COST
from support.kmock_k8s import register
from support.pg import await_for

from .conftest import NAMESPACE, Cluster, jobqueue_spec, running_operator

HERE = Path(__file__).resolve().parent
POD_PREFIX = "/api/v1/namespaces/default/pods"
PODS = kmock.resource("", "v1", "pods")


class Pods:
    """The Deployment controller and kubelet of the test: pods with worker processes, removed by deletion cost."""

    def __init__(self, cluster: Cluster, name: str, dsn: str, tmp: Path) -> None:
        self.cluster, self.name, self.dsn, self.tmp = cluster, name, dsn, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.deleted: list[str] = []

    def _env(self, pod: str) -> dict[str, str]:
        dep = self.cluster.deployment(self.name) or {}
        container = dep["spec"]["template"]["spec"]["containers"][0]
        env: dict[str, str] = {}
        for item in container["env"]:
            if "value" in item:
                value = item["value"]
                for known, resolved in env.items():
                    value = value.replace(f"$({known})", resolved)
                env[item["name"]] = value
            elif "fieldRef" in item.get("valueFrom", {}):
                field = item["valueFrom"]["fieldRef"]["fieldPath"]
                env[item["name"]] = {"metadata.name": pod, "metadata.namespace": NAMESPACE}.get(field, pod)
            else:
                env[item["name"]] = self.dsn  # the DSN Secret's key
        env["SKIPLOCK_METRICS_PORT"] = "0"  # four "pods" share one network namespace here
        env["SKIPLOCK_WORKER_ID"] = pod  # and one host name: in a cluster the default id starts with the pod's
        pythonpath = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        return {**os.environ, **env, "PYTHONPATH": pythonpath}

    async def start(self, suffix: str) -> str:
        pod = f"{self.name}-worker-{suffix}"
        dep = self.cluster.deployment(self.name) or {}
        labels = dep["spec"]["template"]["metadata"]["labels"]
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": labels}}
        await self.cluster.create(POD_PREFIX, body)
        out = open(self.tmp / f"{pod}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.procs[pod] = subprocess.Popen(
            [sys.executable, "-m", "skiplock", "worker"], env=self._env(pod), stdout=out, stderr=subprocess.STDOUT
        )
        return pod

    def cost(self, pod: str) -> int:
        meta = (self.cluster.get(PODS, pod) or {}).get("metadata") or {}
        return int((meta.get("annotations") or {}).get(DELETION_COST, "0"))

    async def follow(self, stop: asyncio.Event) -> None:
        """Delete pods while there are more than the Deployment's replicas: lowest deletion cost first."""
        while not stop.is_set():
            live = [p for p in self.procs if p not in self.deleted]
            extra = len(live) - (self.cluster.replicas(self.name) or 0)
            for pod in sorted(live, key=lambda p: (self.cost(p), p))[: max(0, extra)]:
                self.deleted.append(pod)
                async with self.cluster.emu.request("DELETE", f"{POD_PREFIX}/{pod}") as resp:
                    assert resp.status < 300
                self.procs[pod].send_signal(signal.SIGTERM)
            await asyncio.sleep(0.05)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def holders(dsn: str, schema: str) -> dict[str, str]:
    """name -> pod of each job being processed."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT payload->>'name', split_part(locked_by, ':', 1) FROM \"{schema}\".jobs WHERE status = 'processing'"
        ).fetchall()
    return {str(name): str(pod) for name, pod in rows}


def finished(dsn: str, schema: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT payload->>'name', status, attempts FROM \"{schema}\".jobs").fetchall()
    return {str(name): (str(status), int(attempts)) for name, status, attempts in rows}


async def test_scale_in_drains_the_busy_pod_it_removes_and_removes_the_idle_ones_first(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, tmp_path: Path
) -> None:
    register(cluster.emu, {"v1/pods": {"kind": "Pod", "namespaced": True}})
    log = tmp_path / "runs.log"

    def job(name: str, *, held: bool = True) -> dict[str, Any]:
        return {"log": str(log), "name": name, **({"barrier": str(tmp_path / f"release-{name}")} if held else {})}

    def release(name: str) -> None:
        (tmp_path / f"release-{name}").touch()

    pods = Pods(cluster, "drain", pg_dsn, tmp_path)
    stop = asyncio.Event()
    async with running_operator(cluster):
        await cluster.apply_secret("db", pg_dsn)
        await aqueue.enqueue("drain", job("L1"))
        await aqueue.enqueue("drain", job("F"))
        spec = jobqueue_spec("drain", schema, minReplicas=4, maxReplicas=4, scaleInDrainSeconds=60)
        await cluster.create_jobqueue("drain", {**spec, "handler": "drain_handlers:run", "concurrency": 2})
        await await_for(lambda: cluster.replicas("drain") == 4, what="4 replicas")
        follower = asyncio.create_task(pods.follow(stop))
        try:
            first = await pods.start("a")  # alone at first: it takes L1 and F, both its slots
            await await_for(lambda: holders(pg_dsn, schema) == {"L1": first, "F": first}, timeout=30, what="a full")
            others = [await pods.start(s) for s in ("b", "c", "d")]
            await aqueue.enqueue("drain", job("L2"))
            await await_for(lambda: "L2" in holders(pg_dsn, schema), timeout=30, what="L2 claimed")
            second = holders(pg_dsn, schema)["L2"]
            assert second in others
            release("F")
            await await_for(lambda: "F" not in holders(pg_dsn, schema), what="F done")

            # The backlog is gone and two long jobs run: the autoscaler wants 1 replica (ceil(2 / concurrency 2)).
            await cluster.patch_jobqueue("drain", {"spec": {"scaling": {"minReplicas": 1}}})
            await await_for(
                lambda: ((cluster.jobqueue("drain") or {}).get("status", {}).get("scaleIn") or {}).get("draining"),
                timeout=20,
                what="a drain",
            )
            scale_in = cluster.jobqueue("drain")["status"]["scaleIn"]  # type: ignore[index]
            idle = set(others) - {second}
            assert set(scale_in["draining"]) == idle | {second}, scale_in  # L2's pod holds the least work invested
            assert second in scale_in["waitingFor"], scale_in
            assert pods.cost(first) > 0 and all(pods.cost(p) < 0 for p in scale_in["draining"])

            # A drained pod claims nothing: a new job runs on the pod that stays, while L2 keeps its pod.
            await aqueue.enqueue("drain", job("S", held=False))
            await await_for(lambda: finished(pg_dsn, schema)["S"][0] == "done", timeout=30, what="S done")
            assert f"start S {first}" in log.read_text(), log.read_text()
            assert cluster.replicas("drain") == 4, "replicas dropped while a chosen pod still held a job"
            assert not pods.deleted

            release("L2")  # the busy pod to go finishes its job: now the replicas drop
            await await_for(lambda: cluster.replicas("drain") == 1, timeout=30, what="1 replica")
            await await_for(lambda: len(pods.deleted) == 3, what="three pods deleted")
            assert set(pods.deleted) == idle | {second} and pods.deleted[:2] != [second], pods.deleted
            release("L1")
            await await_for(lambda: finished(pg_dsn, schema)["L1"][0] == "done", timeout=30, what="L1 done")
        finally:
            for name in ("L1", "L2", "F"):
                release(name)
            stop.set()
            await follower
            pods.stop_all()

    runs = log.read_text().split("\n")
    starts = Counter(line.split()[1] for line in runs if line.startswith("start"))
    ends = Counter(line.split()[1] for line in runs if line.startswith("end"))
    assert starts == ends == Counter({"L1": 1, "L2": 1, "F": 1, "S": 1}), runs  # none cut, none run twice
    assert {name: row for name, row in finished(pg_dsn, schema).items()} == {
        n: ("done", 1) for n in ("L1", "L2", "F", "S")
    }
    reasons = [e.get("reason") for e in cluster.events()]
    assert "Draining" in reasons and "ScaledIn" in reasons, reasons
