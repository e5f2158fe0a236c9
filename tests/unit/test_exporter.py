"""The metrics server of workers and the operator: bounded threads, idle clients dropped, 404 off its paths."""

from __future__ import annotations

import socket
import threading
import time

from prometheus_client import CollectorRegistry

from skiplock.exporter import MAX_CONNECTIONS, REQUEST_TIMEOUT_SECONDS, serve
from support.http import status_of
from support.pg import wait_for


def test_idle_clients_cannot_pile_up_threads_and_are_dropped_after_the_timeout():
    server = serve(CollectorRegistry(), "127.0.0.1", 0, {"/healthz": lambda: (True, "ok")})
    server.start()
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3 * MAX_CONNECTIONS)]  # say nothing
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS, "a thread per idle connection"
        # the idle clients time out; then a real scrape is served
        started = time.monotonic()
        code = wait_for(lambda: _status(f"http://127.0.0.1:{server.port}/healthz"), timeout=60)
        assert code == 200
        assert time.monotonic() - started < 3 * REQUEST_TIMEOUT_SECONDS + 10
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_only_metrics_and_the_probes_answer():
    server = serve(CollectorRegistry(), "127.0.0.1", 0, {"/readyz": lambda: (False, "draining")})
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert [status_of(url + p) for p in ("/metrics", "/readyz", "/", "/metrics/x")] == [200, 503, 404, 404]
    finally:
        server.stop()


def _status(url: str) -> int:
    try:
        return status_of(url, timeout=2)
    except OSError:  # still queued behind the idle clients
        return 0
