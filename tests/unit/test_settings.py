import pytest
from hypothesis import given
from hypothesis import strategies as st

from skiplock.errors import ConfigError
from skiplock.settings import Settings, mask_dsn, redact


def test_flag_beats_env_beats_database_url_beats_default():
    env = {"SKIPLOCK_QUEUE": "from-env", "SKIPLOCK_DSN": "postgresql://env/db", "DATABASE_URL": "postgresql://url/db"}
    s = Settings.from_env(env=env, queue="from-flag")
    assert s.queue == "from-flag"
    assert s.dsn == "postgresql://env/db"
    assert Settings.from_env(env={"DATABASE_URL": "postgresql://url/db"}).dsn == "postgresql://url/db"
    assert Settings.from_env(env={}).queue == "default"
    assert Settings.from_env(env={}).dsn is None


def test_env_values_are_typed():
    s = Settings.from_env(env={"SKIPLOCK_CONCURRENCY": "7", "SKIPLOCK_LEASE_SECONDS": "90", "SKIPLOCK_LISTEN": "false"})
    assert (s.concurrency, s.lease_seconds, s.listen) == (7, 90.0, False)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SKIPLOCK_CONCURRENCY": "lots"}, "SKIPLOCK_CONCURRENCY"),
        ({"SKIPLOCK_CONCURRENCY": "0"}, "concurrency must be >= 1"),
        ({"SKIPLOCK_LISTEN": "perhaps"}, "SKIPLOCK_LISTEN"),
        ({"SKIPLOCK_LEASE_SECONDS": "nan"}, "finite"),
        ({"SKIPLOCK_HEARTBEAT_SECONDS": "40"}, "heartbeat_seconds"),
        ({"SKIPLOCK_SCHEMA": 'x"; drop table jobs; --'}, "schema"),
        ({"SKIPLOCK_QUEUE": "bad queue name"}, "queue"),
        ({"SKIPLOCK_BACKOFF_JITTER": "2"}, "backoff_jitter"),
        ({"SKIPLOCK_LOG_FORMAT": "xml"}, "log_format"),
        ({"SKIPLOCK_HANDLER": "no-colon"}, "handler"),
    ],
)
def test_invalid_settings_are_rejected_with_the_reason(env, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        Settings.from_env(env=env)
    assert fragment in str(info.value)


def test_unknown_flag_is_an_error():
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.from_env(env={}, concurency=3)


def test_to_env_round_trips_and_leaves_the_dsn_out():
    s = Settings.from_env(
        env={}, dsn="postgresql://u:pw@h/db", queue="emails", concurrency=3, lease_seconds=120, listen=False
    )
    env = s.to_env()
    assert "SKIPLOCK_DSN" not in env
    assert env["SKIPLOCK_QUEUE"] == "emails"
    back = Settings.from_env(env=env)
    assert (back.queue, back.concurrency, back.lease_seconds, back.listen) == ("emails", 3, 120.0, False)


def test_repr_masks_the_password():
    s = Settings.from_env(env={}, dsn="postgresql://app:s3cret@db:5432/app")
    assert "s3cret" not in repr(s)
    assert "app:***@db" in repr(s)


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("postgresql://db/app?password=s3cret&sslmode=require", "postgresql://db/app?password=***&sslmode=require"),
        ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
        ("host=db password='with space' dbname=app", "host=db password=*** dbname=app"),
    ],
)
def test_mask_dsn(dsn, masked):
    assert mask_dsn(dsn) == masked


def test_redact_removes_the_password_from_any_text():
    dsn = "postgresql://app:s3cret@db/app"
    assert "s3cret" not in redact(f"failed: {dsn} said s3cret", dsn)


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0.1, max_value=1e6, allow_nan=False))
def test_env_parsing_of_numbers(concurrency, lease):
    s = Settings.from_env(
        env={
            "SKIPLOCK_CONCURRENCY": str(concurrency),
            "SKIPLOCK_LEASE_SECONDS": repr(lease),
            "SKIPLOCK_HEARTBEAT_SECONDS": repr(lease / 4),
            "SKIPLOCK_POLL_SECONDS": repr(lease / 4),
        }
    )
    assert s.concurrency == concurrency
    assert s.lease_seconds == lease
