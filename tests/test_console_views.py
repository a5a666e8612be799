"""The console's views under Pilot at a frozen time: the numbered views, the timeline, who
fires, columns, backfill, the filter, paging and help, redrawing without re-measuring,
failure without colour, and one zone for every time on screen.

The fixture ledger (tests/console_fixtures.py) has, at the frozen instant, one firing
instance (``web-2``, heartbeat a moment ago), the schedules' runs of one simulated minute
and, for the timeline, an hour of history before it.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.coordinate import Coordinate
from textual.pilot import Pilot
from textual.widgets import Checkbox, Input
from textual.widgets.data_table import CellKey

from backend import Engine, ManualClock, Run, define_schedule
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import ConnectionInfo
from backend.model import InstanceInfo, ScheduleView, parse_iso
from console.app import SchedtuiApp
from console.fleet import CronCache, Durations, Overdue, durations, fleet_of
from console.screens import BackfillScreen, Confirm, HelpScreen, QuitPrompt, RunDetails
from console.views.timeline import TimelineView
from console.widgets import (
    ConsoleHeader,
    DetailBar,
    FleetBanner,
    RunsTable,
    TimelineGrid,
    UpcomingLine,
)
from console.widgets.palette import status_style
from console.widgets.schedules import FreshTable, RingFreeCache, last_run_text
from tests.console_fixtures import FROZEN, WHERE, add_timeline_history, build_ledger, console_backend, ledger_copy
from tests.test_console import Notes, cell, plain_at, schedules, select, settle
from tests.test_console_confirm import screen_rows

ZONE = "Europe/Berlin"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("console-views")
    url = asyncio.run(build_ledger(folder))
    asyncio.run(add_timeline_history(url))
    return folder / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


@asynccontextmanager
async def console(
    url: str, *, size: tuple[int, int] = (120, 32), clock: ManualClock | None = None, backend: Any = None,
    **kwargs: Any,
) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], ManualClock, Notes]]:
    clock = clock or ManualClock(FROZEN)
    backend = backend or console_backend(url, clock)
    kwargs.setdefault("operator_zone", ZONE)
    app = SchedtuiApp(backend, clock, where=WHERE, **kwargs)
    notes = Notes(app)
    try:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            yield app, pilot, clock, notes
    finally:
        await backend.close()


async def later(app: SchedtuiApp, pilot: Pilot[Any], clock: ManualClock, seconds: float) -> None:
    """Move the clock, refresh (what the timer would do) and let everything settle."""
    clock.advance(seconds)
    app.tick()
    await settle(pilot)
    app.action_refresh()
    await settle(pilot)


def plain(widget: Any) -> str:
    rendered = widget.render()
    return rendered.plain if hasattr(rendered, "plain") else str(rendered)


# ----------------------------------------------------------------------------------------
# views, numbered
# ----------------------------------------------------------------------------------------
async def test_number_keys_switch_views_and_each_keeps_its_selection(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "stuck-import")
        await pilot.press("2")
        await settle(pilot)
        assert app.active_view_id == "timeline"
        grid = app.query_one(TimelineGrid)
        assert grid.has_focus and grid.selected_name == "daily-digest"
        await pilot.press("down", "down")
        assert app.selected_name == "flaky-export"
        await pilot.press("1")
        await settle(pilot)
        assert app.active_view_id == "schedules" and app.selected_name == "stuck-import"
        await pilot.press("2")
        await settle(pilot)
        assert app.selected_name == "flaky-export"


@pytest.mark.parametrize(("key", "system"), [("3", "jobs"), ("4", "durable"), ("5", "locks"), ("6", "audit"), ("7", "health")])
async def test_a_view_whose_system_the_backend_does_not_offer_says_so(store_url: str, key: str, system: str) -> None:
    import dataclasses

    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        assert app.info is not None and system in app.info.systems
        app.info = dataclasses.replace(app.info, systems=("schedules",))  # an older server
        await pilot.press(key)
        await settle(pilot)
        assert app.active_view_id == "schedules"
        assert notes.titled("Not available") and f"does not offer {system}" in notes.titled("Not available")[-1]


async def test_views_are_in_the_footer_the_palette_and_help(store_url: str) -> None:
    from console.commands import ConsoleCommands

    async with console(store_url) as (app, pilot, clock, notes):
        footer_keys = {b.binding.key_display or b.binding.key for b in app.screen.active_bindings.values() if b.binding.show}
        assert "1-7" in footer_keys
        provider = ConsoleCommands(app.screen)
        hits = [hit async for hit in provider.search("view 2")]
        assert hits and str(hits[0].text) == "View 2: Timeline"
        await hits[0].command()
        await settle(pilot)
        assert app.active_view_id == "timeline"
        sections = dict(app.help_keys())
        assert [key for key, _ in sections["Views"]] == ["1", "2", "3", "4", "5", "6", "7"]
        assert any("zoom" in description for _, description in sections["2 Timeline"])


# ----------------------------------------------------------------------------------------
# the timeline
# ----------------------------------------------------------------------------------------
async def test_timeline_rows_marks_cursor_and_details(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("2", "plus", "plus")  # 1 hour
        await settle(pilot)
        grid = app.query_one(TimelineGrid)
        assert [v.name for v in grid.rows] == list(schedules(app).views)
        assert grid.window is not None and grid.window.end - grid.window.start >= timedelta(hours=1)
        window = grid.window
        # stuck-import: no rows 07:30-07:45 UTC (gaps), then missed slots
        stuck = next(v for v in grid.rows if v.name == "stuck-import")
        cells, _ = grid.marks(stuck)
        gap = cells[window.index(parse_iso("2026-03-02T07:35:00Z"))]
        assert gap.gap and not gap.runs
        missed = cells[window.index(parse_iso("2026-03-02T07:47:00Z"))]
        assert missed.worst is not None and missed.worst.status == "missed"
        # billing-webhook: two backfilled slots, the rest of the outage gaps
        billing = next(v for v in grid.rows if v.name == "billing-webhook")
        cells, _ = grid.marks(billing)
        backfilled = cells[window.index(parse_iso("2026-03-02T07:40:00Z"))].worst
        assert backfilled is not None and backfilled.trigger == "manual"
        assert cells[window.index(parse_iso("2026-03-02T07:43:00Z"))].gap
        # flaky-export: several runs per cell, the worst shown
        flaky = next(v for v in grid.rows if v.name == "flaky-export")
        cells, _ = grid.marks(flaky)
        busy = cells[window.index(parse_iso("2026-03-02T07:22:00Z"))]
        assert len(busy.runs) >= 3 and busy.worst is not None and busy.worst.status == "failed"
        # the cursor on that cell; Enter opens the worst run's details
        await pilot.press("down", "down")
        grid.cursor_cell = window.index(parse_iso("2026-03-02T07:22:00Z")) - 1
        await pilot.press("right")
        await settle(pilot)
        info = plain(app.query_one("#timeline-info"))
        assert "✗ failed" in info and "runs in this cell" in info and "08:2" in info  # CET
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, RunDetails) and app.screen.run_data.status == "failed"
        assert app.screen.run_data.name == "flaky-export"


async def test_timeline_zoom_pan_now_and_zone(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("2")
        await settle(pilot)
        grid = app.query_one(TimelineGrid)
        view = app.active_view
        assert isinstance(view, TimelineView)
        spans = []
        for _ in range(12):
            await pilot.press("plus")
            await settle(pilot)
            assert grid.window is not None
            spans.append(grid.window.cell * grid.window.cells)
        assert timedelta(minutes=15) <= spans[-1] < timedelta(minutes=16) and notes.titled("")[-1].startswith("Already at 15m")
        for _ in range(12):
            await pilot.press("minus")
            await settle(pilot)
        assert grid.window is not None and timedelta(days=7) <= grid.window.end - grid.window.start < timedelta(days=7, hours=1)
        await pilot.press("h")
        await settle(pilot)
        assert not view.following and grid.window.end < clock.now() + timedelta(days=1)
        await pilot.press("0")
        await settle(pilot)
        assert view.following
        axis = grid.render_line(0).text
        assert "CET" in axis
        await pilot.press("z")
        await settle(pilot)
        assert "UTC" in grid.render_line(0).text


async def test_timeline_rows_follow_the_filter(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("2", "slash", *"export", "enter")
        await settle(pilot)
        assert [v.name for v in app.query_one(TimelineGrid).rows] == ["flaky-export"]


async def test_timeline_reads_only_the_rows_on_screen(tmp_path: Path) -> None:
    async def quick(ctx: Any) -> None:
        return None

    many = [define_schedule(name=f"job-{n:04d}", cron="*/5 * * * *", timezone="UTC", handler=quick) for n in range(300)]
    clock = ManualClock(FROZEN)
    backend = EmbeddedBackend(Engine(many, f"sqlite:///{tmp_path / 'state.db'}", clock=clock, instance="console"))
    asked: list[int] = []
    original = backend.runs_between

    async def counting(names: list[str], start: datetime, end: datetime, *, limit_per_name: int = 200) -> Any:
        asked.append(len(names))
        return await original(names, start, end, limit_per_name=limit_per_name)

    backend.runs_between = counting  # type: ignore[method-assign]  # counts the names asked for
    async with console("", backend=backend, clock=clock, size=(80, 24)) as (app, pilot, _, notes):
        await pilot.press("2")
        await settle(pilot)
        assert asked and max(asked) <= 24
        await pilot.press("end")
        await settle(pilot)
        assert app.selected_name == "job-0299" and max(asked) <= 24


# ----------------------------------------------------------------------------------------
# the header: who fires, and loudly when nothing does
# ----------------------------------------------------------------------------------------
async def test_the_header_shows_who_fires_and_says_loudly_when_nothing_does(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        header = app.query_one(ConsoleHeader)
        assert "▲ 1 firing web-2" in plain(header)
        assert not app.query_one(FleetBanner).display
        await later(app, pilot, clock, 90)  # web-2 stopped beating 90 s ago
        assert "NOTHING FIRES" in plain(header)
        banner = app.query_one(FleetBanner)
        assert banner.display and "NOTHING IS FIRING" in plain(banner) and "web-2" in plain(banner)
        assert "5 enabled schedules need an engine's timer" in plain(banner)


async def test_a_schedule_whose_last_slot_has_no_run_is_overdue(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        assert cell(app, "heartbeat", "state") == "● on"
        await later(app, pilot, clock, 20)  # 08:00:10 and :20 have passed, but within 30 s
        assert cell(app, "heartbeat", "state") == "● on"
        await later(app, pilot, clock, 40)
        assert cell(app, "heartbeat", "state") == "⚠ overdue"
        assert cell(app, "legacy-cleanup", "state") == "○ off"  # disabled: owes nothing
        assert cell(app, "daily-digest", "state") == "● on"  # its next slot is tomorrow
        await select(pilot, "heartbeat")
        detail = plain(app.query_one(DetailBar))
        assert "⚠ overdue no run for the slot of 03-02 09:00:10 CET" in detail


def test_fleet_counts_only_engines_that_fire() -> None:
    now = parse_iso(FROZEN)
    beats = [InstanceInfo("console", "h", 1, now), InstanceInfo("web-1", "h", 2, now - timedelta(minutes=5)),
             InstanceInfo("web-2", "h", 3, now - timedelta(seconds=4))]
    watching = ConnectionInfo("embedded", "state.db", "single", "console", False, fires=False)
    fleet = fleet_of(beats, now, watching, [])
    assert [i.name for i in fleet.firing] == ["web-2"] and fleet.last_beat is not None
    assert not fleet.silent  # no self-triggered schedule: nothing needs firing
    firing = ConnectionInfo("embedded", "state.db", "single", "console", False, fires=True)
    assert [i.name for i in fleet_of(beats, now, firing, []).firing] == ["console", "web-2"]


def test_a_member_standing_down_for_its_clock_does_not_count_as_firing_and_the_banner_says_why() -> None:
    now = parse_iso(FROZEN)
    down = InstanceInfo("web-3", "h", 3, now - timedelta(seconds=2), role="firing", coordination="advisoryLock",
                        clock_offset_s=-61.24, clock_off=True)  # fmt: skip
    beats = [down, InstanceInfo("console", "h", 1, now, role="observer", clock_offset_s=90.0, clock_off=True)]
    watching = ConnectionInfo("embedded", "state.db", "advisoryLock", "console", False, fires=False)
    timer = ScheduleView("a", "* * * * *", "UTC", "self", "skip", "skip", 60.0, None, None, True, None, None, None)
    fleet = fleet_of(beats, now, watching, [timer])
    assert fleet.firing == () and [i.name for i in fleet.standing_down] == ["web-3"] and fleet.silent
    assert ConsoleHeader._fleet(fleet) == (
        "[b reverse $text-error] ✗ NOTHING FIRES [/] [b $text-error]✗ 1 clock off[/] [$text-muted]web-3[/]"
    )
    banner = FleetBanner()
    banner.fleet, banner.now = fleet, now
    assert banner.render().plain == (
        "✗ NOTHING IS FIRING: web-3's clock is -61.2s off the database server's: it takes no work until they agree; "
        "fix its time sync (NTP). 1 enabled schedule needs an engine's timer."
    )
    agreeing = replace(down, clock_offset_s=0.2, clock_off=False)
    assert [i.name for i in fleet_of([agreeing], now, watching, [timer]).firing] == ["web-3"]


def test_the_banner_says_since_when_nothing_fires_after_an_engine_stopped_cleanly() -> None:
    """An engine that stops cleanly takes its instance's row with it: the banner said "no
    engine has ever registered in this store" over a store full of its runs (outside review
    of the package as shipped). It says when the newest run was fired, and by whom."""
    now = parse_iso(FROZEN)
    watching = ConnectionInfo("embedded", "state.db", "single", "console", False, fires=False)
    fired = now - timedelta(minutes=3)
    last = Run(id="a", name="a", scheduled_at=fired, status="succeeded", trigger="self", coordination_outcome="single",
               instance="web-1:4242", fired_at=fired, finished_at=fired)  # fmt: skip
    older = replace(last, id="b", fired_at=fired - timedelta(hours=1), instance="web-0:1")
    timer = ScheduleView("a", "* * * * *", "UTC", "self", "skip", "skip", 60.0, None, None, True, None, None, last)
    other = replace(timer, name="b", last_run=older)
    banner = FleetBanner()
    banner.fleet, banner.now = fleet_of([], now, watching, [other, timer]), now
    assert banner.render().plain == (
        "✗ NOTHING IS FIRING: no engine is sending heartbeats; none is registered (one that stops takes its "
        "registration with it); the newest run was fired 3m ago by web-1:4242. 2 enabled schedules need an "
        "engine's timer: start `schedtui serve`."
    )
    banner.fleet = fleet_of([], now, watching, [replace(timer, last_run=None)])
    assert "none is registered, and no schedule has run yet." in banner.render().plain


# ----------------------------------------------------------------------------------------
# columns by priority, ages, elapsed time, durations
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 32)])
async def test_key_columns_stay_on_screen_and_hidden_ones_are_named(store_url: str, size: tuple[int, int]) -> None:
    async with console(store_url, size=size) as (app, pilot, clock, notes):
        table = schedules(app)
        hidden = table.hidden_columns()
        assert not {"name", "state", "next fire", "last run"} & set(hidden)
        title = plain(app.query_one("#schedules-title"))
        if hidden:
            assert f"→ {', '.join(hidden)} off-screen" in title
        runs = app.query_one(RunsTable)
        assert "error" not in runs.hidden_columns()


async def test_the_disabled_note_is_shown_whole_with_who_and_when(store_url: str) -> None:
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        await select(pilot, "legacy-cleanup")
        detail = plain(app.query_one(DetailBar))
        assert "○ disabled: paused during the session-store migration (by ops at 03-02 08:59:00 CET, 1m ago)" in detail
        # The note comes first, where 80 columns do not cut it (who and when may be cut).
        bar = app.query_one(DetailBar)
        second = bar.render().plain.splitlines()[1]
        assert second.index("paused during the session-store migration") + 42 < bar.content_size.width


async def test_last_run_has_an_age_running_runs_their_elapsed_time_and_durations(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        assert cell(app, "heartbeat", "last") == "✓ succeeded 5s ago 0ms ◆"
        clock.advance(60)
        app.tick()
        await settle(pilot)  # (a minute without the stream's pings: the store is read once)
        assert cell(app, "heartbeat", "last") == "✓ succeeded 1m ago 0ms ◆"
        runs = app.query_one(RunsTable)
        assert runs.runs[0].status == "running" and plain_at(runs, 0, 3) == "1m of 30m"
        assert cell(app, "daily-digest", "last").endswith("✎▶ 1m/30m")
        detail = app.query_one(DetailBar)
        assert detail.durations is not None and detail.durations.count == 3
        assert "p50 306ms p95 35.0s (3 runs)" in plain(detail)
        detail.durations = Durations(306, 306, 1)
        await settle(pilot)
        assert "p50 306ms p95 306ms (1 run)" in plain(detail)  # not "1 runs"


def test_durations_are_nearest_rank_percentiles_of_finished_runs() -> None:
    at = parse_iso(FROZEN)
    runs = [Run(id=str(n), name="x", scheduled_at=at, status="succeeded", trigger="self",
                coordination_outcome="single", instance="i", fired_at=at,
                finished_at=at + timedelta(milliseconds=n * 10)) for n in range(1, 21)]
    runs.append(Run(id="r", name="x", scheduled_at=at, status="running", trigger="self",
                    coordination_outcome="single", instance="i", fired_at=at))
    d = durations(runs)
    assert d is not None and (d.p50_ms, d.p95_ms, d.count) == (100, 190, 20)
    assert durations(runs[-1:]) is None


# ----------------------------------------------------------------------------------------
# backfill
# ----------------------------------------------------------------------------------------
async def open_backfill(app: SchedtuiApp, pilot: Pilot[Any], name: str, start: str, end: str = "now") -> BackfillScreen:
    await select(pilot, name)
    await pilot.press("b")
    await settle(pilot)
    screen = app.screen
    assert isinstance(screen, BackfillScreen)
    screen.query_one("#from", Input).value = start
    screen.query_one("#to", Input).value = end
    await settle(pilot)
    return screen


async def start(pilot: Pilot[Any], screen: BackfillScreen) -> None:
    """Backfill, and yes to the question it asks (the console's one confirmation)."""
    screen.action_start()
    await pilot.pause()
    assert isinstance(pilot.app.screen, Confirm) and pilot.app.screen.action == "start_backfill"
    await pilot.press("y")
    await pilot.pause()


async def test_the_plan_says_how_many_already_succeeded_and_can_skip_them(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(app, pilot, "flaky-export", "2026-03-02T07:50:00Z", "2026-03-02T07:51:00Z")
        assert screen.plan is not None and (screen.plan.count, screen.plan.already_succeeded) == (6, 6)
        assert "6 of them already succeeded and would run again" in plain(screen.query_one("#plan"))
        screen.query_one("#skip", Checkbox).value = True
        await settle(pilot)
        assert screen.to_fire == 0 and screen.query_one("#start").disabled
        assert "nothing to run" in plain(screen.query_one("#plan"))
        screen.query_one("#from", Input).value = "2026-03-02T07:20:00Z"
        screen.query_one("#to", Input).value = "2026-03-02T07:21:00Z"
        await settle(pilot)  # 07:20-07:21: the export API failed at :20 and :40 (and :00)
        assert screen.plan is not None and screen.plan.already_succeeded == 3 and screen.to_fire == 3
        await pilot.press("tab", "tab", "enter")  # skip box -> Backfill
        await settle(pilot)
        question = app.screen
        assert isinstance(question, Confirm) and "3 slots in" in question.text and "already succeeded skipped" in question.text
        await pilot.press("y")
        await settle(pilot)
        assert screen.progress is not None and screen.progress.total == 3 and screen.state == "done"


async def test_the_range_shown_is_the_range_fired(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(app, pilot, "heartbeat", "-1m")
        assert screen.plan is not None
        shown = (screen.plan.start, screen.plan.end)
        assert "as read now" in plain(screen.query_one("#plan"))
        clock.advance(40)  # the operator reads the plan for 40 s; "now" moves, the plan must not
        await start(pilot, screen)
        await settle(pilot)
        assert screen.progress is not None
        assert (screen.progress.start, screen.progress.end) == shown and screen.progress.total == 6


async def test_a_wrong_typed_count_says_why(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(app, pilot, "heartbeat", "-10m")
        assert screen.state == "confirm"
        screen.query_one("#confirm").focus()
        await pilot.press(*"59", "enter")
        await settle(pilot)
        assert notes.titled("Not confirmed") == ["You typed 59; type 60, the number of slots that would fire, to confirm."]
        assert "You typed 59" in plain(screen.query_one("#confirm-hint"))
        assert screen.state == "confirm"


async def test_a_running_backfill_can_be_stopped_and_q_asks_first(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        # slow-reindex's handler waits 14 s on the (frozen) clock: the backfill stays running.
        screen = await open_backfill(app, pilot, "slow-reindex", "-1m")
        await start(pilot, screen)
        assert screen.state == "running" and app.backfills
        await pilot.press("escape")  # close the dialog; the backfill goes on
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, QuitPrompt)
        await pilot.press("escape")  # stay
        await pilot.pause()
        assert not isinstance(app.screen, QuitPrompt) and app.is_running
        progress = next(iter(app.backfills.values()))
        stopped = await app.backend.cancel_backfill(progress.id)
        assert stopped.state == "cancelled" and stopped.fired < stopped.total
        clock.advance(30)  # the run in flight finishes
        await settle(pilot)
        assert notes.titled("Backfill cancelled") and not app.backfills


async def test_a_backfill_is_still_followed_through_a_moment_without_the_store(store_url: str) -> None:
    # The follower used to give up at the first error: the app then kept the backfill as
    # running (q asked about it for ever) and never said how it ended.
    from backend.errors import Unavailable

    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(app, pilot, "slow-reindex", "-1m")
        await start(pilot, screen)
        await pilot.press("escape")  # the dialog closed; the backfill goes on
        await pilot.pause()
        backend = app.backend
        progress_of = backend.backfill_progress
        failures = [Unavailable('the store "state.db" is locked'), Unavailable('the store "state.db" is locked')]

        async def flaky(backfill_id: str) -> Any:
            if failures:
                raise failures.pop()
            return await progress_of(backfill_id)

        backend.backfill_progress = flaky  # type: ignore[method-assign]  # fails twice, then reads
        progress = next(iter(app.backfills.values()))
        await progress_of(progress.id)
        await backend.cancel_backfill(progress.id)
        clock.advance(30)
        await settle(pilot)
        assert not failures  # the follower met both
        assert len([n for n in notes.seen if "still following" in str(n)]) == 1  # said once
        assert notes.titled("Backfill cancelled") and not app.backfills


async def test_the_dialog_stop_button_cancels(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(app, pilot, "slow-reindex", "-1m")
        await start(pilot, screen)
        assert screen.state == "running"
        screen.action_stop()  # asks first: no leaves it running
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and app.screen.action == "cancel_backfill"
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is screen  # type: ignore[comparison-overlap]  # mypy keeps the earlier narrowing across the awaits
        assert screen.state == "running"
        screen.action_stop()
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        await pilot.pause()
        assert screen.progress is not None and screen.progress.state == "cancelled"
        assert "cancelled" in plain(screen.query_one("#counts")) and "not fired" in plain(screen.query_one("#counts"))
        clock.advance(30)
        await settle(pilot)


# ----------------------------------------------------------------------------------------
# the filter
# ----------------------------------------------------------------------------------------
async def test_the_filter_leaves_the_header_visible_and_filters_by_state(store_url: str) -> None:
    async with console(store_url, size=(80, 24), read_only=True) as (app, pilot, clock, notes):
        await pilot.press("slash")
        await settle(pilot)
        header, field = app.query_one(ConsoleHeader), app.query_one("#filter", Input)
        assert field.display and header.region.height == 1 and not header.region.overlaps(field.region)
        assert "READ-ONLY" in plain(header) and "live" in plain(header)
        await pilot.press(*"failed")
        await settle(pilot)
        assert list(schedules(app).views) == ["flaky-export", "stuck-import"]
        field.value = "disabled"
        await settle(pilot)
        assert list(schedules(app).views) == ["legacy-cleanup"]


async def test_clearing_the_filter_keeps_the_cursor(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("slash", *"reindex", "enter")
        await settle(pilot)
        assert app.selected_name == "slow-reindex"
        await pilot.press("escape")
        await settle(pilot)
        assert len(schedules(app).views) == 7 and app.selected_name == "slow-reindex"
        assert schedules(app).cursor_row == 3


async def test_overdue_filter(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await later(app, pilot, clock, 60)
        await pilot.press("slash", *"overdue")
        await settle(pilot)
        assert "heartbeat" in schedules(app).views and "daily-digest" not in schedules(app).views


# ----------------------------------------------------------------------------------------
# paused countdowns, paging marker, Home/End, help
# ----------------------------------------------------------------------------------------
async def test_paging_shows_no_markup_and_home_end_jump(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        detail = app.query_one(DetailBar)
        detail.page = "page 2 · [ newer"
        text = plain(detail)
        assert "page 2 · [ newer" in text and "[/]" not in text
        await pilot.press("end")
        assert app.selected_name == "legacy-cleanup"
        await pilot.press("home")
        assert app.selected_name == "daily-digest"
        await pilot.press("tab", "end")
        runs = app.query_one(RunsTable)
        assert runs.cursor_row == len(runs.runs) - 1


async def test_help_lists_navigation_and_scrolls_at_80x24(store_url: str) -> None:
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        await pilot.press("question_mark")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, HelpScreen)
        described = " ".join(d for _, d in screen.keys)
        for words in ("first / last row", "the previous / next run", "switch between the schedules and the runs"):
            assert words in described
        from textual.containers import VerticalScroll

        box = screen.query_one(VerticalScroll)
        assert box.max_scroll_y > 0 and "scroll" in str(box.border_subtitle)
        await pilot.press("end")
        await settle(pilot)
        assert box.scroll_y == box.max_scroll_y


async def test_help_lines_wrap_under_their_description_at_80x24(store_url: str) -> None:
    """A description too long for 80 columns goes on under itself (it went on at the left
    edge, under the keys)."""
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        await pilot.press("question_mark")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, HelpScreen)
        long = "command palette: every action by name, go to a schedule or a view"
        assert ("^p", long) in screen.keys
        rows = screen_rows(app)
        [first] = [i for i, row in enumerate(rows) if "command palette: every action" in row]
        column = rows[first].index("command palette")
        assert rows[first][:column].strip(" │") == "^p"
        rest = rows[first + 1]
        assert rest[:column].strip(" │") == "" and rest[column] != " ", rows[first : first + 2]
        assert " ".join((rows[first][column:] + rest[column:]).replace("│", "").split()).startswith(long)
        assert long in screen.text and "  read-only" not in screen.text


# ----------------------------------------------------------------------------------------
# no column re-measuring on refresh
# ----------------------------------------------------------------------------------------
async def test_a_refresh_that_changes_every_last_run_remeasures_no_column(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        measured: list[CellKey] = []
        original = table._update_column_widths

        def counting(updated_cells: set[CellKey]) -> None:
            measured.extend(updated_cells)
            original(updated_cells)

        table._update_column_widths = counting  # type: ignore[method-assign]  # records the cells measured
        # A minute later every schedule has a new last run (as after a minute boundary).
        changed = [
            replace(v, last_run=replace(v.last_run, id=v.last_run.id + "x", scheduled_at=v.last_run.scheduled_at
                                        + timedelta(minutes=1)))
            if v.last_run is not None else v
            for v in app.views
        ]
        app.views = changed
        table.show(changed, clock.now() + timedelta(minutes=1), clock.now())
        await settle(pilot)
        assert measured == []


def with_bulk(views: list[ScheduleView], count: int) -> list[ScheduleView]:
    """``views`` and ``count`` more schedules after them (copies of the first that has run)."""
    model = next(v for v in views if v.last_run is not None)
    return [*views, *(replace(model, name=f"bulk-{i:04d}") for i in range(count))]


def fired(views: list[ScheduleView], cron: str | None = None) -> list[ScheduleView]:
    """Every schedule with a new last run (a missed one), and a new cron if given."""
    return [
        replace(v, cron=cron or v.cron, last_run=None if v.last_run is None
                else replace(v.last_run, id=v.last_run.id + "x", status="missed"))
        for v in views
    ]


async def test_a_refresh_that_changes_every_schedule_redraws_the_rows_on_screen_at_once_the_rest_after(
    store_url: str,
) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        many = with_bulk(app.views, 600)
        table.show(many, clock.now(), clock.now())
        await settle(pilot)
        await select(pilot, "stuck-import")
        before = {v.name: cell(app, v.name, "last") for v in many}
        repainted: list[str] = []  # update_cell repaints the table on screen
        update_cell = table.update_cell

        def counting(row_key: Any, *args: Any, **kwargs: Any) -> None:
            repainted.append(str(getattr(row_key, "value", row_key)))
            update_cell(row_key, *args, **kwargs)

        table.update_cell = counting  # type: ignore[method-assign]  # records the rows repainted
        changed = fired(many)
        table.show(changed, clock.now(), clock.now())
        redrawn = {v.name for v in changed if cell(app, v.name, "last") != before[v.name]}
        # at once: the rows on screen (the cursor's among them), not the 600 below
        assert "stuck-import" in redrawn and "daily-digest" in redrawn
        assert len(redrawn) <= table.size.height + 2
        await settle(pilot)
        assert all(" missed " in cell(app, v.name, "last") for v in changed if v.last_run is not None)
        assert table.selected_name == "stuck-import" and app.selected_name == "stuck-import"
        # the rows below took their cells without repainting the table once per row
        assert len(set(repainted)) <= table.size.height + 2 and "bulk-0599" not in repainted
        # and what the table remembers showing is what it shows, not equal copies (a thousand
        # rows' copies were thousands of objects more for the garbage collector)
        columns = [key for key, _, _ in table.COLUMNS]
        assert all(table._shown[v.name][i] is table.get_cell(v.name, key) for v in changed
                   for i, key in enumerate(columns))
        assert notes.seen == []


async def test_rows_scrolled_on_screen_before_their_batch_are_redrawn_by_the_next_tick(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        many = with_bulk(app.views, 600)
        table.show(many, clock.now(), clock.now())
        await settle(pilot)
        table.show(fired(many, cron="*/7 * * * *"), clock.now(), clock.now())
        table.scroll_to(y=table.max_scroll_y, animate=False, immediate=True)
        table.tick(clock.now())  # before any batch ran (nothing awaited since the refresh)
        last = many[-1].name
        assert cell(app, last, "cron") == "*/7 * * * *"
        assert cell(app, many[len(many) // 2].name, "cron") != "*/7 * * * *"  # still waiting for its batch
        await settle(pilot)
        assert all(cell(app, v.name, "cron") == "*/7 * * * *" for v in many)
        table.scroll_to(y=len(many) // 2, animate=False, immediate=True)  # rows caught up off screen
        await settle(pilot)
        drawn = ["".join(segment.text for segment in table.render_line(y)) for y in range(1, table.size.height)]
        assert all("*/7 * * * *" in line and "bulk-" in line for line in drawn)


async def test_rows_shown_again_after_a_filter_are_measured_by_their_text_not_rendered(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Clearing a "/" filter at 1,000 schedules adds every row back: Textual rendered and
    # measured each cell through the console (a terminal-size call each), ~170 ms on the
    # UI loop. The widths come from the cells' text now, and are the same.
    import textual.widgets._data_table as data_table
    from textual.render import measure

    rendered: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> int:
        rendered.append(1)
        return measure(*args, **kwargs)

    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        many = with_bulk(app.views, 600)
        table.show(many[:3], clock.now(), clock.now())  # filtered
        await settle(pilot)
        monkeypatch.setattr(data_table, "measure", counting)
        table.show(many, clock.now(), clock.now())  # the filter cleared
        await settle(pilot)
        assert len(rendered) < 50  # was 600 rows x 7 columns
        monkeypatch.undo()
        for column in table.columns.values():  # as Textual would have measured them
            if not column.auto_width:
                continue  # (its width is set: what its cells measure draws nothing differently)
            cells = [data_table.default_cell_formatter(value) for value in table.get_column(column.key)]
            assert column.content_width == max(measure(app.console, c, 1) for c in cells), column.label
        assert table.virtual_size.height == len(many) + 1  # the rows and the header
        assert notes.seen == []


async def test_a_cleared_filter_builds_the_cells_of_the_rows_on_screen_and_catches_the_rest_up(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        many = with_bulk(app.views, 600)
        table.show(many, clock.now(), clock.now())
        await settle(pilot)
        await select(pilot, "stuck-import")
        table.show([v for v in many if v.name == "stuck-import"], clock.now(), clock.now())  # filtered
        await settle(pilot)
        changed = fired(many)  # meanwhile, every schedule got a new last run
        built: list[str] = []
        cells_of = table._cells

        def counting(view: ScheduleView, now: datetime, data_now: datetime) -> tuple[Text | str, ...]:
            built.append(view.name)
            return cells_of(view, now, data_now)

        table._cells = counting  # type: ignore[method-assign]  # records the rows built
        table.show(changed, clock.now(), clock.now())  # the filter cleared
        assert len(built) <= 4 * table.size.height  # the rows on screen, not 600
        assert "stuck-import" in built and table.selected_name == "stuck-import"
        assert " missed " not in cell(app, "bulk-0599", "last")  # far below: its old cells, for now
        await settle(pilot)
        assert all(" missed " in cell(app, v.name, "last") for v in changed if v.last_run is not None)
        assert table.selected_name == "stuck-import"
        assert notes.seen == []


async def test_the_console_freezes_the_heap_of_its_first_screen_only_when_asked(store_url: str) -> None:
    frozen = gc.get_freeze_count()
    try:
        async with console(store_url) as (app, pilot, clock, notes):
            assert gc.get_freeze_count() == frozen  # tests run many apps in one process
            assert not app.collector.started
        thresholds = gc.get_threshold()
        async with console(store_url, freeze_heap=True) as (app, pilot, clock, notes):
            assert gc.get_freeze_count() > frozen + 10_000
            assert app.collector.started and gc.get_threshold()[2] > thresholds[2]  # full collections paced
        assert gc.get_threshold() == thresholds
    finally:
        gc.unfreeze()


def test_a_cleared_table_cache_frees_its_entries_without_the_cycle_collector() -> None:
    class Rendered:
        pass

    gc.disable()
    try:
        cache: RingFreeCache[int, Rendered] = RingFreeCache(10)
        alive = []
        for key in range(25):  # evicting as it goes
            value = Rendered()
            alive.append(weakref.ref(value))
            cache[key] = value
        del value
        cache.clear()
        assert [ref() for ref in alive] == [None] * 25
    finally:
        gc.enable()


async def test_every_console_table_keeps_a_few_screens_rendered_in_ring_free_caches(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        tables = list(app.query(FreshTable))
        assert len(tables) >= 2
        for table in tables:
            caches = (table._row_render_cache, table._cell_render_cache, table._row_renderable_cache, table._line_cache,
                      table._cells_drawn, table._offset_cache, table._ordered_row_cache)  # (those two: every row, cleared with the rows)
            assert all(isinstance(cache, RingFreeCache) for cache in caches)
            assert table._cell_render_cache.maxsize == FreshTable.CACHED_CELLS <= 1000


# ----------------------------------------------------------------------------------------
# failure unmistakable without colour
# ----------------------------------------------------------------------------------------
async def test_failure_is_bold_and_reversed_everywhere(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        failed = status_style(app, "failed")
        assert failed.bold and failed.reverse and not status_style(app, "succeeded").reverse
        view = app.view_of("stuck-import")
        assert view is not None
        text: Text = last_run_text(view, clock.now(), app)
        first = text.spans[0]
        assert text.plain[first.start:first.end] == "✗ failed"
        style = first.style
        assert not isinstance(style, str) and style.reverse and style.bold
        await select(pilot, "stuck-import")
        status = app.query_one(RunsTable).get_cell_at(Coordinate(0, 1))
        assert isinstance(status, Text) and not isinstance(status.style, str) and status.style.reverse


# ----------------------------------------------------------------------------------------
# one zone for every time on screen
# ----------------------------------------------------------------------------------------
async def test_times_are_in_the_operators_zone_or_utc_whatever_the_schedule(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        runs = app.query_one(RunsTable)
        assert plain_at(runs, 0, 0) == "03-02 09:00:04 CET"  # daily-digest, a Berlin schedule
        await select(pilot, "stuck-import")  # a Tokyo schedule: still CET
        assert plain_at(runs, 0, 0) == "03-02 09:00:00 CET"
        await pilot.press("z")
        await settle(pilot)
        assert plain_at(runs, 0, 0) == "03-02 08:00:00 UTC"
        assert "times UTC" in plain(app.query_one("#tabs"))
        # its cron and next fires stay in its own zone
        assert app.query_one("#upcoming", UpcomingLine).zone == "Asia/Tokyo"


# ----------------------------------------------------------------------------------------
# the run details: both zones, and where a traceback will go
# ----------------------------------------------------------------------------------------
async def test_run_details_show_the_display_zone_and_the_schedules_own(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "stuck-import")
        await pilot.press("tab", "enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, RunDetails)
        body = plain(screen.query_one("#run-body"))
        assert "2026-03-02 09:00:00 CET" in body and "2026-03-02 17:00:00 JST" in body


def test_the_console_takes_the_crons_its_embedded_definitions_parsed() -> None:
    """A console's first screen judges every schedule's overdue state by its cron: on an
    embedded backend it takes the definitions' parsed crons, it does not parse them again
    (a thousand parses on the UI loop, one of the first screen's costs)."""
    definition = define_schedule(name="first-screen-cron", cron="@daily", timezone="Asia/Kolkata", handler=lambda ctx: None)
    assert CronCache().get(definition.cron.expr, "Asia/Kolkata") is definition.cron  # "0 0 * * *", as views carry it
    assert CronCache().get("@daily", "Asia/Kolkata") is definition.cron
    assert CronCache().get("61 * * * *", "UTC") is None  # a server newer than this console: no crash


def test_overdue_is_cached_until_it_can_change() -> None:
    crons = CronCache()
    overdue = Overdue(crons)
    at = parse_iso("2026-03-02T08:00:00Z")
    last = Run(id="a", name="x", scheduled_at=at, status="succeeded", trigger="self", coordination_outcome="single",
               instance="i", fired_at=at, finished_at=at)
    view = ScheduleView(name="x", cron="* * * * *", timezone="UTC", trigger="self", on_overlap="skip", backfill="skip",
                        max_runtime_s=60, description=None, payload=None, enabled=True, state_note=None,
                        next_fire_at=None, last_run=last)
    assert overdue.since(view, at + timedelta(seconds=89)) is None  # 08:01 is due at 08:01:30
    assert overdue.since(view, at + timedelta(seconds=90)) == at + timedelta(minutes=1)
    assert overdue.since(view, at + timedelta(hours=3)) == at + timedelta(minutes=1)


async def test_the_timeline_draws_under_no_color(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")  # Textual's monochrome filter reads every segment's style
    async with console(store_url) as (app, pilot, clock, notes):
        assert app.no_color
        await pilot.press("2")
        await settle(pilot)
        grid = app.query_one(TimelineGrid)
        assert grid.rows and "CET" in grid.render_line(0).text
        svg = app.export_screenshot()  # the whole screen, through the filter
        assert "flaky-export" in svg


async def test_rows_caught_up_off_screen_leave_the_rows_on_screen_rendered(store_url: str) -> None:
    # After a minute boundary, hundreds of rows off screen take their new cells in batches.
    # Each batch used to count an update, which dropped the rendering of every row: the
    # rows on screen were drawn again, cell by cell, in the next frame (and the next).
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        many = with_bulk(app.views, 600)
        table.show(many, clock.now(), clock.now())
        await settle(pilot)
        rendered = len(table._cells_drawn.keys())
        assert rendered > 0
        drawn = table._update_count
        table.show(fired(many), clock.now(), clock.now())  # every schedule got a new last run
        await settle(pilot)
        assert not table._stale
        assert " missed " in cell(app, "bulk-0599", "last")  # far below: caught up
        # On screen: its cells redrawn through update_cell (an update each); off screen: none.
        assert table._update_count - drawn <= 3 * (table.size.height + 2)
        assert len(table._cells_drawn.keys()) >= rendered // 2  # the screen's cells still there
        assert notes.seen == []


async def test_the_timeline_judges_overdue_only_the_rows_it_draws(store_url: str) -> None:
    # Switching to the timeline right after a minute boundary judged every schedule at once
    # (a cron walk each for a thousand); now only the rows drawn are asked about.
    async with console(store_url) as (app, pilot, clock, notes):  # (the backend knows no bulk-*: its notes)
        app.views = with_bulk(app.views, 600)
        asked: list[str] = []
        since = app.overdue.since

        def counting(view: ScheduleView, now: datetime) -> datetime | None:
            asked.append(view.name)
            return since(view, now)

        app.overdue.since = counting  # type: ignore[method-assign]  # records the schedules asked about
        await pilot.press("2")
        await settle(pilot)
        grid = app.query_one(TimelineGrid)
        assert grid.rows
        assert 0 < len(set(asked)) <= 3 * grid.size.height  # not 610 (the switch drew them all)


async def test_a_silent_event_stream_is_not_called_live(store_url: str) -> None:
    """A frozen server (SIGSTOP) keeps its connections open and says nothing: the header
    said "● live (events)" for the 40 s until the stream was given up. After 20 s without a
    ping it says the server is waited for; the next signal makes it live again."""
    async with console(store_url) as (app, pilot, clock, notes):
        header = app.query_one(ConsoleHeader)
        assert header.feed == "events"
        app.on_signals([])
        clock.advance(15)
        app.tick()
        assert "● live (events)" in header.render().plain
        clock.advance(10)
        app.tick()
        shown = header.render().plain
        assert "◌ waiting for the server (events silent 25s)" in shown and "live" not in shown
        app.on_signals([])  # a ping
        app.tick()
        assert "● live (events)" in header.render().plain
