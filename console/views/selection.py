"""The schedule selected that went from under the cursor by itself, on the views that list
schedules (Schedules, Timeline).

Deleted elsewhere, or out of a ``/`` filter by its own change (``/failed``: its next run
succeeded), the selected schedule's row goes and the cursor falls on another: a key
pressed just then would act on a schedule nobody picked (``r`` fired it, ``e`` disabled
it). So it is said at once, and the next key that acts does nothing but say so again;
moving the cursor chooses what it is on now. A row that a filter being typed leaves out
is the operator's doing: no surprise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SelectionLeft"]


class SelectionLeft:
    """Watches the selected schedule across redraws. ``deleted`` says how one that is gone
    went ("was deleted elsewhere"); ``notify`` is the view's."""

    def __init__(self, notify: Callable[..., Any], deleted: str) -> None:
        self.notify = notify
        self.deleted = deleted
        self.moved: tuple[str, str | None] | None = None
        """The schedule that left, and the one the cursor fell on instead, until the operator
        moves the cursor or presses a key that acts."""
        self.why = deleted
        """Why :attr:`moved`'s schedule left: deleted, or out of the filter."""
        self._filter_shown: str | None = None
        """The filter the rows were last drawn with."""

    def redrawn(self, before: str | None, landed: str | None, *, exists: bool, filter_text: str) -> None:
        """The rows were drawn again: the cursor was on ``before``, is on ``landed`` now;
        ``exists``: whether ``before`` is still a schedule; under ``filter_text``."""
        same_filter, self._filter_shown = self._filter_shown == filter_text, filter_text
        if before is None or landed == before:
            return
        elsewhere = f"; the cursor is on {landed} now" if landed is not None else ""
        shown = filter_text.strip()
        if not exists:
            self.moved, self.why = (before, landed), self.deleted
            self.notify(f"{before} is gone: it {self.deleted}{elsewhere}.", title="Schedule deleted",
                        severity="warning", markup=False)  # fmt: skip
        elif same_filter and shown:
            self.moved, self.why = (before, landed), f"left the filter “{shown}”"
            self.notify(f"{before} no longer matches the filter “{shown}”{elsewhere}.",
                        title="Schedule left the filter", severity="warning", markup=False)  # fmt: skip

    def chosen(self, on: str | None) -> None:
        """The cursor is on ``on``: moved there by the operator unless it is where it fell."""
        if self.moved is not None and on != self.moved[1]:
            self.moved = None

    def holds(self, action: str) -> bool:
        """Whether a key that acts may act on the selection; if not (the schedule left just
        before), it says so and the next key acts."""
        if self.moved is None:
            return True
        gone, landed = self.moved
        self.moved = None
        again = f" Press the key again to act on {landed}." if landed is not None else ""
        self.notify(f"{action}: not done. {gone} {self.why} and the cursor moved by itself.{again}",
                    title="Schedule deleted" if self.why == self.deleted else "Schedule left the filter",
                    severity="warning", markup=False)  # fmt: skip
        return False
