"""The fleet timeline's arithmetic: windows, zoom levels, cells, marks and ticks.

No Textual here: :class:`Window` maps instants to character cells, :func:`row_marks` turns
one schedule's runs and cron into the marks of its row (runs at their scheduled time, the
worst status when several share a cell, slots that have no run, the next fires), and
:func:`ticks` places the axis labels in a zone. The widget draws what these return.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Literal

from backend.cron import Cron
from backend.model import Run, ScheduleView
from console import format as fmt
from console.fleet import OVERDUE_AFTER

__all__ = [
    "SEVERITY",
    "ZOOMS",
    "Cell",
    "Window",
    "kind_of",
    "row_marks",
    "ticks",
    "zoom_label",
]

ZOOMS: tuple[timedelta, ...] = (
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
    timedelta(days=2),
    timedelta(days=7),
)
"""The spans ``+``/``-`` step through, 15 minutes to 7 days."""

DEFAULT_ZOOM = 4
"""6 hours."""

FUTURE_SHARE = 5
"""One cell in this many is right of "now" (where the next fires show), when following now."""

SEVERITY = {"failed": 5, "missed": 4, "skipped": 3, "running": 2, "succeeded": 1}
"""Which status wins a shared cell: the worst."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

Kind = Literal["single", "wonLock", "external", "runnow", "backfill"]


def kind_of(run: Run) -> Kind:
    """Who fired a run, as the timeline tells them apart: the coordination outcome, and for
    manual runs a Run now (its slot is the moment it was asked for) or a backfill (an old slot)."""
    if run.trigger != "manual":
        outcome = run.coordination_outcome
        return outcome if outcome in ("single", "wonLock", "external") else "single"
    if run.fired_at is not None:
        return "runnow" if run.fired_at - run.scheduled_at < timedelta(minutes=1) else "backfill"
    return "runnow" if run.scheduled_at.microsecond else "backfill"


def zoom_label(span: timedelta) -> str:
    if span >= timedelta(days=1):
        return f"{span.days}d"
    if span >= timedelta(hours=1):
        return f"{span.seconds // 3600}h"
    return f"{span.seconds // 60}m"


