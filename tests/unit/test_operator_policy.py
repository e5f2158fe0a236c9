"""Pure parts of the operator's security: admin policy, DSN host allow-list, error classes, budget."""

from __future__ import annotations

import psycopg
import pytest

from skiplock_operator.config import OperatorConfig, Policy, policy_from_env
from skiplock_operator.database import (
    MESSAGES,
    DatabaseProblem,
    budget_from_limits,
    check_dsn,
    classify,
    dsn_hosts,
    host_allowed,
)
from skiplock_operator.spec import parse_spec, policy_violations

BASE = {"queue": "q", "handler": "a.b:c", "image": "registry.example.com/team-a/w:1", "dsnSecretRef": {"name": "db"}}


def test_policy_comes_from_env() -> None:
    env = {
        "SKIPLOCK_OPERATOR_ALLOWED_IMAGES": "registry.example.com/team-a/, ghcr.io/org/",
        "SKIPLOCK_OPERATOR_ALLOWED_SERVICE_ACCOUNTS": "worker",
        "SKIPLOCK_OPERATOR_ALLOWED_ANNOTATION_KEYS": "prometheus.io/,team",
        "SKIPLOCK_OPERATOR_ALLOW_SCHEDULING": "true",
        "SKIPLOCK_OPERATOR_ALLOWED_DSN_HOSTS": ".db.internal,10.0.0.0/8",
    }
    policy = OperatorConfig.from_env(env).policy
    assert policy == Policy(
        allowed_images=("registry.example.com/team-a/", "ghcr.io/org/"),
        allowed_service_accounts=("worker",),
        allowed_pod_annotations=("prometheus.io/", "team"),
        allow_scheduling=True,
        allowed_dsn_hosts=(".db.internal", "10.0.0.0/8"),
    )
    assert OperatorConfig.from_env({}).policy == Policy()
    assert OperatorConfig.from_env({}).watch_secrets and OperatorConfig.from_env({}).watch_deployments
    quiet = OperatorConfig.from_env(
        {"SKIPLOCK_OPERATOR_WATCH_SECRETS": "false", "SKIPLOCK_OPERATOR_WATCH_DEPLOYMENTS": "no"}
    )
    assert not quiet.watch_secrets and not quiet.watch_deployments
    with pytest.raises(ValueError, match="ALLOW_SCHEDULING"):
        policy_from_env({"SKIPLOCK_OPERATOR_ALLOW_SCHEDULING": "maybe"})


def test_the_default_policy_allows_images_but_not_scheduling_fields() -> None:
    assert policy_violations(parse_spec(BASE), Policy()) == []
    spec = parse_spec({**BASE, "tolerations": [{"key": "gpu", "operator": "Exists"}], "affinity": {"x": {}}})
    assert policy_violations(spec, Policy()) == [
        "spec.tolerations is not allowed by the operator's policy",
        "spec.affinity is not allowed by the operator's policy",
    ]
    assert policy_violations(spec, Policy(allow_scheduling=True)) == []


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (
            {"image": "docker.io/evil/miner:1"},
            "spec.image 'docker.io/evil/miner:1' is not under an allowed image prefix",
        ),
        ({"serviceAccountName": "cluster-admin"}, "spec.serviceAccountName 'cluster-admin' is not allowed"),
        ({"podAnnotations": {"sidecar.istio.io/inject": "false"}}, "spec.podAnnotations key 'sidecar.istio.io/inject'"),
    ],
)
def test_allow_lists(change: dict[str, object], found: str) -> None:
    policy = Policy(
        allowed_images=("registry.example.com/team-a/",),
        allowed_service_accounts=("worker",),
        allowed_pod_annotations=("prometheus.io/", "team*"),
    )
    ok = {**BASE, "serviceAccountName": "worker", "podAnnotations": {"prometheus.io/port": "1", "team-x": "y"}}
    assert policy_violations(parse_spec(ok), policy) == []
    problems = policy_violations(parse_spec({**ok, **change}), policy)
    assert len(problems) == 1 and problems[0].startswith(found)


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("pg.db.internal", True),
        ("db.internal", False),  # a suffix rule needs a name under it
        ("pg.db.internal.evil.com", False),
        ("10.1.2.3", True),
        ("192.168.1.1", False),
        ("exact.example", True),
        ("/var/run/postgresql", False),
    ],
)
def test_host_rules(host: str, allowed: bool) -> None:
    assert host_allowed(host, (".db.internal", "10.0.0.0/8", "exact.example")) is allowed


