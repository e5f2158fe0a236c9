"""Static checks of the Grafana dashboard: layout, variables, datasource, and PromQL that promtool parses."""

from __future__ import annotations

import subprocess
from itertools import combinations
from pathlib import Path

import yaml

from observability.promsupport import load_dashboard, panel_queries, panels, require_binary, substitute


def test_dashboard_identity_and_variables() -> None:
    dash = load_dashboard()
    assert dash["uid"] == "skiplock"
    assert dash["title"] == "skiplock"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    queue = variables["queue"]
    # The queue gauges of both sources list every queue: the operator's at zero replicas, the workers' without it.
    assert queue["query"]["query"] == 'label_values(skiplock_queue_jobs{namespace=~"$namespace"}, queue)'
    assert queue["multi"] and queue["includeAll"]
    namespace = variables["namespace"]  # one tenant at a time in a shared cluster
    assert namespace["query"]["query"] == "label_values(skiplock_queue_jobs, namespace)"
    assert namespace["multi"] and namespace["includeAll"] and namespace["allValue"] == ".*"
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names.index("namespace") < names.index("queue")  # the queue list follows the namespace chosen


def test_every_panel_has_a_title_a_description_and_the_datasource_variable() -> None:
    ids = [p["id"] for p in load_dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(load_dashboard()):
        assert panel["title"] and panel["description"], panel["id"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert "$queue" in target["expr"], f"{panel['title']}: not filtered by the queue selector"
            assert "$namespace" in target["expr"], f"{panel['title']}: not filtered by the namespace selector"


def test_panels_fit_the_grid_without_overlapping() -> None:
    boxes = [(p["title"], p["gridPos"]) for p in load_dashboard()["panels"]]
    for title, g in boxes:
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, title
    for (a, ga), (b, gb) in combinations(boxes, 2):
        apart = (
            ga["x"] + ga["w"] <= gb["x"]
            or gb["x"] + gb["w"] <= ga["x"]
            or ga["y"] + ga["h"] <= gb["y"]
            or gb["y"] + gb["h"] <= ga["y"]
        )
        assert apart, f"{a!r} overlaps {b!r}"


def test_dashboard_covers_the_issue_and_the_lifecycle() -> None:
    titles = {p["title"] for p in panels(load_dashboard())}
    for wanted in (
        "Backlog by state",
        "Oldest ready job age",
        "Finished attempts by outcome",
        "Failure ratio",
        "Run duration percentiles",
        "Run duration heatmap",
        "In flight and capacity",
        "Listener connected",
        "Database reachable",
        "Paused queues",
        "Cancelled and snoozed attempts",
        "Timed out and stuck slots",
        "Jobs purged by retention",
        "Retention errors",
        "Jobs held back by flow control",
        "Periodic task ticks",
    ):
        assert wanted in titles


def test_substitute_fills_every_variable() -> None:
    expr = 'rate(x{queue=~"$queue"}[$__rate_interval]) + y{queue=~"${queue}", namespace=~"$namespace"}'
    assert substitute(expr, queue="(a|b)", rate_interval="1m", namespace="shop") == (
        'rate(x{queue=~"(a|b)"}[1m]) + y{queue=~"(a|b)", namespace=~"shop"}'
    )


def test_every_panel_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule: a PromQL syntax error fails here, without a server."""
    promtool = require_binary("promtool")
    rules = [
        {"record": f"dashboard:panel{i}", "expr": q.expr}
        for i, q in enumerate(panel_queries(queue="(emails|reports)", rate_interval="5m"))
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    out = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout
