"""The operator's metrics server: a busy port is a clear exit 2, unknown paths are 404 (the worker's server)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from prometheus_client import CollectorRegistry

from skiplock.exporter import serve
from skiplock_operator.metrics import OperatorMetrics
from support.http import status_of


def test_a_busy_operator_metrics_port_exits_2_with_a_clear_message():
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
        env["SKIPLOCK_OPERATOR_METRICS_PORT"] = str(port)
        done = subprocess.run(
            [sys.executable, "-m", "skiplock", "operator", "--namespace", "default"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"cannot serve operator metrics on 0.0.0.0:{port}" in done.stderr


def test_the_operator_metrics_server_answers_only_metrics():
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    server = serve(registry, "127.0.0.1", 0, {}, what="operator metrics")
    server.start()
    try:
        codes = {p: status_of(f"http://127.0.0.1:{server.port}{p}") for p in ("/metrics", "/", "/nosuch")}
        assert codes == {"/metrics": 200, "/": 404, "/nosuch": 404}
    finally:
        server.stop()
