"""Tests for backend.cron: syntax, validation messages, day-field and DST rules.

Expected instants are written out by hand (UTC, year 2026 unless given). The 2026
transitions used below were looked up with zoneinfo once, not guessed:

    Europe/Berlin        03-29 01:00Z +1 -> +2 (02:00-03:00 skipped)
                         10-25 01:00Z +2 -> +1 (02:00-03:00 twice)
    America/New_York     03-08 07:00Z -5 -> -4 (02:00-03:00 skipped)
                         11-01 06:00Z -4 -> -5 (01:00-02:00 twice)
    America/Santiago     04-05 03:00Z -3 -> -4 (04-04 23:00-24:00 twice)
                         09-06 04:00Z -4 -> -3 (09-06 00:00-01:00 skipped)
    Australia/Lord_Howe  04-04 15:00Z +11 -> +10:30 (04-05 01:30-02:00 twice)
                         10-03 15:30Z +10:30 -> +11 (10-04 02:00-02:30 skipped)
    Pacific/Chatham      04-04 14:00Z +13:45 -> +12:45 (04-05 02:45-03:45 twice)
                         09-26 14:00Z +12:45 -> +13:45 (09-27 02:45-03:45 skipped)
    Asia/Tokyo           none (+9 all year)
"""

from __future__ import annotations

import errno
import os
import pickle
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.cron import Cron, shared_cron
from backend.errors import CronError, Unavailable

UTC = UTC
YEAR = 2026


def at(text: str) -> datetime:
    """``"03-29 01:00"``, ``"03-29 01:00:20"`` or ``"2028-02-29 00:00"`` as aware UTC."""
    if text.count("-") == 1:
        text = f"{YEAR}-{text}"
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def slots(cron: Cron, start: str, end: str) -> list[datetime]:
    return list(cron.occurrences(at(start), at(end)))


# --------------------------------------------------------------------------------------
# DST: (zone, expression, window start (exclusive), window end (inclusive), expected)
# --------------------------------------------------------------------------------------

