"""The fleet timeline grid: a row per schedule, its runs drawn at their scheduled time.

A line-API widget: it draws only the rows on screen, each from marks computed once per
(window, runs loaded, state) and cached, so 1,000 schedules cost what the 25 visible ones
cost. The first line is the time axis and stays put while the rows scroll under it.
"""

from __future__ import annotations

from collections.abc import Container
from datetime import datetime

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.color import Color
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from backend.model import Run, ScheduleView
from console import format as fmt
from console.fleet import CronCache
from console.timeline import Cell, Window, kind_of, row_marks, ticks
from console.widgets.palette import KIND_GLYPHS, STATUS_COLORS, theme_color

__all__ = ["MARKS", "TimelineGrid"]

MARKS = {
    "gap": "◌",
    "next": "○",
    "upcoming": "·",
    "now": "│",
    "unknown": "╌",
}
"""The timeline's marks besides runs (legend under ``?``)."""

NAME_MAX = 24
_PLAIN = Style()
"""Padding's style: never None (the NO_COLOR filter reads every segment's style)."""


class TimelineGrid(ScrollView, can_focus=True):
    """Rows of marks; a cursor (row, cell) on a run. The owner sets :meth:`show`'s data."""

    DEFAULT_CSS = """
    TimelineGrid {
        height: 1fr;
        scrollbar-size-vertical: 1;
        scrollbar-size-horizontal: 0;
        overflow-x: hidden;
    }
    """

    BINDINGS = [
        Binding("up", "row(-1)", "Up", show=False),
        Binding("down", "row(1)", "Down", show=False),
        Binding("pageup", "row(-10)", "Page up", show=False),
        Binding("pagedown", "row(10)", "Page down", show=False),
        Binding("home", "row(-1000000)", "First", show=False),
        Binding("end", "row(1000000)", "Last", show=False),
        Binding("j", "row(1)", "Down", show=False),
        Binding("k", "row(-1)", "Up", show=False),
        Binding("g", "row(-1000000)", "First", show=False),
        Binding("G", "row(1000000)", "Last", show=False),
        Binding("left", "step(-1)", "Previous run", show=False, id="timeline_previous_run"),
        Binding("right", "step(1)", "Next run", show=False, id="timeline_next_run"),
    ]

    class CursorMoved(Message):
        """The cursor moved to another row or cell (or the data under it changed)."""

    def __init__(self, crons: CronCache, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.crons = crons
        self.rows: list[ScheduleView] = []
        """The schedules shown, in order (the filter applied)."""
        self.runs: dict[str, list[Run]] = {}
        """Runs loaded per schedule for :attr:`window`, newest first."""
        self.limit = 0
        """The per-schedule limit the runs were loaded with (exactly that many: maybe more)."""
        self.window: Window | None = None
        self.now: datetime | None = None
        self.zone = "UTC"
        self.overdue: Container[str] = frozenset()
        self.cursor_row = 0
        self.cursor_cell: int | None = None
        self._marks: dict[str, tuple[tuple[object, ...], dict[int, Cell], int | None]] = {}
        self._styles: dict[tuple[object, ...], Style] = {}
        self._axis_cache: tuple[object, list[tuple[int, str]]] = (None, [])
        self._name_width: tuple[list[ScheduleView] | None, int] = (None, 0)

    # -- data ---------------------------------------------------------------------------
    @property
    def name_width(self) -> int:
        # Once per list of rows, not for every line drawn (a thousand names each time).
        rows, width = self._name_width
        if rows is not self.rows:
            longest = max((len(v.name) for v in self.rows), default=8)
            width = min(NAME_MAX, max(8, longest)) + 2  # a state glyph and a space
            self._name_width = (self.rows, width)
        return width

    @property
    def cells(self) -> int:
        """Grid cells that fit beside the names."""
        return max(10, self.size.width - self.name_width - 2)

    def show(
        self,
        rows: list[ScheduleView],
        runs: dict[str, list[Run]],
        window: Window,
        now: datetime,
        zone: str,
        *,
        limit: int,
        overdue: Container[str],
    ) -> None:
        """Draw these; the cursor stays on its schedule (and its cell's instant)."""
        selected = self.selected_name
        old = self.window
        if old is not None and old != window and self.cursor_cell is not None:
            index = window.index(old.cell_start(self.cursor_cell))  # the cursor stays on its instant
            self.cursor_cell = index if 0 <= index < window.cells else None
        self.rows, self.runs, self.window, self.now, self.zone = rows, runs, window, now, zone
        self.limit, self.overdue = limit, overdue
        if selected is not None:
            row = next((i for i, v in enumerate(rows) if v.name == selected), None)
            if row is not None:
                self.cursor_row = row
        self.cursor_row = max(0, min(self.cursor_row, len(rows) - 1))
        if self.cursor_cell is not None:
            self.cursor_cell = max(0, min(self.cursor_cell, window.cells - 1))
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        self.refresh()
        self.post_message(self.CursorMoved())

    def marks(self, view: ScheduleView) -> tuple[dict[int, Cell], int | None]:
        """The row's cells, computed once per (window, runs, state, now's cell)."""
        assert self.window is not None and self.now is not None
        runs = self.runs.get(view.name, [])
        key = (self.window, id(runs), len(runs), view.enabled, view.state_note, view.last_run,
               self.window.index(self.now), view.cron, view.timezone)
        cached = self._marks.get(view.name)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        truncated = self.limit > 0 and len(runs) >= self.limit
        cells, known_from = row_marks(
            self.window, view, runs, self.crons.get(view.cron, view.timezone), self.now, truncated=truncated
        )
        self._marks[view.name] = (key, cells, known_from)
        return cells, known_from

    @property
    def selected_name(self) -> str | None:
        if 0 <= self.cursor_row < len(self.rows):
            return self.rows[self.cursor_row].name
        return None

    @property
    def cursor(self) -> tuple[ScheduleView, Cell | None, int | None] | None:
        """The schedule under the cursor, the cell (if it holds anything) and its index."""
        name = self.selected_name
        if name is None or self.window is None:
            return None
        view = self.rows[self.cursor_row]
        if self.cursor_cell is None:
            return view, None, None
        cells, _ = self.marks(view)
        return view, cells.get(self.cursor_cell), self.cursor_cell

    @property
    def selected_run(self) -> Run | None:
        cursor = self.cursor
        if cursor is None or cursor[1] is None:
            return None
        return cursor[1].worst

    # -- moving -------------------------------------------------------------------------
    def select_name(self, name: str) -> bool:
        index = next((i for i, v in enumerate(self.rows) if v.name == name), None)
        if index is None:
            return False
        self._move_row(index)
        return True

    def action_row(self, delta: int) -> None:
        if self.rows:
            self._move_row(max(0, min(len(self.rows) - 1, self.cursor_row + delta)))

    def _move_row(self, index: int) -> None:
        self.cursor_row = index
        if self.cursor_cell is not None:
            self.cursor_cell = self._nearest_run(self.cursor_cell)
        self._keep_visible()
        self.refresh()
        self.post_message(self.CursorMoved())

    def action_step(self, direction: int) -> None:
        """Left/right: to the previous/next cell of this row that holds a run."""
        if not self.rows or self.window is None:
            return
        cells, _ = self.marks(self.rows[self.cursor_row])
        filled = sorted(i for i, c in cells.items() if c.runs or c.gap)
        if not filled:
            self.cursor_cell = None
        elif self.cursor_cell is None:
            self.cursor_cell = filled[-1] if direction < 0 else filled[0]
            if direction < 0 and self.now is not None:  # from nothing, left starts at now
                past = [i for i in filled if i <= self.window.index(self.now)]
                self.cursor_cell = past[-1] if past else filled[0]
        else:
            ahead = [i for i in filled if (i - self.cursor_cell) * direction > 0]
            if ahead:
                self.cursor_cell = ahead[0] if direction > 0 else ahead[-1]
        self.refresh()
        self.post_message(self.CursorMoved())

    def _nearest_run(self, cell: int) -> int | None:
        cells, _ = self.marks(self.rows[self.cursor_row])
        filled = [i for i, c in cells.items() if c.runs or c.gap]
        return min(filled, key=lambda i: (abs(i - cell), -i)) if filled else cell

    def _keep_visible(self) -> None:
        visible = max(1, self.size.height - 1)
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False)

    def on_click(self, event: Click) -> None:
        if event.y == 0 or self.window is None:
            return
        row = int(self.scroll_y) + event.y - 1
        if 0 <= row < len(self.rows):
            self.cursor_row = row
            cell = event.x - self.name_width
            self.cursor_cell = self._nearest_run(cell) if 0 <= cell < self.window.cells else None
            self.refresh()
            self.post_message(self.CursorMoved())

    # -- drawing ------------------------------------------------------------------------
    def _style(self, key: tuple[object, ...]) -> Style:
        """Rich styles from theme variables, resolved once per theme."""
        full = (self.app.theme, *key)
        style = self._styles.get(full)
        if style is None:
            kind, value, *flags = key
            color = theme_color(self.app, str(value))
            if kind == "cursor":
                text = Color.parse(color).get_contrast_text(1.0).hex6
                style = Style(color=text, bgcolor=color, bold=True, underline=True)
            else:
                style = Style(color=color, bold="bold" in flags, reverse="reverse" in flags, dim="dim" in flags)
            self._styles[full] = style
        return style

    def _mark(self, cell: Cell) -> tuple[str, Style]:
        run = cell.worst
        if run is not None:
            status = run.status
            color = STATUS_COLORS.get(status, "foreground")
            if status in ("skipped", "missed", "running"):
                return fmt.STATUS_GLYPHS[status], self._style(("mark", color, "bold"))
            glyph = KIND_GLYPHS[kind_of(run)]
            if status == "failed":  # unmistakable without colour, in 16 colours, under NO_COLOR
                return glyph, self._style(("mark", color, "bold", "reverse"))
            return glyph, self._style(("mark", color))
        if cell.gap:
            return MARKS["gap"], self._style(("mark", "text-warning", "bold"))
        if cell.next:
            return MARKS["next"], self._style(("mark", "text-primary", "bold"))
        return MARKS["upcoming"], self._style(("mark", "text-muted"))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self.window is None or self.now is None:
            return Strip.blank(width, _PLAIN)
        if y == 0:
            return self._axis(width)
        index = int(self.scroll_y) + y - 1
        if not 0 <= index < len(self.rows):
            return Strip.blank(width, _PLAIN)
        return self._row(self.rows[index], index == self.cursor_row, width)

    def _axis(self, width: int) -> Strip:
        assert self.window is not None and self.now is not None
        window, name_w = self.window, self.name_width
        label = f"{fmt.zone_abbr(self.zone, self.now)} ▸"
        now_i = window.index(self.now)
        key = (window, self.zone)
        if self._axis_cache[0] != key:
            self._axis_cache = (key, ticks(window, self.zone))
        chars = [" "] * window.cells
        for i, text in self._axis_cache[1]:
            if i + len(text) <= window.cells:  # a label cut at the right edge would misread
                chars[i : i + len(text)] = text
        muted = self._style(("axis", "text-muted"))
        segments = [Segment(label.rjust(name_w - 1)[: name_w - 1] + " ", self._style(("axis", "text-muted", "bold")))]
        if not 0 <= now_i < window.cells:
            segments.append(Segment("".join(chars), muted))
        else:
            # "now" is ▼ in its column; on a label, that character of the label reversed
            # (a ▼ there hid the label, or the label was left out)
            on_label = chars[now_i] != " "
            now = (chars[now_i], self._style(("axis", "text-accent", "bold", "reverse"))) if on_label else (
                "▼", self._style(("axis", "text-accent", "bold")))  # fmt: skip
            segments += [Segment("".join(chars[:now_i]), muted), Segment(*now), Segment("".join(chars[now_i + 1 :]), muted)]
        return Strip(segments).adjust_cell_length(width, _PLAIN)

    def _row(self, view: ScheduleView, is_cursor: bool, width: int) -> Strip:
        assert self.window is not None and self.now is not None
        window, name_w = self.window, self.name_width
        cells, known_from = self.marks(view)
        if view.name in self.overdue:
            state = ("⚠", self._style(("state", "text-warning", "bold", "reverse")))
        elif not view.enabled:
            state = ("○", self._style(("state", "text-muted")))
        else:
            state = (" ", self._style(("state", "foreground")))
        name = view.name if len(view.name) <= name_w - 2 else view.name[: name_w - 3] + "…"
        name_style = self._style(("name", "foreground", "bold", "reverse")) if is_cursor else self._style(("name", "foreground", "bold"))
        segments = [Segment(*state), Segment(name.ljust(name_w - 2), name_style), Segment(" ", _PLAIN)]
        now_i = window.index(self.now)
        muted = self._style(("mark", "text-muted", "dim"))
        for i in range(window.cells):
            cell = cells.get(i)
            if cell is not None and (cell.runs or cell.gap or cell.upcoming):
                char, style = self._mark(cell)
            elif i == now_i:
                char, style = MARKS["now"], self._style(("mark", "text-accent", "bold"))
            elif known_from is not None and i < known_from:
                char, style = MARKS["unknown"], muted
            else:
                char, style = " ", muted
            if is_cursor and i == self.cursor_cell:
                style = self._style(("cursor", "accent"))
            segments.append(Segment(char, style))
        return Strip(Segment.simplify(segments)).adjust_cell_length(width, _PLAIN)

    def refresh_now(self, now: datetime) -> None:
        """A tick: redraw only if "now" moved to another cell (the marks depend on it)."""
        if self.window is None or self.now is None:
            self.now = now
            return
        moved = self.window.index(now) != self.window.index(self.now)
        self.now = now
        if moved:
            self.refresh()
