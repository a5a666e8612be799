"""The runs table under a stream of new runs: the newest stays in sight unless the
operator moved the cursor down to an older run, which then stays under it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from textual.app import App, ComposeResult

from backend.model import Run
from console.widgets import RunsTable, UpcomingLine

START = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def runs(newest: int, count: int) -> list[Run]:
    """``count`` runs of an every-ten-seconds schedule, newest first, the newest at slot ``newest``."""
    return [
        Run(id=f"run-{n:03d}", name="heartbeat", scheduled_at=START + timedelta(seconds=10 * n), status="succeeded",
            trigger="self", coordination_outcome="wonLock", instance="a", fired_at=START + timedelta(seconds=10 * n))
        for n in range(newest, newest - count, -1)
    ]  # fmt: skip


class Runs(App[None]):
    def compose(self) -> ComposeResult:
        yield RunsTable(id="runs")


async def twenty_runs_shown(app: Runs, pilot: Any) -> RunsTable:
    """The runs table focused, showing runs 1 to 20 (its 8 rows show the newest few)."""
    table = app.query_one(RunsTable)
    table.focus()
    table.show(runs(20, 20), "UTC", START)
    await pilot.pause()
    return table


async def test_new_runs_come_in_at_the_top_in_sight_while_the_cursor_is_on_the_newest() -> None:
    """A regression: the cursor stayed on the run that was newest when the schedule was
    selected, and the table scrolled to keep it in view: once more new runs had come than
    rows fit, the newest were above the top, out of sight, with nothing saying so."""
    app = Runs()
    async with app.run_test(size=(100, 8)) as pilot:
        table = await twenty_runs_shown(app, pilot)
        for newest in range(21, 35):  # more new runs than the table has rows
            table.show(runs(newest, 20), "UTC", START)
            await pilot.pause()
            assert table.cursor_row == 0 and table.scroll_y == 0
            assert table.selected_run is not None and table.selected_run.id == f"run-{newest:03d}"


async def test_a_run_the_operator_moved_the_cursor_to_stays_under_it() -> None:
    app = Runs()
    async with app.run_test(size=(100, 8)) as pilot:
        table = await twenty_runs_shown(app, pilot)
        await pilot.press("down", "down")
        assert table.selected_run is not None and table.selected_run.id == "run-018"
        for newest in range(21, 30):
            table.show(runs(newest, 20), "UTC", START)
            await pilot.pause()
            assert table.selected_run is not None and table.selected_run.id == "run-018"


@pytest.mark.parametrize("width", [80, 76])  # (76: the table's room in an 80-column console)
async def test_at_80_columns_the_lag_is_shown_whole(width: int) -> None:
    """LAG came after ERROR, whose width assumed the columns before it fixed: at 80 columns a
    lag of ``+23ms`` was cut to ``+23m``, milliseconds read as minutes. It comes before ERROR,
    which takes the room left."""
    app = Runs()
    async with app.run_test(size=(width, 8)) as pilot:
        table = app.query_one(RunsTable)
        newest, older, *rest = runs(20, 4)
        late = [
            replace(newest, status="failed", coordination_outcome="external", error_tag="timeout", error_message="x" * 100,
                    fired_at=newest.scheduled_at + timedelta(milliseconds=23), finished_at=newest.scheduled_at + timedelta(seconds=95)),
            replace(older, trigger="manual", coordination_outcome="manual", fired_at=older.scheduled_at + timedelta(milliseconds=10),
                    finished_at=older.scheduled_at + timedelta(minutes=12)),
            *rest,
        ]  # fmt: skip
        table.show(late, "UTC", START + timedelta(hours=1))
        await pilot.pause()
        room = table.scrollable_content_region.width
        used = 0
        for column in table.ordered_columns:
            used += column.get_render_width(table)
            if str(column.key.value) == "lag":
                assert used <= room, "the lag column runs off the screen"
                break
        assert "lag" not in table.hidden_columns()


async def test_a_disabled_schedules_note_comes_before_its_fire_times() -> None:
    class Upcoming(App[None]):
        def compose(self) -> ComposeResult:
            yield UpcomingLine()

    app = Upcoming()
    async with app.run_test(size=(80, 3)) as pilot:
        line = app.query_one(UpcomingLine)
        line.slots = [START + timedelta(minutes=15 * n) for n in range(1, 6)]
        line.note = "disabled: will not fire"
        await pilot.pause()
        shown = line.render().plain
        assert shown.startswith("next    (disabled: will not fire) "), shown


async def test_fire_times_in_different_years_show_their_years() -> None:
    """A yearly schedule's next five were shown "01-01 00:00" five times: one time
    repeated, to the eye."""

    class Upcoming(App[None]):
        def compose(self) -> ComposeResult:
            yield UpcomingLine()

    app = Upcoming()
    async with app.run_test(size=(120, 3)) as pilot:
        line = app.query_one(UpcomingLine)
        line.zone = "UTC"
        line.slots = [datetime(2027 + n, 1, 1, tzinfo=UTC) for n in range(5)]
        await pilot.pause()
        shown = line.render().plain
        assert shown.startswith("next    2027-01-01 00:00 · 2028-01-01 00:00 · "), shown
        line.slots = [datetime(2027, 1, 1 + n, tzinfo=UTC) for n in range(5)]  # one year: no year shown
        await pilot.pause()
        assert line.render().plain.startswith("next    01-01 00:00 · 01-02 00:00 · "), line.render().plain
