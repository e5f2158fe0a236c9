"""Parsing of task limits (``rate_limit="100/m"``, ``global_concurrency=N``) and their registration parameters."""

from __future__ import annotations

import pytest

from skiplock import App
from skiplock.errors import ConfigError
from skiplock.limits import RateLimit, TaskLimits, changed, parse_rate_limit, register_params


@pytest.mark.parametrize(
    ("text", "count", "seconds"),
    [("100/m", 100, 60.0), ("5/s", 5, 1.0), ("1000/h", 1000, 3600.0), ("10/d", 10, 86400.0),
     ("3/10s", 3, 10.0), (" 50 / 15m ", 50, 900.0), ("1/1s", 1, 1.0)],
)  # fmt: skip
def test_rate_limits_parse(text: str, count: int, seconds: float) -> None:
    assert parse_rate_limit(text) == RateLimit(count, seconds)


@pytest.mark.parametrize(
    "bad", ["", "100", "100/", "/m", "100/x", "0/m", "-1/m", "1.5/m", "100/0s", "100/m/s", "10001/s", 100, None, "5/ms"]
)
def test_bad_rate_limits_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError, match="rate_limit"):
        parse_rate_limit(bad)


@pytest.mark.parametrize("bad", [0, -1, 1001, 2.5, True, "3"])
def test_bad_global_concurrency_is_a_config_error_at_registration(bad: object) -> None:
    app = App()
    with pytest.raises(ConfigError, match="global_concurrency"):
        app.task(name="t", global_concurrency=bad)(lambda job: None)


def test_a_task_carries_its_limits_and_a_bad_rate_fails_at_definition() -> None:
    app = App()

    @app.task(name="api.call", global_concurrency=4, rate_limit="100/m")
    def call(job: object) -> None: ...

    @app.task(name="plain")
    def plain(job: object) -> None: ...

    assert call.limits == TaskLimits("api.call", 4, RateLimit(100, 60.0))
    assert not plain.limits.limited
    with pytest.raises(ConfigError, match="rate_limit '100 per minute'"):
        app.task(name="bad", rate_limit="100 per minute")(lambda job: None)
    with pytest.raises(ConfigError, match="serial_skip_on_retry"):
        app.task(name="bad2", serial_skip_on_retry="yes")(lambda job: None)


def test_registration_parameters_are_sorted_by_task() -> None:
    params = register_params([TaskLimits("b", 2), TaskLimits("a", None, RateLimit(5, 1.0))], "w1")
    assert params == {
        "tasks": ["a", "b"],
        "concurrency": [None, 2],
        "rate": [5, None],
        "period": [1.0, None],
        "worker": "w1",
    }


def test_changed_only_when_another_registration_differs() -> None:
    row = {"concurrency": 2, "rate": None, "period": None, "was_present": True, "was_concurrency": 2,
           "was_rate": None, "was_period": None}  # fmt: skip
    assert not changed(row)
    assert changed(row | {"was_concurrency": 3})
    assert not changed(row | {"was_present": False, "was_concurrency": None})


def test_the_operator_exports_jobs_waiting_by_reason_and_drops_them_with_the_queue() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from skiplock import QueueStats
    from skiplock_operator.metrics import OperatorMetrics

    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    row = QueueStats("a", 9, 0, 1, 0, 0, 1.0, waiting_serial_key=4, waiting_concurrency=2, waiting_rate=3)
    metrics.observe_queues("ns", "jq", {"a": row})
    text = generate_latest(registry).decode()
    for reason, value in (("serial_key", 4), ("concurrency", 2), ("rate", 3)):
        line = f'skiplock_queue_jobs_waiting{{jobqueue="jq",namespace="ns",queue="a",reason="{reason}"}} {value}.0'
        assert line in text
    metrics.forget("ns", "jq")
    assert "skiplock_queue_jobs_waiting{" not in generate_latest(registry).decode()
