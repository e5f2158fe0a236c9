"""A JobQueue's ``spec`` as typed, validated values (pure; the CRD repeats these defaults and bounds).

The API server applies the CRD's defaults and rules; this module applies them again, so the operator is
correct against a server that skipped them (an old CRD, an emulator) and a unit test keeps both in step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skiplock import ConfigError
from skiplock.knobs import KNOBS, Knob, crd_bounds, crd_choices, crd_default, knob
from skiplock.settings import Settings
from skiplock_operator.config import Policy
from skiplock_operator.scaling import WORKER_CONNECTION_OVERHEAD, ScalingSpec

METRICS_PORT = 9464
RESERVED_ENV = re.compile(r"^(SKIPLOCK_|POD_(NAME|NAMESPACE|UID)$)")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
SELECTOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance")


class InvalidSpecError(ValueError):
    """The spec cannot be run as written; the message says which field and why (no retry helps)."""


@dataclass(frozen=True)
class JobQueueSpec:
    queue: str
    handler: str | None
    image: str
    dsn_secret_name: str
    dsn_secret_key: str = "dsn"
    app: str | None = None
    queues: tuple[str, ...] = ()
    operator_dsn_secret_name: str | None = None
    """The DSN the operator uses (migrate, stats, LISTEN); workers only ever get ``dsnSecretRef``."""
    operator_dsn_secret_key: str = "dsn"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    schema: str = crd_default(knob("schema"))
    concurrency: int = knob("concurrency").default
    batch: int = knob("batch").default
    prefetch: int = knob("prefetch").default
    lease_seconds: float = knob("lease_seconds").default
    heartbeat_seconds: float | None = None
    poll_seconds: float = knob("poll_seconds").default
    recover_seconds: float | None = None
    max_attempts: int = knob("max_attempts").default
    backoff_base_seconds: float = knob("backoff_base_seconds").default
    backoff_cap_seconds: float = knob("backoff_cap_seconds").default
    backoff_jitter: float = knob("backoff_jitter").default
    shutdown_grace_seconds: float = knob("shutdown_grace_seconds").default
    listen: bool = crd_default(knob("listen"))
    event_loop: str = crd_default(knob("event_loop"))
    log_format: str = crd_default(knob("log_format"))
    log_level: str = crd_default(knob("log_level"))
    replicas: int | None = None
    paused: bool = False
    retain_done_seconds: float = knob("retain_done_seconds").default
    retain_failed_seconds: float = knob("retain_failed_seconds").default
    retain_cancelled_seconds: float = knob("retain_cancelled_seconds").default
    purge_interval_seconds: float = knob("purge_interval_seconds").default
    """How often the operator runs the scheduled purge of the schema (0: never); its workers never do."""
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    resources: Mapping[str, Any] = field(default_factory=dict)
    env: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    service_account_name: str | None = None
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def served_queues(self) -> tuple[str, ...]:
        """The queues the workers serve, hence the ones the operator polls and reports."""
        return self.queues or (self.queue,)

    @property
    def operator_secret(self) -> tuple[str, str]:
        """(name, key) of the Secret with the operator's DSN (default: the workers' one)."""
        if self.operator_dsn_secret_name:
            return self.operator_dsn_secret_name, self.operator_dsn_secret_key
        return self.dsn_secret_name, self.dsn_secret_key

    @property
    def manual(self) -> bool:
        """``spec.replicas`` is set (``kubectl scale``): the replicas are the user's, autoscaling is off."""
        return self.replicas is not None

    def worker_settings(self) -> Settings:
        """The worker's settings (no DSN: it comes from the Secret); raises InvalidSpecError."""
        try:
            return Settings(
                dsn=None,
                schema=self.schema,
                queue=self.queue,
                queues=self.queues,
                app=self.app,
                handler=self.handler,
                concurrency=self.concurrency,
                batch=self.batch,
                prefetch=self.prefetch,
                lease_seconds=self.lease_seconds,
                heartbeat_seconds=self.heartbeat_seconds,
                poll_seconds=self.poll_seconds,
                recover_seconds=self.recover_seconds,
                backoff_base_seconds=self.backoff_base_seconds,
                backoff_cap_seconds=self.backoff_cap_seconds,
                backoff_jitter=self.backoff_jitter,
                max_attempts=self.max_attempts,
                shutdown_grace_seconds=self.shutdown_grace_seconds,
                retain_done_seconds=self.retain_done_seconds,
                retain_failed_seconds=self.retain_failed_seconds,
                retain_cancelled_seconds=self.retain_cancelled_seconds,
                purge_interval_seconds=0.0,  # the operator purges (at zero replicas too, with the owner role)
                metrics_port=METRICS_PORT,
                listen=self.listen,
                event_loop=self.event_loop,
                log_format=self.log_format,  # type: ignore[arg-type]
                log_level=self.log_level,
                worker_id="rendered-by-operator",
            )
        except ConfigError as exc:
            raise InvalidSpecError(settings_error(str(exc))) from None

    def worker_env(self) -> dict[str, str]:
        return self.worker_settings().to_env()


