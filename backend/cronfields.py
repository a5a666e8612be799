"""The search for matching wall-clock times over a cron expression's field values.

A :class:`CronFields` knows no timezone: it answers "which naive local date and time at or
after (or before) this one do the fields match?", with the Vixie/Debian day-field rule
that :mod:`backend.cron` documents. :class:`~backend.cron.Cron` maps its answers to real
instants through the zone's DST gaps and folds.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from datetime import date, datetime
from typing import Final

from backend.cronparse import FieldValues

__all__ = ["CronFields"]

_DAYS_IN_MONTH: Final = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _month_len(year: int, month: int) -> int:
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS_IN_MONTH[month]


def _cron_weekday(year: int, month: int, day: int) -> int:
    # Python counts Monday as 0, cron counts Sunday as 0.
    return (date(year, month, day).weekday() + 1) % 7


def _flags(vals: tuple[int, ...], size: int) -> tuple[bool, ...]:
    chosen = set(vals)
    return tuple(i in chosen for i in range(size))


class CronFields:
    """The wall-clock times one set of field values matches; not changed once built.

    ``day_or`` is whether a day matching either day field fires (both are restricted)
    rather than a day matching both.
    """

    __slots__ = (
        "_seconds",
        "_minutes",
        "_hours",
        "_months",
        "_minute_ok",
        "_hour_ok",
        "_month_ok",
        "_dom_ok",
        "_dow_ok",
        "_day_or",
        "_every_day",
    )

    _seconds: tuple[int, ...]
    _minutes: tuple[int, ...]
    _hours: tuple[int, ...]
    _months: tuple[int, ...]
    _minute_ok: tuple[bool, ...]
    _hour_ok: tuple[bool, ...]
    _month_ok: tuple[bool, ...]
    _dom_ok: tuple[bool, ...]
    _dow_ok: tuple[bool, ...]
    _day_or: bool
    _every_day: bool

    def __init__(self, values: FieldValues, *, day_or: bool) -> None:
        self._seconds = values.second
        self._minutes = values.minute
        self._hours = values.hour
        self._months = values.month
        self._minute_ok = _flags(values.minute, 60)
        self._hour_ok = _flags(values.hour, 24)
        self._month_ok = _flags(values.month, 13)
        self._dom_ok = _flags(values.dom, 32)
        self._dow_ok = _flags(values.dow, 7)
        self._day_or = day_or
        self._every_day = len(values.dom) == 31 and len(values.dow) == 7

    def fires_on_some_date(self) -> bool:
        """Whether the day fields agree on any date at all.

        Hours, minutes and seconds always have values, so only the date matters.
        2001-2028 is one full 28-year cycle inside a single Gregorian century: every
        (month, day, weekday) combination, Feb 29 included, occurs in it.
        """
        if self._day_or:
            return True  # every month has every weekday, so the day-of-week side always fires
        doms = [d for d in range(1, 32) if self._dom_ok[d]]
        for year in range(2001, 2029):
            for month in self._months:
                for day in doms:
                    if day > _month_len(year, month):
                        break
                    if self._day_matches(year, month, day):
                        return True
        return False

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        if not self._month_ok[month]:
            return False
        if self._every_day:
            return True
        dom = self._dom_ok[day]
        dow = self._dow_ok[_cron_weekday(year, month, day)]
        return (dom or dow) if self._day_or else (dom and dow)

    def wall_at_or_after(self, wall: datetime, limit: datetime | None) -> datetime | None:
        """First matching wall time at or after ``wall`` and before ``limit``."""
        y, mo, d = wall.year, wall.month, wall.day
        if self._day_matches(y, mo, d):
            hms = self._time_at_or_after(wall.hour, wall.minute, wall.second)
            if hms is not None:
                found = datetime(y, mo, d, *hms)
                return found if limit is None or found < limit else None
        stop = (9999, 12, 31) if limit is None else (limit.year, limit.month, limit.day)
        day = self._day_after(y, mo, d, stop)
        if day is None:
            return None
        found = datetime(*day, self._hours[0], self._minutes[0], self._seconds[0])
        return found if limit is None or found < limit else None

    def wall_at_or_before(self, wall: datetime, floor: datetime | None) -> datetime | None:
        """Last matching wall time at or before ``wall`` and at or after ``floor``."""
        y, mo, d = wall.year, wall.month, wall.day
        if self._day_matches(y, mo, d):
            hms = self._time_at_or_before(wall.hour, wall.minute, wall.second)
            if hms is not None:
                found = datetime(y, mo, d, *hms)
                return found if floor is None or found >= floor else None
        stop = (1, 1, 1) if floor is None else (floor.year, floor.month, floor.day)
        day = self._day_before(y, mo, d, stop)
        if day is None:
            return None
        found = datetime(*day, self._hours[-1], self._minutes[-1], self._seconds[-1])
        return found if floor is None or found >= floor else None

    def _time_at_or_after(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        seconds, minutes, hours = self._seconds, self._minutes, self._hours
        if self._hour_ok[h]:
            if self._minute_ok[m]:
                i = bisect_left(seconds, s)
                if i < len(seconds):
                    return h, m, seconds[i]
            i = bisect_right(minutes, m)
            if i < len(minutes):
                return h, minutes[i], seconds[0]
        i = bisect_right(hours, h)
        if i < len(hours):
            return hours[i], minutes[0], seconds[0]
        return None

    def _time_at_or_before(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        seconds, minutes, hours = self._seconds, self._minutes, self._hours
        if self._hour_ok[h]:
            if self._minute_ok[m]:
                i = bisect_right(seconds, s)
                if i:
                    return h, m, seconds[i - 1]
            i = bisect_left(minutes, m)
            if i:
                return h, minutes[i - 1], seconds[-1]
        i = bisect_left(hours, h)
        if i:
            return hours[i - 1], minutes[-1], seconds[-1]
        return None

    def _day_after(
        self, y: int, mo: int, d: int, stop: tuple[int, int, int]
    ) -> tuple[int, int, int] | None:
        """First matching date strictly after (y, mo, d) and not after ``stop``."""
        months, month_ok, dom_ok, dow_ok = self._months, self._month_ok, self._dom_ok, self._dow_ok
        day_or, every_day = self._day_or, self._every_day
        d += 1
        while (y, mo) <= stop[:2]:
            if month_ok[mo]:
                length = _month_len(y, mo)
                if d <= length:
                    if every_day:
                        return (y, mo, d) if (y, mo, d) <= stop else None
                    wd = _cron_weekday(y, mo, d)
                    while d <= length:
                        dom, dow = dom_ok[d], dow_ok[wd]
                        if (dom or dow) if day_or else (dom and dow):
                            return (y, mo, d) if (y, mo, d) <= stop else None
                        d += 1
                        wd = (wd + 1) % 7
            # Skip straight to the next allowed month.
            i = bisect_right(months, mo)
            if i < len(months):
                mo = months[i]
            else:
                y, mo = y + 1, months[0]
            d = 1
        return None

    def _day_before(
        self, y: int, mo: int, d: int, stop: tuple[int, int, int]
    ) -> tuple[int, int, int] | None:
        """Last matching date strictly before (y, mo, d) and not before ``stop``."""
        months, month_ok, dom_ok, dow_ok = self._months, self._month_ok, self._dom_ok, self._dow_ok
        day_or, every_day = self._day_or, self._every_day
        d -= 1
        while (y, mo) >= stop[:2]:
            if month_ok[mo] and d >= 1:
                d = min(d, _month_len(y, mo))
                if every_day:
                    return (y, mo, d) if (y, mo, d) >= stop else None
                wd = _cron_weekday(y, mo, d)
                while d >= 1:
                    dom, dow = dom_ok[d], dow_ok[wd]
                    if (dom or dow) if day_or else (dom and dow):
                        return (y, mo, d) if (y, mo, d) >= stop else None
                    d -= 1
                    wd = (wd - 1) % 7
            i = bisect_left(months, mo)
            if i > 0:
                mo = months[i - 1]
            else:
                y, mo = y - 1, months[-1]
            d = 31
        return None