DST_CASES = [
    # Europe/Berlin, spring forward: 02:00-02:59 local does not exist on 03-29.
    pytest.param(
        "Europe/Berlin", "30 2 * * *", "03-27 12:00", "03-30 12:00",
        ["03-28 01:30", "03-29 01:00", "03-30 00:30"],  # gap slot fires at 03:00 CEST
        id="berlin-spring-fixed-in-gap",
    ),
    pytest.param(
        "Europe/Berlin", "0,30 2,3 * * *", "03-29 00:00", "03-29 06:00",
        ["03-29 01:00", "03-29 01:30"],  # 02:00, 02:30 and 03:00 CEST are one slot
        id="berlin-spring-fixed-gap-dedup",
    ),
    pytest.param(
        "Europe/Berlin", "0-59 2 * * *", "03-28 23:00", "03-29 23:00",
        ["03-29 01:00"],  # sixty skipped wall minutes, one slot
        id="berlin-spring-fixed-every-minute-of-gap",
    ),
    pytest.param(
        "Europe/Berlin", "0 * * * *", "03-28 22:30", "03-29 03:30",
        ["03-28 23:00", "03-29 00:00", "03-29 01:00", "03-29 02:00", "03-29 03:00"],
        id="berlin-spring-hourly",
    ),
    pytest.param(
        "Europe/Berlin", "*/15 * * * *", "03-29 00:30", "03-29 01:30",
        ["03-29 00:45", "03-29 01:00", "03-29 01:15", "03-29 01:30"],
        id="berlin-spring-every-15",
    ),
    pytest.param(
        "Europe/Berlin", "0 30 2 * * *", "03-27 12:00", "03-30 12:00",
        ["03-28 01:30", "03-30 00:30"],  # real time: 02:30 never happens on 03-29
        id="berlin-spring-six-field",
    ),
    # Europe/Berlin, fall back: 02:00-02:59 local happens twice on 10-25.
    pytest.param(
        "Europe/Berlin", "30 2 * * *", "10-23 12:00", "10-26 12:00",
        ["10-24 00:30", "10-25 00:30", "10-26 01:30"],  # first 02:30 only (CEST)
        id="berlin-fall-fixed-in-repeat",
    ),
    pytest.param(
        "Europe/Berlin", "0,20,40 2 * * *", "10-24 23:00", "10-25 03:00",
        ["10-25 00:00", "10-25 00:20", "10-25 00:40"],
        id="berlin-fall-fixed-first-pass-only",
    ),
    pytest.param(
        "Europe/Berlin", "*/20 2 * * *", "10-24 23:00", "10-25 03:00",
        ["10-25 00:00", "10-25 00:20", "10-25 00:40", "10-25 01:00", "10-25 01:20", "10-25 01:40"],
        id="berlin-fall-real-time-both-passes",
    ),
    pytest.param(
        "Europe/Berlin", "0 * * * *", "10-24 22:30", "10-25 02:30",
        ["10-24 23:00", "10-25 00:00", "10-25 01:00", "10-25 02:00"],  # 02:00 twice
        id="berlin-fall-hourly",
    ),
    pytest.param(
        "Europe/Berlin", "*/15 * * * *", "10-25 00:30", "10-25 01:30",
        ["10-25 00:45", "10-25 01:00", "10-25 01:15", "10-25 01:30"],
        id="berlin-fall-every-15",
    ),
    pytest.param(
        "Europe/Berlin", "0 30 2 * * *", "10-24 12:00", "10-26 12:00",
        ["10-25 00:30", "10-25 01:30", "10-26 01:30"],  # real time: 02:30 twice
        id="berlin-fall-six-field",
    ),
    pytest.param(
        "Europe/Berlin", "*/20 * * * * *", "10-25 00:59:00", "10-25 01:01:00",
        ["10-25 00:59:20", "10-25 00:59:40", "10-25 01:00:00",
         "10-25 01:00:20", "10-25 01:00:40", "10-25 01:01:00"],
        id="berlin-fall-six-field-every-20s",
    ),
    # America/New_York.
    pytest.param(
        "America/New_York", "30 2 * * *", "03-06 12:00", "03-09 12:00",
        ["03-07 07:30", "03-08 07:00", "03-09 06:30"],
        id="newyork-spring-fixed-in-gap",
    ),
    pytest.param(
        "America/New_York", "0 * * * *", "03-08 05:30", "03-08 09:30",
        ["03-08 06:00", "03-08 07:00", "03-08 08:00", "03-08 09:00"],
        id="newyork-spring-hourly",
    ),
    pytest.param(
        "America/New_York", "*/15 * * * *", "03-08 06:30", "03-08 07:30",
        ["03-08 06:45", "03-08 07:00", "03-08 07:15", "03-08 07:30"],
        id="newyork-spring-every-15",
    ),
    pytest.param(
        "America/New_York", "0 30 2 * * *", "03-06 12:00", "03-09 12:00",
        ["03-07 07:30", "03-09 06:30"],
        id="newyork-spring-six-field",
    ),
    pytest.param(
        "America/New_York", "30 1 * * *", "10-30 12:00", "11-02 12:00",
        ["10-31 05:30", "11-01 05:30", "11-02 06:30"],
        id="newyork-fall-fixed-in-repeat",
    ),
    pytest.param(
        "America/New_York", "0 * * * *", "11-01 03:30", "11-01 07:30",
        ["11-01 04:00", "11-01 05:00", "11-01 06:00", "11-01 07:00"],  # 01:00 twice
        id="newyork-fall-hourly",
    ),
    pytest.param(
        "America/New_York", "*/15 * * * *", "11-01 05:30", "11-01 06:30",
        ["11-01 05:45", "11-01 06:00", "11-01 06:15", "11-01 06:30"],
        id="newyork-fall-every-15",
    ),
    pytest.param(
        "America/New_York", "0 30 1 * * *", "10-31 12:00", "11-02 12:00",
        ["11-01 05:30", "11-01 06:30", "11-02 06:30"],
        id="newyork-fall-six-field",
    ),
    # America/Santiago: transitions at local midnight.
    pytest.param(
        "America/Santiago", "30 23 * * *", "04-03 12:00", "04-06 12:00",
        ["04-04 02:30", "04-05 02:30", "04-06 03:30"],  # 04-04 23:30 first pass (-03)
        id="santiago-april-fixed-in-repeat",
    ),
    pytest.param(
        "America/Santiago", "0 0 * * *", "04-03 12:00", "04-06 12:00",
        ["04-04 03:00", "04-05 04:00", "04-06 04:00"],  # 04-05 00:00 exists once (-04)
        id="santiago-april-fixed-midnight",
    ),
    pytest.param(
        "America/Santiago", "0 * * * *", "04-05 01:30", "04-05 05:30",
        ["04-05 02:00", "04-05 03:00", "04-05 04:00", "04-05 05:00"],  # 23:00 twice
        id="santiago-april-hourly",
    ),
    pytest.param(
        "America/Santiago", "*/15 * * * *", "04-05 02:30", "04-05 03:30",
        ["04-05 02:45", "04-05 03:00", "04-05 03:15", "04-05 03:30"],
        id="santiago-april-every-15",
    ),
    pytest.param(
        "America/Santiago", "0 30 23 * * *", "04-04 12:00", "04-06 12:00",
        ["04-05 02:30", "04-05 03:30", "04-06 03:30"],
        id="santiago-april-six-field",
    ),
    pytest.param(
        "America/Santiago", "0 0 * * *", "09-04 12:00", "09-07 12:00",
        ["09-05 04:00", "09-06 04:00", "09-07 03:00"],  # 09-06 00:00 is in the gap
        id="santiago-september-fixed-midnight-in-gap",
    ),
    pytest.param(
        "America/Santiago", "0 * * * *", "09-06 01:30", "09-06 05:30",
        ["09-06 02:00", "09-06 03:00", "09-06 04:00", "09-06 05:00"],
        id="santiago-september-hourly",
    ),
    pytest.param(
        "America/Santiago", "*/15 * * * *", "09-06 03:30", "09-06 04:30",
        ["09-06 03:45", "09-06 04:00", "09-06 04:15", "09-06 04:30"],
        id="santiago-september-every-15",
    ),
    pytest.param(
        "America/Santiago", "0 30 0 * * *", "09-04 12:00", "09-07 12:00",
        ["09-05 04:30", "09-07 03:30"],
        id="santiago-september-six-field",
    ),
    # Australia/Lord_Howe: 30-minute shifts.
    pytest.param(
        "Australia/Lord_Howe", "45 1 * * *", "04-03 00:00", "04-06 00:00",
        ["04-03 14:45", "04-04 14:45", "04-05 15:15"],
        id="lordhowe-april-fixed-in-repeat",
    ),
    pytest.param(
        "Australia/Lord_Howe", "0 * * * *", "04-04 12:30", "04-04 17:30",
        ["04-04 13:00", "04-04 14:00", "04-04 15:30", "04-04 16:30", "04-04 17:30"],
        id="lordhowe-april-hourly",
    ),
    pytest.param(
        "Australia/Lord_Howe", "*/15 * * * *", "04-04 14:20", "04-04 15:40",
        ["04-04 14:30", "04-04 14:45", "04-04 15:00", "04-04 15:15", "04-04 15:30"],
        id="lordhowe-april-every-15",
    ),
    pytest.param(
        "Australia/Lord_Howe", "0 45 1 * * *", "04-04 00:00", "04-06 00:00",
        ["04-04 14:45", "04-04 15:15", "04-05 15:15"],
        id="lordhowe-april-six-field",
    ),
    pytest.param(
        "Australia/Lord_Howe", "15 2 * * *", "10-02 00:00", "10-05 00:00",
        ["10-02 15:45", "10-03 15:30", "10-04 15:15"],
        id="lordhowe-october-fixed-in-gap",
    ),
    pytest.param(
        "Australia/Lord_Howe", "0 * * * *", "10-03 12:00", "10-03 18:00",
        ["10-03 12:30", "10-03 13:30", "10-03 14:30", "10-03 16:00", "10-03 17:00",
         "10-03 18:00"],
        id="lordhowe-october-hourly",
    ),
    pytest.param(
        "Australia/Lord_Howe", "*/15 * * * *", "10-03 15:00", "10-03 16:00",
        ["10-03 15:15", "10-03 15:30", "10-03 15:45", "10-03 16:00"],
        id="lordhowe-october-every-15",
    ),
    pytest.param(
        "Australia/Lord_Howe", "0 15 2 * * *", "10-02 00:00", "10-05 00:00",
        ["10-02 15:45", "10-04 15:15"],
        id="lordhowe-october-six-field",
    ),
    # Pacific/Chatham: +12:45/+13:45, shifting at 02:45 standard time.
    pytest.param(
        "Pacific/Chatham", "0 3 * * *", "04-03 00:00", "04-06 00:00",
        ["04-03 13:15", "04-04 13:15", "04-05 14:15"],
        id="chatham-april-fixed-in-repeat",
    ),
    pytest.param(
        "Pacific/Chatham", "0 * * * *", "04-04 11:00", "04-04 16:00",
        ["04-04 11:15", "04-04 12:15", "04-04 13:15", "04-04 14:15", "04-04 15:15"],
        id="chatham-april-hourly",
    ),
    pytest.param(
        "Pacific/Chatham", "*/15 * * * *", "04-04 13:30", "04-04 14:30",
        ["04-04 13:45", "04-04 14:00", "04-04 14:15", "04-04 14:30"],
        id="chatham-april-every-15",
    ),
    pytest.param(
        "Pacific/Chatham", "0 0 3 * * *", "04-04 00:00", "04-06 00:00",
        ["04-04 13:15", "04-04 14:15", "04-05 14:15"],
        id="chatham-april-six-field",
    ),
    pytest.param(
        "Pacific/Chatham", "0 3 * * *", "09-25 00:00", "09-28 00:00",
        ["09-25 14:15", "09-26 14:00", "09-27 13:15"],
        id="chatham-september-fixed-in-gap",
    ),
    pytest.param(
        "Pacific/Chatham", "0 * * * *", "09-26 11:00", "09-26 16:00",
        ["09-26 11:15", "09-26 12:15", "09-26 13:15", "09-26 14:15", "09-26 15:15"],
        id="chatham-september-hourly",
    ),
    pytest.param(
        "Pacific/Chatham", "*/15 * * * *", "09-26 13:30", "09-26 14:30",
        ["09-26 13:45", "09-26 14:00", "09-26 14:15", "09-26 14:30"],
        id="chatham-september-every-15",
    ),
    pytest.param(
        "Pacific/Chatham", "0 0 3 * * *", "09-25 00:00", "09-28 00:00",
        ["09-25 14:15", "09-27 13:15"],
        id="chatham-september-six-field",
    ),
    # Asia/Tokyo has no DST: Berlin's transition days are ordinary days there.
    pytest.param(
        "Asia/Tokyo", "30 2 * * *", "03-27 12:00", "03-30 12:00",
        ["03-27 17:30", "03-28 17:30", "03-29 17:30"],
        id="tokyo-march-fixed",
    ),
    pytest.param(
        "Asia/Tokyo", "30 2 * * *", "10-23 12:00", "10-26 12:00",
        ["10-23 17:30", "10-24 17:30", "10-25 17:30"],
        id="tokyo-october-fixed",
    ),
    pytest.param(
        "Asia/Tokyo", "0 * * * *", "03-28 22:30", "03-29 02:30",
        ["03-28 23:00", "03-29 00:00", "03-29 01:00", "03-29 02:00"],
        id="tokyo-hourly",
    ),
    pytest.param(
        "Asia/Tokyo", "*/15 * * * *", "10-25 00:30", "10-25 01:30",
        ["10-25 00:45", "10-25 01:00", "10-25 01:15", "10-25 01:30"],
        id="tokyo-every-15",
    ),
    pytest.param(
        "Asia/Tokyo", "0 30 2 * * *", "10-23 12:00", "10-26 12:00",
        ["10-23 17:30", "10-24 17:30", "10-25 17:30"],
        id="tokyo-six-field",
    ),
    pytest.param(
        "UTC", "30 2 * * *", "03-28 00:00", "03-30 00:00",
        ["03-28 02:30", "03-29 02:30"],
        id="utc-fixed",
    ),
]


