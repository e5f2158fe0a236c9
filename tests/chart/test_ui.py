"""The chart's UI (ui.enabled), rendered by the real helm: off by default; on, a hardened Deployment running
`skiplock ui` with its DSN and token from Secrets as files, a Service, and a NetworkPolicy."""

from __future__ import annotations

from typing import Any

import pytest

from chart.chartlib import Render, Template, of_kind, only

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
