"""The schedules table: one row per schedule, what matters most on the left.

Columns by priority: name, state (on, off, overdue), next fire (a countdown), last run (its
status, age or elapsed time, duration, who fired it, and a newer manual run), then cron,
zone and trigger. Every column that changes while the console runs has a fixed width:
updating a cell then never makes the table re-measure a column of a thousand rows (that
re-measuring froze the console after each minute boundary at 1,000 schedules).

A refresh that changes many schedules at once (every one of 1,000 fired at the top of the
hour) updates the rows on screen at once and the others in batches (:data:`ROWS_PER_BATCH`)
with the event loop free in between: building a thousand rows' cells in one go kept a key
pressed then waiting 150-200 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from itertools import islice, zip_longest
from typing import Any, ClassVar, Self, TypeVar

from rich.console import RenderableType
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual._types import SegmentLines
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.render import measure
from textual.renderables.styled import Styled
from textual.widget import Widget
from textual.widgets import DataTable
from textual.widgets._data_table import _EMPTY_TEXT, Row, default_cell_formatter
from textual.widgets.data_table import ColumnKey, DuplicateKey, RowKey

from backend.model import Run, ScheduleView
from backend.safetext import in_line
from console import format as fmt
from console.fleet import CronCache, Overdue
from console.widgets.palette import OUTCOME_COLORS, status_style, theme_color
from console.workers import work

__all__ = [
    "BATCH_PAUSE",
    "LAST_WIDTH",
    "NAME_MAX",
    "ROWS_PER_BATCH",
    "STORED_MARK",
    "FreshTable",
    "RingFreeCache",
    "SchedulesTable",
    "last_run_text",
]

NAME_MAX = 28
"""Longer names are cut with an ellipsis (the detail bar shows the whole name)."""
STORED_MARK = "⊕"
"""After the name of a schedule created at run time (stored; ``E`` edits it, ``D`` deletes it)."""
LAST_WIDTH = 34
ROWS_PER_BATCH = 50
"""Rows off screen brought up to date at a time after a refresh changed them (~3 ms of work:
a key pressed meanwhile waits for one batch, not for all of them)."""
BATCH_PAUSE = 0.005
"""Seconds between two batches: the event loop goes idle in between, so a key pressed
meanwhile is handled whole (it takes several turns of the loop; with a bare ``sleep(0)``
between batches it waited for most of them)."""


def _run_age(run: Run, view: ScheduleView, now: datetime) -> str:
    if run.status == "running":
        started = run.fired_at or run.scheduled_at
        budget = fmt.compact_delta(timedelta(seconds=view.max_runtime_s)).split(" ")[0]
        return f"{fmt.age(started, now)}/{budget}"
    return f"{fmt.age(run.finished_at or run.fired_at or run.scheduled_at, now)} ago"


def last_run_text(view: ScheduleView, now: datetime, app: object) -> Text:
    """``✓ succeeded 3m ago 310ms ◆`` (a running one: ``▶ running 12s/30m``, its elapsed
    time against max_runtime), then ``✎▶ 2s`` when a manual run is newer than that slot."""
    from textual.app import App

    assert isinstance(app, App)
    muted = Style(color=theme_color(app, "text-muted"))
    last = view.last_run
    if last is None:
        text = Text("- " if view.latest_manual is None else "", style=muted)
    else:
        # Each part its own span: a Text's base style would spread the failure's reverse.
        text = Text()
        text.append(f"{fmt.STATUS_GLYPHS.get(last.status, '?')} {last.status}", style=status_style(app, last.status))
        text.append(f" {_run_age(last, view, now)}")
        if last.status != "running" and last.duration_ms is not None:
            text.append(f" {fmt.duration(last.duration_ms)}", style=muted)
        text.append(" ")
        text.append(
            fmt.OUTCOME_GLYPHS.get(last.coordination_outcome, "?"),
            style=Style(color=theme_color(app, OUTCOME_COLORS.get(last.coordination_outcome, "foreground"))),
        )
    manual = view.latest_manual
    if manual is not None and (last is None or (manual.scheduled_at, manual.id) > (last.scheduled_at, last.id)):
        text.append(" " if last is not None else "")
        text.append(fmt.OUTCOME_GLYPHS["manual"], style=Style(color=theme_color(app, OUTCOME_COLORS["manual"])))
        text.append(fmt.STATUS_GLYPHS.get(manual.status, "?"), style=status_style(app, manual.status))
        text.append(f" {_run_age(manual, view, now)}", style=muted)
    text.truncate(LAST_WIDTH, overflow="ellipsis")
    return text


_LINE_BREAK = Text("\n")
"""What Rich joins a text's wrapped lines with."""

