"""The pure timing of periodic tasks: next and last ticks for cron (with seconds, in time zones across DST) and
for every=N, counts of missed ticks, what a late firer enqueues, and the errors of bad options at import."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from skiplock import App, ConfigError, schedule
from skiplock.schedule import Timing, fire_params, tick_key

BERLIN = ZoneInfo("Europe/Berlin")


def local(t: datetime) -> str:
    return t.astimezone(BERLIN).isoformat()


def test_every_ticks_at_multiples_of_the_period_since_the_epoch() -> None:
    t = Timing(every=1)
    now = datetime(2026, 1, 1, 0, 0, 5, 300_000, tzinfo=UTC)
    assert t.last_at_or_before(now) == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert t.next_after(now) == datetime(2026, 1, 1, 0, 0, 6, tzinfo=UTC)
    assert t.next_after(datetime(2026, 1, 1, 0, 0, 6, tzinfo=UTC)) == datetime(2026, 1, 1, 0, 0, 7, tzinfo=UTC)
    assert Timing(every=90).next_after(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)
    assert Timing(every=0.25).next_after(now) == datetime(2026, 1, 1, 0, 0, 5, 500_000, tzinfo=UTC)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert t.ticks_between(start, start + timedelta(seconds=5)) == 4  # 1, 2, 3, 4


def test_cron_with_and_without_seconds_in_utc() -> None:
    at = datetime(2026, 5, 4, 12, 7, 30, tzinfo=UTC)
    assert Timing(cron="*/5 * * * *").next_after(at) == datetime(2026, 5, 4, 12, 10, tzinfo=UTC)
    assert Timing(cron="*/5 * * * *").last_at_or_before(at) == datetime(2026, 5, 4, 12, 5, tzinfo=UTC)
    assert Timing(cron="*/5 * * * *").last_at_or_before(datetime(2026, 5, 4, 12, 5, tzinfo=UTC)) == datetime(
        2026, 5, 4, 12, 5, tzinfo=UTC
    )  # a tick exactly now is the last one at or before now
    assert Timing(cron="*/20 * * * * *").next_after(at) == datetime(2026, 5, 4, 12, 7, 40, tzinfo=UTC)  # seconds first
    assert Timing(cron="0 0 1 * *").period_seconds(at) == 31 * 86400


def test_cron_in_a_time_zone_across_dst() -> None:
    nightly = Timing(cron="30 2 * * *", timezone="Europe/Berlin")
    # Spring forward (2026-03-29: 02:00 -> 03:00): 02:30 does not exist; it runs at 03:00 that day, then 02:30.
    spring = [nightly.next_after(datetime(2026, 3, 28, 12, tzinfo=BERLIN))]
    spring.append(nightly.next_after(spring[0]))
    assert [local(t) for t in spring] == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]
    # Fall back (2026-10-25: 03:00 -> 02:00): 02:30 happens twice; it runs once, at the first.
    fall = [nightly.next_after(datetime(2026, 10, 24, 12, tzinfo=BERLIN))]
    fall.append(nightly.next_after(fall[0]))
    assert [local(t) for t in fall] == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    assert (fall[1] - fall[0]) == timedelta(hours=25)
    # Wall-clock hours keep their local time; in UTC they move by an hour.
    assert Timing(cron="0 9 * * *", timezone="Europe/Berlin").next_after(datetime(2026, 7, 1, tzinfo=UTC)) == datetime(
        2026, 7, 1, 7, tzinfo=UTC
    )
    assert Timing(cron="0 9 * * *").next_after(datetime(2026, 7, 1, tzinfo=UTC)) == datetime(2026, 7, 1, 9, tzinfo=UTC)


def test_a_late_firer_enqueues_only_the_last_missed_tick() -> None:
    stored = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    row = {
        "name": "t",
        "cron": None,
        "every_seconds": 1.0,
        "timezone": "UTC",
        "next_run_at": stored,
        "now": stored + timedelta(seconds=5, milliseconds=400),
    }
    params, missed = fire_params(row, "chan")
    assert params["expected"] == stored  # the compare-and-set is against what was read
    assert params["tick"] == stored + timedelta(seconds=5)
    assert params["following"] == stored + timedelta(seconds=6)
    assert params["unique_key"] == tick_key("t", stored + timedelta(seconds=5))
    assert missed == 5  # 0, 1, 2, 3, 4 skipped
    on_time, none_missed = fire_params(row | {"now": stored + timedelta(milliseconds=10)}, "chan")
    assert on_time["tick"] == stored and on_time["following"] == stored + timedelta(seconds=1) and none_missed == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"cron": "* * *"}, "5 fields"),
        ({"cron": "0 0 30 2 *"}, "invalid cron"),
        ({"cron": "* * * * *", "every": 5}, "not both"),
        ({"every": 0}, "every must be"),
        ({"every": float("nan")}, "every must be"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"timezone": "UTC"}, "timezone needs cron"),
    ],
)
def test_bad_periodic_options_fail_at_import(options: dict[str, object], message: str) -> None:
    app = App()
    with pytest.raises(ConfigError, match=message):

        @app.task(name="bad", **options)
        def bad(job: object) -> None: ...

    assert "bad" not in app


def test_periodic_tasks_become_schedules() -> None:
    app = App("billing")

    @app.task(name="invoices.close", queue="billing", cron="0 3 * * *", timezone="Europe/Berlin", priority=3)
    def close(job: object) -> None: ...

    @app.task(name="plain")
    def plain(job: object) -> None: ...

    [s] = app.schedules
    assert (s.name, s.app, s.queue, s.priority) == ("invoices.close", "billing", "billing", 3)
    assert s.timing == Timing(cron="0 3 * * *", timezone="Europe/Berlin")
    assert plain.schedule is None


def test_the_missed_ticks_of_a_row_late_by_a_year_cost_a_bounded_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37, item 3: a late cron row was counted one tick at a time, up to 10,000 cron steps per row inline on
    the firer's loop (the operator's, shared by every tenant). The walk stops at WALK_STEPS and estimates the rest."""
    steps = 0
    real = schedule.CronSim

    class Counting(real):  # type: ignore[misc, valid-type]
        def __next__(self) -> datetime:
            nonlocal steps
            steps += 1
            return super().__next__()

    monkeypatch.setattr(schedule, "CronSim", Counting)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    every_second = Timing(cron="* * * * * *")
    assert every_second.ticks_between(start, start + timedelta(days=365)) == schedule.MISSED_COUNT_LIMIT
    assert steps <= schedule.WALK_STEPS + 2, steps
    steps = 0
    five_minutes = Timing(cron="*/5 * * * *")
    exact = 30 * 24 * 12 - 1  # strictly between: the tick at either end is not missed
    assert five_minutes.ticks_between(start, start + timedelta(days=30)) == exact  # a regular cron: estimated exactly
    assert steps <= schedule.WALK_STEPS + 2, steps
    assert five_minutes.ticks_between(start, start + timedelta(hours=2)) == 23  # under the walk: counted


def test_every_is_bounded_as_the_schedules_table_bounds_it() -> None:
    Timing(every=schedule.EVERY_SECONDS_MAX)
    for bad in (schedule.EVERY_SECONDS_MAX * 2, 1e300, float("nan")):
        with pytest.raises(ValueError, match=r"every must be a number of seconds from 0\.001"):
            Timing(every=bad)
