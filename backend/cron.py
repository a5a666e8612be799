"""Cron expressions with a timezone: parsing, validation and slot arithmetic.

A :class:`Cron` is one expression in one IANA timezone. It answers "when is the next
slot after this instant?" (and the previous one, the newest one at or before an instant,
and lazy runs of slots in either direction). Every answer is an aware UTC ``datetime``
with whole seconds. This module is pure: no I/O beyond loading zone data through
:mod:`zoneinfo`, no clock, no globals that change.

Syntax
------
* Five fields ``minute hour day-of-month month day-of-week``, or six with a *leading*
  seconds field ``second minute hour day-of-month month day-of-week``. ``*/30 * * * * *``
  fires at :00 and :30 of every minute.
* Each field is a comma list of items; an item is ``*``, a value, or a range ``a-b``,
  optionally followed by ``/step``. ``a/step`` means ``a-<field max>/step``. Values are
  decimal numbers, three-letter month names (``jan``) in the month field and three-letter
  weekday names (``mon``) in the day-of-week field, in any letter case. Day-of-week runs
  0-7 and both 0 and 7 mean Sunday (so ``1/2`` is Mon, Wed, Fri, Sun, as in cronie).
* A range must run upwards (``22-2`` is rejected; write ``22-23,0-2``).
* The croniter extensions standard cron lacks (``L``, ``W``, ``#``, ``?``, ``H``/``R``
  hashes, a seventh year field) are rejected, and so is ``@reboot``. The macros
  ``@yearly @annually @monthly @weekly @daily @midnight @hourly`` are accepted and
  replaced by their five-field form: ``Cron("@daily", tz).expr == "0 0 * * *"``.
* :attr:`Cron.expr` is the expression with its whitespace collapsed to single spaces;
  the text of each field is kept as written.
* An expression that can never fire (``0 0 30 2 *``) is an error; ``0 0 29 2 *`` is fine.
* Every problem raises :class:`~backend.errors.CronError` with the message
  ``invalid cron expression "<expr>" (tz="<zone>"): <what is wrong>``. A timezone is
  required and never defaulted.

The work is in three parts: :mod:`backend.cronparse` reads the text into each field's
set of values, :class:`~backend.cronfields.CronFields` finds the wall-clock times those
values match, and this module maps wall times to real instants through the zone's DST
changes and answers the queries.

Day fields (Vixie/Debian cron)
------------------------------
If both day-of-month and day-of-week are restricted, a day matching *either* fires.
A day field whose text starts with ``*`` (``*``, ``*/2``) counts as unrestricted, and
then both must match: ``0 0 */2 * 1`` is "odd days of the month that are Mondays",
``0 0 1,15 * 1`` is "the 1st, the 15th and every Monday".

Daylight saving time (Debian cron)
----------------------------------
Slots are found in local wall-clock time and then mapped to real instants.

* *Fixed-time* schedules (five fields, and neither the minute nor the hour field starts
  with ``*``) follow the wall clock. A wall time that a spring-forward gap skips fires
  once, at the first instant after the gap (the transition itself). A wall time that a
  fall-back repeats fires once, at its first occurrence. Slots from one gap that land on
  the same instant count once.
* All other schedules (minute or hour field starting with ``*``, and every six-field
  expression) follow real time: they fire at each real instant whose local wall time
  matches. In a repeated hour they fire twice; wall times inside a gap never happen and
  do not fire.

Transitions are found from :mod:`zoneinfo` alone (gaps and folds are detected by
comparing the ``fold=0`` and ``fold=1`` offsets of a wall time, and the transition
instant is found by bisection), so zones with 30-minute shifts, midnight transitions or
odd offsets need no special cases. ``next``, ``prev``, ``latest``, ``occurrences`` and
``occurrences_back`` all describe the same strictly increasing set of slots.

Dates are limited to what :class:`datetime.datetime` can represent (years 1-9999):
``next``/``prev``/``latest`` raise :class:`ValueError` when no slot exists inside that
range (``next_or_none`` answers None), and the iterators simply end there.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Final, cast
from zoneinfo import ZoneInfo

from backend.cronfields import CronFields
from backend.cronparse import Invalid, expand, parse
from backend.errors import CronError, Unavailable

#: Errors reading a zone's file that say the machine is short of something (descriptors,
#: memory, a disk), not that the zone is unknown.
_SYSTEM_SHORT: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO})

__all__ = ["PLACEHOLDER_ZONES", "Cron", "shared_cron"]

_UTC: Final = UTC
_SECOND: Final = timedelta(seconds=1)


#: Names in the time zone database that are no place: "Factory" means "local time not set
#: yet" (offset 0, abbreviation -00); "posixrules" is whichever zone the system chose for
#: POSIX TZ strings (America/New_York on Debian): a default by the back door. Refused.
PLACEHOLDER_ZONES = frozenset({"Factory", "posix/Factory", "posixrules", "posix/posixrules"})


class Cron:
    """One cron expression in one IANA timezone; immutable, hashable, parsed once.

    >>> c = Cron("30 2 * * *", "Europe/Berlin")
    >>> c.next(datetime(2026, 3, 28, 12, tzinfo=timezone.utc)).isoformat()
    '2026-03-29T01:00:00+00:00'
    """

    __slots__ = (
        "expr",
        "timezone",
        "zone",
        "has_seconds",
        "is_fixed_time",
        "fields",
        "seconds_field",
        "timing",
        "_search",
        "_utcoffset",
    )

    expr: str
    timezone: str
    zone: ZoneInfo
    has_seconds: bool
    is_fixed_time: bool
    fields: tuple[str, str, str, str, str]
    seconds_field: str | None
    timing: tuple[object, ...]
    """What the expression fires, whatever its spelling (``*/4`` or ``0-59/4``, ``0 9``
    or ``00 09``, five fields or six with ``0`` seconds): the values of each field, whether
    the day fields are OR-ed, and whether it follows the wall clock through DST. Two
    expressions with one ``timing`` fire the same instants in one zone."""
    _search: CronFields
    _utcoffset: Callable[[datetime], timedelta]

    def __init__(self, expr: str, timezone: str) -> None:
        set_ = object.__setattr__  # the class forbids plain assignment (immutability)

        def fail(what: str) -> CronError:
            shown_tz = "" if timezone is None else str(timezone)
            shown = expr if not isinstance(expr, str) or len(expr) <= 100 else expr[:100] + "…"
            return CronError(f'invalid cron expression "{shown}" (tz="{shown_tz}"): {what}')

        if not isinstance(expr, str):
            raise fail("the expression must be a string")
        try:
            tokens, canonical = parse(expr)
        except Invalid as exc:
            raise fail(str(exc)) from None
        zone = self._load_zone(timezone, fail)
        set_(self, "zone", zone)
        # ZoneInfo.utcoffset never returns None (typeshed says it may); bind it once,
        # typed, because it is the hottest call in the search.
        set_(self, "_utcoffset", cast(Callable[[datetime], timedelta], zone.utcoffset))
        set_(self, "expr", " ".join(tokens))
        set_(self, "timezone", timezone)
        has_seconds = len(tokens) == 6
        text = tokens if has_seconds else ["0", *tokens]  # our slots: second first
        set_(self, "has_seconds", has_seconds)
        set_(self, "seconds_field", tokens[0] if has_seconds else None)
        set_(self, "fields", (text[1], text[2], text[3], text[4], text[5]))
        # Debian's rule: only five-field schedules with literal minute and hour follow the
        # wall clock through DST changes; anything "every N" follows real time.
        set_(
            self,
            "is_fixed_time",
            not has_seconds and not text[1].startswith("*") and not text[2].startswith("*"),
        )
        try:
            values = expand(canonical, has_seconds)
        except Invalid as exc:
            raise fail(str(exc)) from None
        dom_star = text[3].startswith("*")
        dow_star = text[5].startswith("*")
        # Vixie cron: OR the day fields only when both are restricted.
        day_or = not dom_star and not dow_star
        set_(self, "_search", CronFields(values, day_or=day_or))
        set_(self, "timing", (values, day_or, self.is_fixed_time))
        self._check_fires(fail, every_weekday=len(values.dow) == 7)

    # -- construction helpers -------------------------------------------------------

    @staticmethod
    def _load_zone(name: object, fail: Callable[[str], CronError]) -> ZoneInfo:
        if name is None or (isinstance(name, str) and not name.strip()):
            raise fail('timezone is required (an IANA name such as "Europe/Berlin")')
        if not isinstance(name, str):
            raise fail('timezone must be a string (an IANA name such as "Europe/Berlin")')
        if name == "localtime":
            # An alias for the host's zone would default the zone by the back door.
            raise fail(
                'timezone "localtime" follows the host; name the zone '
                '(an IANA name such as "Europe/Berlin")'
            )
        if name in PLACEHOLDER_ZONES:
            raise fail(f'timezone "{name}" is a placeholder of the time zone database, not a place; name the zone '
                       '(an IANA name such as "Europe/Berlin")')  # fmt: skip
        if name.startswith("right/"):
            # These files count leap seconds; zoneinfo then puts transitions ~27 s late.
            raise fail(f'timezone "{name}" counts leap seconds; use "{name[6:]}"')
        try:
            zone = ZoneInfo(name)
        except OSError as exc:
            if exc.errno in _SYSTEM_SHORT:  # the machine, not the name: never "unknown" for it
                raise Unavailable(f'cannot read the time zone database for "{name}": {exc.strerror}') from None
            raise fail(f'unknown timezone "{name}"') from None
        except (ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
            raise fail(f'unknown timezone "{name}"') from None
        return zone

    def _check_fires(self, fail: Callable[[str], CronError], *, every_weekday: bool) -> None:
        """Reject expressions whose day fields can never agree on a date."""
        if self._search.fires_on_some_date():
            return
        what = f'day-of-month "{self.fields[2]}" in month "{self.fields[3]}"'
        if not every_weekday:
            what += f' on day-of-week "{self.fields[4]}"'
        raise fail(f"never fires (no date matches {what})")

    # -- immutability, equality, repr --------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Cron is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Cron is immutable (cannot delete {name!r})")

    def __reduce__(self) -> tuple[type[Cron], tuple[str, str]]:
        return (Cron, (self.expr, self.timezone))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cron):
            return NotImplemented
        return self.expr == other.expr and self.timezone == other.timezone

    def __hash__(self) -> int:
        return hash((self.expr, self.timezone))

    def __repr__(self) -> str:
        return f"Cron({self.expr!r}, {self.timezone!r})"

    # -- public queries ------------------------------------------------------------------

    def next(self, after: datetime) -> datetime:
        """The first slot strictly after ``after``."""
        found = self.next_or_none(after)
        if found is None:
            raise ValueError(f"{self!r} has no slot after {after.isoformat()} before year 10000")
        return found

    def next_or_none(self, after: datetime) -> datetime | None:
        """The first slot strictly after ``after``; None when there is none before year 10000."""
        start = _to_utc(after, "after")
        try:
            found = self._first_at_or_after(start + _SECOND)
        except OverflowError:
            found = None
        return None if found is None else found.replace(tzinfo=_UTC)

    def prev(self, before: datetime) -> datetime:
        """The newest slot strictly before ``before``."""
        exact = _to_utc(before, "before", floor=False)
        # Slots are whole seconds: "before 10:00:00.5" includes 10:00:00 itself.
        if exact.microsecond:
            found = self._latest_safe(exact.replace(microsecond=0))
        else:
            found = self._latest_safe(exact, strictly_before=True)
        if found is None:
            raise ValueError(f"{self!r} has no slot before {before.isoformat()} after year 1")
        return found.replace(tzinfo=_UTC)

    def latest(self, at: datetime) -> datetime:
        """The newest slot at or before ``at``."""
        found = self._latest_safe(_to_utc(at, "at"))
        if found is None:
            raise ValueError(f"{self!r} has no slot at or before {at.isoformat()} after year 1")
        return found.replace(tzinfo=_UTC)

    def occurrences(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """Slots in ``(start, end]``, ascending, computed lazily."""
        first = _to_utc(start, "start")
        last = _to_utc(end, "end")  # floored; slots are whole seconds, so (start, end] holds
        return self._forward(first, last)

    def occurrences_back(self, end: datetime) -> Iterator[datetime]:
        """Slots at or before ``end``, newest first, lazily and without end (use islice)."""
        return self._backward(_to_utc(end, "end"))

    # -- iteration -----------------------------------------------------------------------

    def _forward(self, start: datetime, end: datetime) -> Iterator[datetime]:
        current = start
        while True:
            try:
                found = self._first_at_or_after(current + _SECOND)
            except OverflowError:
                return
            if found is None or found > end:
                return
            if found <= current:  # pragma: no cover - a bug here must not hang callers
                raise RuntimeError(f"{self!r}: slot search went backwards after {current}")
            yield found.replace(tzinfo=_UTC)
            current = found

    def _backward(self, end: datetime) -> Iterator[datetime]:
        found = self._latest_safe(end)
        while found is not None:
            yield found.replace(tzinfo=_UTC)
            current, found = found, self._latest_safe(found, strictly_before=True)
            if found is not None and found >= current:  # pragma: no cover - as above
                raise RuntimeError(f"{self!r}: slot search went forwards before {current}")

    def _latest_safe(self, b: datetime, *, strictly_before: bool = False) -> datetime | None:
        """The newest slot at (or strictly before) ``b``, None when there is none."""
        # Walking off year 1 (or converting a wall time there) raises OverflowError;
        # to callers that simply means "no earlier slot".
        try:
            return self._last_at_or_before(b - _SECOND if strictly_before else b)
        except OverflowError:
            return None

    # -- slot search in real time ----------------------------------------------------------
    # Instants are naive UTC datetimes with whole seconds; walls are naive local times.

    def _fold_around(
        self, local: datetime
    ) -> tuple[bool, timedelta, timedelta, datetime, datetime] | None:
        """Where the real instant ``local`` (aware, in our zone) lies in a repeated stretch.

        None if its wall time occurs once. Otherwise (first_pass, offset_before,
        offset_after, fold_start, fold_end): the repeated walls are [fold_start, fold_end).
        """
        offset = self._utcoffset(local)
        other = self._utcoffset(local.replace(fold=1 - local.fold))
        if other == offset:
            return None
        first_pass = local.fold == 0
        o_before, o_after = (offset, other) if first_pass else (other, offset)
        wall = local.replace(tzinfo=None, fold=0)
        t = self._transition(wall - o_before, wall - o_after)
        return first_pass, o_before, o_after, t + o_after, t + o_before

    def _first_at_or_after(self, a: datetime) -> datetime | None:
        """The first slot at or after the instant ``a``."""
        zone, utcoffset = self.zone, self._utcoffset
        if self.is_fixed_time:
            # Fixed-time slots map walls to instants monotonically, so start one second
            # past the wall time of a-1s: that keeps the gap's walls (which map to the
            # transition instant) in view when a is exactly that instant.
            prev_local = zone.fromutc((a - _SECOND).replace(tzinfo=zone))
            wall = prev_local.replace(tzinfo=None, fold=0) + _SECOND
            while True:
                w = self._search.wall_at_or_after(wall, None)
                if w is None:
                    return None
                o0 = utcoffset(w)
                o1 = utcoffset(w.replace(fold=1))
                if o0 == o1:
                    instant = w - o0
                    if instant >= a:
                        return instant
                    wall = w + _SECOND  # pragma: no cover - defensive
                elif o0 < o1:  # skipped by a gap: fires at the transition
                    t = self._transition(w - o1, w - o0)
                    if t >= a:
                        return t
                    wall = t + o1  # pragma: no cover - defensive
                else:  # repeated: fires at the first occurrence
                    instant = w - o0
                    if instant >= a:
                        return instant
                    # a is in the second pass: this fold's slots are all behind us.
                    wall = self._transition(w - o0, w - o1) + o0
        # Real time. Within one stretch of constant offset, walls and instants advance
        # together; a repeated stretch revisits walls, which is the only place where wall
        # order and real order disagree.
        local = zone.fromutc(a.replace(tzinfo=zone))
        wall = local.replace(tzinfo=None, fold=0)
        fold = self._fold_around(local)
        if fold is not None:
            first_pass, o_before, o_after, f_start, f_end = fold
            # Rest of the current pass, then (from the first pass) the whole second pass.
            w = self._search.wall_at_or_after(wall, f_end)
            if w is not None:
                return w - (o_before if first_pass else o_after)
            if first_pass:
                w = self._search.wall_at_or_after(f_start, f_end)
                if w is not None:
                    return w - o_after
            wall = f_end
        while True:
            w = self._search.wall_at_or_after(wall, None)
            if w is None:
                return None
            o0 = utcoffset(w)
            o1 = utcoffset(w.replace(fold=1))
            if o0 == o1:
                return w - o0
            if o0 < o1:  # a skipped wall time never happens: go on after the gap
                wall = self._transition(w - o1, w - o0) + o1
            else:  # entering a repeated stretch: its first pass comes first
                return w - o0

    def _last_at_or_before(self, b: datetime) -> datetime | None:
        """The newest slot at or before the instant ``b`` (mirror of the above)."""
        zone, utcoffset = self.zone, self._utcoffset
        local = zone.fromutc(b.replace(tzinfo=zone))
        wall = local.replace(tzinfo=None, fold=0)
        fold = self._fold_around(local)
        if self.is_fixed_time:
            if fold is not None and not fold[0]:
                # In the second pass every wall of the fold already fired (first pass).
                wall = fold[4] - _SECOND
            while True:
                w = self._search.wall_at_or_before(wall, None)
                if w is None:
                    return None
                o0 = utcoffset(w)
                o1 = utcoffset(w.replace(fold=1))
                if o0 < o1:  # skipped by a gap: fired at the transition
                    instant = self._transition(w - o1, w - o0)
                else:  # single, or repeated and fired at its first occurrence
                    instant = w - o0
                if instant <= b:
                    return instant
                wall = w - _SECOND  # pragma: no cover - defensive
        if fold is not None:
            first_pass, o_before, o_after, f_start, f_end = fold
            if first_pass:
                w = self._search.wall_at_or_before(wall, f_start)
                if w is not None:
                    return w - o_before
            else:
                # Earlier in the second pass, then the whole first pass.
                w = self._search.wall_at_or_before(wall, f_start)
                if w is not None:
                    return w - o_after
                w = self._search.wall_at_or_before(f_end - _SECOND, f_start)
                if w is not None:
                    return w - o_before
            wall = f_start - _SECOND
        while True:
            w = self._search.wall_at_or_before(wall, None)
            if w is None:
                return None
            o0 = utcoffset(w)
            o1 = utcoffset(w.replace(fold=1))
            if o0 == o1:
                return w - o0
            if o0 < o1:  # a skipped wall time never happens: look before the gap
                wall = self._transition(w - o1, w - o0) + o0 - _SECOND
            else:  # leaving a repeated stretch backwards: its second pass is newest
                return w - o1

    def _transition(self, low: datetime, high: datetime) -> datetime:
        """The first instant in (low, high] whose UTC offset differs from low's.

        Bisection over whole seconds; the caller guarantees the offsets at ``low`` and
        ``high`` differ and that one transition lies between them (gaps and folds are
        hours long, transitions months apart).
        """
        zone, utcoffset = self.zone, self._utcoffset
        base = utcoffset(zone.fromutc(low.replace(tzinfo=zone)))
        lo, hi = 0, int((high - low).total_seconds())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            probe = low + timedelta(seconds=mid)
            if utcoffset(zone.fromutc(probe.replace(tzinfo=zone))) == base:
                lo = mid
            else:
                hi = mid
        return low + timedelta(seconds=hi)


def _to_utc(value: datetime, name: str, *, floor: bool = True) -> datetime:
    """``value`` as a naive UTC instant, by default floored to whole seconds."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{name} must be timezone-aware, got naive datetime {value.isoformat()} "
            "(attach a zone, e.g. tzinfo=timezone.utc)"
        )
    try:
        utc = value.astimezone(_UTC).replace(tzinfo=None)
    except OverflowError:
        raise ValueError(f"{name} {value.isoformat()} is outside the supported range") from None
    return utc.replace(microsecond=0) if floor and utc.microsecond else utc


_SHARED: dict[tuple[str, str], Cron] = {}
_SHARED_MAX: Final = 20_000
"""Past this many, the shared crons are dropped and parsed again as asked for (a process
that keeps meeting new expressions must not keep them all)."""


def shared_cron(expr: str, timezone: str) -> Cron:
    """The :class:`Cron` of ``expr`` in ``timezone``, parsed once per process (a Cron is
    immutable, so one can be shared): a parse costs 70-200 µs, and the definitions, the
    engine and a console on an embedded backend all ask for the same thousand schedules'
    crons; a console's first screen parsed them all again. Kept under the text asked for
    and under the canonical one (``@daily`` is kept as ``0 0 * * *`` too: what a
    schedule's view says). An expression that cannot be parsed raises, and is not kept."""
    if not (isinstance(expr, str) and isinstance(timezone, str)):
        return Cron(expr, timezone)  # its own message for what is not text
    key = (expr, timezone)
    cron = _SHARED.get(key)
    if cron is None:
        cron = Cron(expr, timezone)
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        cron = _SHARED.setdefault((cron.expr, cron.timezone), cron)
        _SHARED[key] = cron
    return cron