K = TypeVar("K")
V = TypeVar("V")


class RingFreeCache(LRUCache[K, V]):
    """Textual's LRU cache, but cleared without leaving garbage for the cycle collector.

    Textual's keeps its entries in a ring of linked lists: cleared, the ring is a cycle that
    only a full collection frees, with every rendered line in it. A table clears its caches
    whenever it changes (its rows replaced, focus, a resize), so tens of thousands of
    objects waited for full collections that took 50-100 ms each at 1,000 schedules."""

    def clear(self) -> None:
        for link in self._cache.values():
            link.clear()  # the ring broken: reference counting frees every entry now
        super().clear()


class FreshTable(DataTable[Text | str]):
    """A DataTable that never shows rows drawn with the column widths of before: Textual
    measures new rows when idle and keeps lines it drew in between (a frame could show the
    first rows cut to the old widths). Once measured, those lines are dropped.

    Its render caches hold a few screens (:data:`CACHED_LINES`, :data:`CACHED_CELLS`), not
    Textual's 1,000 rows and 10,000 cells: every entry is keyed by the table's update count,
    which the countdowns move every second, so older ones are never read again; they only
    kept the garbage collector busy. And they are cleared without cycles (:class:`RingFreeCache`)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # k9s's and htop's habits, beside the arrows (a subclass's bindings add to these)
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "scroll_top", "First", show=False),
        Binding("G", "scroll_bottom", "Last", show=False),
        Binding("home", "scroll_top", "First", show=False),
        Binding("end", "scroll_bottom", "Last", show=False),
    ]

    CACHED_LINES = 200
    """Rows and lines kept rendered (a tall terminal shows ~100)."""
    CACHED_CELLS = 1000
    """Cells kept rendered (~100 rows of up to 10 columns)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # (before Textual's init, which lists the rows: the row locations they were listed
        # from, a new object after clear, sort or remove_row; the row count)
        self._rows_kept: tuple[object, int, list[Row]] = (None, 0, [])
        self._offsets_kept: list[tuple[RowKey, int]] = []
        super().__init__(*args, **kwargs)
        self._row_render_cache = RingFreeCache(self.CACHED_LINES)
        self._cell_render_cache = RingFreeCache(self.CACHED_CELLS)
        self._row_renderable_cache = RingFreeCache(self.CACHED_LINES)
        self._line_cache = RingFreeCache(self.CACHED_LINES)
        self._cells_drawn: RingFreeCache[tuple[object, ...], tuple[object, SegmentLines]] = RingFreeCache(
            self.CACHED_CELLS
        )
        """The cells rendered (:meth:`_render_cell`), with what each showed."""
        # (one entry each, but Textual's ring of one is a cycle too: the list of every row)
        self._rows_made: dict[str, tuple[RowKey, Row, dict[ColumnKey, Text | str]]] = {}
        """Each row added by :meth:`add_plain_rows` (its key, row and cells), by its key:
        added again with the same cells, it is taken as it was."""
        self._measured: dict[RowKey, tuple[object, ...]] = {}
        """The cells of each row (in the columns sized to their cells) as last measured."""
        self._offset_cache = RingFreeCache(1)
        self._ordered_row_cache = RingFreeCache(1)

    @property
    def ordered_rows(self) -> list[Row]:
        """As Textual's, but kept while the rows stay the same rows in the same order:
        Textual's is keyed by the update count, so every cell changed (the countdowns, every
        second) made the next frame list a thousand rows again, and their line offsets."""
        locations = self._row_locations
        kept_for, count, rows = self._rows_kept
        if kept_for is locations and count == len(self.rows):
            return rows
        rows = super().ordered_rows
        if all(row.height == 1 and not row.auto_height for row in rows):  # else heights may change
            self._rows_kept = (locations, len(self.rows), rows)
            self._offsets_kept = [(row.key, 0) for row in rows]
        return rows

    @property
    def _y_offsets(self) -> list[tuple[RowKey, int]]:
        rows = self.ordered_rows  # (a row a line when kept)
        if self._rows_kept[2] is rows:
            return self._offsets_kept
        offsets: list[tuple[RowKey, int]] = super()._y_offsets
        return offsets

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """Column widths for new rows. Textual renders and measures every cell through the
        console (a terminal-size call each); a thousand rows shown again when a filter is
        cleared held the UI loop for ~170 ms. These rows are one line high and unlabelled,
        so a cell's width is its text's cell length."""
        keys = list(new_rows)
        for key in keys:
            row = self.rows.get(key)
            if row is not None and (row.auto_height or row.height != 1 or row.label is not None):
                super()._update_dimensions(keys)  # Textual's way, for the rows that need it
                return
        # Only the columns sized to their cells, and only cells not measured before: a
        # column never narrows (as Textual's), so rows shown again with the cells they had
        # when measured (a filter cleared) change nothing.
        ordered = self.ordered_columns
        columns = [column for column in ordered if column.auto_width]
        at = [ordered.index(column) for column in columns]
        measured = self._measured
        for key in keys:
            values = self._data.get(key)
            if values is None or key not in self._row_locations:
                continue  # removed before the idle came
            in_order = list(values.values())  # (in the columns' order, as rows are made)
            cells = tuple(in_order[i] if i < len(in_order) else None for i in at)
            before = measured.get(key)
            if before is not None and all(a is b for a, b in zip(before, cells, strict=True)):
                continue
            measured[key] = cells
            for column, value in zip(columns, cells, strict=True):
                text = value if isinstance(value, Text) else default_cell_formatter(value)
                width = text.cell_len if isinstance(text, Text) else measure(self.app.console, text, 1)
                if width > column.content_width:
                    column.content_width = width
        width = sum(column.get_render_width(self) for column in self.columns.values()) + self._row_label_column_width
        self.virtual_size = Size(width, self._total_row_height + (self.header_height if self.show_header else 0))

    def add_column(self, *args: Any, **kwargs: Any) -> ColumnKey:
        self._measured.clear()  # (every row measured again, for it too)
        self._rows_made.clear()
        return super().add_column(*args, **kwargs)

    def clear(self, columns: bool = False) -> Self:
        if columns:
            self._measured.clear()
            self._rows_made.clear()
        return super().clear(columns)

    @property
    def measuring(self) -> bool:
        """New rows or changed cells wait to be measured (at the next idle): their columns
        may still widen."""
        return bool(self._require_update_dimensions or self._updated_cells)

    def measure_now(self) -> None:
        """Measure the rows just added before anything draws them. Textual measures at its
        next idle, and a frame drawn before then (on a loaded machine, a screenshot too)
        shows them cut to the widths of before: after :meth:`clear`, the headers' widths."""
        if not self._require_update_dimensions:
            return
        self._require_update_dimensions = False
        rows = self._new_rows.copy()
        self._new_rows.clear()
        self._update_dimensions(rows)
        self._line_cache.clear()
        self.refresh()

    async def _on_idle(self, event: events.Idle) -> None:
        measuring = self._require_update_dimensions
        await super()._on_idle(event)
        if measuring:
            self._line_cache.clear()
            self.refresh()

    def forget_rendered(self, cells: dict[RowKey, set[ColumnKey]]) -> None:
        """Drop what is rendered of these cells (row -> columns), changed in place, and of
        their rows and the lines drawn from them. (Counting an update instead, as Textual
        does, drops the rendering of every cell: all the cells on screen were drawn again,
        through Rich, for a countdown changed in each row.)"""
        rows = set(cells)
        indices: set[object] = {self._row_locations.get(row) for row in rows}
        changed = {(row, column) for row, columns in cells.items() for column in columns}
        for cell in [key for key in self._cells_drawn.keys() if key[:2] in changed]:
            self._cells_drawn.discard(cell)  # (row key, column key, …)
        for textual_cell in [key for key in self._cell_render_cache.keys() if key[:2] in changed]:
            self._cell_render_cache.discard(textual_cell)
        for lines in [key for key in self._row_render_cache.keys() if key[0] in rows]:
            self._row_render_cache.discard(lines)  # (row key, line, …)
        for renderables in [key for key in self._row_renderable_cache.keys() if key[1] in indices]:
            self._row_renderable_cache.discard(renderables)  # (update count, row index)
        self._line_cache.clear()  # keyed by screen line: cheap to draw again from the rows

    def _render_cell(
        self, row_index: int, column_index: int, base_style: Style, width: int, cursor: bool = False, hover: bool = False
    ) -> SegmentLines:
        """A cell's lines, kept while the cell, its place, width and the styles it is drawn
        with stay the same. Textual keys them by the table's update count and focus as well,
        and drops them all on any style change (focus taken or lost, the view shown again):
        every cell on screen was drawn again through Rich, ~100 µs each, and a view switched
        back to redrew its whole table."""
        header = row_index == -1
        if column_index == -1 or (not header and (row_index < self.fixed_rows or column_index < self.fixed_columns)):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)  # (unused here)
        column_key = self._column_locations.get_key(column_index)
        row_key = self._header_row_key if header else self._row_locations.get_key(row_index)
        if column_key is None or row_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        column = self.columns[column_key]
        datum: object
        if header:
            datum, height = column.label, self.header_height
        else:
            row = self.rows[row_key]
            if row.auto_height:
                return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
            datum, height = self._data[row_key].get(column.key), row.height
        component_style, post_style = self._get_styles_to_render_cell(
            header, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css",
        )  # fmt: skip
        content = datum if datum is None or isinstance(datum, str) else id(datum)  # (a Text is replaced, not changed)
        key = (row_key, column.key, row_index, column_index, content, width, height, self.cell_padding, base_style,
               component_style, post_style)  # fmt: skip
        kept = self._cells_drawn.get(key)
        if kept is not None and (kept[0] is datum or content is datum):
            return kept[1]
        if datum is None:
            renderable: RenderableType = _EMPTY_TEXT
        elif header:
            renderable = column.label
        else:
            renderable = default_cell_formatter(datum, wrap=height != 1, height=height) or _EMPTY_TEXT
        pre_style = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
        lines = self._one_line(renderable, width, pre_style, post_style) if height == 1 else None
        if lines is None:
            options = self.app.console_options.update_dimensions(width, height)
            if height == 1:
                options = options.update(no_wrap=True)
            styled = Styled(Padding(renderable, (0, self.cell_padding)), pre_style=pre_style, post_style=post_style)
            lines = self.app.console.render_lines(styled, options)
        self._cells_drawn[key] = (datum, lines)
        return lines

    def _one_line(self, cell: object, width: int, pre_style: Style, post_style: Style) -> SegmentLines | None:
        """A one-line text that fits its column, drawn as Rich draws it (padded, its style
        under its spans, then ``pre_style`` and ``post_style`` over it all) without Rich's
        wrapping, measuring and padding machinery, a fifth of the time. ``None`` for any
        other cell (Rich draws it)."""
        if not isinstance(cell, Text) or cell.justify not in (None, "default"):
            return None
        pad = self.cell_padding
        room = width - 2 * pad
        plain = cell.plain
        if room <= 0 or not plain or "\n" in plain or "\t" in plain or cell.cell_len > room:
            return None
        null = Style.null()
        segments: list[Segment] = [Segment(" " * pad, null)] if pad else []
        segments.extend(_LINE_BREAK.join([cell]).render(self.app.console))  # (as a wrapped line is joined)
        if cell.cell_len < room:
            segments.append(Segment(" " * (room - cell.cell_len), null))
        if pad:
            segments.append(Segment(" " * pad, null))
        return [list(Segment.apply_style(segments, pre_style, post_style))]

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._cells_drawn.clear()

    def notify_style_update(self) -> None:
        """As Textual's, but the cells rendered stay (:meth:`_render_cell`: each is kept with
        the styles it was drawn with)."""
        Widget.notify_style_update(self)
        self._row_render_cache.clear()
        self._row_renderable_cache.clear()
        self._line_cache.clear()
        self._styles_cache.clear()
        self._get_styles_to_render_cell.cache_clear()
        self.refresh()

    def hidden_columns(self) -> list[str]:
        """The labels of the columns that do not fit the table's width, whole (from the
        right): the title says they are off-screen (← → scroll to them)."""
        room = self.scrollable_content_region.width
        used, hidden = 0, []
        for column in self.ordered_columns:
            used += column.get_render_width(self)
            if used > room:
                hidden.append(str(column.label).lower())
        return hidden

    def off_screen(self) -> str:
        """What a view's title adds to say which columns do not fit (nothing if all do)."""
        hidden = self.hidden_columns()
        return f" · → {', '.join(hidden)} off-screen (wider terminal, or ← →)" if hidden else ""

    def add_plain_rows(self, rows: Iterable[tuple[str, Sequence[Text | str]]]) -> None:
        """``add_row`` for many rows (each its key and cells; one line high, unlabelled) at
        once. Textual's sets the cursor again, counts an update and asks for an idle for
        every row: the thousand rows put back when a filter is cleared paid that a thousand
        times, more than everything else that key does."""
        columns = [column.key for column in self.ordered_columns]
        before = index = self.row_count
        kept = self._rows_made
        for key, cells in rows:
            made = kept.get(key)
            if made is not None and len(made[2]) == len(columns) and all(
                a is b for a, b in zip_longest(made[2].values(), cells)
            ):
                row_key, row, data = made  # the row as it was (a filter cleared): nothing to make
            else:
                if len(cells) > len(columns):
                    raise ValueError("More values provided than there are columns.")
                row_key = RowKey(key)
                row, data = Row(row_key, 1), dict(zip_longest(columns, cells))
                kept[key] = (row_key, row, data)
            if row_key in self._row_locations:
                raise DuplicateKey(f"The row key {row_key!r} already exists.")
            self._row_locations[row_key] = index
            self._data[row_key] = data
            self.rows[row_key] = row
            self._new_rows.add(row_key)
            index += 1
        if index == before:
            return
        self._require_update_dimensions = True
        self.cursor_coordinate = self.cursor_coordinate
        if before == 0 and self.columns and self.show_cursor and self.cursor_type != "none":
            self._highlight_cursor()  # as add_row: a cell to highlight where there was none
        self._update_count += 1
        self.check_idle()

    def replace_rows(self, shown: Sequence[tuple[str, Sequence[Text | str]]], keep: str | None) -> None:
        """Redraw with ``shown`` (each row's key and cells), the cursor back on the row
        keyed ``keep`` if it is still there."""
        self.clear()
        self.add_plain_rows(shown)
        self.measure_now()
        if keep is not None and any(key == keep for key, _ in shown):
            self.move_cursor(row=self.get_row_index(keep), animate=False)


