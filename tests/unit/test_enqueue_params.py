import json
import threading
from typing import Any

import pytest

from skiplock import Settings
from skiplock.errors import EnqueueError, PayloadError
from skiplock.store.statements import Statements
from skiplock.store.validation import (
    _JSON,
    ENQUEUE_MANY_OPTIONS,
    ENQUEUE_OPTIONS,
    _common_params,
    default_params,
    encode_payload,
    enqueue_params,
)

SETTINGS = Settings(schema="t", max_attempts=7)
DEFAULTS_GIVEN = {"delay": 0, "priority": 0, "serial_key": None, "task": None, "run_at": None}


def test_an_enqueue_without_options_gets_the_parameters_its_defaults_given_explicitly_get():
    assert enqueue_params(SETTINGS, "q", {"a": 1}, {}) == enqueue_params(SETTINGS, "q", {"a": 1}, DEFAULTS_GIVEN)
    for known in (ENQUEUE_OPTIONS, ENQUEUE_MANY_OPTIONS):
        assert _common_params(SETTINGS, "q", {}, known) == _common_params(SETTINGS, "q", DEFAULTS_GIVEN, known)


def test_an_enqueue_without_options_still_checks_its_queue_name():
    with pytest.raises(EnqueueError, match="queue name"):
        enqueue_params(SETTINGS, "no spaces allowed", {}, {})
    with pytest.raises(EnqueueError, match="queue name"):
        enqueue_params(SETTINGS, "no spaces allowed", {}, {}, default_params(SETTINGS))


def test_the_usual_enqueue_built_from_the_defaults_gets_the_same_parameters_and_leaves_them_as_they_were():
    defaults = default_params(SETTINGS)
    kept = dict(defaults)
    assert enqueue_params(SETTINGS, "q", {"a": 1}, {}, defaults) == enqueue_params(SETTINGS, "q", {"a": 1}, {})
    assert enqueue_params(SETTINGS, "q", {"a": 1}, {"priority": 3}, defaults)["priority"] == 3
    assert defaults == kept
    call = Statements(SETTINGS).enqueue("q", {"a": 1}, {})
    assert call.params == enqueue_params(SETTINGS, "q", {"a": 1}, {}) and call.tuples
    assert call.query == Statements(SETTINGS).q.job_insert_usual.encode()  # its own statement, as bytes


class Unserialisable:
    pass


circular: dict[str, Any] = {}
circular["self"] = circular


@pytest.mark.parametrize(
    "payload",
    [circular, [circular], float("nan"), {"x": float("inf")}, {1, 2}, Unserialisable(), {(1, 2): "key"}, 10**5000],
    ids=lambda p: type(p).__name__,
)
def test_a_payload_json_cannot_hold_gets_the_reason_the_full_encoder_gives(payload: Any):
    with pytest.raises((TypeError, ValueError)) as reason:
        _JSON.encode(payload)
    with pytest.raises(PayloadError, match="not JSON-serialisable") as raised:
        encode_payload(payload, 10**6)
    assert str(reason.value) in str(raised.value)


@pytest.mark.parametrize(
    ("payload", "limit"),
    [
        ("é" * 10, 21),  # 22 bytes with the quotes
        ("é" * 10, 22),
        ("x" * 20, 21),
        ("x" * 20, 22),
    ],
)
def test_the_size_limit_counts_utf8_bytes(payload: str, limit: int):
    size = len(json.dumps(payload, ensure_ascii=False).encode())
    if size > limit:
        with pytest.raises(PayloadError, match=f"payload is {size} bytes"):
            encode_payload(payload, limit)
    else:
        assert encode_payload(payload, limit) == json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def test_lone_surrogates_are_refused_ascii_and_not():
    for payload in ("\ud800", "é\ud800", {"k": ["x", "\udfff"]}):
        with pytest.raises(PayloadError, match="not valid Unicode"):
            encode_payload(payload, 10**6)


def test_one_payload_encoded_by_many_threads_at_once_is_never_taken_for_circular():
    shared = {"items": [{"n": i, "tags": ["a", "b"]} for i in range(200)]}
    expected = json.dumps(shared, separators=(",", ":"))
    errors: list[BaseException] = []

    def encode() -> None:
        try:
            for _ in range(200):
                assert encode_payload(shared, 10**6) == expected
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=encode) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
