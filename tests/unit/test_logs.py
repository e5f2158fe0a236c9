"""The outage filter (``skiplock.logs.DatabaseOutage``) folds many failure lines into two, without hiding a fact of
its own: the listener's reconnection stays visible in the "database back" line."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from skiplock.logs import DatabaseOutage, PlainFormatter


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(PlainFormatter())
    handler.addFilter(DatabaseOutage())
    logger = logging.getLogger("skiplock.listener")
    logger.addHandler(handler)
    old, logger.propagate = logger.propagate, False
    logger.setLevel(logging.INFO)
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.propagate = old
        logger.setLevel(logging.NOTSET)


def test_the_listener_reconnected_line_survives_the_end_of_an_outage(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured
    logger.warning("listener lost its connection (server closed); reconnecting", extra={"action": "listener_down"})
    logger.warning("listener lost its connection (server closed); reconnecting", extra={"action": "listener_down"})
    logger.info("listener %s", "connected", extra={"action": "listener_up", "channel": "s_wakeup"})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "database unreachable since" in lines[0]
    assert "database back after 0 s" in lines[1] and "listener connected" in lines[1]


def test_a_listener_connected_outside_an_outage_is_logged_as_is(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.info("listener %s", "connected", extra={"action": "listener_up"})
    (line,) = out.getvalue().splitlines()
    assert line.endswith("skiplock.listener: listener connected")


def test_the_workers_own_recovery_line_ends_an_outage_once(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.warning("call failed", extra={"action": "db_error"})
    logger.info("database reachable again", extra={"action": "db_recovered"})
    logger.info("database reachable again", extra={"action": "db_recovered"})
    lines = out.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines[1:]] == ["database back after 0 s", "database reachable again"]