class SchedulesTable(FreshTable):
    """:meth:`show` diffs against what is on screen (cursor and scroll stay put); :meth:`tick`
    recomputes the time-dependent cells (countdown, ages, overdue) of the rows on screen."""

    DEFAULT_CSS = """
    SchedulesTable {
        height: auto;
        max-height: 45%;
        min-height: 4;
    }
    """

    BINDINGS = [
        Binding("home", "scroll_top", "First", show=False),
        Binding("end", "scroll_bottom", "Last", show=False),
    ]

    COLUMNS = (
        ("name", "NAME", None),
        ("state", "STATE", 9),
        ("next", "NEXT FIRE", 11),
        ("last", "LAST RUN", LAST_WIDTH),
        ("cron", "CRON", None),
        ("tz", "TIMEZONE", None),
        ("trigger", "TRIGGER", 8),
    )

    def __init__(self, crons: CronCache, overdue: Overdue, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.crons = crons
        self.overdue = overdue
        self.views: dict[str, ScheduleView] = {}
        """The schedules shown, by name."""
        self._shown: dict[str, tuple[Text | str, ...]] = {}
        self._drawn: dict[str, tuple[Text | str, ...]] = {}
        """The cells each schedule's row had when it was last in the table (a filter hid it)."""
        self._stale: dict[str, None] = {}
        """Rows whose schedule changed and whose cells are not redrawn yet (off screen), in
        table order."""
        self._now: datetime | None = None
        self._data_now: datetime | None = None
        self._changed: dict[RowKey, set[ColumnKey]] = {}
        """Cells changed in place, their rendering to drop (:meth:`_drop_changed`)."""
        self._repaint = False

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    @property
    def selected_name(self) -> str | None:
        """The name under the cursor, if any."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None

    # -- cells --------------------------------------------------------------------------
    def _state(self, view: ScheduleView, data_now: datetime) -> Text:
        if view.problem is not None:
            return Text("✗ invalid", style=Style(color=theme_color(self.app, "text-error"), bold=True, reverse=True))
        if not view.enabled:
            return Text("○ off", style=theme_color(self.app, "text-warning"))
        if self.overdue.since(view, data_now) is not None:
            return Text("⚠ overdue", style=Style(color=theme_color(self.app, "text-warning"), bold=True, reverse=True))
        return Text("● on", style=theme_color(self.app, "text-success"))

    def _countdown(self, view: ScheduleView, now: datetime) -> Text:
        if view.problem is not None:
            return Text("not run", style=theme_color(self.app, "text-muted"))
        if not view.enabled:
            return Text("disabled", style=theme_color(self.app, "text-muted"))
        if view.next_fire_at is None:
            return Text("external", style=theme_color(self.app, "text-muted"))
        target = view.next_fire_at
        if target <= now:
            # The known slot has passed and no fresh data says what came next (paused, or
            # between refreshes): count down to the cron's next slot instead of "due now".
            target = self.crons.next_after(view, now) or target
        return Text(fmt.countdown(target, now))

    def _cells(self, view: ScheduleView, now: datetime, data_now: datetime) -> tuple[Text | str, ...]:
        # Text, never str: a str cell is parsed as markup on every measure and render.
        # (A server's names, crons and zones are checked where they are made; one that did not
        # check them, an older or a misbehaving one, still gets its controls shown escaped.)
        name = in_line(view.name)
        name = name if len(name) <= NAME_MAX else name[: NAME_MAX - 1] + "…"
        cell = Text(name, style="bold")
        if view.source == "store":
            cell.append(f" {STORED_MARK}", style=Style(color=theme_color(self.app, "text-accent")))
        return (
            cell,
            self._state(view, data_now),
            self._countdown(view, now),
            last_run_text(view, now, self.app),
            Text(in_line(view.cron)),
            Text(in_line(view.timezone)),
            Text(view.trigger),
        )

    # -- showing ------------------------------------------------------------------------
    def show(self, views: list[ScheduleView], now: datetime, data_now: datetime) -> None:
        """Show ``views`` (already filtered), keeping the cursor on the same schedule.
        ``data_now`` is the backend's time when the data was read (overdue is judged
        against it, so paused or stale data does not make schedules look overdue)."""
        self._now, self._data_now = now, data_now
        names = [v.name for v in views]
        previous = self.views
        self.views = {v.name: v for v in views}
        if names != list(self._shown):
            # Other rows (a filter typed or cleared): the rows that will be on screen get
            # their cells now; the others show the cells they had when last drawn, and are
            # caught up a batch at a time, as after a refresh (a thousand rows' cells built
            # at once held the UI loop for ~50 ms).
            selected = self.selected_name
            self._drawn.update(self._shown)
            self.clear()
            self._shown = {}
            self._stale = {}
            at = names.index(selected) if selected in names else 0
            span = self.size.height + 2
            near = {*names[:span], *names[max(0, at - span) : at + span]}
            for view in views:
                cells = self._drawn.get(view.name)
                if cells is None or view.name in near:
                    cells = self._cells(view, now, data_now)
                else:
                    self._stale[view.name] = None
                self._shown[view.name] = cells
            self.add_plain_rows(self._shown.items())
            self.measure_now()
            if selected in self._shown:
                self.move_cursor(row=self.get_row_index(selected), animate=False, scroll=True)
            if self._stale:
                self._catch_up_off_screen()
            return
        for view in views:  # an unchanged one: its time-dependent cells are the tick's business
            if view != previous.get(view.name):
                self._stale[view.name] = None
        self._catch_up(self._on_screen())
        if self._stale:
            self._catch_up_off_screen()

    @property
    def shown(self) -> bool:
        """Displayed, and so are the view and everything that holds it."""
        return all(node.display for node in self.ancestors_with_self)

    def _on_screen(self) -> list[str]:
        """The names of the rows on screen (and one either side)."""
        first = max(0, int(self.scroll_y) - 1)
        return list(self._shown)[first : first + self.size.height + 1]

    def _catch_up(self, names: Iterable[str], *, on_screen: bool = True) -> None:
        """Redraw the rows of ``names`` that are stale."""
        assert self._now is not None and self._data_now is not None
        for name in names:
            if name in self._stale:
                del self._stale[name]
                view = self.views[name]
                self._update_row(view, self._cells(view, self._now, self._data_now), on_screen=on_screen)
        self._drop_changed()

    def _drop_changed(self) -> None:
        """Drop the rendering of the cells changed in place; repaint if one is on screen."""
        if self._changed:
            self.forget_rendered(self._changed)
            self._changed = {}
        if self._repaint:
            self._repaint = False
            self.refresh()

    @work(group="catch-up", exclusive=True)
    async def _catch_up_off_screen(self) -> None:
        """The stale rows, a batch at a time (what scrolled on screen meanwhile first).
        Not while the table is hidden (another view on screen): those batches only slowed
        that view's keys, and :meth:`show` starts again when the view is back."""
        while self._stale:
            await asyncio.sleep(BATCH_PAUSE)
            if not self.shown:
                return
            self._catch_up(self._on_screen())
            self._catch_up(list(islice(self._stale, ROWS_PER_BATCH)), on_screen=False)

    def _update_row(self, view: ScheduleView, cells: tuple[Text | str, ...], *, on_screen: bool = True) -> None:
        """Put the cells that changed in the row. A row off screen takes them without
        ``update_cell``, which repaints the whole table on screen each time (a repaint of
        10-20 ms per batch of rows caught up), and without counting an update, which drops
        the rendering of every row (the rows on screen were all drawn again, cell by cell,
        after each batch): only its own rendering is dropped (:meth:`forget_rendered`). On
        screen too, a cell of a column of set width is changed in place, and only its
        rendering dropped (the others on screen stay drawn). An equal cell is kept, not its
        copy (a thousand rows' copies were thousands more objects for the garbage collector)."""
        row = RowKey(view.name)
        kept: list[Text | str] = []
        for (key, _, width), new_cell, old_cell in zip(self.COLUMNS, cells, self._shown[view.name], strict=False):
            if new_cell == old_cell:
                kept.append(old_cell)
                continue
            kept.append(new_cell)
            if width is None:  # a column sized to its cells: measured again
                self.update_cell(row, key, new_cell, update_width=True)
            else:
                column = ColumnKey(key)
                self._data[row][column] = new_cell
                self._changed.setdefault(row, set()).add(column)
                self._repaint = self._repaint or on_screen
        self._shown[view.name] = tuple(kept)

    def tick(self, now: datetime, data_now: datetime | None = None) -> None:
        """Recompute the time-dependent cells of the rows on screen (others follow when
        scrolled to: :meth:`show` and this only ever look at what is visible)."""
        self._now = now
        if data_now is not None:
            self._data_now = data_now
        if not self._shown or self._data_now is None:
            return
        on_screen = self._on_screen()
        self._catch_up(on_screen)
        for name in on_screen:
            view = self.views.get(name)
            if view is None:
                continue
            fresh = (self._state(view, self._data_now), self._countdown(view, now), last_run_text(view, now, self.app))
            cells = self._shown[name]
            if fresh != cells[1:4]:
                self._update_row(view, (cells[0], *fresh, *cells[4:]))
        self._drop_changed()