@pytest.mark.parametrize(("zone", "expr", "start", "end", "expected"), DST_CASES)
def test_dst_occurrences(zone: str, expr: str, start: str, end: str, expected: list[str]) -> None:
    cron = Cron(expr, zone)
    want = [at(s) for s in expected]
    got = slots(cron, start, end)
    assert got == want
    # The same slots backwards, and next/prev/latest step through them one by one.
    back = list(islice(cron.occurrences_back(at(end)), len(want) + 1))
    assert back[: len(want)] == want[::-1]
    assert back[len(want)] <= at(start)
    assert cron.next(at(start)) == want[0]
    assert cron.prev(want[0]) <= at(start)
    for earlier, later in zip(want, want[1:], strict=False):
        assert cron.next(earlier) == later
        assert cron.prev(later) == earlier
        assert cron.latest(later - timedelta(seconds=1)) == earlier
        assert cron.latest(later) == later


def test_gap_fires_at_the_transition_from_every_side() -> None:
    berlin = Cron("30 2 * * *", "Europe/Berlin")
    transition = at("03-29 01:00")  # 03:00 CEST
    assert berlin.next(transition - timedelta(microseconds=1)) == transition
    assert berlin.next(transition - timedelta(seconds=1)) == transition
    assert berlin.next(transition) == at("03-30 00:30")
    assert berlin.latest(transition) == transition
    assert berlin.prev(transition) == at("03-28 01:30")
    assert berlin.prev(transition + timedelta(microseconds=1)) == transition


