"""The exporter the worker and the operator serve their metrics with: /metrics and health probes on one port.

Public (docs/reference/python.md): ``serve(registry, host, port, probes)`` binds at once (a busy port is a
:class:`PortInUseError`, a :class:`~skiplock.ConfigError`) and answers only GET (or HEAD) of /metrics and of the
probes' paths (another path is 404, another method 405, a request head over :data:`MAX_HEAD_BYTES` 431).

It runs an asyncio loop in a thread of its own. Each connection has :data:`REQUEST_TIMEOUT_SECONDS` for the whole
exchange (request and answer): a client that trickles its request one byte at a time is cut at that deadline like
a silent one. At most :data:`MAX_CONNECTIONS` are open; a new connection beyond that closes the oldest one still
sending its request, so clients holding connections open cannot keep a probe out. The probes are answered on the
loop; /metrics is rendered in one thread beside it (a collector may query the database), so a slow scrape never
delays a probe.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from skiplock.errors import ConfigError

log = logging.getLogger(__name__)


class PortInUseError(ConfigError):
    """The metrics port cannot be bound (busy, or not allowed)."""


MAX_CONNECTIONS = 64
"""Most connections open at once; one more closes the oldest connection still sending its request."""
REQUEST_TIMEOUT_SECONDS = 5.0
"""Deadline of a whole exchange, from the connection to the end of the answer (a trickling client is cut too)."""
MAX_HEAD_BYTES = 8192
"""Largest request head (request line and headers) read; a longer one is answered 431."""

Probe = Callable[[], tuple[bool, str]]
_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def serve(
    registry: CollectorRegistry, host: str, port: int, probes: dict[str, Probe], *, what: str = "metrics"
) -> Exporter:
    """Bind ``host:port`` now (a busy port is a :class:`PortInUseError` at once) and return the unstarted server
    for /metrics plus one path per probe (e.g. /healthz, /readyz); any other path is 404."""
    return Exporter(registry, host, port, probes, what=what)


class Exporter:
    """/metrics and health probes on one port, on an asyncio loop in a thread, with a whole-request deadline and a
    bounded number of connections."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, probes: dict[str, Probe], *, what: str = "metrics"
    ) -> None:
        self._registry, self._probes = registry, dict(probes)
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise PortInUseError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}") from None
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._render = ThreadPoolExecutor(1, thread_name_prefix="skiplock-exporter-render")
        self._open: dict[asyncio.Task[None], float] = {}  # each connection: since when
        self._reading: set[asyncio.Task[None]] = set()  # those still sending their request
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),), daemon=True)
        self._thread.name = "skiplock-exporter"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            while self._stop is None:  # the loop has not reached _run yet
                time.sleep(0.01)
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
        self._loop.close()
        self._sock.close()
        self._render.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, sock=self._sock, limit=MAX_HEAD_BYTES)
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(self._open):
                task.cancel()
            await asyncio.gather(*self._open, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._open) >= MAX_CONNECTIONS:  # close the oldest still reading (else the oldest): never more
            oldest = min(self._reading or self._open, key=self._open.__getitem__)
            self._reading.discard(oldest)
            self._open.pop(oldest)
            oldest.cancel()
        self._open[task] = time.monotonic()
        self._reading.add(task)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                await self._exchange(task, reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            log.debug("metrics request ended early", extra={"action": "scrape_dropped"})
        except asyncio.CancelledError:
            if self._stop is not None and self._stop.is_set():
                raise
            log.debug("metrics request closed for a newer connection", extra={"action": "scrape_dropped"})
        finally:
            self._reading.discard(task)
            self._open.pop(task, None)
            writer.transport.abort()

    async def _exchange(self, task: asyncio.Task[None], reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            head = b""
        self._reading.discard(task)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if not head:
            status, body, ctype = 431, b"request head too large\n", "text/plain"
        elif len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
            status, body, ctype = 405, b"only GET and HEAD\n", "text/plain"
        else:
            headers = dict(_header(line) for line in lines[1:] if ":" in line)
            status, body, ctype = await self._answer(parts[1], headers.get("accept", ""))
        w.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode("latin-1")
        )
        if parts[0] != "HEAD":
            w.write(body)
        await w.drain()

    async def _answer(self, target: str, accept: str) -> tuple[int, bytes, str]:
        url = urlsplit(target)
        probe = self._probes.get(url.path)
        if probe is not None:
            ok, why = probe()
            return (200, why.encode() + b"\n", "text/plain") if ok else (503, why.encode() + b"\n", "text/plain")
        if url.path != "/metrics":
            return 404, b"not found: try /metrics, " + ", ".join(self._probes).encode() + b"\n", "text/plain"
        encoder, ctype = choose_encoder(accept)
        names = parse_qs(url.query).get("name[]")
        registry = self._registry.restricted_registry(names) if names else self._registry
        body = await self._loop.run_in_executor(self._render, encoder, registry)
        return 200, body, ctype


def _header(line: str) -> tuple[str, str]:
    name, _, value = line.partition(":")
    return name.strip().lower(), value.strip()
