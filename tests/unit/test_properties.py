"""Property tests (hypothesis): settings parsing, backoff bounds, payload round trips."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skiplock import Settings
from skiplock.backoff import backoff_seconds
from skiplock.errors import ConfigError, PayloadError
from skiplock.job import payload_depth_exceeded
from skiplock.settings import ENV_PREFIX
from skiplock.store.validation import encode_payload, encode_payloads

FIELDS = [f.name for f in fields(Settings)]
# The latest timestamp PostgreSQL stores is in the year 294276: a retry delay must land before it.
LATEST_STORABLE_DELAY = 8.0e12


# ---------------------------------------------------------------------------------------------- settings
@st.composite
def valid_settings(draw: st.DrawFn) -> Settings:
    lease = draw(st.floats(min_value=0.5, max_value=1e6, allow_nan=False))
    base = draw(st.floats(min_value=0.001, max_value=1e4))
    return Settings(
        schema=draw(st.from_regex(r"[a-z_][a-z0-9_]{0,39}", fullmatch=True)),
        queue=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", fullmatch=True)),
        handler=draw(st.none() | st.from_regex(r"[a-z_][a-z0-9_.]{0,20}:[a-z_][a-z0-9_]{0,20}", fullmatch=True)),
        concurrency=draw(st.integers(1, 10_000)),
        batch=draw(st.integers(1, 10_000)),
        lease_seconds=lease,
        heartbeat_seconds=draw(st.floats(min_value=lease / 1000, max_value=lease / 2)),
        poll_seconds=draw(st.floats(min_value=lease / 1000, max_value=lease * 0.99)),
        recover_seconds=draw(st.floats(min_value=0.01, max_value=1e5)),
        backoff_base_seconds=base,
        backoff_cap_seconds=draw(st.floats(min_value=base, max_value=1e7)),
        backoff_jitter=draw(st.floats(min_value=0, max_value=1)),
        max_attempts=draw(st.integers(1, 1000)),
        shutdown_grace_seconds=draw(st.floats(min_value=0, max_value=1e5)),
        metrics_port=draw(st.integers(0, 65535)),
        listen=draw(st.booleans()),
        max_payload_bytes=draw(st.integers(1, 1 << 30)),
        log_format=draw(st.sampled_from(["plain", "json"])),
        worker_id=draw(st.from_regex(r"[a-z0-9-]{1,30}", fullmatch=True)),
    )


@given(valid_settings())
@settings(max_examples=150, deadline=None)
def test_settings_survive_a_trip_through_the_environment(s: Settings):
    env = s.to_env(exclude=("dsn",))
    assert all(k.startswith(ENV_PREFIX) and isinstance(v, str) for k, v in env.items())
    assert Settings.load(env=env) == s


@given(st.sampled_from(FIELDS), st.text(max_size=30))
@settings(max_examples=300, deadline=None)
@example("lease_seconds", "nan")
@example("lease_seconds", "inf")
@example("concurrency", "1e3")
@example("concurrency", "10.5")
@example("listen", "maybe")
@example("metrics_port", "70000")
@example("schema", 'x"; DROP SCHEMA public; --')
def test_any_environment_text_gives_settings_or_a_config_error(name: str, raw: str):
    try:
        s = Settings.load(env={ENV_PREFIX + name.upper(): raw})
    except ConfigError as exc:
        assert str(exc) and "Traceback" not in str(exc)
        return
    s.validate()  # whatever loads is valid
    for number in ("lease_seconds", "poll_seconds", "heartbeat_seconds", "backoff_cap_seconds"):
        assert math.isfinite(getattr(s, number))


@given(st.integers(1, 500), st.integers(1, 500))
def test_an_explicit_flag_beats_the_environment(flag: int, env: int):
    s = Settings.load(env={"SKIPLOCK_CONCURRENCY": str(env), "SKIPLOCK_DSN": "postgresql://e/x"}, concurrency=flag)
    assert s.concurrency == flag and s.dsn == "postgresql://e/x"
    assert Settings.load(env={"DATABASE_URL": "postgresql://d/x", "SKIPLOCK_DSN": "postgresql://s/x"}).dsn == (
        "postgresql://s/x"
    )


# ---------------------------------------------------------------------------------------------- backoff
@given(
    attempts=st.integers(-5, 10_000),
    base=st.floats(min_value=1e-3, max_value=1e6),
    extra=st.floats(min_value=0, max_value=1e9),
    jitter=st.floats(min_value=0, max_value=1),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_stays_within_zero_and_the_capped_ceiling(attempts, base, extra, jitter, rand):
    cap = base + extra
    delay = backoff_seconds(attempts, base=base, cap=cap, jitter=jitter, rand=lambda: rand)
    ceiling = min(cap, base * 2.0 ** min(max(attempts - 1, 0), 62))
    assert math.isfinite(delay)
    assert 0.0 <= delay <= ceiling * (1 + 1e-12)
    assert delay >= ceiling * (1 - jitter) * (1 - 1e-12)  # only the jittered fraction is random
    if jitter == 0:
        assert delay == ceiling


@given(st.integers(1, 200), st.floats(min_value=1e-3, max_value=1e4), st.floats(min_value=1, max_value=1e7))
def test_backoff_ceiling_never_shrinks_as_attempts_grow(attempts, base, cap_factor):
    cap = base * cap_factor

    def ceiling(n: int) -> float:
        return backoff_seconds(n, base=base, cap=cap, jitter=0)

    assert ceiling(attempts) <= ceiling(attempts + 1) <= cap


def test_settings_refuse_a_backoff_cap_postgres_cannot_store():
    with pytest.raises(ConfigError, match="backoff_cap_seconds"):
        Settings.load(env={}, backoff_cap_seconds=1e13)


@given(valid_settings(), st.integers(1, 10_000))
@settings(max_examples=100, deadline=None)
def test_retry_delays_of_sane_settings_are_storable(s: Settings, attempts: int):
    delay = backoff_seconds(attempts, base=s.backoff_base_seconds, cap=s.backoff_cap_seconds, jitter=s.backoff_jitter)
    assert 0 <= delay <= s.backoff_cap_seconds < LATEST_STORABLE_DELAY


# ---------------------------------------------------------------------------------------------- payloads
# A backslash followed by "u0000" is refused by mistake (hypothesis found it; the strict xfail
# test_api_a_literal_backslash_u0000_is_not_a_nul in tests/integration/test_bad_input.py pins it): kept out here.
safe_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40).filter(
    lambda t: "\\u0000" not in t
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | safe_text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(safe_text, children, max_size=5),
    max_leaves=30,
)


@given(json_values)
@settings(max_examples=300)
def test_payloads_round_trip_through_encode_payload(value: Any):
    text = encode_payload(value, 10**7)
    assert json.loads(text) == value
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # compact, as stored


@given(json_values, st.integers(1, 4096))
@settings(max_examples=300)
def test_the_size_limit_is_exact_in_utf8_bytes(value: Any, limit: int):
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size <= limit:
        assert encode_payload(value, limit)
    else:
        with pytest.raises(PayloadError, match="max_payload_bytes"):
            encode_payload(value, limit)


@given(safe_text, safe_text)
def test_text_with_a_nul_is_always_refused(before: str, after: str):
    with pytest.raises(PayloadError, match="NUL"):
        encode_payload({"k": before + "\x00" + after}, 10**6)


@given(st.sampled_from([math.nan, math.inf, -math.inf]), json_values)
def test_non_finite_numbers_are_always_refused(number: float, around: Any):
    with pytest.raises(PayloadError):
        encode_payload({"n": [around, number]}, 10**6)


def _outcome(encode: Any) -> Any:
    try:
        return encode()
    except PayloadError as exc:
        return ("PayloadError", str(exc))


bad_payloads = st.sampled_from([math.nan, "nul \x00", "lone \ud800", object(), {(1,): 2}, "x" * 5000, [[[[[[]]]]]]])


@given(st.lists(json_values | bad_payloads, max_size=8), st.sampled_from([40, 4096, 10**6]))
@settings(max_examples=300)
def test_a_batch_encodes_as_its_payloads_one_by_one(values: list[Any], limit: int):
    """encode_payloads checks the batch at once: the same texts, or the same first error, as payload by payload."""
    one_by_one = _outcome(lambda: [encode_payload(v, limit) for v in values])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("skiplock.store.validation.MAX_PAYLOAD_DEPTH", 4)  # deep payloads are cheap to draw at depth 4
        mp.setattr("skiplock.store.validation.payload_depth_exceeded", lambda text: payload_depth_exceeded(text, 4))
        assert _outcome(lambda: encode_payloads(values, limit)) == _outcome(
            lambda: [encode_payload(v, limit) for v in values]
        )
    assert _outcome(lambda: encode_payloads(values, limit)) == one_by_one


odd_values = st.sampled_from(
    [
        {7: "int key", 2.5: "float key", False: "bool key", None: "none key"},
        (1, "tuple"),
        2**80,
        -(2**70),
        1e16,
        1.5e-300,
        "é \u2028 \U0001f600",
        ["\\", '"', "\t"],
        {"nested": [{"a": (1, [2, {"b": None}])}]},
    ]
)


@given(st.lists(json_values | odd_values, max_size=8))
@settings(max_examples=300)
def test_the_batch_encoder_writes_what_the_payload_encoder_writes(values: list[Any]):
    """batch_encoder (the C encoder built once a batch) against _JSON.encode (one built per payload)."""
    from skiplock.store.validation import _JSON, batch_encoder

    encode = batch_encoder()
    assert [encode(v) for v in values] == [_JSON.encode(v) for v in values]


@pytest.mark.parametrize("bad", [math.nan, math.inf, object(), {(1,): 2}, {"set": {1}}])
def test_the_batch_encoder_refuses_what_the_payload_encoder_refuses(bad: Any):
    from skiplock.store.validation import _JSON, batch_encoder

    with pytest.raises((TypeError, ValueError)) as expected:
        _JSON.encode(["ok", bad])
    with pytest.raises(expected.type):
        batch_encoder()(["ok", bad])