def test_repeated_hour_real_time_from_inside_each_pass() -> None:
    # Every wall time 02:00-02:59 on 10-25 happens at 00:xx UTC (CEST) and 01:xx UTC (CET).
    quarter = Cron("15 * * * *", "Europe/Berlin")
    # From 02:30 CEST the next :15 is 02:15 CET, which comes before 03:15 CET.
    assert quarter.next(at("10-25 00:30")) == at("10-25 01:15")
    assert quarter.next(at("10-25 01:15")) == at("10-25 02:15")
    assert quarter.prev(at("10-25 01:15")) == at("10-25 00:15")
    assert quarter.prev(at("10-25 01:10")) == at("10-25 00:15")
    assert quarter.latest(at("10-25 01:10")) == at("10-25 00:15")
    assert quarter.latest(at("10-25 00:10")) == at("10-24 23:15")
    fixed = Cron("15,45 2 * * *", "Europe/Berlin")
    assert fixed.next(at("10-25 00:30")) == at("10-25 00:45")
    assert fixed.next(at("10-25 00:45")) == at("10-26 01:15")  # no second 02:15 or 02:45
    assert fixed.next(at("10-25 01:30")) == at("10-26 01:15")
    # From 02:30 CET (second pass) the newest slot is 02:45 CEST, from the first pass.
    assert fixed.latest(at("10-25 01:30")) == at("10-25 00:45")
    assert fixed.prev(at("10-25 01:00")) == at("10-25 00:45")


# --------------------------------------------------------------------------------------
# Day fields, seconds, macros, parsing
# --------------------------------------------------------------------------------------

