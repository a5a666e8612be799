"""The Health view's rows: a name, two sparklines with their totals beside them, and a last
column (a schedule's lateness, a queue's dead jobs).

The sparklines are drawn from zero up: a cell's bar is the busiest minute it covers against
the busiest of the row, so a steady schedule shows full bars and a minute without anything
the bottom line. A cell that covers any count is at least two eighths high, so without
colour (``NO_COLOR``) a minute with one failure still stands out from one without; the
totals beside say how many.

A row is one widget drawing one line (the columns laid out as Textual would lay out a
widget each: the sparklines share what the fixed columns leave). It was seven widgets; at
1,000 schedules the view's 120 rows were some 800 widgets, and laying them out and drawing
them each time the view was shown again took 100-200 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TypeAlias

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.content import Content
from textual.strip import Strip
from textual.style import Style
from textual.widget import Widget

__all__ = ["BARS", "HealthRow", "levels", "spark"]

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


def spark(data: Sequence[float], width: int, color: str) -> Content:
    """A sparkline ``width`` cells wide (see the module): its bars in ``color``, the cells
    without anything muted."""
    parts: list[tuple[str, str]] = []
    for level in levels(list(data), width):
        if level == 0:
            parts.append(("▁", "$text-disabled"))
        elif parts and parts[-1][1] == color:
            parts[-1] = (parts[-1][0] + BARS[level], color)  # (a run of bars: one piece, as drawn before)
        else:
            parts.append((BARS[level], color))
    return Content.assemble(*parts)


Cell: TypeAlias = Content | list[int]
"""What a row shows in a column: text, or a series (a sparkline's)."""


def _text(value: Sequence[int] | Content | str) -> Content:
    if isinstance(value, Content):
        return value
    return Content(value) if isinstance(value, str) else Content("")


class HealthRow(Widget):
    """One row: name, a sparkline and its total, another and its total, and a last column.
    The header row (``header=True``) has the columns' titles where the sparklines go."""

    DEFAULT_CSS = """
    HealthRow {
        height: 1;
        padding: 0 1;
    }
    HealthRow.-header { color: $text-muted; text-style: bold; }
    """

    NAME = 17
    TOTAL = 6
    """A total's width, right-aligned, then a space."""
    LAST = 10
    FIRST_COLOR = "$text-success"
    SECOND_COLOR = "$text-error"

    def __init__(self, *, header: bool = False, id: str | None = None) -> None:
        super().__init__(id=id, classes="-header" if header else None)
        self.header = header
        self.cells: tuple[Content, Cell, Content, Cell, Content, Content] = (
            Content(""), Content(""), Content(""), Content(""), Content(""), Content("")
        )  # fmt: skip
        """What each column shows: name, first series (a title in the header), its total,
        second series, its total, last column."""

    def show(
        self,
        name: Content | str,
        first: Sequence[int] | Content | str,
        first_total: Content | str,
        second: Sequence[int] | Content | str,
        second_total: Content | str,
        last: Content | str,
    ) -> None:
        """Draw the row (a header takes titles where a row takes series); redrawn only if
        something changed."""

        def column(value: Sequence[int] | Content | str) -> Cell:
            return _text(value) if self.header or isinstance(value, (Content, str)) else list(value)

        cells = (_text(name), column(first), _text(first_total), column(second), _text(second_total), _text(last))
        if not all(_same(a, b) for a, b in zip(cells, self.cells, strict=True)):
            self.cells = cells
            self.refresh()

    def show_last(self, last: Content | str) -> None:
        """Draw the last column alone (it counts on between reads)."""
        self.show(*self.cells[:5], last)

    def _columns(self) -> list[Content | tuple[list[int], int, str]]:
        """The line's pieces: text, or a sparkline (its series, width and colour)."""
        name, first, first_total, second, second_total, last = self.cells
        room = max(0, self.size.width - self.NAME - 2 * (self.TOTAL + 1) - self.LAST)
        first_width, second_width = room // 2, room - room // 2  # as Textual shares 1fr between two

        def series(cell: Cell, width: int, color: str) -> Content | tuple[list[int], int, str]:
            return _fit(cell, width) if isinstance(cell, Content) else (cell, width, color)

        return [
            _fit(name, self.NAME),
            series(first, first_width, self.FIRST_COLOR),
            _fit(first_total, self.TOTAL, right=True),
            _GAP,
            series(second, second_width, self.SECOND_COLOR),
            _fit(second_total, self.TOTAL, right=True),
            _GAP,
            _fit(last, self.LAST),
        ]

    def render(self) -> Content:
        return Content.assemble(*(piece if isinstance(piece, Content) else spark(*piece) for piece in self._columns()))

    def render_line(self, y: int) -> Strip:
        """:meth:`render`'s line as Textual draws it (the same pieces, each in its style
        with its place on the line, for a mouse selection), but with those styles kept
        rather than made anew for each of some forty pieces: 0.6 ms a row, most of the time
        to draw the view after a refresh."""
        width = self.size.width
        base = self.visual_style
        if y or not width:
            return Strip.blank(width, base.rich_style)
        segments: list[Segment] = []
        x = 0

        def add(text: str, style: Style) -> None:
            nonlocal x
            segments.append(Segment(text, _placed(style, x)))
            x += len(text)

        for piece in self._columns():
            if isinstance(piece, Content):
                for text, style in piece.render(base, end="", parse_style=self._get_style):
                    add(text, base + style)
                continue
            data, cells, color = piece
            bar, empty = base + self._get_style(color), base + self._get_style("$text-disabled")
            run = ""
            for level in levels(data, cells):
                if level:
                    run += BARS[level]
                    continue
                if run:
                    add(run, bar)
                    run = ""
                add("▁", empty)  # (a piece each, as spark() makes them)
            if run:
                add(run, bar)
        return Strip(segments, width).adjust_cell_length(width, base.rich_style)


@lru_cache(maxsize=4096)
def _placed(style: Style, x: int) -> RichStyle:
    """``style`` at ``x`` on a row's line (a few styles, a few hundred places)."""
    return style.rich_style_with_offset(x, 0)


def _same(a: Cell, b: Cell) -> bool:
    if isinstance(a, Content) and isinstance(b, Content):
        return a.is_same(b)
    return a == b


_SPACE = "not bold"
"""The style of the spaces between columns: they look the same, but the text of each column
stays a piece of its own (as when each was a widget; a picture of the screen places each
piece where its column starts)."""
_GAP = Content.styled(" ", _SPACE)


def _fit(text: Content, width: int, *, right: bool = False) -> Content:
    """``text`` in exactly ``width`` cells, cut with an ellipsis if longer."""
    text = text.truncate(width, ellipsis=True)
    pad = Content.styled(" " * (width - text.cell_length), _SPACE)
    return pad + text if right else text + pad