def _plain(x: float) -> str:
    """A bound as written in the CRD: 315360000, not 3.1536e+08."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class _Reader:
    """Typed access to one mapping, naming the full path in every error."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise InvalidSpecError(f"{path} must be an object")
        self.data, self.path = data, path

    def _value(self, key: str, default: Any, required: bool) -> Any:
        value = self.data.get(key)
        if value is None:
            if required:
                raise InvalidSpecError(f"{self.path}.{key} is required")
            return default
        return value

    def text(
        self, key: str, default: str | None = None, *, required: bool = False, choices: tuple[str, ...] = ()
    ) -> Any:
        value = self._value(key, default, required)
        if value is None:
            return None
        if not isinstance(value, str) or (required and not value):
            raise InvalidSpecError(f"{self.path}.{key} must be a non-empty string")
        if choices and value not in choices:
            raise InvalidSpecError(f"{self.path}.{key} must be one of {', '.join(choices)} (got {value!r})")
        return value

    def integer(self, key: str, default: int | None, low: int, high: int) -> Any:
        value = self._value(key, default, False)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise InvalidSpecError(f"{self.path}.{key} must be an integer")
        if not low <= value <= high:
            raise InvalidSpecError(f"{self.path}.{key} must be within {low}..{high} (got {value})")
        return int(value)

    def number(self, key: str, default: float, low: float, high: float) -> float:
        value = self._value(key, default, False)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidSpecError(f"{self.path}.{key} must be a number")
        if not low <= value <= high:
            raise InvalidSpecError(f"{self.path}.{key} must be within {_plain(low)}..{_plain(high)} (got {value})")
        return float(value)

    def optional_number(self, key: str, low: float, high: float) -> float | None:
        return None if self.data.get(key) is None else self.number(key, 0.0, low, high)

    def names(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise InvalidSpecError(f"{self.path}.{key} must be a list of non-empty strings")
        return tuple(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._value(key, default, False)
        if not isinstance(value, bool):
            raise InvalidSpecError(f"{self.path}.{key} must be true or false")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        return dict(_Reader(self.data.get(key), f"{self.path}.{key}").data)

    def strings(self, key: str) -> dict[str, str]:
        value = self.mapping(key)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise InvalidSpecError(f"{self.path}.{key} must map strings to strings")
        return value

    def objects(self, key: str) -> tuple[Mapping[str, Any], ...]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            raise InvalidSpecError(f"{self.path}.{key} must be a list of objects")
        return tuple(value)

    def child(self, key: str) -> _Reader:
        return _Reader(self.data.get(key), f"{self.path}.{key}")


SPEC_KNOBS = tuple(k for k in KNOBS if k.crd and k.name not in ("queue", "queues", "app", "handler"))
"""The worker settings read generically (``queue``, ``queues``, ``app`` and ``handler`` relate: read by hand)."""


def knob_value(r: _Reader, k: Knob, *, required: bool = False) -> Any:
    """One worker setting at ``spec.<k.crd>``: the knob's type, the CRD's bounds, choices and default."""
    *parents, leaf = (k.crd or "").split(".")
    for parent in parents:
        r = r.child(parent)
    default = crd_default(k)
    if k.type is bool:
        return r.flag(leaf, default)
    if k.type is str:
        return r.text(leaf, default, required=required, choices=crd_choices(k))
    if k.type is tuple:
        return r.names(leaf)
    low, high = crd_bounds(k)
    if k.type is int:
        return r.integer(leaf, default, int(low if low is not None else -(2**63)), int(high or 2**63))
    lower = -math.inf if low is None else low
    upper = math.inf if high is None else high
    if default is None:
        return r.optional_number(leaf, lower, upper)
    return r.number(leaf, default, lower, upper)


def settings_error(message: str) -> str:
    """A ``Settings`` error in the JobQueue's words: each setting name becomes its ``spec.<field>`` (a problem
    starts with its setting's name; a second one, in a rule relating two, has an underscore)."""
    for k in sorted(KNOBS, key=lambda x: -len(x.name)):
        if k.crd:
            where = rf"\b{k.name}\b" if "_" in k.name else rf"(?:^|(?<=; )|(?<=: )){k.name}\b"
            message = re.sub(where, f"spec.{k.crd}", message)
    return message.removeprefix("invalid settings: ")


def parse_scaling(r: _Reader) -> ScalingSpec:
    d = ScalingSpec()
    s = ScalingSpec(
        enabled=r.flag("enabled", d.enabled),
        min_replicas=r.integer("minReplicas", d.min_replicas, 0, 1000),
        max_replicas=r.integer("maxReplicas", d.max_replicas, 0, 1000),
        target_backlog_per_replica=r.integer("targetBacklogPerReplica", d.target_backlog_per_replica, 1, 1_000_000),
        activation_backlog=r.integer("activationBacklog", d.activation_backlog, 1, 1_000_000),
        max_oldest_ready_age_seconds=r.number("maxOldestReadyAgeSeconds", d.max_oldest_ready_age_seconds, 0, 86400),
        scale_down_stabilization_seconds=r.number(
            "scaleDownStabilizationSeconds", d.scale_down_stabilization_seconds, 0, 3600
        ),
        polling_interval_seconds=r.number("pollingIntervalSeconds", d.polling_interval_seconds, 0.1, 300),
        connection_budget=r.integer("connectionBudget", d.connection_budget, 0, 100_000),
        scale_in_drain_seconds=r.number("scaleInDrainSeconds", d.scale_in_drain_seconds, 0, 86400),
        target_wait_seconds=r.number("targetWaitSeconds", d.target_wait_seconds, 0, 86400),
        pod_startup_seconds=r.number("podStartupSeconds", d.pod_startup_seconds, 0, 3600),
    )
    if s.min_replicas > s.max_replicas:
        raise InvalidSpecError(
            f"spec.scaling.minReplicas ({s.min_replicas}) must not exceed spec.scaling.maxReplicas ({s.max_replicas})"
        )
    return s


def parse_spec(spec: Mapping[str, Any] | None) -> JobQueueSpec:
    """Defaults applied, bounds and cross-field rules checked; raises InvalidSpecError."""
    r = _Reader(spec, "spec")
    d = JobQueueSpec(queue="", handler="", image="", dsn_secret_name="")
    secret = r.child("dsnSecretRef")
    operator_secret = r.child("operatorDsnSecretRef")
    queues = knob_value(r, knob("queues"))
    handler, app = knob_value(r, knob("handler")), knob_value(r, knob("app"))
    if not handler and not app:
        raise InvalidSpecError("spec.handler or spec.app is required")
    parsed = JobQueueSpec(
        queue=knob_value(r, knob("queue"), required=not queues) or queues[0],
        handler=handler,
        app=app,
        queues=queues,
        image=r.text("image", required=True),
        dsn_secret_name=secret.text("name", required=True),
        dsn_secret_key=secret.text("key", d.dsn_secret_key),
        operator_dsn_secret_name=operator_secret.text("name", required=bool(operator_secret.data)),
        operator_dsn_secret_key=operator_secret.text("key", d.operator_dsn_secret_key),
        image_pull_policy=r.text("imagePullPolicy", d.image_pull_policy, choices=PULL_POLICIES),
        image_pull_secrets=tuple(
            _Reader(s, "spec.imagePullSecrets[]").text("name", required=True) for s in r.objects("imagePullSecrets")
        ),
        replicas=r.integer("replicas", None, 0, 1000),
        paused=r.flag("paused", d.paused),
        **{k.name: knob_value(r, k) for k in SPEC_KNOBS},
        scaling=parse_scaling(r.child("scaling")),
        resources=r.mapping("resources"),
        env=r.objects("env"),
        node_selector=r.strings("nodeSelector"),
        tolerations=r.objects("tolerations"),
        affinity=r.mapping("affinity"),
        service_account_name=r.text("serviceAccountName"),
        pod_labels=r.strings("podLabels"),
        pod_annotations=r.strings("podAnnotations"),
    )
    check_cross_fields(parsed)
    parsed.worker_settings()  # the worker's own validation (heartbeat vs lease, handler shape, ...)
    return parsed


def check_cross_fields(s: JobQueueSpec) -> None:
    """The JobQueue's own rules; the worker settings' rules are Settings's (JobQueueSpec.worker_settings)."""
    budget = s.scaling.connection_budget
    if budget and budget < s.concurrency + WORKER_CONNECTION_OVERHEAD:
        raise InvalidSpecError(
            f"spec.scaling.connectionBudget ({budget}) cannot hold one worker "
            f"(concurrency + {WORKER_CONNECTION_OVERHEAD} = "
            f"{s.concurrency + WORKER_CONNECTION_OVERHEAD} connections)"
        )
    for item in s.env:
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidSpecError("spec.env[].name is required")
        if RESERVED_ENV.match(name):
            raise InvalidSpecError(f"spec.env sets {name}, which the operator owns: use the matching spec field")
    for key in SELECTOR_LABELS:
        if key in s.pod_labels:
            raise InvalidSpecError(f"spec.podLabels must not set {key} (the Deployment selector uses it)")


def policy_violations(s: JobQueueSpec, policy: Policy) -> list[str]:
    """What in ``s`` the admin's policy forbids (empty: allowed). Messages name the field, not a secret."""
    out: list[str] = []
    if policy.allowed_images and not any(image_allowed(s.image, prefix) for prefix in policy.allowed_images):
        out.append(f"spec.image {s.image!r} is not under an allowed image prefix")
    if (
        s.service_account_name
        and policy.allowed_service_accounts
        and s.service_account_name not in policy.allowed_service_accounts
    ):
        out.append(f"spec.serviceAccountName {s.service_account_name!r} is not allowed")
    for field_name, keys, rules in (
        ("podAnnotations", s.pod_annotations, policy.allowed_pod_annotations),
        ("podLabels", s.pod_labels, policy.allowed_pod_label_keys),
    ):
        if rules:
            out.extend(
                f"spec.{field_name} key {key!r} is not allowed"
                for key in sorted(keys)
                if not any(_key_allowed(key, rule) for rule in rules)
            )
    for item in s.env:
        name = str(item.get("name"))
        if not env_name_allowed(name, policy):
            out.append(f"spec.env name {name!r} is not allowed by the operator's policy")
    if policy.allowed_secrets:
        for where, secret in secret_refs(s):
            if not any(_key_allowed(secret, rule) for rule in policy.allowed_secrets):
                out.append(f"{where} names Secret {secret!r}, which is not allowed")
    if policy.allowed_image_pull_secrets:
        out.extend(
            f"spec.imagePullSecrets {name!r} is not allowed"
            for name in s.image_pull_secrets
            if not any(_key_allowed(name, rule) for rule in policy.allowed_image_pull_secrets)
        )
    if not policy.allow_scheduling:
        for name, value in (
            ("nodeSelector", s.node_selector),
            ("tolerations", s.tolerations),
            ("affinity", s.affinity),
        ):
            if value:
                out.append(f"spec.{name} is not allowed by the operator's policy")
    return out


def image_allowed(image: str, prefix: str) -> bool:
    """Whether ``image`` is under ``prefix`` on whole path segments: ``ghcr.io/acme`` allows ``ghcr.io/acme/app``
    but not ``ghcr.io/acme-evil/app``; a prefix naming a repository (with a ``/``) also allows its tags and
    digests (``ghcr.io/acme/app:1``, ``ghcr.io/acme/app@sha256:...``)."""
    if prefix.endswith("/"):
        return image.startswith(prefix)
    bounds = ("/", ":", "@") if "/" in prefix else ("/",)
    return image == prefix or any(image.startswith(prefix + bound) for bound in bounds)


def env_name_allowed(name: str, policy: Policy) -> bool:
    """Denied names (``PYTHON*``, ``LD_*``, ``BROWSER`` by default) pass only when allowed by exact name."""
    if name in policy.allowed_env_names:
        return True
    if any(_key_allowed(name, rule) for rule in policy.denied_env_names):
        return False
    return not policy.allowed_env_names or any(_key_allowed(name, rule) for rule in policy.allowed_env_names)


def secret_refs(s: JobQueueSpec) -> list[tuple[str, str]]:
    """(field, Secret name) of every Secret the worker pods get: the DSN Secret and each env secretKeyRef."""
    refs = [("spec.dsnSecretRef", s.dsn_secret_name)]
    for item in s.env:
        value_from = item.get("valueFrom")
        ref = value_from.get("secretKeyRef") if isinstance(value_from, Mapping) else None
        if isinstance(ref, Mapping):
            refs.append((f"spec.env {item.get('name')!s}", str(ref.get("name"))))
    return refs


def _key_allowed(key: str, rule: str) -> bool:
    if rule.endswith("*"):
        return key.startswith(rule[:-1])
    if rule.endswith("/"):
        return key.startswith(rule)
    return key == rule
