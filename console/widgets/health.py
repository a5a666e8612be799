"""The Health view's rows: a name, two sparklines with their totals beside them, and a last
column (a schedule's lateness, a queue's dead jobs).

The sparklines are Textual's :class:`~textual.widgets.Sparkline`, drawn from zero up: a
cell's bar is the busiest minute it covers against the busiest of the row, so a steady
schedule shows full bars and a minute without anything the bottom line. A cell that covers
any count is at least two eighths high, so without colour (``NO_COLOR``) a minute with one
failure still stands out from one without; the totals beside say how many.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Sparkline

from console.widgets.line import Line

__all__ = ["BARS", "HealthRow", "Spark", "levels"]

BARS = "▁▂▃▄▅▆▇█"


def levels(data: Sequence[float], width: int) -> list[int]:
    """Each of ``width`` cells as a level 0-7 (an index into :data:`BARS`): the largest
    value among the data the cell covers, scaled from zero to the largest of all; 0 only for
    cells whose values are all zero."""
    if width <= 0:
        return []
    if not data:
        return [0] * width
    count = len(data)
    peaks = []
    for cell in range(width):
        low = cell * count // width
        high = max(low + 1, (cell + 1) * count // width)
        peaks.append(max(data[low:high]))
    top = max(peaks)
    if top <= 0:
        return [0] * width
    return [0 if peak <= 0 else 1 + round(peak / top * 6) for peak in peaks]


class Spark(Sparkline):
    """A :class:`~textual.widgets.Sparkline` from zero up (see the module docstring); its
    bars take the widget's colour, the cells without anything are muted."""

    DEFAULT_CSS = """
    Spark {
        width: 1fr;
        height: 1;
    }
    """

    def render(self) -> Content:
        cells = levels(list(self.data or []), self.size.width)
        parts: list[tuple[str, str] | str] = []
        for level in cells:
            parts.append(("▁", "$text-disabled") if level == 0 else BARS[level])
        return Content.assemble(*parts)


class HealthRow(Horizontal):
    """One row: name, a sparkline and its total, another and its total, and a last column.
    The header row (``header=True``) has the columns' titles where the sparklines go."""

    DEFAULT_CSS = """
    HealthRow {
        height: 1;
        padding: 0 1;
    }
    HealthRow > .name { width: 17; }
    HealthRow > .total { width: 7; text-align: right; padding-right: 1; }
    HealthRow > .last { width: 10; }
    HealthRow > .title { width: 1fr; }
    HealthRow > Spark.first { color: $text-success; }
    HealthRow > Spark.second { color: $text-error; }
    HealthRow.-header { color: $text-muted; text-style: bold; }
    """

    def __init__(self, *, header: bool = False, id: str | None = None) -> None:
        super().__init__(id=id, classes="-header" if header else None)
        self.header = header
        self.name_cell = Line(classes="name")
        self.first: Line | Spark = Line(classes="title") if header else Spark(classes="first")
        self.first_total = Line(classes="total")
        self.second: Line | Spark = Line(classes="title") if header else Spark(classes="second")
        self.second_total = Line(classes="total")
        self.last = Line(classes="last")

    def compose(self) -> ComposeResult:
        yield from (self.name_cell, self.first, self.first_total, self.second, self.second_total, self.last)

    def show(
        self,
        name: Content | str,
        first: Sequence[int] | Content | str,
        first_total: Content | str,
        second: Sequence[int] | Content | str,
        second_total: Content | str,
        last: Content | str,
    ) -> None:
        """Draw the row (a header takes titles where a row takes series)."""
        self.name_cell.update(name)
        for cell, value in ((self.first, first), (self.second, second)):
            if isinstance(cell, Line):
                cell.update(value if isinstance(value, (Content, str)) else "")
            elif not isinstance(value, (Content, str)) and list(cell.data or []) != list(value):
                cell.data = list(value)
        self.first_total.update(first_total)
        self.second_total.update(second_total)
        self.last.update(last)
