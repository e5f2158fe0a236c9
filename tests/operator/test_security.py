"""The operator is no confused deputy: foreign Deployments, Secret contents, admin policy, operator DSN."""

from __future__ import annotations

import base64
import json
from typing import Any

from skiplock import AsyncQueue
from support.pg import await_for

from .conftest import NAMESPACE, CapturedLog, Cluster, jobqueue_spec, metric, running_operator
from .netfaults import Tarpit
from .test_conditions import closed_port_dsn, is_status

TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InNlY3JldC1rZXktaWQifQ.c2VydmljZS1hY2NvdW50LXRva2VuLWNvbnRlbnQ.c2lnbmF0dXJl"


def warnings_with(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events() if e.get("reason") == reason and e.get("type") == "Warning"]


def everything(cluster: Cluster, name: str, log: CapturedLog) -> str:
    return json.dumps([cluster.jobqueue(name), cluster.events()]) + log.text()


async def test_an_unrelated_deployment_of_the_same_name_is_never_touched(
    pg_dsn: str, schema: str, aqueue: AsyncQueue, cluster: Cluster, operator: Any
) -> None:
    billing = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "billing-worker", "labels": {"app": "billing"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "billing"}},
            "template": {
                "metadata": {"labels": {"app": "billing"}},
                "spec": {"containers": [{"name": "billing", "image": "example.com/billing:7"}]},
            },
        },
    }
    await cluster.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", billing)
    before = cluster.deployment("billing")
    assert before is not None
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("billing", jobqueue_spec("billing", schema))
    await aqueue.enqueue_many("billing", [{"n": i} for i in range(30)])

    await await_for(
        lambda: is_status(cluster, "billing", "Ready", "False", "DeploymentConflict"), what="DeploymentConflict"
    )
    await await_for(lambda: warnings_with(cluster, "DeploymentConflict"), what="a DeploymentConflict Warning")
    await await_for(  # the autoscaler polled the backlog, and still did not scale someone else's Deployment
        lambda: (
            metric(
                operator, "skiplock_queue_jobs", namespace=NAMESPACE, jobqueue="billing", queue="billing", state="ready"
            )
            == 30
        ),
        what="the backlog polled",
    )
    assert cluster.deployment("billing") == before, "the operator changed a Deployment it does not own"

    await cluster.delete_jobqueue("billing")
    await await_for(lambda: cluster.jobqueue("billing") is None, what="JobQueue finalized")
    assert cluster.deployment("billing") == before, "the operator deleted a Deployment it does not own"


