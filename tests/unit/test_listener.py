"""The listener's pure parts: its connection options and its reconnect pause (the reconnection itself is tested
against PostgreSQL in tests/integration/test_listener.py)."""

from __future__ import annotations

from skiplock.listener import connection_options, reconnect_delay


def test_the_listener_sets_a_connect_timeout_and_keepalives_unless_the_dsn_does() -> None:
    assert connection_options("host=db dbname=x") == {
        "connect_timeout": "5",
        "keepalives": "1",
        "keepalives_idle": "10",
        "keepalives_interval": "5",
        "keepalives_count": "3",
    }
    mine = connection_options("postgresql://u@db/x?connect_timeout=30&keepalives_idle=60")
    assert "connect_timeout" not in mine and "keepalives_idle" not in mine and mine["keepalives"] == "1"


def test_the_reconnect_pause_starts_short_and_never_exceeds_a_second() -> None:
    assert 0.1 <= reconnect_delay(1) <= 0.2
    assert all(0 < reconnect_delay(n) <= 1.0 for n in range(1, 100))
