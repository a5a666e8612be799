"""Reading the instants an operator types: ISO 8601, a date, ``now``, or ``-2d``-style offsets;
and writing a span of time as messages show it (``4m 59s``).

A time without an offset is read in the schedule's own timezone, the zone the operator
sees slots in; the result is always an aware UTC datetime.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo

import humanize

from backend.errors import BadInput
from backend.inputs import check_instant, check_text, out_of_range
from backend.safetext import printable

_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
# ASCII digits (\d is any script's); how many is checked before int() (which refuses
# past 4300 of them): an offset of more than 12 digits is beyond the calendar anyway.
_RELATIVE = re.compile(r"^([+-])((?:[0-9]+[wdhms])+)$")
_PART = re.compile(r"([0-9]+)([wdhms])")
_MAX_DIGITS = 12
_JUST_BEFORE = timedelta(microseconds=1)


def parse_when(
    text: str, *, now: datetime, zone: ZoneInfo | str = "UTC", field: str = "time", lower: bool = False
) -> datetime:
    """Parse ``text``; raises :class:`BadInput` naming the field and the value. The result
    lies within :data:`backend.inputs.EARLIEST` … :data:`~backend.inputs.LATEST`.
    ``lower``: the text is the start of a range that excludes it, ``(start, end]`` (see
    :func:`wall_instant`)."""
    try:
        value = _parse(text, now=now, zone=zone, field=field, lower=lower)
    except OverflowError:  # past the calendar's ends, before or after the zone's offset
        raise out_of_range(field, text) from None
    return check_instant(value, field, text)


def _parse(text: str, *, now: datetime, zone: ZoneInfo | str, field: str, lower: bool) -> datetime:
    tz = ZoneInfo(zone) if isinstance(zone, str) else zone
    # datetime.fromisoformat reads "2026-08-10T00:00\x00Z" as midnight: such a character
    # must not be dropped quietly.
    raw = check_text(text, field, one_line=True).strip()
    if not raw:
        raise BadInput(f"{field} is empty (use ISO 8601 such as 2026-08-10T00:00Z, or now, -6h, -2d)", field=field)
    lowered = raw.lower()
    if lowered == "now":
        return now.astimezone(UTC)
    match = _RELATIVE.match(lowered.replace(" ", ""))
    if match:
        parts = _PART.findall(match.group(2))
        if any(len(n.lstrip("0")) > _MAX_DIGITS for n, _ in parts):
            raise OverflowError(text)
        delta = timedelta(**{_UNITS[u]: int(n) for n, u in parts})
        return (now + delta if match.group(1) == "+" else now - delta).astimezone(UTC)
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadInput(
            f'{field} "{printable(text, 60)}" is not a time (use ISO 8601 such as 2026-08-10T00:00Z, or now, -6h, -2d)',
            field=field,
        ) from None
    if len(raw) == 10 and isinstance(value, datetime):  # a bare date: midnight in the zone
        value = datetime.combine(value.date(), time(0))
    if value.tzinfo is None:
        return wall_instant(value, tz, lower=lower)
    return value.astimezone(UTC)


def wall_instant(wall: datetime, tz: tzinfo, *, lower: bool = False) -> datetime:
    """The instant (UTC) of the naive wall time ``wall`` in ``tz``, as a cron reads one: a
    repeated wall time is its first pass; one in a gap (the hour spring skips) is the
    moment the gap ends, where the cron fires a slot of the skipped hour (Python would
    read it with the offset before the change: an hour past the gap). ``lower``: ``wall``
    starts a range that excludes its start, ``(start, end]``: one in a gap is a microsecond
    before the gap ends, so that the range holds the skipped hour's slots, fired there
    (from 02:00 to 04:00 on the night spring skips 02:00-03:00 held no slot of 02:30)."""
    first = wall.replace(tzinfo=tz, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == wall:
        return instant
    low = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)  # with the offset after the change: before the gap
    after = instant.astimezone(tz).utcoffset()
    lo, hi = 0, int((instant - low).total_seconds())  # the change lies in (low, instant]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (low + timedelta(seconds=mid)).astimezone(tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return low + timedelta(seconds=hi) - (_JUST_BEFORE if lower else timedelta(0))


def compact_delta(delta: timedelta) -> str:
    """Two most significant units: ``4m 59s``, ``3h 2m``, ``2d 4h``; ``0s`` at least."""
    total = int(delta.total_seconds())
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, seconds = divmod(rem, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    if days >= 365:
        return humanize.naturaldelta(delta)
    first = next((i for i, (n, _) in enumerate(parts) if n), None)
    if first is None:
        return "0s"
    # Two adjacent units, the smaller left out when zero: 10h 0m 46s is "10h", never "10h 46s".
    shown = [f"{n}{u}" for n, u in parts[first : first + 2] if n]
    return " ".join(shown)
