"""The console's and the CLI's time texts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from console.format import compact_delta


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=59), "59s"),
        (timedelta(minutes=4, seconds=59), "4m 59s"),
        (timedelta(hours=3, minutes=2, seconds=5), "3h 2m"),
        (timedelta(hours=10, seconds=46), "10h"),  # never "10h 46s": the units are adjacent
        (timedelta(days=2, minutes=5), "2d"),
        (timedelta(days=2, hours=4, minutes=5), "2d 4h"),
        (timedelta(minutes=7), "7m"),
    ],
)
def test_two_adjacent_units_the_smaller_left_out_when_zero(delta: timedelta, text: str) -> None:
    assert compact_delta(delta) == text


def test_a_tz_naming_a_folder_or_too_long_falls_back_instead_of_crashing(monkeypatch: pytest.MonkeyPatch) -> None:
    from console.format import operator_zone

    for bad in ("Europe", "America", "x" * 300, "../../etc/passwd", "UTC+1"):
        monkeypatch.setenv("TZ", bad)
        assert operator_zone() not in ("Europe", "America", bad)  # the system's zone, or UTC
    monkeypatch.setenv("TZ", "Asia/Kathmandu")
    assert operator_zone() == "Asia/Kathmandu"


def test_a_zone_this_host_does_not_know_is_shown_in_utc_not_a_crash() -> None:
    """A remote server's schedule may name a zone the operator's machine lacks (newer
    tzdata there): its times are shown in UTC, saying so."""
    from datetime import UTC, datetime

    from console.format import local_time, short_time, zone_abbr, zone_of
    from console.timeline import Window, ticks

    at = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert zone_of("Mars/Olympus_Mons") is UTC and zone_of("Europe") is UTC and str(zone_of("Europe/Berlin")) == "Europe/Berlin"
    assert local_time(at, "Mars/Olympus_Mons") == "2026-03-02 09:00:00 UTC"
    assert short_time(at, "Mars/Olympus_Mons", at) == "03-02 09:00:00 UTC"
    assert zone_abbr("Mars/Olympus_Mons", at) == "UTC"
    window = Window.following(at, timedelta(hours=6), 60)
    assert ticks(window, "Mars/Olympus_Mons") == ticks(window, "UTC")


def test_a_time_far_from_now_or_in_another_year_is_written_with_its_year() -> None:
    """A wait's 366-day limit was written "until 12-08 02:29:03" under "in a year": read as
    tomorrow. Month-day alone only for a time of now's year within half a year of it."""
    from datetime import UTC, datetime

    from console.format import day_time, short_time

    now = datetime(2026, 12, 7, 2, 29, 3, tzinfo=UTC)
    assert short_time(now + timedelta(days=1), "UTC", now) == "12-08 02:29:03 UTC"
    assert short_time(now + timedelta(days=366), "UTC", now) == "2027-12-08 02:29:03 UTC"
    assert short_time(now + timedelta(days=30), "UTC", now) == "2027-01-06 02:29:03 UTC"  # (the next year's)
    assert short_time(now - timedelta(days=340), "UTC", now) == "2026-01-01 02:29:03 UTC"  # (this year's, far)
    assert short_time(now - timedelta(days=160), "UTC", now, seconds=False) == "06-30 02:29 UTC"
    assert short_time(now, "UTC", None) == "2026-12-07 02:29:03 UTC"  # (no clock to say which year is now)
    # The year is the zone's: New Year's Eve in UTC is already next year in Tokyo.
    eve = datetime(2026, 12, 31, 20, tzinfo=UTC)
    assert short_time(eve, "Asia/Tokyo", eve) == "01-01 05:00:00 JST"
    assert short_time(eve, "Asia/Tokyo", now) == "2027-01-01 05:00:00 JST"
    assert day_time(now - timedelta(hours=2), "UTC", now) == "00:29:03"
    assert day_time(now - timedelta(hours=3), "UTC", now) == "12-06 23:29:03"
    assert day_time(now - timedelta(days=400), "UTC", now) == "2025-11-02 02:29:03"
