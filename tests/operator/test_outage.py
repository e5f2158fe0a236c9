"""Outage detection through a real partition (a local TCP proxy that stops forwarding), and tarpits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from skiplock_operator.database import DatabaseProblem, Databases
from support.pg import await_for

from .conftest import NAMESPACE, Cluster, jobqueue_spec, metric
from .netfaults import Proxy, Tarpit
from .test_conditions import is_status

POLL = 1.0
TIMEOUT = 2.0  # the operator's database_timeout_seconds in these tests (conftest)


async def test_a_partition_is_reported_within_poll_plus_timeout_and_healed_within_a_poll(
    pg_dsn: str, schema: str, cluster: Cluster, operator: Any
) -> None:
    async with Proxy(pg_dsn) as proxy:
        await cluster.apply_secret("db", proxy.dsn())
        await cluster.create_jobqueue("part", jobqueue_spec("part", schema, minReplicas=1, pollingIntervalSeconds=POLL))
        await await_for(lambda: is_status(cluster, "part", "DatabaseReachable", "True"), what="reachable")
        await await_for(
            lambda: metric(operator, "skiplock_operator_database_up", namespace=NAMESPACE, jobqueue="part") == 1,
            what="up=1",
        )

        proxy.partition()
        cut = time.monotonic()
        await await_for(
            lambda: is_status(cluster, "part", "DatabaseReachable", "False"), timeout=30, what="the partition seen"
        )
        detected = time.monotonic() - cut
        reason = cluster.condition("part", "DatabaseReachable")["reason"]  # type: ignore[index]
        assert reason in ("QueryTimeout", "ConnectTimeout"), reason
        assert metric(operator, "skiplock_operator_database_up", namespace=NAMESPACE, jobqueue="part") == 0
        assert cluster.replicas("part") == 1, "replicas are kept through an outage"
        # The documented bound: pollingIntervalSeconds + database timeout + 2 s.
        assert detected <= POLL + TIMEOUT + 2.0, f"partition detected after {detected:.1f}s"

        proxy.heal()
        healed = time.monotonic()
        await await_for(lambda: is_status(cluster, "part", "DatabaseReachable", "True"), timeout=30, what="healed")
        recovered = time.monotonic() - healed
        assert recovered <= POLL + 2.0, f"recovery seen after {recovered:.1f}s"
        print(f"partition detected after {detected:.2f}s, heal seen after {recovered:.2f}s")


async def test_tarpit_jobqueues_do_not_stall_a_healthy_one_of_the_same_namespace(pg_dsn: str, schema: str) -> None:
    """Issue 37 item 9: connects are isolated per JobQueue, so four tarpit DSNs of one namespace (the default
    install's single namespace) never delay another JobQueue's poll there."""
    dbs = Databases(timeout=3.0)
    try:
        async with Tarpit() as tarpit:
            stuck = [
                asyncio.create_task(
                    dbs.stats((NAMESPACE, f"evil{i}"), tarpit.dsn(f"pw{i}"), "skiplock", ["q"], lease_seconds=60)
                )
                for i in range(4)
            ]
            await await_for(lambda: tarpit.accepted == 4, what="the tarpit holds every evil JobQueue's connect")
            healthy = await dbs.stats((NAMESPACE, "good"), pg_dsn, schema, ["q"], lease_seconds=60)
            assert healthy["q"].ready == 0
            assert not any(t.done() for t in stuck), "the healthy JobQueue had to wait for the tarpits"
            results = await asyncio.gather(*stuck, return_exceptions=True)
            assert all(isinstance(r, DatabaseProblem) and r.reason == "ConnectTimeout" for r in results), results
    finally:
        await dbs.close()


async def test_a_blackholed_dns_holds_neither_the_kubernetes_threads_nor_other_tenants(
    pg_dsn: str, schema: str, monkeypatch: Any
) -> None:
    """Issue 37 item 9: host names are resolved on the operator's own threads, a few per namespace: forty
    JobQueues in twenty namespaces whose DNS never answers leave the default executor (every Kubernetes call)
    and another namespace's connect to a host name alone."""
    import socket
    import threading

    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "blackhole.invalid":
            release.wait(30)  # a lookup that never answers, holding its thread
            raise socket.gaierror(socket.EAI_NONAME, "blackholed")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    dbs = Databases(timeout=2.0)
    try:
        evil = [
            asyncio.create_task(
                dbs.stats(
                    (f"evil{i % 20}", f"jq{i}"),
                    f"postgresql://u{i}:p@blackhole.invalid/app",
                    "s",
                    ["q"],
                    lease_seconds=60,
                )
            )
            for i in range(40)
        ]
        await asyncio.sleep(0.2)  # the lookups start and hang
        kube_like = await asyncio.wait_for(asyncio.to_thread(lambda: "answered"), timeout=1.5)
        assert kube_like == "answered"
        by_name = pg_dsn.replace("127.0.0.1", "localhost")
        assert (await dbs.stats(("good", "jq"), by_name, schema, ["q"], lease_seconds=60))["q"].ready == 0
        results = await asyncio.gather(*evil, return_exceptions=True)
        assert {getattr(r, "reason", r) for r in results} <= {"HostUnknown", "ConnectTimeout"}, results
    finally:
        release.set()
        await dbs.close()
        resolving = [t for t in threading.enumerate() if t.name.startswith("skiplock-resolve")]
        await await_for(lambda: not any(t.is_alive() for t in resolving), what="the resolver's threads end")


async def test_a_query_stuck_behind_a_partition_fails_within_the_timeout(pg_dsn: str, schema: str) -> None:
    """No cancel request is sent over the dead link (it would wait for its own timeout)."""
    async with Proxy(pg_dsn) as proxy:
        dbs = Databases(timeout=2.0)
        try:
            dsn = proxy.dsn()
            await dbs.stats("a", dsn, schema, ["q"], lease_seconds=60)
            proxy.partition()
            call = asyncio.create_task(dbs.stats("a", dsn, schema, ["q"], lease_seconds=60))
            done, _ = await asyncio.wait({call}, timeout=2.0 + 2.0)
            assert done, "the stuck query outlived timeout + 2 s"
            error = call.exception()
            assert isinstance(error, DatabaseProblem) and error.reason == "QueryTimeout"
            assert len(dbs) == 0, "the severed connection must be dropped"
            proxy.heal()
            assert (await dbs.stats("a", dsn, schema, ["q"], lease_seconds=60))["q"].ready == 0
        finally:
            await dbs.close()


async def test_every_jobqueue_sharing_a_database_sees_a_partition_within_the_bound(
    pg_dsn: str, schema: str, cluster: Cluster, operator: Any
) -> None:
    """They share one connection: none waits behind another's stuck query or reconnect past the bound."""
    names = [f"share{i}" for i in range(4)]
    async with Proxy(pg_dsn) as proxy:
        await cluster.apply_secret("db", proxy.dsn())
        for name in names:
            await cluster.create_jobqueue(name, jobqueue_spec(name, schema, minReplicas=1, pollingIntervalSeconds=POLL))
        for name in names:
            await await_for(lambda n=name: is_status(cluster, n, "DatabaseReachable", "True"), what=f"{name} up")

        proxy.partition()
        cut = time.monotonic()
        seen: dict[str, float] = {}

        def all_seen() -> bool:
            for name in names:
                if name not in seen and is_status(cluster, name, "DatabaseReachable", "False"):
                    seen[name] = time.monotonic() - cut
            return len(seen) == len(names)

        await await_for(all_seen, timeout=40, interval=0.05, what="every JobQueue sees the partition")
        worst = max(seen.values())
        print("partition seen after " + ", ".join(f"{n} {t:.2f}s" for n, t in sorted(seen.items())))
        assert worst <= POLL + TIMEOUT + 2.0, f"a JobQueue saw the partition only after {worst:.1f}s: {seen}"
        proxy.heal()
        for name in names:
            await await_for(lambda n=name: is_status(cluster, n, "DatabaseReachable", "True"), timeout=30, what="heal")
