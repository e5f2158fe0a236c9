"""The exporter the worker and the operator serve their metrics with: /metrics and health probes on one port.

Public (docs/reference/python.md): ``serve(registry, host, port, probes)`` binds at once (a busy port is a
:class:`PortInUseError`, a :class:`~skiplock.ConfigError`), answers only /metrics and the probes' paths (anything
else is 404), serves at most :data:`MAX_CONNECTIONS` requests at a time and drops a client silent for
:data:`REQUEST_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import CollectorRegistry

from skiplock.errors import ConfigError

log = logging.getLogger(__name__)


class PortInUseError(ConfigError):
    """The metrics port cannot be bound (busy, or not allowed)."""


MAX_CONNECTIONS = 16
"""Most requests the metrics server serves at once; more wait in the listen backlog (a bounded server)."""
REQUEST_TIMEOUT_SECONDS = 5.0
"""A client that sends nothing for this long is disconnected (idle connections cannot pile up)."""


class _BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # at most MAX_CONNECTIONS threads; the accept loop waits for a free one
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or hung up is routine: no traceback on stderr."""
        log.debug("metrics request from %s ended early", client_address[0], extra={"action": "scrape_dropped"})


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


Probe = Callable[[], tuple[bool, str]]


def serve(
    registry: CollectorRegistry, host: str, port: int, probes: dict[str, Probe], *, what: str = "metrics"
) -> Exporter:
    """Bind ``host:port`` now (a busy port is a :class:`PortInUseError` at once) and return the unstarted server
    for /metrics plus one path per probe (e.g. /healthz, /readyz); any other path is 404."""
    return Exporter(registry, host, port, probes, what=what)


class Exporter:
    """/metrics and health probes on one port, in a thread, with bounded concurrency and request timeouts."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, probes: dict[str, Probe], *, what: str = "metrics"
    ) -> None:
        metrics_app = prometheus_client.make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            probe = probes.get(path)
            if probe is not None:
                ok, why = probe()
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [why.encode() + b"\n"]
            if path != "/metrics":
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found: try /metrics, " + ", ".join(probes).encode() + b"\n"]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        try:
            self._server: WSGIServer = make_server(
                host, port, app, server_class=_BoundedServer, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise PortInUseError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="skiplock-exporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