SCHEDULE_CASES = [
    # Vixie rule: "*"-prefixed day field => AND; both restricted => OR.
    pytest.param(
        "0 0 */2 * 1", "05-31 00:00", "07-31 00:00",
        ["06-01 00:00", "06-15 00:00", "06-29 00:00", "07-13 00:00", "07-27 00:00"],
        id="odd-days-that-are-mondays",
    ),
    pytest.param(
        "0 0 1,15 * 1", "05-31 00:00", "07-07 00:00",
        ["06-01 00:00", "06-08 00:00", "06-15 00:00", "06-22 00:00", "06-29 00:00",
         "07-01 00:00", "07-06 00:00"],
        id="first-fifteenth-and-mondays",
    ),
    pytest.param(
        "0 0 1 * */2", "2025-12-31 00:00", "12-31 00:00",
        ["01-01 00:00", "02-01 00:00", "03-01 00:00", "08-01 00:00", "09-01 00:00",
         "10-01 00:00", "11-01 00:00", "12-01 00:00"],  # 1st that is Sun/Tue/Thu/Sat
        id="first-of-month-on-even-weekdays",
    ),
    pytest.param(
        "0 0 1-31 * 1", "06-01 00:00", "06-04 00:00",
        ["06-02 00:00", "06-03 00:00", "06-04 00:00"],  # "1-31" is restricted: OR => daily
        id="explicit-range-dom-is-restricted",
    ),
    pytest.param(
        "0 12 * * 7", "06-01 00:00", "06-15 00:00",
        ["06-07 12:00", "06-14 12:00"],
        id="dow-7-is-sunday",
    ),
    pytest.param(
        "0 0 * * 1/2", "06-01 00:00", "06-08 00:00",
        ["06-03 00:00", "06-05 00:00", "06-07 00:00", "06-08 00:00"],  # Mon Wed Fri Sun
        id="dow-start-step-runs-to-7",
    ),
    pytest.param(
        "0 9 * * MON-fri", "06-05 00:00", "06-09 00:00",
        ["06-05 09:00", "06-08 09:00"],
        id="weekday-names",
    ),
    pytest.param(
        "0 0 1 jan,Jul *", "2025-12-31 00:00", "12-31 00:00",
        ["01-01 00:00", "07-01 00:00"],
        id="month-names",
    ),
    pytest.param(
        "0-0 0 * * *", "06-01 00:00", "06-03 00:00",
        ["06-02 00:00", "06-03 00:00"],  # croniter alone would read 0-0 as every minute
        id="equal-range-is-one-value",
    ),
    pytest.param(
        "0 0 5-5 * *", "06-01 00:00", "08-01 00:00",
        ["06-05 00:00", "07-05 00:00"],
        id="equal-range-day",
    ),
    pytest.param(
        "59/15 * * * *", "06-01 00:00", "06-01 02:00",
        ["06-01 00:59", "06-01 01:59"],
        id="start-step-at-field-max",
    ),
    pytest.param(
        "0 0 29 2 *", "01-01 00:00", "2032-12-31 00:00",
        ["2028-02-29 00:00", "2032-02-29 00:00"],
        id="feb-29-every-four-years",
    ),
    pytest.param(
        # Feb 29 falls on Tue 2028, Sun 2032, Fri 2036, Wed 2040; */2 is Sun/Tue/Thu/Sat.
        "0 0 29 2 */2", "01-01 00:00", "2040-12-31 00:00",
        ["2028-02-29 00:00", "2032-02-29 00:00"],
        id="feb-29-and-even-weekday",
    ),
    # Seconds lead when there are six fields.
    pytest.param(
        "*/30 * * * * *", "06-01 12:00:00", "06-01 12:01:30",
        ["06-01 12:00:30", "06-01 12:01:00", "06-01 12:01:30"],
        id="six-fields-every-30-seconds",
    ),
    pytest.param(
        "15 * * * * *", "06-01 12:00:00", "06-01 12:02:59",
        ["06-01 12:00:15", "06-01 12:01:15", "06-01 12:02:15"],
        id="six-fields-second-15",
    ),
    pytest.param(
        "0 0 * * * *", "06-01 12:00:00", "06-01 14:00:00",
        ["06-01 13:00", "06-01 14:00"],
        id="six-fields-hourly",
    ),
    pytest.param(
        "10,50 59 23 31 12 *", "12-31 23:00", "2027-01-01 00:00",
        ["12-31 23:59:10", "12-31 23:59:50"],
        id="six-fields-year-end",
    ),
]


@pytest.mark.parametrize(("expr", "start", "end", "expected"), SCHEDULE_CASES)
def test_schedule_occurrences(expr: str, start: str, end: str, expected: list[str]) -> None:
    assert slots(Cron(expr, "UTC"), start, end) == [at(s) for s in expected]


@pytest.mark.parametrize(
    ("macro", "expanded"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("  @DAILY ", "0 0 * * *"),
    ],
)
def test_macros_store_their_five_field_form(macro: str, expanded: str) -> None:
    cron = Cron(macro, "Europe/Berlin")
    assert cron.expr == expanded
    assert cron == Cron(expanded, "Europe/Berlin")
    assert cron.fields == tuple(expanded.split())


def test_macro_slots() -> None:
    assert slots(Cron("@weekly", "UTC"), "06-01 00:00", "06-15 00:00") == [
        at("06-07 00:00"),
        at("06-14 00:00"),
    ]
    assert Cron("@hourly", "Europe/Berlin").is_fixed_time is False
    assert Cron("@daily", "Europe/Berlin").is_fixed_time is True


def test_attributes() -> None:
    five = Cron("0  9\t* *   mon", "Europe/Berlin")
    assert five.expr == "0 9 * * mon"
    assert five.timezone == "Europe/Berlin"
    assert five.zone == ZoneInfo("Europe/Berlin")
    assert five.fields == ("0", "9", "*", "*", "mon")
    assert five.seconds_field is None
    assert five.has_seconds is False
    assert five.is_fixed_time is True
    assert repr(five) == "Cron('0 9 * * mon', 'Europe/Berlin')"

    six = Cron("*/10 0 9 * * *", "UTC")
    assert six.expr == "*/10 0 9 * * *"
    assert six.fields == ("0", "9", "*", "*", "*")
    assert six.seconds_field == "*/10"
    assert six.has_seconds is True
    assert six.is_fixed_time is False  # six fields always follow real time


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("0 9 * * *", True),
        ("30 2 1 * *", True),
        ("0,30 1-3 * * *", True),
        ("* 9 * * *", False),
        ("*/5 9 * * *", False),
        ("0 * * * *", False),
        ("0 */2 * * *", False),
        ("0 0 9 * * *", False),
    ],
)
def test_is_fixed_time(expr: str, fixed: bool) -> None:
    assert Cron(expr, "UTC").is_fixed_time is fixed


def test_equality_hash_immutability_pickle() -> None:
    a = Cron("0 9 * * *", "Europe/Berlin")
    assert a == Cron("0   9 * * *", "Europe/Berlin")
    assert hash(a) == hash(Cron("0 9 * * *", "Europe/Berlin"))
    assert a != Cron("0 9 * * *", "Europe/Paris")
    assert a != Cron("0 10 * * *", "Europe/Berlin")
    assert a != "0 9 * * *"
    assert len({a, Cron("0 9 * * *", "Europe/Berlin"), Cron("@daily", "Europe/Berlin")}) == 2
    with pytest.raises(AttributeError):
        a.expr = "0 10 * * *"
    with pytest.raises(AttributeError):
        a.timezone = "UTC"
    restored = pickle.loads(pickle.dumps(a))
    assert restored == a
    assert restored.next(at("06-01 00:00")) == at("06-01 07:00")


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------

