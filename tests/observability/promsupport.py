"""Shared by the Prometheus tests: the dashboard's PromQL with its variables filled in, and the binaries."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.ci import missing

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts/skiplock/files/dashboard.json"
ALERTS = ROOT / "charts/skiplock/files/alerts.yaml"


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str

    @property
    def label(self) -> str:
        return f"{self.panel!r}/{self.ref}"


def load_dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row (rows may nest their panels when collapsed)."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def substitute(expr: str, *, queue: str, rate_interval: str, namespace: str = ".*") -> str:
    """Fill in $queue and $namespace (regexes, as Grafana does for a multi-value variable; the namespace
    selector's All is .*) and $__rate_interval."""
    out = expr.replace("$__rate_interval", rate_interval).replace("${queue}", queue).replace("$queue", queue)
    out = out.replace("${namespace}", namespace).replace("$namespace", namespace)
    left = re.findall(r"\$\{?\w+", out)
    if left:
        raise ValueError(f"unsubstituted variables {left} in {expr!r}")
    return out


def panel_queries(*, queue: str, rate_interval: str = "1m", namespace: str = ".*") -> list[PanelQuery]:
    return [
        PanelQuery(
            panel["title"],
            target["refId"],
            substitute(target["expr"], queue=queue, rate_interval=rate_interval, namespace=namespace),
        )
        for panel in panels(load_dashboard())
        for target in panel.get("targets", [])
    ]


def require_binary(name: str) -> str:
    """The path of a Prometheus binary; fails in CI (CI=true) when it is missing, skips elsewhere."""
    path = shutil.which(name)
    if path:
        return path
    why = f"{name} not found: apt-get install -y --no-install-recommends prometheus (Debian; .ci/run installs it)"
    missing(why)