def test_dsn_checks_name_every_host_and_never_echo_the_dsn() -> None:
    assert dsn_hosts("postgresql://u:p@a.db.internal,b.db.internal:5433/x") == ("a.db.internal", "b.db.internal")
    check_dsn("postgresql://u:p@a.db.internal/x", (".db.internal",))
    check_dsn("host=anything dbname=x", ())  # no allow-list: any host
    for dsn in ("postgresql://u:p@a.db.internal,127.0.0.1/x", "dbname=x", "host=/tmp dbname=x"):
        with pytest.raises(DatabaseProblem) as info:
            check_dsn(dsn, (".db.internal",))
        assert info.value.reason == "HostNotAllowed"
    with pytest.raises(DatabaseProblem) as info:
        check_dsn("eyJhbGciOi.secret-token-text", ())
    assert info.value.reason == "DSNInvalid" and "secret-token-text" not in str(info.value)


@pytest.mark.parametrize(
    ("exc", "connecting", "reason"),
    [
        (TimeoutError(), True, "ConnectTimeout"),
        (TimeoutError(), False, "QueryTimeout"),
        (psycopg.OperationalError('connection to server at "h" failed: Connection refused'), True, "ConnectRefused"),
        (psycopg.OperationalError("connection timeout expired"), True, "ConnectTimeout"),
        (psycopg.OperationalError('FATAL:  password authentication failed for user "u"'), True, "AuthFailed"),
        (psycopg.OperationalError('FATAL:  role "nobody" does not exist'), True, "AuthFailed"),
        (psycopg.OperationalError('FATAL:  database "nope" does not exist'), True, "DatabaseMissing"),
        (psycopg.OperationalError('could not translate host name "x" to address'), True, "HostUnknown"),
        (psycopg.ProgrammingError('missing "=" after "my-secret" in connection info string'), True, "DSNInvalid"),
        (psycopg.OperationalError("server closed the connection unexpectedly"), False, "ConnectionLost"),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False, "QueryTimeout"),
        (psycopg.DataError("bad"), False, "QueryFailed"),
        (psycopg.OperationalError("something new"), True, "ConnectFailed"),
    ],
)
def test_errors_are_classified_and_the_message_is_fixed(exc: BaseException, connecting: bool, reason: str) -> None:
    assert classify(exc, connecting=connecting) == reason
    assert str(DatabaseProblem(reason)) == MESSAGES[reason]


def test_the_default_budget_is_80_percent_of_max_connections_minus_the_reserved() -> None:
    assert budget_from_limits(100, 3) == 77
    assert budget_from_limits(500, 10) == 390
    assert budget_from_limits(2, 3) == 0


def test_default_worker_resources_come_from_json_and_a_bad_value_is_refused():
    import pytest

    from skiplock_operator.config import OperatorConfig

    env = {"SKIPLOCK_OPERATOR_DEFAULT_WORKER_RESOURCES": '{"requests": {"cpu": "50m"}}'}
    assert OperatorConfig.from_env(env).default_worker_resources == {"requests": {"cpu": "50m"}}
    with pytest.raises(ValueError, match="JSON object"):
        OperatorConfig.from_env({"SKIPLOCK_OPERATOR_DEFAULT_WORKER_RESOURCES": "[1]"})


# ------------------------------------------------------------------ issue 37 item 4: the allow-lists' side doors
def violations(policy: Policy, **change: object) -> list[str]:
    return policy_violations(parse_spec({**BASE, **change}), policy)


@pytest.mark.parametrize(
    "name", ["PYTHONWARNINGS", "PYTHONPATH", "PYTHONSTARTUP", "BROWSER", "LD_PRELOAD", "LD_LIBRARY_PATH"]
)
def test_env_names_that_run_code_are_denied_by_default(name: str) -> None:
    problems = violations(Policy(), env=[{"name": name, "value": "x"}])
    assert problems == [f"spec.env name {name!r} is not allowed by the operator's policy"]