ERROR_CASES = [
    ("0 25 * * *", "UTC", "hour 25 out of range (0-23)"),
    ("60 * * * *", "UTC", "minute 60 out of range (0-59)"),
    ("60 0 * * * *", "UTC", "second 60 out of range (0-59)"),
    ("0 0 0 * *", "UTC", "day-of-month 0 out of range (1-31)"),
    ("0 0 32 * *", "UTC", "day-of-month 32 out of range (1-31)"),
    ("0 0 * 13 *", "UTC", "month 13 out of range (1-12)"),
    ("0 0 * * 8", "UTC", "day-of-week 8 out of range (0-7)"),
    ("* * * * * * *", "UTC", "expected 5 or 6 fields, got 7"),
    ("* * * *", "UTC", "expected 5 or 6 fields, got 4"),
    ("", "UTC", "empty expression"),
    ("   ", "UTC", "empty expression"),
    ("0 0 * * funday", "UTC", 'day-of-week "funday" is not a value'),
    ("0 0 * mon *", "UTC", 'month "mon" is not a value'),
    ("jan * * * *", "UTC", 'minute "jan" is not a value'),
    ("*/0 * * * *", "UTC", 'step 0 in minute "*/0"'),
    ("0 1-5/x * * *", "UTC", 'step "x" in hour "1-5/x" is not a number'),
    ("0 22-2 * * *", "UTC", 'hour range "22-2" is reversed (write it low-high)'),
    (
        "0 0 * * fri-sun",
        "UTC",
        'day-of-week range "fri-sun" is reversed (write it low-high; Sunday is also 7)',
    ),
    ("1,,2 * * * *", "UTC", 'minute "1,,2" has an empty list item'),
    ("0 1,* * * *", "UTC", 'hour "1,*" lists "*" beside other values ("*" alone means every value)'),
    ("*,5 * * * *", "UTC", 'minute "*,5" lists "*" beside other values ("*" alone means every value)'),
    ("0 0 * * *,1", "UTC", 'day-of-week "*,1" lists "*" beside other values ("*" alone means every value)'),
    ("* * * * * *,1", "UTC", 'day-of-week "*,1" lists "*" beside other values ("*" alone means every value)'),
    ("-1 * * * *", "UTC", 'minute "-1" is malformed'),
    ("0 0 L * *", "UTC", 'day-of-month "L" uses the non-standard "L" syntax'),
    ("0 0 15W * *", "UTC", 'day-of-month "15W" uses the non-standard "W" syntax'),
    ("0 0 * * 5L", "UTC", 'day-of-week "5L" uses the non-standard "L" syntax'),
    ("0 0 * * mon#2", "UTC", 'day-of-week "mon#2" uses the non-standard "#" syntax'),
    ("H * * * *", "UTC", 'minute "H" uses the non-standard "H" syntax'),
    ("0 0 ? * *", "UTC", 'day-of-month "?" uses the non-standard "?" syntax'),
    (
        "@reboot",
        "UTC",
        'macro "@reboot" is not supported '
        "(use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)",
    ),
    ("0 0 30 2 *", "UTC", 'never fires (no date matches day-of-month "30" in month "2")'),
    ("0 0 31 4 *", "UTC", 'never fires (no date matches day-of-month "31" in month "4")'),
    (
        "0 0 31 2,4 */2",
        "UTC",
        'never fires (no date matches day-of-month "31" in month "2,4" on day-of-week "*/2")',
    ),
    ("0 9 * * *", "", 'timezone is required (an IANA name such as "Europe/Berlin")'),
    ("0 9 * * *", None, 'timezone is required (an IANA name such as "Europe/Berlin")'),
    ("0 9 * * *", "Mars/Base", 'unknown timezone "Mars/Base"'),
    ("0 9 * * *", "europe/berlin", 'unknown timezone "europe/berlin"'),
    ("0 9 * * *", "../etc/passwd", 'unknown timezone "../etc/passwd"'),
    (
        "0 9 * * *",
        "localtime",
        'timezone "localtime" follows the host; name the zone '
        '(an IANA name such as "Europe/Berlin")',
    ),
    (
        "0 9 * * *",
        "right/Europe/Berlin",
        'timezone "right/Europe/Berlin" counts leap seconds; use "Europe/Berlin"',
    ),
    # Placeholders of the database: "local time not set yet", and the system's choice.
    *(
        (
            "0 9 * * *",
            zone,
            f'timezone "{zone}" is a placeholder of the time zone database, not a place; name the zone '
            '(an IANA name such as "Europe/Berlin")',
        )
        for zone in ("Factory", "posixrules")
    ),
]