async def test_a_deployment_replaced_before_the_delete_survives_it(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object
) -> None:
    """The delete carries the owned Deployment's UID as a precondition: the emulator refuses a mismatch."""
    await cluster.apply_secret("db", pg_dsn)
    await cluster.create_jobqueue("pre", jobqueue_spec("pre", schema, minReplicas=1))
    dep = await await_for(lambda: cluster.deployment("pre"), what="Deployment")
    url = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/pre-worker"
    async with cluster.emu.request(
        "DELETE", url, json={"preconditions": {"uid": "someone-else"}}, headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 409
    assert cluster.deployment("pre") == dep

    await cluster.delete_jobqueue("pre")
    await await_for(lambda: cluster.deployment("pre") is None, what="the owned Deployment deleted")
    deletes = [r for r in cluster.emu if r.method.value == "DELETE" and str(r.url).endswith("/deployments/pre-worker")]
    sent = [(r.data or {}).get("preconditions") for r in deletes[1:]]  # the first one is the test's own
    assert sent == [{"uid": dep["metadata"]["uid"]}], sent


async def test_a_secret_without_the_opt_in_label_is_not_used(
    pg_dsn: str, schema: str, cluster: Cluster, operator: object, captured_log: CapturedLog
) -> None:
    await cluster.apply_secret("db", pg_dsn.replace("postgres@", "postgres:not-opted-in-pw@"), opted_in=False)
    await cluster.create_jobqueue("optin", jobqueue_spec("optin", schema))
    await await_for(lambda: is_status(cluster, "optin", "Ready", "False", "SecretNotOptedIn"), what="SecretNotOptedIn")
    await await_for(lambda: warnings_with(cluster, "SecretNotOptedIn"), what="a SecretNotOptedIn Warning")
    assert cluster.deployment("optin") is None
    assert "not-opted-in-pw" not in everything(cluster, "optin", captured_log)

    await cluster.patch_secret_labels("db", {"skiplock.io/dsn": "true"})
    await await_for(lambda: is_status(cluster, "optin", "Ready", "True"), timeout=15, what="Ready once opted in")


async def test_a_service_account_token_as_dsn_leaks_nowhere(
    schema: str, cluster: Cluster, operator: object, captured_log: CapturedLog
) -> None:
    encoded = base64.b64encode(TOKEN.encode()).decode()
    for name, labels in (("sa-token", {}), ("sa-token-labelled", {"skiplock.io/dsn": "true"})):
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {"name": name, "labels": labels, "annotations": {"kubernetes.io/service-account.name": "x"}},
            "data": {"token": encoded},
        }
        await cluster.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", secret)
    await cluster.create_jobqueue(
        "steal", {**jobqueue_spec("steal", schema), "dsnSecretRef": {"name": "sa-token", "key": "token"}}
    )
    await cluster.create_jobqueue(
        "steal2", {**jobqueue_spec("steal2", schema), "dsnSecretRef": {"name": "sa-token-labelled", "key": "token"}}
    )
    await await_for(lambda: is_status(cluster, "steal", "Ready", "False", "SecretNotOptedIn"), what="not opted in")
    await await_for(lambda: is_status(cluster, "steal2", "Ready", "False", "DSNInvalid"), what="DSNInvalid")
    await await_for(lambda: warnings_with(cluster, "DSNInvalid"), what="a DSNInvalid Warning")
    assert any("steal2" in line for line in captured_log.lines), "the operator's log was not captured"
    text = everything(cluster, "steal", captured_log) + everything(cluster, "steal2", captured_log)
    for fragment in (TOKEN, TOKEN[:20], TOKEN.split(".")[1]):
        assert fragment not in text, "a Secret's value reached a status, an Event or a log line"


async def test_policy_violations_are_refused_with_an_event(pg_dsn: str, schema: str, cluster: Cluster) -> None:
    policy = {"allowed_images": ("registry.example.com/team-a/",), "allowed_service_accounts": ("worker",)}
    from skiplock_operator.config import Policy

    async with running_operator(cluster, config={"policy": Policy(**policy)}):  # type: ignore[arg-type]
        await cluster.apply_secret("db", pg_dsn)
        spec = {**jobqueue_spec("pol", schema), "serviceAccountName": "admin", "nodeSelector": {"gpu": "yes"}}
        await cluster.create_jobqueue("pol", spec)
        await await_for(lambda: is_status(cluster, "pol", "Ready", "False", "PolicyViolation"), what="PolicyViolation")
        message = cluster.condition("pol", "Ready")["message"]  # type: ignore[index]
        assert "spec.image" in message and "serviceAccountName" in message and "nodeSelector" in message
        await await_for(lambda: warnings_with(cluster, "PolicyViolation"), what="a PolicyViolation Warning")
        assert cluster.deployment("pol") is None

        fixed = {
            "image": "registry.example.com/team-a/worker:1",
            "serviceAccountName": "worker",
            "nodeSelector": None,
        }
        await cluster.patch_jobqueue("pol", {"spec": fixed})
        await await_for(lambda: is_status(cluster, "pol", "Ready", "True"), timeout=15, what="Ready once allowed")
        assert cluster.deployment("pol") is not None


