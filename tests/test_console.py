"""The operations console, driven by Pilot against an embedded backend at a frozen time.

The ledger comes from a real engine run on a ManualClock (tests/console_fixtures.py); the app
gets a backend over a copy of it and the same kind of clock, frozen at FROZEN. Nothing here
sleeps: tests wait for the app's workers and for Pilot to settle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.content import Content
from textual.coordinate import Coordinate
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import DataTable, Input

from backend import BadInput, Engine, Forbidden, ManualClock, NotFound, Run, define_schedule
from backend.client.embedded import EmbeddedBackend
from backend.events.audit import os_user
from backend.model import parse_iso
from backend.store import open_store
from console import format as fmt
from console.app import PAGE_SIZE, SchedtuiApp, parse_keymap, short_where
from console.commands import ConsoleCommands
from console.screens import BackfillScreen, Confirm, HelpScreen, NotePrompt, RunDetails
from console.widgets import (
    ConsoleHeader,
    DetailBar,
    RecentRuns,
    RunsTable,
    SchedulesTable,
    UpcomingLine,
)
from tests.servers import poll

OPERATOR_ZONE = "Europe/Berlin"
"""The operator's zone in these tests: times on screen are CET whatever the schedule's zone."""

from tests.console_fixtures import (  # noqa: E402
    FROZEN,
    WHERE,
    FlakyBackend,
    Held,
    build_ledger,
    console_backend,
    ledger_copy,
    seeded_ids,
)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("console-ledger")
    asyncio.run(build_ledger(folder))
    return folder / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    """A private copy of the fixture ledger (tests act on it)."""
    return ledger_copy(ledger, tmp_path)


class Notes:
    """Records every notification the app shows (title, message)."""

    def __init__(self, app: SchedtuiApp) -> None:
        self.seen: list[tuple[str, str]] = []
        original = app.notify

        def notify(message: str, *, title: str = "", **kwargs: Any) -> None:
            self.seen.append((title, message))
            original(message, title=title, **kwargs)

        app.notify = notify  # type: ignore[method-assign]  # records each notification, then shows it

    def titled(self, title: str) -> list[str]:
        return [message for t, message in self.seen if t == title]


async def settle(pilot: Pilot[Any]) -> None:
    """Let every worker finish and the screen catch up."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@asynccontextmanager
async def console(
    url: str,
    *,
    backend: Any = None,
    clock: ManualClock | None = None,
    size: tuple[int, int] = (100, 30),
    **kwargs: Any,
) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], ManualClock, Notes]]:
    clock = clock or ManualClock(FROZEN)
    backend = backend or console_backend(url, clock, read_only=kwargs.get("read_only", False))
    kwargs.setdefault("operator_zone", OPERATOR_ZONE)
    app = SchedtuiApp(backend, clock, where=WHERE, **kwargs)
    notes = Notes(app)
    try:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            yield app, pilot, clock, notes
    finally:
        await backend.close()


async def select(pilot: Pilot[Any], name: str) -> None:
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    app.action_select(name)
    await settle(pilot)
    assert app.selected_name == name


def schedules(app: SchedtuiApp) -> SchedulesTable:
    return app.query_one(SchedulesTable)


def cell(app: SchedtuiApp, name: str, column: str) -> str:
    value = schedules(app).get_cell(name, column)
    return value if isinstance(value, str) else value.plain


def plain(widget: Widget) -> str:
    """The text ``widget`` renders (a Static's Content, or a widget's own Content or Text)."""
    rendered = widget.render()
    assert isinstance(rendered, (Content, Text)), rendered
    return rendered.plain


def plain_at(table: DataTable[Text | str], row: int, column: int) -> str:
    """The text of a cell that the table holds as Text."""
    value = table.get_cell_at(Coordinate(row, column))
    assert isinstance(value, Text), value
    return value.plain