@pytest.mark.parametrize(("expr", "zone", "what"), ERROR_CASES)
def test_validation_messages(expr: str, zone: str | None, what: str) -> None:
    with pytest.raises(CronError) as caught:
        Cron(expr, zone)  # type: ignore[arg-type]  # a missing zone is one of the cases
    shown_zone = "" if zone is None else zone
    assert str(caught.value) == f'invalid cron expression "{expr}" (tz="{shown_zone}"): {what}'
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("expr", "what"),
    [
        ("9" * 5000 + " * * * *", "minute 99999999999999999999… out of range (0-59)"),
        ("1-" + "9" * 5000 + " * * * *", "minute 99999999999999999999… out of range (0-59)"),
        ("*/" + "9" * 5000 + " * * * *", 'step "99999999999999999999…" in minute is too large'),
        ("0" * 30 + "5 * * * *", None),  # leading zeros are not digits too many
    ],
)
def test_a_number_of_thousands_of_digits_is_refused_not_a_crash(expr: str, what: str | None) -> None:
    # int() refuses past 4300 digits (ValueError): the API answered such a cron with a 500.
    if what is None:
        assert Cron(expr, "UTC").next(at("01-01 00:00")) == at("01-01 00:05")
        return
    with pytest.raises(CronError) as caught:
        Cron(expr, "UTC")
    assert str(caught.value) == f'invalid cron expression "{expr[:100]}…" (tz="UTC"): {what}'


def test_the_documented_example_message() -> None:
    with pytest.raises(CronError, match=r'^invalid cron expression "0 25 \* \* \*" \(tz="UTC"\): '):
        Cron("0 25 * * *", "UTC")


@pytest.mark.parametrize(
    ("expr", "first"),
    [
        ("0 0 29 2 *", "2028-02-29 00:00"),
        ("0 0 31 1,2 *", "01-31 00:00"),  # February never has a 31st, January does
        ("0 0 30 2 1", "02-02 00:00"),  # both restricted: Feb 30 OR a Monday in February
        ("0 0 31 * */6", "01-31 00:00"),  # a 31st that is a Saturday or Sunday
        ("0 0 1 1 7", "01-04 00:00"),  # Jan 1 OR a Sunday
    ],
)
def test_rare_but_possible_expressions_are_accepted(expr: str, first: str) -> None:
    assert Cron(expr, "UTC").next(at("01-01 00:00")) == at(first)


@pytest.mark.parametrize("method", ["next", "prev", "latest", "occurrences_back"])
def test_naive_datetimes_are_rejected(method: str) -> None:
    cron = Cron("0 9 * * *", "UTC")
    with pytest.raises(ValueError, match="must be timezone-aware"):
        getattr(cron, method)(datetime(2026, 6, 1, 9))


def test_naive_datetimes_are_rejected_by_occurrences() -> None:
    cron = Cron("0 9 * * *", "UTC")
    with pytest.raises(ValueError, match="start must be timezone-aware"):
        cron.occurrences(datetime(2026, 6, 1), at("06-02 00:00"))
    with pytest.raises(ValueError, match="end must be timezone-aware"):
        cron.occurrences(at("06-01 00:00"), datetime(2026, 6, 2))


# --------------------------------------------------------------------------------------
# Inputs, outputs, edges
# --------------------------------------------------------------------------------------


def test_results_are_utc_whole_seconds_for_any_input_zone() -> None:
    cron = Cron("0 9 * * *", "Europe/Berlin")
    berlin_noon = datetime(2026, 6, 1, 12, 0, 0, 999_999, tzinfo=ZoneInfo("Europe/Berlin"))
    for result in (cron.next(berlin_noon), cron.prev(berlin_noon), cron.latest(berlin_noon)):
        assert result.tzinfo is UTC
        assert result.microsecond == 0
    assert cron.next(berlin_noon) == at("06-02 07:00")
    assert cron.prev(berlin_noon) == at("06-01 07:00")
    plus_two = timezone(timedelta(hours=2))
    assert cron.next(datetime(2026, 6, 1, 9, tzinfo=plus_two)) == at("06-02 07:00")
    assert cron.latest(datetime(2026, 6, 1, 9, tzinfo=plus_two)) == at("06-01 07:00")


def test_strictness_around_a_slot() -> None:
    cron = Cron("0 9 * * *", "UTC")
    slot = at("06-01 09:00")
    assert cron.next(slot) == at("06-02 09:00")
    assert cron.next(slot - timedelta(microseconds=1)) == slot
    assert cron.prev(slot) == at("05-31 09:00")
    assert cron.prev(slot + timedelta(microseconds=1)) == slot
    assert cron.latest(slot) == slot
    assert cron.latest(slot + timedelta(microseconds=999_999)) == slot
    assert cron.latest(slot - timedelta(microseconds=1)) == at("05-31 09:00")
    # occurrences is (start, end]
    assert list(cron.occurrences(slot, at("06-02 09:00"))) == [at("06-02 09:00")]
    assert list(cron.occurrences(at("06-02 09:00"), slot)) == []
    assert list(islice(cron.occurrences_back(slot), 2)) == [slot, at("05-31 09:00")]


def test_iterators_are_lazy_and_unbounded_backwards() -> None:
    every_second = Cron("* * * * * *", "UTC")
    back = every_second.occurrences_back(at("06-01 00:00:00"))
    assert next(back) == at("06-01 00:00:00")
    assert next(back) == at("05-31 23:59:59")
    forward = every_second.occurrences(at("06-01 00:00"), at("2999-01-01 00:00"))
    assert list(islice(forward, 3)) == [
        at("06-01 00:00:01"),
        at("06-01 00:00:02"),
        at("06-01 00:00:03"),
    ]


