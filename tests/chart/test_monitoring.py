"""Monitoring objects: the PrometheusRule carries files/alerts.yaml minus the disabled alerts, the dashboard
ConfigMap carries files/dashboard.json for the Grafana sidecar, and the monitors scrape the right ports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart.chartlib import CHART, NAMESPACE, Render, Template, of_kind, only
from support.ci import missing

MONITORING = ("-f", str(CHART / "ci" / "monitoring-values.yaml"))


def alert_file() -> dict[str, Any]:
    return yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())


def alert_names() -> list[str]:
    return [rule["alert"] for group in alert_file()["groups"] for rule in group["rules"] if "alert" in rule]


def test_monitoring_is_off_by_default(render: Render) -> None:
    docs = render()
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"):
        assert not of_kind(docs, kind), kind


def test_prometheus_rule_carries_every_rule(render: Render) -> None:
    rule = only(render(*MONITORING), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == alert_file()["groups"]
    assert alert_names(), "files/alerts.yaml has no alert"


def test_disabled_alerts_are_dropped_one_by_one(render: Render) -> None:
    names = alert_names()
    dropped = names[:2]
    rule = only(
        render(*MONITORING, "--set", f"metrics.prometheusRule.disabledAlerts={{{','.join(dropped)}}}"), "PrometheusRule"
    )
    kept = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert kept == [n for n in names if n not in dropped]
    expected = [
        {**group, "rules": [r for r in group["rules"] if r.get("alert") not in dropped]}
        for group in alert_file()["groups"]
    ]
    assert rule["spec"]["groups"] == [g for g in expected if g["rules"]]


def test_disabling_every_alert_keeps_a_valid_object(render: Render) -> None:
    names = alert_names()
    rule = only(
        render(*MONITORING, "--set", f"metrics.prometheusRule.disabledAlerts={{{','.join(names)}}}"), "PrometheusRule"
    )
    remaining = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all("alert" not in r for r in remaining)


def test_unknown_disabled_alert_fails_the_render(template: Template) -> None:
    proc = template(*MONITORING, "--set", "metrics.prometheusRule.disabledAlerts={SkiplockNoSuchAlert}")
    assert proc.returncode != 0
    assert "SkiplockNoSuchAlert" in proc.stderr and alert_names()[0] in proc.stderr


def test_prometheus_templates_survive_rendering(render: Render) -> None:
    """{{ $labels.queue }} in the alert annotations must reach Prometheus, not be eaten by Helm."""
    text = json.dumps(only(render(*MONITORING), "PrometheusRule")["spec"])
    source = json.dumps(alert_file()["groups"])
    assert text.count("{{") == source.count("{{") > 0


def test_dashboard_configmap_for_the_grafana_sidecar(render: Render) -> None:
    cm = only(render(*MONITORING), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "skiplock"}
    assert list(cm["data"]) == ["skiplock.json"]
    shipped = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert json.loads(cm["data"]["skiplock.json"]) == shipped
    assert len(cm["data"]["skiplock.json"].encode()) < 1_000_000, "a ConfigMap holds at most 1 MiB"


def test_service_monitor_scrapes_the_operator_service(render: Render) -> None:
    docs = render(*MONITORING)
    monitor, service = only(docs, "ServiceMonitor"), only(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    # Queue-wide series are labelled with the JobQueue's namespace, not the operator's: keep theirs.
    assert [e["honorLabels"] for e in monitor["spec"]["endpoints"]] == [True]


@pytest.mark.parametrize(
    ("mode", "namespaces"),
    [
        (("--set", "rbac.scope=cluster"), {"any": True}),
        (("--set", "rbac.scope=namespace"), {"matchNames": [NAMESPACE]}),
        (("--set", "rbac.namespaces={team-a,team-b}"), {"matchNames": ["team-a", "team-b"]}),
    ],
    ids=["cluster", "namespace", "multi-namespace"],
)
def test_pod_monitor_scrapes_every_worker(render: Render, mode: tuple[str, ...], namespaces: dict[str, Any]) -> None:
    monitor = only(render(*MONITORING, *mode), "PodMonitor")
    assert monitor["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "skiplock-worker"}}
    assert monitor["spec"]["namespaceSelector"] == namespaces
    endpoint = only_endpoint(monitor)
    assert endpoint["port"] == "metrics" and endpoint["interval"] == "15s"


def only_endpoint(monitor: dict[str, Any]) -> dict[str, Any]:
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == 1
    return dict(endpoints[0])


def test_service_monitor_needs_the_service(template: Template) -> None:
    proc = template("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false")
    assert proc.returncode != 0 and "metrics.service.enabled" in proc.stderr


def test_rendered_rules_pass_promtool(render: Render, tmp_path: Path) -> None:
    """The PrometheusRule's groups, with an alert dropped, are still a valid Prometheus rule file."""
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool not found (apt-get install prometheus)")
    dropped = alert_names()[-1]
    rule = only(render(*MONITORING, "--set", f"metrics.prometheusRule.disabledAlerts={{{dropped}}}"), "PrometheusRule")
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = sum(len(group["rules"]) for group in alert_file()["groups"])
    assert f"SUCCESS: {total - 1} rules found" in proc.stdout