async def test_the_secret_and_deployment_watches_ask_the_server_for_our_objects_only(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await await_for(lambda: watch_selectors(cluster), what="the watches")
        selectors = watch_selectors(cluster)
    assert selectors["secrets"] == {"skiplock.io/dsn=true"}, selectors
    assert selectors["deployments"] == {"app.kubernetes.io/managed-by=skiplock-operator"}, selectors


def watch_selectors(cluster: Cluster) -> dict[str, set[str]]:
    """The label selectors of the watch requests the operator sent, by resource."""
    out: dict[str, set[str]] = {}
    for request in list(cluster.emu):  # the request log
        if request.params.get("watch") == "true":
            plural = str(request.url.path).rstrip("/").rsplit("/", 1)[-1]
            out.setdefault(plural, set()).add(request.params.get("labelSelector", ""))
    return out if {"secrets", "deployments"} <= set(out) else {}


async def test_a_tightened_policy_scales_a_violating_deployment_to_zero(
    pg_dsn: str, schema: str, cluster: Cluster
) -> None:
    from skiplock_operator.config import Policy

    await cluster.apply_secret("db", pg_dsn)
    spec = {**jobqueue_spec("tight", schema, minReplicas=1), "env": [{"name": "PYTHONWARNINGS", "value": "x"}]}
    async with running_operator(cluster, config={"policy": Policy(denied_env_names=())}):  # loose: runs
        await cluster.create_jobqueue("tight", spec)
        await await_for(lambda: cluster.replicas("tight") == 1, what="1 replica under the loose policy")
    async with running_operator(cluster):  # the default policy denies PYTHON*: the operator restarts with it
        await await_for(lambda: is_status(cluster, "tight", "Ready", "False", "PolicyViolation"), what="refused")
        await await_for(lambda: cluster.replicas("tight") == 0, timeout=15, what="scaled to 0")
        await await_for(
            lambda: any("scaled to 0" in (e.get("message") or "") for e in warnings_with(cluster, "PolicyViolation")),
            what="a Warning saying so",
        )
        await cluster.patch_jobqueue("tight", {"spec": {"env": [{"name": "APP_MODE", "value": "x"}]}})
        await await_for(lambda: cluster.replicas("tight") == 1, timeout=15, what="back once allowed")


async def test_the_operator_dsn_is_never_given_to_workers(
    pg_dsn: str, fresh_schema: str, cluster: Cluster, operator: object
) -> None:
    await cluster.apply_secret("owner-db", pg_dsn)  # the workers' Secret need not even exist for the operator
    spec = {**jobqueue_spec("split", fresh_schema, minReplicas=1), "dsnSecretRef": {"name": "worker-db"}}
    spec["operatorDsnSecretRef"] = {"name": "owner-db"}
    await cluster.create_jobqueue("split", spec)
    await await_for(lambda: is_status(cluster, "split", "SchemaReady", "True"), what="migrated with the owner DSN")
    dep = await await_for(lambda: cluster.deployment("split"), what="Deployment")
    refs = json.dumps(dep["spec"]["template"])
    assert '"worker-db"' in refs and "owner-db" not in refs


async def test_a_host_outside_the_allow_list_is_never_dialled(schema: str, cluster: Cluster) -> None:
    from skiplock_operator.config import Policy

    async with (
        Tarpit() as tarpit,
        running_operator(cluster, config={"policy": Policy(allowed_dsn_hosts=(".db.internal",))}),
    ):
        await cluster.apply_secret("refused", closed_port_dsn())
        await cluster.apply_secret("tarpit", tarpit.dsn())
        for name in ("refused", "tarpit"):
            await cluster.create_jobqueue(name, {**jobqueue_spec(name, schema), "dsnSecretRef": {"name": name}})
        for name in ("refused", "tarpit"):
            await await_for(lambda n=name: is_status(cluster, n, "Ready", "False", "HostNotAllowed"), what=name)  # type: ignore[misc]
        same = [cluster.condition(n, "DatabaseReachable") for n in ("refused", "tarpit")]
        assert [(c or {}).get("reason") for c in same] == ["HostNotAllowed", "HostNotAllowed"]
        messages = {(c or {}).get("message") for c in same}
        assert len(messages) == 1, "the status tells a refused port from a tarpit"
        assert tarpit.accepted == 0, "the operator connected to a host outside its allow-list"


async def test_a_worker_without_resources_gets_the_admins_default_and_its_own_otherwise(
    pg_dsn: str, schema: str, cluster: Cluster
) -> None:
    default = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    own = {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}
    async with running_operator(cluster, config={"default_worker_resources": default}):
        await cluster.apply_secret("db", pg_dsn)
        await cluster.create_jobqueue("plain", jobqueue_spec("plain", schema))
        await cluster.create_jobqueue("sized", {**jobqueue_spec("sized", schema), "resources": own})
        plain = await await_for(lambda: cluster.deployment("plain"), what="Deployment without resources")
        sized = await await_for(lambda: cluster.deployment("sized"), what="Deployment with resources")
    assert plain["spec"]["template"]["spec"]["containers"][0]["resources"] == default
    assert sized["spec"]["template"]["spec"]["containers"][0]["resources"] == own