def test_date_range_limits() -> None:
    yearly = Cron("0 0 1 1 *", "UTC")
    with pytest.raises(ValueError, match="no slot after"):
        yearly.next(at("9999-06-01 00:00"))
    with pytest.raises(ValueError, match="no slot before"):
        yearly.prev(at("0001-01-01 00:00"))
    assert list(yearly.occurrences_back(at("0003-06-01 00:00"))) == [
        at("0003-01-01 00:00"),
        at("0002-01-01 00:00"),
        at("0001-01-01 00:00"),
    ]
    assert list(yearly.occurrences(at("9997-06-01 00:00"), datetime.max.replace(tzinfo=UTC))) == [
        at("9998-01-01 00:00"),
        at("9999-01-01 00:00"),
    ]


# --------------------------------------------------------------------------------------
# Property: next / prev / latest / occurrences / occurrences_back agree
# --------------------------------------------------------------------------------------

PROPERTY_EXPRS = [
    "30 2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "15,45 1-3 * * *",
    "0 0 * * *",
    "0 30 2 * * *",
    "*/20 * 2 * * *",
    "0 0 */2 * 1",
    "0 12 1,15 * 5",
]
PROPERTY_ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
]
# Instants near the 2026 transitions, where the rules actually bite.
TRANSITIONS = [
    at(s)
    for s in (
        "03-29 01:00", "10-25 01:00", "03-08 07:00", "11-01 06:00", "04-05 03:00",
        "09-06 04:00", "04-04 15:00", "10-03 15:30", "04-04 14:00", "09-26 14:00",
    )
]
instants = st.one_of(
    st.builds(
        lambda base, seconds, micro: base + timedelta(seconds=seconds, microseconds=micro),
        st.sampled_from(TRANSITIONS),
        st.integers(-4 * 3600, 4 * 3600),
        st.sampled_from([0, 0, 1, 500_000, 999_999]),
    ),
    st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    expr=st.sampled_from(PROPERTY_EXPRS), zone=st.sampled_from(PROPERTY_ZONES), t=instants
)
def test_queries_agree(expr: str, zone: str, t: datetime) -> None:
    cron = Cron(expr, zone)
    after = cron.next(t)
    latest = cron.latest(t)
    before = cron.prev(t)
    assert latest <= t < after
    assert before < t
    assert before == latest or (latest == t and before < latest)
    if latest == t:
        assert before == cron.prev(latest)
    assert cron.next(latest) == after
    assert cron.prev(after) == latest
    assert cron.latest(after) == after
    assert cron.latest(after - timedelta(microseconds=1)) == latest
    earlier = cron.prev(latest)
    assert list(cron.occurrences(earlier, after)) == [latest, after]
    assert list(islice(cron.occurrences_back(after), 3)) == [after, latest, earlier]
    # A short run forwards equals the same run backwards, strictly increasing.
    run = list(islice(cron.occurrences(earlier, after + timedelta(days=2)), 8))
    assert run[:2] == [latest, after]
    assert all(x < y for x, y in zip(run, run[1:], strict=False))
    assert list(islice(cron.occurrences_back(run[-1]), len(run))) == run[::-1]
    for value in (after, latest, before):
        assert value.tzinfo is UTC and value.microsecond == 0


def test_shared_cron_is_parsed_once_per_expression_and_zone() -> None:
    first = shared_cron("@hourly", "Europe/Berlin")
    assert first == Cron("0 * * * *", "Europe/Berlin")
    assert shared_cron("@hourly", "Europe/Berlin") is first
    assert shared_cron("0 * * * *", "Europe/Berlin") is first  # the canonical text finds it too
    assert shared_cron("0 * * * *", "UTC") is not first


def test_shared_cron_keeps_nothing_that_does_not_parse() -> None:
    for _ in range(2):
        with pytest.raises(CronError, match='"61 \\* \\* \\* \\*"'):
            shared_cron("61 * * * *", "UTC")
    with pytest.raises(CronError, match="must be a string"):
        shared_cron(["* * * * *"], "UTC")  # type: ignore[arg-type]  # the refused value is the point


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.EIO])
def test_a_zone_the_machine_cannot_read_now_is_unavailable_never_unknown(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Out of descriptors (or memory, or a failing disk) when a zone's file is first read:
    the zone is not "unknown" (a stored schedule would be taken for invalid), the machine
    is short."""
    import backend.cron

    def short(name: str) -> Any:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(backend.cron, "ZoneInfo", short)
    with pytest.raises(Unavailable, match=f'cannot read the time zone database for "Asia/Kathmandu": {os.strerror(code)}'):
        Cron("0 4 * * *", "Asia/Kathmandu")

    def missing(name: str) -> Any:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))

    monkeypatch.setattr(backend.cron, "ZoneInfo", missing)
    with pytest.raises(CronError, match='unknown timezone "Asia/Kathmandu"'):
        Cron("0 4 * * *", "Asia/Kathmandu")


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("*/4 * * * * *", "0-59/4 * * * * *", True),
        ("0 9 * * *", "00 09 * * *", True),
        ("0 9 * * 1-5", "0 9 * * mon-fri", True),
        ("10,40 * * * *", "0 10,40 * * * *", True),  # (hour "*": both follow real time)
        ("0 2 * * *", "0 0 2 * * *", False),  # five fields with a literal hour follow the wall clock through DST
        ("0 9 1 * *", "0 9 1 * 1", False),  # both day fields restricted: OR-ed
        ("0 9 * * *", "0 10 * * *", False),
    ],
)
def test_a_timing_is_what_an_expression_fires_whatever_its_spelling(one: str, other: str, same: bool) -> None:
    assert (Cron(one, "Europe/Berlin").timing == Cron(other, "Europe/Berlin").timing) is same
