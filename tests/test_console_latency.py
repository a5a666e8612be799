"""What keeps every key under 100 ms at 1,000 schedules (issue 24 item 15, measured by
``python -m tests.bench.console --part boundary``): each test checks one thing a key no
longer waits for, and fails without it."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.css.stylesheet import Stylesheet
from textual.dom import DOMNode
from textual.geometry import Region
from textual.message_pump import MessagePump
from textual.renderables.styled import Styled
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget
from textual.widgets.data_table import RowKey

from console.heap import Collector, lines_without_cycles
from console.keygate import _busy, quiet
from console.views.health import HealthRows
from console.views.schedules import SchedulesView
from console.views.timeline import TimelineView
from console.widgets import RecentRuns, RunsTable, UpcomingLine
from console.widgets.health import HealthRow
from console.widgets.schedules import FreshTable
from tests.test_console import cell, console, ledger, schedules, settle, store_url  # noqa: F401 - fixtures
from tests.test_console_views import fired, with_bulk


async def test_the_key_gate_asks_only_busy_widgets_whether_they_are_done(
    store_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # After each key that may move the focus, the gate waits for every message queue to
    # run dry. Asking each of the screen's widgets (a callback each, every round) took half
    # the time to show the "/" filter at 1,000 schedules; an idle one has nothing to finish.
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        assert not _busy(table)
        table.call_later(lambda: None)
        assert _busy(table)  # a message waits in its queue
        await pilot.pause()
        assert not _busy(table)
        asked: list[MessagePump] = []
        call_later = MessagePump.call_later

        def counting(self: MessagePump, *args: Any, **kwargs: Any) -> bool:
            asked.append(self)
            return call_later(self, *args, **kwargs)

        monkeypatch.setattr(MessagePump, "call_later", counting)
        pumps = [app, *app.screen.walk_children(with_self=True)]
        assert len(pumps) > 50
        rounds = await quiet(app)
        assert len(asked) <= rounds * 5  # the app, and the few widgets with work in hand


async def test_leaving_the_health_view_restyles_its_rows_container_not_every_row(
    store_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # The health view's rows are some 800 widgets at 1,000 schedules; Textual restyles a
    # widget and everything under it when its focus changes: ~100 ms on leaving the view.
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        rows = app.query_one(HealthRows)
        assert rows.has_focus and list(rows.query(HealthRow))
        restyled: list[DOMNode] = []
        update_nodes = Stylesheet.update_nodes

        def counting(self: Stylesheet, nodes: Any, animate: bool = False) -> None:
            nodes = list(nodes)
            restyled.extend(nodes)
            update_nodes(self, nodes, animate=animate)

        monkeypatch.setattr(Stylesheet, "update_nodes", counting)
        await pilot.press("1")
        await settle(pilot)
        assert not rows.has_focus and rows in restyled  # it lost its focus, and looks it
        assert not any(isinstance(node, HealthRow) or rows in node.ancestors for node in restyled)
        assert notes.seen == []


async def test_a_health_row_is_one_widget(store_url: str) -> None:  # noqa: F811
    # Seven widgets a row made the view's 120 rows some 800 widgets at 1,000 schedules:
    # laid out and drawn each time the view was shown again (100-200 ms).
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        container = app.query_one("#schedule-rows")
        rows = list(container.query_children(HealthRow))
        assert len(rows) == len(app.views) and list(container.walk_children()) == rows
        assert notes.seen == []


async def test_a_view_switched_to_is_read_again_once_it_is_on_screen(store_url: str) -> None:  # noqa: F811
    # The read that follows a view switch ran beside the first frame of the view: an
    # embedded engine answers on a thread of its own, which held the interpreter lock for
    # half of the time that frame took to draw.
    async with console(store_url) as (app, pilot, clock, notes):
        timeline = app.query_one(TimelineView)
        on_screen: list[bool] = []
        refresh_data = app.refresh_data

        def recording() -> Any:
            on_screen.append(timeline.is_on_screen)
            return refresh_data()

        app.refresh_data = recording  # type: ignore[method-assign]  # notes whether the timeline is on screen
        await pilot.press("2")
        await settle(pilot)
        assert on_screen == [True]
        assert notes.seen == []


async def test_a_hidden_schedules_table_catches_up_once_shown_again(store_url: str) -> None:  # noqa: F811
    # After a minute boundary the rows off screen take their new cells in batches. While
    # another view is on screen those batches only slowed its keys.
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        view = app.query_one(SchedulesView)
        many = with_bulk(app.views, 600)
        table.show(many, clock.now(), clock.now())
        await settle(pilot)
        changed = fired(many)
        table.show(changed, clock.now(), clock.now())  # the rows on screen at once, the rest in batches
        view.display = False  # another view switched to (as the view switcher does)
        await settle(pilot)
        assert " missed " not in cell(app, "bulk-0599", "last") and "bulk-0599" in table._stale
        view.display = True
        table.show(changed, clock.now(), clock.now())  # as the view does when shown again
        await settle(pilot)
        assert not table._stale and " missed " in cell(app, "bulk-0599", "last")
        assert notes.seen == []


async def test_a_table_shown_again_draws_no_cell_it_drew_before(
    store_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # Textual drops every cell a table rendered when the table takes or loses the focus
    # (a view switched away from and back): each cell on screen went through Rich again.
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("2")
        await settle(pilot)
        drawn: list[object] = []
        render_lines = app.console.render_lines
        one_line = FreshTable._one_line

        def through_rich(renderable: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(renderable, Styled):  # a table's cell
                drawn.append(renderable)
            return render_lines(renderable, *args, **kwargs)

        def as_one_line(table: FreshTable, cell: object, *args: Any) -> Any:
            drawn.append(cell)
            return one_line(table, cell, *args)

        monkeypatch.setattr(app.console, "render_lines", through_rich)
        monkeypatch.setattr(FreshTable, "_one_line", as_one_line)
        await pilot.press("1")
        await settle(pilot)
        assert schedules(app).has_focus and app.query_one(RunsTable).row_count
        assert drawn == []  # the same data: every cell as drawn before
        schedules(app).action_cursor_down()
        await settle(pilot)
        assert drawn  # (the cursor's row: drawn with the cursor's style)
        assert notes.seen == []


async def test_a_tables_text_cells_are_drawn_as_rich_draws_them_without_rich(
    store_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # Rich's wrapping, measuring and padding took four fifths of the time to draw a cell.
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        pre, post = Style(color="red", bgcolor="black", meta={"row": 1}), Style(bold=True)
        options = app.console_options.update_dimensions(20, 1).update(no_wrap=True)
        for cell in (Text("every"), Text("bold", style="bold blue"), Text.assemble(("✗ failed", "reverse"), " 3m ago"),
                     Text("漢字 wide"), Text("⚠ overdue", style=Style(reverse=True)), Text("18 chars exactly..")):  # fmt: skip
            rich = app.console.render_lines(Styled(Padding(cell, (0, 1)), pre_style=pre, post_style=post), options)
            assert table._one_line(cell, 20, pre, post) == rich, cell
        for other in (Text(""), Text("two\nlines"), Text("a tab\there"), Text("x" * 19), "a str", Text("r", justify="right")):
            assert table._one_line(other, 20, pre, post) is None  # Rich draws those
        through_rich: list[object] = []
        render_lines = app.console.render_lines

        def counting(renderable: Any, *args: Any, **kwargs: Any) -> Any:
            through_rich.append(renderable)
            return render_lines(renderable, *args, **kwargs)

        monkeypatch.setattr(app.console, "render_lines", counting)
        table._clear_caches()
        lines = table.render_lines(Region(0, 0, table.size.width, table.size.height))
        assert len(lines) == table.size.height and "daily-digest" in "".join(line.text for line in lines)
        assert through_rich == []
        assert notes.seen == []


async def test_a_health_row_is_drawn_as_textual_draws_its_content_with_its_styles_kept(
    store_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # A style made afresh for each of a row's ~40 pieces (a sparkline's cells) took most of
    # the time to draw the view after a refresh.
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        rows = list(app.query(HealthRow))
        assert len(rows) > 5
        for row in rows:
            assert list(row.render_line(0)) == list(Widget.render_line(row, 0))  # Textual's, from render()
        made: list[object] = []
        with_offset = TextualStyle.rich_style_with_offset

        def counting(style: TextualStyle, x: int, y: int) -> Any:
            made.append(style)
            return with_offset(style, x, y)

        monkeypatch.setattr(TextualStyle, "rich_style_with_offset", counting)
        for row in rows:
            row.refresh()  # (as new data does)
            row.render_line(0)
        assert made == []
        assert notes.seen == []


async def test_rows_shown_again_with_the_cells_they_had_are_not_made_or_measured_again(
    store_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # A thousand rows back after a filter, with the cells they had, were made again and
    # measured again (7,000 cells; a column never narrows): most of the time the key took
    # before its frame.
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        many = with_bulk(app.views, 600)
        table.show(many, clock.now(), clock.now())
        await settle(pilot)
        widths = {key: column.get_render_width(table) for key, column in table.columns.items()}
        far = RowKey("bulk-0599")
        row, data = table.rows[far], table._data[far]
        table.show(many[:3], clock.now(), clock.now())  # filtered
        await settle(pilot)
        measured: list[Text] = []
        cell_len = Text.cell_len

        def counting(text: Text) -> int:
            measured.append(text)
            return cell_len.fget(text)  # type: ignore[attr-defined, no-any-return]  # the property object: mypy reads an int

        monkeypatch.setattr(Text, "cell_len", property(counting))
        table.show(many, clock.now(), clock.now())  # the filter cleared
        await settle(pilot)
        monkeypatch.undo()
        assert len(measured) < 300  # the rows whose cells were made again (on screen), not 600 x 7
        assert table.rows[far] is row and table._data[far] is data and table.get_row_index("bulk-0599") == len(many) - 1
        assert {key: column.get_render_width(table) for key, column in table.columns.items()} == widths
        assert notes.seen == []


async def test_esc_brings_every_row_back_with_the_filter_it_hides(store_url: str) -> None:  # noqa: F811
    # (the rows came back once the field said it was empty: a frame later, drawn again)
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("slash", *"stuck", "enter")
        await settle(pilot)
        table = schedules(app)
        assert table.row_count == 1 and app.filter_text == "stuck"
        app.action_clear_filter()
        assert table.row_count == len(app.views) and not app.query_one("#filter").display
        await settle(pilot)
        assert table.row_count == len(app.views) and app.filter_text == "" and notes.seen == []


async def test_the_runs_strip_and_next_fires_are_not_drawn_again_unchanged(store_url: str) -> None:  # noqa: F811
    # Every refresh and every filter key sets them; they were drawn again each time.
    async with console(store_url) as (app, pilot, clock, notes):
        await settle(pilot)
        strip, upcoming = app.query_one(RecentRuns), app.query_one(UpcomingLine)
        assert strip.runs and upcoming.slots
        drawn: list[object] = []
        for widget in (strip, upcoming):
            render = widget.render

            def counting(render: Any = render, widget: Any = widget) -> Any:
                drawn.append(widget)
                return render()

            widget.render = counting  # type: ignore[method-assign]  # records each render
        app.query_one(SchedulesView).show()
        await settle(pilot)
        assert drawn == []
        upcoming.slots = upcoming.slots[1:]
        await settle(pilot)
        assert drawn == [upcoming]
        assert notes.seen == []


def in_a_cycle(start: object) -> bool:
    """Whether ``start`` can reach itself through references (only the collector frees it)."""
    seen: set[int] = set()
    todo = list(gc.get_referents(start))
    while todo:
        item = todo.pop()
        if item is start:
            return True
        if id(item) not in seen and gc.is_tracked(item):
            seen.add(id(item))
            todo.extend(gc.get_referents(item))
    return False


def test_lines_drawn_are_freed_without_the_cycle_collector() -> None:
    # A line cut into one piece (the compositor's cuts at its own width) or cropped to its
    # own length kept itself in its own caches: every line drawn was a cycle of it and its
    # eight caches, most of the garbage a full collection had to find.
    lines_without_cycles()
    line = Strip([Segment("every"), Segment(" schedule")])
    assert line.divide([line.cell_length]) == [line]
    assert line.crop_extend(0, line.cell_length, None) is line
    assert line.crop_extend(0, 5, None).text == "every"
    assert line.divide([5, line.cell_length])[0].text == "every"
    assert not in_a_cycle(line)


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_full_collections_wait_for_the_keys_to_be_quiet_but_not_for_ever() -> None:
    ticks = Ticks()
    collector = Collector(quiet=1.0, every=20.0, latest=120.0, monotonic=ticks)
    before = gc.get_threshold()
    collector.start()
    try:
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 1_000_000  # Python's own: off
        ticks.now += 19.0
        assert not collector.tick()  # not yet: one every 20 s at most
        ticks.now += 1.5
        collector.busy()  # a key
        ticks.now += 0.5
        assert not collector.tick()  # keys are coming
        ticks.now += 0.6
        assert collector.tick() and collector.collections == 1  # quiet for a second
        assert not collector.tick()
        collected_at = ticks.now
        for _ in range(300):  # keys every half second, for longer than two minutes
            ticks.now += 0.5
            collector.busy()
            if collector.tick():
                break
        assert collector.collections == 2 and 120.0 <= ticks.now - collected_at <= 120.5
    finally:
        collector.stop()
    assert gc.get_threshold() == before
    assert not collector.tick()  # stopped: Python's own again
