"""The console's checkbox: ticked or not, it says so without colour.

Textual's checkbox draws ``▐X▌`` either way and tells the two apart by the colour of the
``X`` alone: under ``NO_COLOR`` (or on a terminal that drops colours) a ticked box looked
the same as an empty one. This one draws the ``X`` only when ticked (``▐ ▌`` when not)."""

from __future__ import annotations

from textual.widgets import Checkbox

__all__ = ["TickBox"]

TICKED = "X"
EMPTY = " "


class TickBox(Checkbox):
    """A checkbox whose box holds ``X`` when ticked and nothing when not."""

    def watch_value(self) -> None:
        self.BUTTON_INNER = TICKED if self.value else EMPTY
        super().watch_value()

    def on_mount(self) -> None:
        self.BUTTON_INNER = TICKED if self.value else EMPTY  # (the value given at creation)
        self.refresh()