# ----------------------------------------------------------------------------------------
# what it shows
# ----------------------------------------------------------------------------------------
async def test_main_screen_shows_every_schedule_and_the_selected_runs(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        table = schedules(app)
        assert list(table.views) == [
            "daily-digest", "heartbeat", "flaky-export", "slow-reindex", "stuck-import", "billing-webhook",
            "legacy-cleanup",
        ]
        assert app.selected_name == "daily-digest"
        assert cell(app, "daily-digest", "next") == "in 23h 59m"
        assert cell(app, "heartbeat", "next") == "in 5s"
        assert cell(app, "billing-webhook", "next") == "external"
        assert cell(app, "legacy-cleanup", "next") == "disabled"
        assert cell(app, "legacy-cleanup", "state") == "○ off"
        assert cell(app, "heartbeat", "state") == "● on"
        assert cell(app, "stuck-import", "last") == "✗ failed 0s ago 5.0s ◆"
        assert cell(app, "billing-webhook", "last") == "✓ succeeded 5s ago 0ms ⇲"
        # LAST RUN is the newest self/external slot; the newer manual run is marked as such.
        assert cell(app, "daily-digest", "last") == "↷ skipped 5s ago 0ms ◆ ✎▶ 1s/30m"
        assert cell(app, "daily-digest", "tz") == "Europe/Berlin"
        runs = app.query_one(RunsTable).runs
        assert [r.status for r in runs] == ["running", "skipped", "succeeded", "failed", "missed", "missed", "succeeded"]
        assert [r.scheduled_at for r in runs] == sorted((r.scheduled_at for r in runs), reverse=True)
        assert {r.coordination_outcome for r in runs} == {"manual", "wonLock", "single"}
        assert app.query_one(RecentRuns).runs == runs
        upcoming = app.query_one(UpcomingLine)
        assert len(upcoming.slots) == 5 and upcoming.zone == "Europe/Berlin"
        assert upcoming.slots[0] == parse_iso("2026-03-03T08:00:00Z")
        header = app.query_one(ConsoleHeader)
        assert header.state == "live" and header.where == WHERE and not header.read_only
        assert header.info is not None and header.info.coordination == "advisoryLock"
        assert header.info.instance == "console"
        # the scheduled time is shown in the operator's zone
        assert plain_at(app.query_one(RunsTable), 0, 0) == "03-02 09:00:04 CET"
        assert notes.seen == []


async def test_countdowns_are_recomputed_from_the_clock_on_every_tick(store_url: str) -> None:
    async with console(store_url, live_events=False) as (app, pilot, clock, notes):  # polling: the header has an age
        assert cell(app, "heartbeat", "next") == "in 5s"
        clock.advance(2)
        app.tick()
        assert cell(app, "heartbeat", "next") == "in 3s"
        assert cell(app, "stuck-import", "next") == "in 13s"
        clock.advance(timedelta(seconds=3, milliseconds=500))
        app.tick()  # past the slot (nothing armed here fires it): the cron's next slot, never "due now"
        assert cell(app, "heartbeat", "next") == "in 9s"
        # the header's age of the last good refresh comes from the same clock
        assert app.query_one(ConsoleHeader).render().plain.count("5s ago") == 1


async def test_selecting_another_schedule_loads_its_runs_and_next_fires(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("down")
        await settle(pilot)
        assert app.selected_name == "heartbeat"
        assert [r.status for r in app.query_one(RunsTable).runs] == ["succeeded"] * 6
        upcoming = app.query_one(UpcomingLine)
        assert upcoming.slots[:2] == [parse_iso("2026-03-02T08:00:10Z"), parse_iso("2026-03-02T08:00:20Z")]
        await select(pilot, "stuck-import")
        errors = [r.error_tag for r in app.query_one(RunsTable).runs]
        assert errors == ["timeout"] * 3


# ----------------------------------------------------------------------------------------
# acting
# ----------------------------------------------------------------------------------------
async def test_r_runs_now_names_the_run_and_shows_it_in_the_timeline(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        await pilot.press("r")
        await settle(pilot)
        fired = notes.titled("Run now: fired")
        assert len(fired) == 1
        newest = app.query_one(RecentRuns).runs[0]
        assert newest.trigger == "manual" and newest.coordination_outcome == "manual"
        assert newest.id in fired[0] and "heartbeat" in fired[0]
        assert app.query_one(RunsTable).runs[0].id == newest.id
        assert newest.status == "succeeded"  # re-read once it finished
        finished = notes.titled("Run finished")
        assert finished and newest.id in finished[0] and "succeeded" in finished[0]
        assert cell(app, "heartbeat", "last").startswith("✓ succeeded")
        assert cell(app, "heartbeat", "last").endswith("✎✓ 0s ago")  # the manual run, as such


async def test_run_finished_shows_an_error_with_controls_as_its_escapes_as_the_runs_do(store_url: str) -> None:
    """A handler's error with an escape sequence: the runs table shows it as its escapes,
    the "Run finished" notification had it raw, which the last-resort filter cut to
    'boom ]0;title' (what the handler wrote could not be told)."""

    class Failing:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.read_only = inner.read_only

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def wait_run(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
            run = await self.inner.wait_run(run_id, *args, **kwargs)
            return dataclasses.replace(run, status="failed", error_tag="RuntimeError", error_message="boom \x1b]0;title\x07")

    clock = ManualClock(FROZEN)
    async with console(store_url, backend=Failing(console_backend(store_url, clock)), clock=clock) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        await pilot.press("r")
        await settle(pilot)
        [finished] = notes.titled("Run finished")
        assert finished.endswith("[RuntimeError] boom \\x1b]0;title\\x07") and "\x1b" not in finished


async def test_a_long_note_is_said_cut_short_so_the_notification_fits_the_screen(store_url: str) -> None:
    """In full, a note of 1,000 characters made the "Disabled" toast taller than an 80x24
    screen: its title, and which schedule it was, cut off above the first row."""
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        await pilot.press("e")
        await settle(pilot)
        assert isinstance(app.screen, NotePrompt)
        app.screen.query_one(Input).value = "N" * 1000
        await pilot.press("enter")
        await settle(pilot)
        assert notes.titled("Disabled") == [f"heartbeat disabled: {fmt.cut('N' * 1000, fmt.NOTE_CHARS)}"]
        await pilot.press("e")
        await settle(pilot)
        (enabled,) = notes.titled("Enabled")
        assert f"note cleared: “{fmt.cut('N' * 1000, fmt.NOTE_CHARS)}”" in enabled and len(enabled) < 250


async def test_e_disables_with_a_note_then_enables(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        await pilot.press("e")
        await settle(pilot)
        assert isinstance(app.screen, NotePrompt)
        await pilot.press(*"vendor outage")
        await pilot.press("enter")
        await settle(pilot)
        assert not isinstance(app.screen, NotePrompt)
        view = app.view_of("heartbeat")
        assert view is not None and not view.enabled
        assert view.state_note is not None and view.state_note.note == "vendor outage"
        assert view.state_note.by == os_user()  # the person at the console
        assert cell(app, "heartbeat", "state") == "○ off"
        detail = app.query_one(DetailBar).render().plain
        assert f"○ disabled: vendor outage (by {os_user()} at 03-02 09:00:05 CET, 0s ago)" in detail
        assert cell(app, "heartbeat", "next") == "disabled"
        assert notes.titled("Disabled") == ["heartbeat disabled: vendor outage"]
        await pilot.press("e")  # enabling asks nothing, and says which note it clears
        await settle(pilot)
        view = app.view_of("heartbeat")
        assert view is not None and view.enabled
        assert cell(app, "heartbeat", "next") == "in 5s"
        assert notes.titled("Enabled") == [f"heartbeat enabled; note cleared: “vendor outage” ({os_user()}, 0s ago); next fire in 5s"]


async def test_e_enter_e_typed_at_once_disables_then_enables(store_url: str) -> None:
    clock = ManualClock(FROZEN)
    backend = Held(console_backend(store_url, clock), "set_enabled")
    async with console(store_url, backend=backend, clock=clock) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        backend.go.clear()  # the disable is not answered before the second e
        await pilot.press("e", "enter", "e")
        await pilot.pause()
        assert not isinstance(app.screen, NotePrompt)  # the second e enables: it asks nothing
        backend.go.set()
        await settle(pilot)
        assert [args for _, args in backend.calls] == [("heartbeat", False), ("heartbeat", True)]
        view = app.view_of("heartbeat")
        assert view is not None and view.enabled
        assert notes.titled("Disabled") == ["heartbeat disabled"]
        assert [n.split(";")[0] for n in notes.titled("Enabled")] == ["heartbeat enabled"]


async def test_disabling_enter_skips_the_note_and_esc_cancels(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "flaky-export")
        await pilot.press("e")
        await settle(pilot)
        await pilot.press("escape")
        await settle(pilot)
        view = app.view_of("flaky-export")
        assert view is not None and view.enabled and notes.titled("Disabled") == []
        await pilot.press("e")
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        view = app.view_of("flaky-export")
        assert view is not None and not view.enabled
        assert view.state_note is not None and view.state_note.note is None
        assert cell(app, "flaky-export", "state") == "○ off"


async def open_backfill(pilot: Pilot[Any], name: str, start: str, end: str = "now") -> BackfillScreen:
    await select(pilot, name)
    await pilot.press("b")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, BackfillScreen)
    assert screen.focused is not None and screen.focused.id == "cancel"  # Cancel has the focus
    screen.query_one("#from", Input).value = start
    screen.query_one("#to", Input).value = end
    await settle(pilot)
    return screen


async def test_backfill_plans_as_you_type_then_runs_with_progress_and_a_summary(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(pilot, "heartbeat", "-1m")
        assert screen.state == "ok"
        assert screen.plan is not None and screen.plan.count == 6
        text = plain(screen.query_one("#plan"))
        assert "6 slots would fire" in text and "6 of them already succeeded" in text
        assert "first 2026-03-02 07:59:10 UTC" in text and "last 2026-03-02 08:00:00 UTC" in text
        await pilot.press("tab")  # Cancel -> Backfill
        assert screen.focused is not None and screen.focused.id == "start"
        await pilot.press("enter")
        await settle(pilot)
        question = app.screen
        assert isinstance(question, Confirm) and question.action == "start_backfill"
        assert question.question == 'Backfill "heartbeat"?'
        assert "6 slots in (2026-03-02 07:59:05 UTC … 2026-03-02 08:00:05 UTC]" in question.text
        await pilot.press("y")
        await settle(pilot)
        assert screen.state == "done"  # type: ignore[comparison-overlap]  # mypy keeps the earlier narrowing across the awaits
        assert screen.progress is not None and screen.progress.fired == 6 and screen.progress.remaining == 0
        counts = plain(screen.query_one("#counts"))
        assert "fired 6/6" in counts and "failed 0" in counts and "done" in counts
        assert notes.titled("Backfill finished") == ["heartbeat: 6 fired, 6 succeeded, 0 failed, 0 not fired (done)"]
        await pilot.press("escape")
        await settle(pilot)
        runs = app.query_one(RunsTable).runs
        manual = [r for r in runs if r.trigger == "manual"]
        assert len(manual) == 6
        assert sorted(r.scheduled_at for r in manual)[0] == parse_iso("2026-03-02T07:59:10Z")
        # In scheduled order: each backfilled slot beside its own firing, newest created first.
        assert [(r.scheduled_at, r.trigger) for r in runs[:2]] == [(parse_iso("2026-03-02T08:00:00Z"), "manual"),
                                                                     (parse_iso("2026-03-02T08:00:00Z"), "self")]
        assert cell(app, "heartbeat", "last").startswith("✓ succeeded 5s ago")  # still the newest self slot


async def test_backfill_over_25_slots_needs_the_count_typed(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(pilot, "heartbeat", "-10m")
        assert screen.state == "confirm"
        start = screen.query_one("#start")
        assert start.disabled
        assert "type 60 below to confirm" in plain(screen.query_one("#plan"))
        screen.query_one("#confirm", Input).value = "59"
        await settle(pilot)
        assert start.disabled
        screen.query_one("#confirm", Input).value = "60"
        await settle(pilot)
        assert not start.disabled
        await pilot.press("escape")  # Esc cancels: nothing fired
        await settle(pilot)
        assert not isinstance(app.screen, BackfillScreen)
        assert not any(r.trigger == "manual" for r in app.query_one(RunsTable).runs)


@pytest.mark.parametrize(
    ("start", "end", "why"),
    [
        ("now", "-1h", "reversed range"),
        ("-1h", "+1h", "reaches into the future"),
        ("-3h", "now", "exceed the limit of 1,000"),
        ("2026-03-02T07:59:01", "2026-03-02T07:59:09", "no slots in the range"),  # naive: the zone (UTC)
        ("yesterday", "now", 'from "yesterday" is not a time'),
    ],
)
async def test_backfill_refusals_say_why(store_url: str, start: str, end: str, why: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        await pilot.press("b")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BackfillScreen)
        screen.query_one("#from", Input).value = start
        screen.query_one("#to", Input).value = end
        await settle(pilot)
        assert screen.state in ("refused", "invalid")
        assert why in plain(screen.query_one("#plan"))
        assert screen.query_one("#start").disabled


@pytest.mark.parametrize("start", ["-999999999d", "0001-01-01", "-99999999999999999999w"])
async def test_backfill_from_beyond_the_calendar_says_why(store_url: str, start: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        screen = await open_backfill(pilot, "daily-digest", start)  # Europe/Berlin
        assert screen.state == "invalid"
        assert f'from "{start}" is out of range' in plain(screen.query_one("#plan"))
        assert screen.query_one("#start").disabled
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, BackfillScreen)  # the app is alive and well


async def test_enter_opens_the_run_details(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("tab")  # to the runs table
        await pilot.press("down", "down", "down")  # the failed catch-up run
        await pilot.press("enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, RunDetails)
        body = plain(screen.query_one("#run-body"))
        assert "✗ failed" in body and "ConnectionRefusedError" in body and "smtp.example.internal" in body
        assert "2026-03-01 09:00:00 CET" in body and "◆ wonLock" in body
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, RunDetails)


async def test_older_runs_page_by_keyset(store_url: str) -> None:
    # 120 older heartbeat runs, written straight into the store before the console opens.
    store = open_store(store_url)
    await store.open()
    clock = ManualClock("2026-03-01T00:00:00Z")
    ids = seeded_ids(clock, 99)
    older = []
    for _n in range(120):
        at = clock.now()
        older.append(Run(id=ids(), name="heartbeat", scheduled_at=at, status="succeeded", trigger="self",
                         coordination_outcome="wonLock", instance="web-1", fired_at=at, finished_at=at))
        clock.advance(10)
    store.save_runs(older)
    await store.close()

    async with console(store_url) as (app, pilot, clock, notes):
        calls: list[str | None] = []
        backend = app.backend
        original = backend.list_runs

        async def list_runs(name: str, *, limit: int = 50, before: str | None = None) -> Any:
            calls.append(before)
            assert limit == PAGE_SIZE  # a page at a time, never everything
            return await original(name, limit=limit, before=before)

        backend.list_runs = list_runs  # type: ignore[method-assign]  # records the cursors asked for
        await select(pilot, "heartbeat")
        first = app.query_one(RunsTable).runs
        assert len(first) == PAGE_SIZE
        await pilot.press("right_square_bracket")
        await settle(pilot)
        second = app.query_one(RunsTable).runs
        assert len(second) == PAGE_SIZE and second[0].id < first[-1].id
        assert calls[-2:] == [None, first[-1].id] or first[-1].id in calls
        await pilot.press("right_square_bracket")
        await settle(pilot)
        third = app.query_one(RunsTable).runs
        assert len(third) == 126 - 2 * PAGE_SIZE
        await pilot.press("right_square_bracket")  # nothing older
        await settle(pilot)
        assert notes.titled("") [-1:] == ["No older runs."]
        await pilot.press("left_square_bracket", "left_square_bracket")
        await settle(pilot)
        assert app.query_one(RunsTable).runs == first
        assert app.query_one(RecentRuns).runs == first  # the strip always shows the newest


async def test_filter_with_slash_and_esc(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("slash")
        await pilot.press(*"beat")
        await settle(pilot)
        assert list(schedules(app).views) == ["heartbeat"]
        assert app.selected_name == "heartbeat"
        await pilot.press("enter")  # keeps the filter, back to the table
        assert app.focused is schedules(app)
        await pilot.press("r")  # keys act again once the table has the focus
        await settle(pilot)
        assert len(notes.titled("Run now: fired")) == 1
        await pilot.press("escape")
        await settle(pilot)
        assert len(schedules(app).views) == 7


async def test_p_pauses_auto_refresh_and_ctrl_r_refreshes_now(store_url: str) -> None:
    async with console(store_url, live_events=False) as (app, pilot, clock, notes):  # polling
        reads = 0
        original = app.backend.list_schedules

        async def counting() -> Any:
            nonlocal reads
            reads += 1
            return await original()

        app.backend.list_schedules = counting  # type: ignore[method-assign]  # counts the reads
        clock.advance(1)
        app.tick()
        await settle(pilot)
        assert reads == 1  # due every second by the clock
        await pilot.press("p")
        assert app.query_one(ConsoleHeader).paused
        clock.advance(5)
        app.tick()
        await settle(pilot)
        assert reads == 1
        assert cell(app, "heartbeat", "next") == "in 9s"  # countdowns keep ticking, slot after slot
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert reads == 2
        await pilot.press("p")
        await settle(pilot)
        assert reads == 3 and not app.query_one(ConsoleHeader).paused


async def test_read_only_keys_say_why_and_the_backend_refuses_too(store_url: str) -> None:
    async with console(store_url, read_only=True, backend=None) as (app, pilot, clock, notes):
        assert app.read_only
        for key in ("r", "e", "b"):
            await pilot.press(key)
            await settle(pilot)
        refusals = notes.titled("Read-only")
        assert len(refusals) == 3 and all("--read-only" in m for m in refusals)
        assert not isinstance(app.screen, (NotePrompt, BackfillScreen))
        assert app.query_one("#mode").display
        assert "READ-ONLY" in app.query_one(ConsoleHeader).render().plain
        # not the UI alone: the backend wrapper refuses as well
        with pytest.raises(Forbidden):
            await app.backend.run_now("heartbeat")


async def test_read_only_backend_is_shown_read_only(store_url: str) -> None:
    clock = ManualClock(FROZEN)
    async with console(store_url, backend=console_backend(store_url, clock, read_only=True), clock=clock) as (
        app, pilot, _, notes,
    ):
        assert app.read_only
        await pilot.press("r")
        await settle(pilot)
        assert notes.titled("Read-only") == ["Run now does nothing here: the backend is read-only."]


async def test_a_lost_connection_is_shown_stale_and_retried_with_backoff(store_url: str) -> None:
    clock = ManualClock(FROZEN)
    flaky = FlakyBackend(console_backend(store_url, clock))
    async with console(store_url, backend=flaky, clock=clock) as (app, pilot, _, notes):
        header = app.query_one(ConsoleHeader)
        flaky.down = True
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert header.state == "lost"
        assert app.query_one("#main").has_class("-stale")
        assert notes.titled("Unavailable") == [
            "cannot reach http://10.0.0.7:8080: connection refused. Retrying by itself; the data on screen is stale."
        ]
        assert "retry 1s" in header.render().plain  # (in short words: the long ones pushed the instance out)
        assert len(schedules(app).views) == 7  # the last data stays, marked stale
        clock.advance(1)
        app.tick()
        await settle(pilot)
        assert header.state == "lost" and header.retry_at == clock.now() + timedelta(seconds=2)  # backoff
        assert len(notes.titled("Unavailable")) == 1  # said once, not at every retry
        clock.advance(2)
        flaky.down = False
        app.tick()
        await settle(pilot)
        assert header.state == "live"  # type: ignore[comparison-overlap]  # mypy keeps the earlier narrowing across the awaits
        assert not app.query_one("#main").has_class("-stale")
        assert notes.titled("Reconnected")


async def test_a_store_file_deleted_under_the_console_is_shown_lost_not_live(store_url: str) -> None:
    # It kept showing "● live (events)" and the deleted file's frozen runs, while a new
    # serve fired into a new file at that path.
    clock = ManualClock(FROZEN)
    async with console(store_url, backend=console_backend(store_url, clock), clock=clock) as (app, pilot, _, notes):
        header = app.query_one(ConsoleHeader)
        assert header.state == "live"
        Path(store_url.removeprefix("sqlite:///")).unlink()
        store = app.backend.engine.store  # type: ignore[attr-defined]
        poll(lambda: store.health().state == "lost", timeout=10, what="the store to notice")
        # Within about a second, with no key pressed: the change stream looks at the store
        # while it is quiet (it went on saying "live" until an operator pressed ctrl+r).
        def state() -> str:  # (read afresh: mypy narrowed the attribute before the awaits)
            return header.state

        for _ in range(100):
            if state() == "lost":
                break
            await pilot.pause(0.05)
        assert state() == "lost"
        assert app.query_one("#main").has_class("-stale")
        [said] = notes.titled("Unavailable")
        assert said.startswith(f'the store file "{store.path}" was deleted or replaced while in use')


async def test_every_backend_error_is_a_notification(store_url: str) -> None:
    clock = ManualClock(FROZEN)
    backend = console_backend(store_url, clock)

    async def gone(name: str) -> Run:
        raise NotFound(f'no schedule named "{name}"')

    backend.run_now = gone  # type: ignore[method-assign]  # a backend whose run_now fails
    async with console(store_url, backend=backend, clock=clock) as (app, pilot, _, notes):
        await pilot.press("r")
        await settle(pilot)
        assert notes.titled("Not found") == ['no schedule named "daily-digest"']


async def test_help_lists_the_keys_as_bound_and_the_legend(store_url: str) -> None:
    async with console(store_url, keymap=parse_keymap("run_now=R")) as (app, pilot, clock, notes):
        await pilot.press("question_mark")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, HelpScreen)
        keys = {description.split(":")[0].split(" (")[0]: key for key, description in screen.keys}
        assert keys["Run now"] == "R" and keys["backfill a past range of the selected schedule"] == "b"
        assert keys["refresh now"] == "^r" and keys["Timeline"] == "2" and keys["Jobs"] == "3"
        text = screen.text
        for word in ("succeeded", "failed", "skipped", "missed", "running", "single", "wonLock", "external", "manual"):
            assert word in text
        await pilot.press("escape")
        await settle(pilot)
        await select(pilot, "heartbeat")
        await pilot.press("R")  # the remapped key acts
        await settle(pilot)
        assert len(notes.titled("Run now: fired")) == 1


async def test_the_command_palette_offers_the_actions_by_name(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        provider = ConsoleCommands(app.screen)
        hits = [hit async for hit in provider.search("run now")]
        assert hits and str(hits[0].text) == "Run now: heartbeat"
        await hits[0].command()
        await settle(pilot)
        assert len(notes.titled("Run now: fired")) == 1
        goto = [hit async for hit in provider.search("go to stuck")]
        assert goto and str(goto[0].text) == "Go to schedule stuck-import"
        await goto[0].command()
        await settle(pilot)
        assert app.selected_name == "stuck-import"
        titles = [str(hit.text) async for hit in provider.discover()]
        for title in ("Enable/disable: stuck-import", "Backfill: stuck-import", "Pause or resume auto-refresh",
                      "Refresh now", "Run details"):
            assert title in titles


async def test_usable_at_80x24(store_url: str) -> None:
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        assert app.query_one(RunsTable).size.height >= 4
        assert schedules(app).size.height >= 8
        await pilot.press("b")
        await settle(pilot)
        assert isinstance(app.screen, BackfillScreen)
        assert app.screen.query_one("#start").region.bottom <= 24


def test_short_where_and_keymap() -> None:
    from backend.client.interface import ConnectionInfo

    here = Path.cwd() / ".schedtui" / "state.db"
    assert short_where(ConnectionInfo("embedded", str(here), "single", "i", False)) == ".schedtui/state.db"
    assert short_where(ConnectionInfo("remote", "http://h:1", "single", "i", False)) == "http://h:1"
    assert parse_keymap("run_now=R, backfill=B;") == {"run_now": "R", "backfill": "B"}
    # Views share keys between them, and two keys of one view may trade theirs.
    assert parse_keymap("run_now=R,retry_job=r") == {"run_now": "R", "retry_job": "r"}
    assert parse_keymap("run_now=e,toggle_enabled=r") == {"run_now": "e", "toggle_enabled": "r"}


def test_the_header_names_the_store_without_a_home_or_a_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's arbitrary user id, with no entry in /etc/passwd and no $HOME, has no
    home (``Path.home()`` raises), and a working folder deleted under the console has no
    path: the header's short name of the store raised, and the console did not start."""
    import pwd

    from backend.client.interface import ConnectionInfo

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    store = tmp_path / "elsewhere" / "state.db"
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(RuntimeError):
        Path.home()
    with pytest.raises(FileNotFoundError):
        Path.cwd()
    assert short_where(ConnectionInfo("embedded", str(store), "single", "i", False)) == str(store)


@pytest.mark.parametrize(
    ("keymap", "said"),
    [
        ("run_now=q", "'q' is the key of quit; give run_now another"),  # q fired the schedule, without a word
        ("quit=1", "'1' is the key of view_schedules; give quit another"),
        ("run_now=R,backfill=R", "'R' is the key of run_now; give backfill another"),
        ("bogus=x", "no key has the id 'bogus'"),
        ("run_now=", "'run_now=' is not ID=KEY"),
        ("run_now=R;bad", "'bad' is not ID=KEY"),
        # A key of the same view: e fired the schedule, and the disable had no key left.
        ("run_now=e", "'e' is the key of toggle_enabled on the Schedules view; give run_now another"),
        ("delete_job=R", "'R' is the key of retry_job on the Jobs view; give delete_job another"),
        ("toggle_zone=x", "'x' is the key of delete_job on the Jobs view; give toggle_zone another"),
        ("run_now=j", "'j' is the Schedules view's key: move in the table; give run_now another"),
    ],
)
def test_a_keymap_that_would_take_a_key_or_name_nothing_is_refused(keymap: str, said: str) -> None:
    with pytest.raises(BadInput, match=re.escape(said)):
        parse_keymap(keymap)


# ----------------------------------------------------------------------------------------
# a handler burning CPU runs on the engine's own thread, never on the UI's loop
# ----------------------------------------------------------------------------------------
async def test_embedded_handlers_run_off_the_ui_thread(tmp_path: Path) -> None:
    ran_on: list[int] = []
    done = threading.Event()

    async def burn(ctx: Any) -> None:
        ran_on.append(threading.get_ident())
        total = 0
        for n in range(200_000):  # CPU, no await: would freeze a UI sharing this loop
            total += n
        done.set()

    hog = define_schedule(name="cpu-hog", cron="0 0 1 1 *", timezone="UTC", handler=burn)
    engine = Engine([hog], f"sqlite:///{tmp_path / 'state.db'}", instance="console")
    backend = EmbeddedBackend(engine, arm=True, own_thread=True)
    app = SchedtuiApp(backend, where=WHERE)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("r")
            await settle(pilot)
            assert done.is_set()
            assert ran_on and ran_on[0] != threading.get_ident()
            assert app.query_one(RunsTable).runs[0].status == "succeeded"
    finally:
        await backend.close()
