"""The chart's UI (ui.enabled), rendered by the real helm: off by default; on, a hardened Deployment running
`skiplock ui` with its DSN and token from Secrets as files, a Service, and a NetworkPolicy."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from chart.chartlib import ROOT, Render, Template, of_kind, only
from skiplock.cli import build_parser

ON = ("--set", "ui.enabled=true", "--set", "ui.dsnSecretRef.name=queue-db")


def ui_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "ui"]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-ui"))
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def test_the_ui_is_off_by_default(render: Render) -> None:
    assert ui_objects(render()) == []


def test_read_only_without_a_token_secret(render: Render) -> None:
    docs = render(*ON)
    assert sorted(d["kind"] for d in ui_objects(docs)) == ["Deployment", "NetworkPolicy", "Service"]
    c = container(docs)
    assert c["command"] == ["skiplock", "ui"]
    assert "--host=0.0.0.0" in c["args"] and "--port=8080" in c["args"]
    assert "--dsn-file=/var/run/skiplock/dsn/dsn" in c["args"] and "--schema=skiplock" in c["args"]
    assert not any(a.startswith("--token-file") for a in c["args"])
    assert all(e["name"] != "SKIPLOCK_DSN" for e in c["env"])  # the DSN never goes into the environment
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = next(d for d in ui_objects(docs) if d["kind"] == "Service")
    assert service["spec"]["ports"][0]["port"] == 80 and service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "ui"


def test_the_token_comes_from_a_secret_as_a_file(render: Render) -> None:
    docs = render(*ON, "--set", "ui.tokenSecretRef.name=ui-token", "--set", "ui.hidePayloads=true")
    c = container(docs)
    assert "--token-file=/var/run/skiplock/token/token" in c["args"] and "--hide-payloads" in c["args"]
    pod = next(d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-ui"))["spec"]["template"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "ui-token"
    assert volumes["dsn"]["secret"]["secretName"] == "queue-db"
    assert {m["name"]: m["readOnly"] for m in c["volumeMounts"] if m["name"] != "tmp"} == {"dsn": True, "token": True}
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_the_network_policy_admits_only_the_given_peers_and_reaches_only_dns_and_postgres(render: Render) -> None:
    peer = '{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"ingress-nginx"}}}'
    docs = render(
        *ON, "--set-json", f"ui.networkPolicy.from=[{peer}]", "--set", "ui.networkPolicy.postgres.cidrs={10.0.0.0/8}"
    )
    policy = next(d for d in ui_objects(docs) if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ingress-nginx"
    }
    ports = [p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]]
    assert ports == [53, 53, 5432]
    assert policy["spec"]["egress"][1]["to"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert not any(
        d["kind"] == "NetworkPolicy" for d in ui_objects(render(*ON, "--set", "ui.networkPolicy.enabled=false"))
    )


def test_a_trusted_user_header_needs_the_proxy_as_the_only_source(template: Template, render: Render) -> None:
    refused = template(*ON, "--set", "ui.trustedUserHeader=X-Forwarded-User")
    assert refused.returncode != 0 and "ui.networkPolicy.from" in refused.stderr
    peer = '{"podSelector":{"matchLabels":{"app":"oauth2-proxy"}}}'
    docs = render(
        *ON, "--set", "ui.trustedUserHeader=X-Forwarded-User", "--set-json", f"ui.networkPolicy.from=[{peer}]"
    )
    assert "--trusted-user-header=X-Forwarded-User" in container(docs)["args"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "ui.enabled=true"), "ui.dsnSecretRef.name is required"),
        ((*ON, "--set", "ui.port=0"), "minimum"),
        ((*ON, "--set", "ui.colour=blue"), "colour"),
        ((*ON, "--set", "ui.trustedUserHeader=bad header"), "pattern"),
    ],
)
def test_bad_values_fail_the_render(template: Template, args: tuple[str, ...], message: str) -> None:
    proc = template(*args)
    assert proc.returncode != 0 and message in proc.stderr


def test_the_ui_image_can_be_its_own(render: Render) -> None:
    assert container(render(*ON))["image"].startswith("ghcr.io/skiplock/skiplock:")
    docs = render(*ON, "--set", "ui.image.repository=registry.example/skiplock-ui", "--set", "ui.image.tag=1.2.3")
    assert container(docs)["image"] == "registry.example/skiplock-ui:1.2.3"
    assert only([d for d in ui_objects(docs) if d["kind"] == "Deployment"], "Deployment")["spec"]["replicas"] == 1


def test_the_default_image_provides_the_command_the_ui_deployment_runs(render: Render) -> None:
    """The UI pod runs with the chart's default image: the Dockerfile's default (last) stage installs the `ui`
    extra, the command is that image's `skiplock` entry point, and its `ui` subcommand takes every argument the
    chart passes (all of them switched on)."""
    docs = render(*ON, "--set", "ui.tokenSecretRef.name=ui-token", "--set", "ui.hidePayloads=true")
    c = container(docs)
    operator = next(d for d in of_kind(docs, "Deployment") if not d["metadata"]["name"].endswith("-ui"))
    assert c["image"] == operator["spec"]["template"]["spec"]["containers"][0]["image"], "the chart's one image"
    stages = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)
    default_stage = stages[-1]
    installed = re.findall(r'--no-deps "skiplock\[([\w,]+)\]"', default_stage)
    assert installed and "ui" in installed[0].split(","), "the default image installs skiplock[ui]"
    assert "skiplock ui --help" in default_stage, "the build runs the UI's command once"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert c["command"][0] in scripts, "the command is the wheel's console script"
    args = build_parser().parse_args([*c["command"][1:], *c["args"]])
    assert args.command == "ui" and args.hide_payloads is True
    assert args.token_file == "/var/run/skiplock/token/token" and args.port == 8080
