"""The metrics server of workers and the operator: a whole-request deadline, a bounded number of connections that
clients trickling their requests cannot fill to keep the probes out (issue 37, item 5), 404/405/431 off its paths."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from prometheus_client import CollectorRegistry, Counter

from skiplock.exporter import MAX_CONNECTIONS, MAX_HEAD_BYTES, REQUEST_TIMEOUT_SECONDS, Exporter, PortInUseError, serve
from support.http import status_of

KUBELET_TIMEOUT = 2.0  # a probe's timeoutSeconds in the chart and the operator's Deployments


@contextmanager
def _server() -> Iterator[Exporter]:
    registry = CollectorRegistry()
    Counter("demo_events", "Some events.", registry=registry).inc()
    server = serve(registry, "127.0.0.1", 0, {"/healthz": lambda: (True, "ok"), "/readyz": lambda: (False, "draining")})
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def _tricklers(port: int, count: int, every: float = 0.5) -> Iterator[list[socket.socket]]:
    """``count`` clients sending a request one byte at a time (a slowloris), never finishing it."""
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(every):
            for c in conns:
                with suppress(OSError):  # closed by the server: that is the point
                    c.send(b"X")

    for c in conns:
        c.send(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield conns
    finally:
        stop.set()
        thread.join()
        for c in conns:
            c.close()


def test_probes_answer_while_clients_trickle_their_requests():
    """Reproduction: 16 trickling connections took every slot of the threaded server (its timeout was per read, so
    one byte every 0.5 s kept a connection forever) and 7 of 7 probes with the kubelet's 2 s timeout failed."""
    with _server() as server, _tricklers(server.port, 16):
        time.sleep(0.3)
        url = f"http://127.0.0.1:{server.port}"
        codes = [status_of(url + "/healthz", timeout=KUBELET_TIMEOUT) for _ in range(7)]
        assert codes == [200] * 7


def test_more_tricklers_than_connections_cannot_keep_a_probe_out():
    """Beyond MAX_CONNECTIONS a new connection closes the oldest one still sending its request."""
    with _server() as server, _tricklers(server.port, 2 * MAX_CONNECTIONS):
        time.sleep(0.3)
        url = f"http://127.0.0.1:{server.port}"
        assert [status_of(url + "/healthz", timeout=KUBELET_TIMEOUT) for _ in range(3)] == [200] * 3
        assert status_of(url + "/metrics", timeout=KUBELET_TIMEOUT) == 200


def test_a_trickling_client_is_cut_at_the_whole_request_deadline():
    """The deadline covers the whole request: a client that keeps sending a byte is closed all the same."""
    with _server() as server, _tricklers(server.port, 1, every=0.2) as (conn,):
        conn.settimeout(REQUEST_TIMEOUT_SECONDS * 3)
        started = time.monotonic()
        assert conn.recv(1024) == b""  # closed by the server, no answer
        assert time.monotonic() - started < REQUEST_TIMEOUT_SECONDS * 2


def test_only_get_of_metrics_and_the_probes_answer():
    with _server() as server:
        url = f"http://127.0.0.1:{server.port}"
        assert [status_of(url + p) for p in ("/metrics", "/healthz", "/readyz", "/", "/metrics/x")] == [
            200,
            200,
            503,
            404,
            404,
        ]
        assert _raw(server.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(b"HTTP/1.1 405 ")
        big = b"GET /metrics HTTP/1.1\r\nX-Big: " + b"x" * (2 * MAX_HEAD_BYTES) + b"\r\n\r\n"
        assert _raw(server.port, big).startswith(b"HTTP/1.1 431 ")


def test_metrics_are_served_in_the_format_asked_for():
    with _server() as server:
        text = _raw(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert b"text/plain" in text.split(b"\r\n\r\n")[0] and b"demo_events_total 1.0" in text
        om = _raw(server.port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n")
        assert b"application/openmetrics-text" in om.split(b"\r\n\r\n")[0] and om.rstrip().endswith(b"# EOF")


def test_a_busy_port_is_a_clear_error_at_once():
    with _server() as server, pytest.raises(PortInUseError, match=str(server.port)):
        serve(CollectorRegistry(), "127.0.0.1", server.port, {})


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=KUBELET_TIMEOUT) as conn:
        conn.sendall(request)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