@dataclass(frozen=True)
class Window:
    """``cells`` character cells of ``cell`` each, the first starting at ``start``. Cells
    sit at fixed instants (multiples of ``cell`` since the epoch), so a window that follows
    "now" moves by whole cells and what is drawn in a cell does not flicker."""

    start: datetime
    cell: timedelta
    cells: int

    @classmethod
    def following(cls, now: datetime, span: timedelta, cells: int) -> Window:
        """Ending a fifth of ``span`` after ``now``."""
        cell = cls._cell(span, cells)
        future = max(1, cells // FUTURE_SHARE)
        now_index = (now - _EPOCH) // cell
        return cls(_EPOCH + cell * (now_index - (cells - future - 1)), cell, cells)

    @classmethod
    def around(cls, center: datetime, span: timedelta, cells: int) -> Window:
        """Centred on ``center`` (after a pan or a zoom away from now)."""
        cell = cls._cell(span, cells)
        return cls(_EPOCH + cell * ((center - _EPOCH) // cell - cells // 2), cell, cells)

    @staticmethod
    def _cell(span: timedelta, cells: int) -> timedelta:
        us = -(-span // _US // max(1, cells))  # round up: the window covers at least the span
        return _US * max(us, 1_000_000)

    @property
    def end(self) -> datetime:
        return self.start + self.cell * self.cells

    @property
    def center(self) -> datetime:
        return self.start + self.cell * (self.cells // 2)

    def index(self, at: datetime) -> int:
        """The cell holding ``at`` (may be outside ``0 .. cells-1``)."""
        return (at - self.start) // self.cell

    def cell_start(self, index: int) -> datetime:
        return self.start + self.cell * index


@dataclass
class Cell:
    """What one cell of a row holds."""

    runs: list[Run] = field(default_factory=list)
    """The runs scheduled in it, newest first."""
    gap: bool = False
    """A past slot of the schedule falls here and no run does."""
    upcoming: bool = False
    """A next fire falls here."""
    next: bool = False
    """The very next fire falls here."""

    @property
    def worst(self) -> Run | None:
        """The run shown: the worst status (the newest among equals)."""
        if not self.runs:
            return None
        return max(self.runs, key=lambda r: SEVERITY.get(r.status, 0))  # max keeps the first (newest) of equals


def _slots(cron: Cron, start: datetime, end: datetime, cap: int) -> tuple[list[datetime], bool]:
    """The cron's slots in ``(start, end]``, at most ``cap``; and whether it was cut short."""
    found = list(islice(cron.occurrences(start, end), cap + 1))
    return found[:cap], len(found) > cap


def row_marks(
    window: Window,
    view: ScheduleView,
    runs: Sequence[Run],
    cron: Cron | None,
    now: datetime,
    *,
    truncated: bool = False,
) -> tuple[dict[int, Cell], int | None]:
    """The cells of one schedule's row that hold something, and (when ``truncated``: the
    runs loaded stop short of the window's start) the first cell whose runs are known.

    * Runs sit in the cell of their ``scheduled_at``.
    * A *gap* is a past slot (due :data:`OVERDUE_AFTER` ago or more) with no run in its
      cell, after a run is known (so a schedule is not blamed for the time before it
      existed, nor for the time before it was last enabled, nor while it is disabled).
    * *Upcoming* cells hold the next fires after ``now`` (enabled schedules only).
    Slot walks are capped at twice the cells: a schedule firing more often than a cell lasts
    expects a run in every cell, which is all a gap needs to know."""
    cells: dict[int, Cell] = {}
    for run in runs:  # newest first
        i = window.index(run.scheduled_at)
        if 0 <= i < window.cells:
            cells.setdefault(i, Cell()).runs.append(run)
    known_from = window.index(runs[-1].scheduled_at) if truncated and runs else None
    if cron is None:
        return cells, known_from
    cap = 2 * window.cells + 8

    # Gaps: slots after a known run that have no run of their own.
    known = runs[-1].scheduled_at if runs else (view.last_run.scheduled_at if view.last_run else None)
    if known is not None:
        low = max(known, window.start - _US)
        high = min(now - OVERDUE_AFTER, window.end - _US)
        note = view.state_note
        if note is not None and note.at > low and view.enabled:
            low = note.at  # slots before re-enabling are not owed
        if note is not None and not view.enabled:
            high = min(high, note.at)
        if low < high:
            slots, dense = _slots(cron, low, high, cap)
            if dense:  # more slots than cells: every cell from the first on expects a run
                first, last = window.index(slots[0]), window.index(high)
                targets: Iterator[int] = iter(range(max(first, 0), min(last, window.cells - 1) + 1))
            else:
                targets = (window.index(s) for s in slots)
            for i in targets:
                if 0 <= i < window.cells and not (i in cells and cells[i].runs):
                    cells.setdefault(i, Cell()).gap = True

    # The next fires, right of now (every cell from the next on, for a schedule that fires
    # more often than a cell lasts).
    if view.enabled and now < window.end:
        slots, dense = _slots(cron, now, window.end - _US, cap)
        upcoming = range(window.index(slots[0]), window.cells) if dense else [window.index(s) for s in slots]
        for n, i in enumerate(upcoming):
            if 0 <= i < window.cells:
                cell = cells.setdefault(i, Cell())
                cell.upcoming, cell.next = True, n == 0
    return cells, known_from


_STEPS: tuple[timedelta, ...] = (
    timedelta(minutes=1),
    timedelta(minutes=2),
    timedelta(minutes=5),
    timedelta(minutes=10),
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=2),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
    timedelta(days=2),
)
_LABEL_ROOM = 7
"""Cells a label needs ("09:00" or "03-02", and a gap)."""


def ticks(window: Window, zone: str) -> list[tuple[int, str]]:
    """Axis labels: (cell, text) at round times in ``zone`` (``HH:MM``; a date at midnight
    and for day steps), spaced at least :data:`_LABEL_ROOM` cells apart."""
    step = next((s for s in _STEPS if s / window.cell >= _LABEL_ROOM), _STEPS[-1])
    tz = fmt.zone_of(zone)
    local = window.start.astimezone(tz)
    if step >= timedelta(days=1):
        at = local.replace(hour=0, minute=0, second=0, microsecond=0)
    elif step >= timedelta(hours=1):
        hours = step.seconds // 3600
        at = local.replace(hour=local.hour - local.hour % hours, minute=0, second=0, microsecond=0)
    else:
        minutes = step.seconds // 60
        at = local.replace(minute=local.minute - local.minute % minutes, second=0, microsecond=0)
    found: list[tuple[int, str]] = []
    last = -_LABEL_ROOM
    for _ in range(window.cells + 2):
        # Wall-clock steps (a label stays on the hour across a DST change); a day step is
        # a calendar day.
        instant = at.replace(tzinfo=None).replace(tzinfo=tz).astimezone(UTC)
        i = window.index(instant)
        if i >= window.cells:
            break
        if i >= 0 and i - last >= _LABEL_ROOM:
            midnight = at.hour == 0 and at.minute == 0
            found.append((i, at.strftime("%m-%d") if midnight or step >= timedelta(days=1) else at.strftime("%H:%M")))
            last = i
        at = _wall_add(at, step)
    return found


def _wall_add(at: datetime, step: timedelta) -> datetime:
    naive = at.replace(tzinfo=None) + step
    return naive.replace(tzinfo=at.tzinfo)