def test_env_names_allow_list_and_an_exact_entry_lifts_a_denial() -> None:
    policy = Policy(allowed_env_names=("APP_*", "PYTHONUNBUFFERED"))
    assert violations(Policy(), env=[{"name": "THUMBNAIL_BUCKET", "value": "b"}]) == []
    assert (
        violations(policy, env=[{"name": "APP_MODE", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]) == []
    )
    assert violations(policy, env=[{"name": "OTHER", "value": "1"}]) == [
        "spec.env name 'OTHER' is not allowed by the operator's policy"
    ]
    assert violations(Policy(allowed_env_names=("PYTHON*",)), env=[{"name": "PYTHONWARNINGS", "value": "x"}])
    assert violations(Policy(denied_env_names=()), env=[{"name": "PYTHONWARNINGS", "value": "x"}]) == []
    env = {"SKIPLOCK_OPERATOR_DENIED_ENV_NAMES": "", "SKIPLOCK_OPERATOR_ALLOWED_ENV_NAMES": "APP_*"}
    assert policy_from_env(env).denied_env_names == ()
    assert policy_from_env({}).denied_env_names == ("PYTHON*", "LD_*", "BROWSER")


def test_secret_refs_label_keys_and_pull_secrets_have_allow_lists() -> None:
    policy = Policy(
        allowed_secrets=("db", "app-*"),
        allowed_pod_label_keys=("team", "example.com/"),
        allowed_image_pull_secrets=("registry-credentials",),
    )
    ref = {"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "app-s3", "key": "k"}}}
    good = {
        "env": [ref, {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "podLabels": {"team": "a", "example.com/cost": "b"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
    }
    assert violations(policy, **good) == []
    other = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "operator-token", "key": "token"}}}
    assert violations(policy, env=[ref, other]) == [
        "spec.env TOKEN names Secret 'operator-token', which is not allowed"
    ]
    assert violations(policy, dsnSecretRef={"name": "admin-db"}) == [
        "spec.dsnSecretRef names Secret 'admin-db', which is not allowed"
    ]
    assert violations(policy, podLabels={"sidecar.istio.io/inject": "true"}) == [
        "spec.podLabels key 'sidecar.istio.io/inject' is not allowed"
    ]
    assert violations(policy, imagePullSecrets=[{"name": "other-registry"}]) == [
        "spec.imagePullSecrets 'other-registry' is not allowed"
    ]
    env = {
        "SKIPLOCK_OPERATOR_ALLOWED_SECRETS": "db,app-*",
        "SKIPLOCK_OPERATOR_ALLOWED_POD_LABEL_KEYS": "team,example.com/",
        "SKIPLOCK_OPERATOR_ALLOWED_IMAGE_PULL_SECRETS": "registry-credentials",
    }
    assert policy_from_env(env) == policy


@pytest.mark.parametrize(
    ("image", "prefix", "allowed"),
    [
        ("registry.example.com/team-a/w:1", "registry.example.com/team-a", True),
        ("registry.example.com/team-a-evil/w:1", "registry.example.com/team-a", False),
        ("registry.example.com/team-a/w:1", "registry.example.com/team-a/", True),
        ("registry.example.com/team-ab/w:1", "registry.example.com/team-a/", False),
        ("registry.example.com/team-a/w:1", "registry.example.com/team-a/w", True),
        ("registry.example.com/team-a/w@sha256:" + "a" * 64, "registry.example.com/team-a/w", True),
        ("registry.example.com/team-a/worker:1", "registry.example.com/team-a/w", False),
        ("registry.example.com/x", "registry.example.com", True),
        ("registry.example.com:5000/x", "registry.example.com", False),
        ("registry.example.com.evil.io/x", "registry.example.com", False),
    ],
)
def test_an_image_prefix_matches_whole_path_segments(image: str, prefix: str, allowed: bool) -> None:
    assert (violations(Policy(allowed_images=(prefix,)), image=image) == []) is allowed
