"""The console as an operator on call uses it (issue 24, items 9, 10, 11 and 14).

* the footer: ``? Help`` and ``q Quit`` whole at 80 and 120 columns in every view, read-only
  too, and no key the view does not handle or would refuse;
* k9s and htop habits: ``j``/``k``/``g``/``G`` in every table, the ``:`` command line (typed
  at once, as a terminal delivers it), ``ctrl+c``; ``e`` says which note it clears;
* a cancelled durable execution's step is shown cancelled, not waiting;
* the smaller ones: the failing count in the title, the locks' off-screen hint, the timeline's
  labels beside "now", the audit entry's details, the header's instance at 120 columns, and
  the signal prompt's JSON error wrapped.

On the scenes' ledger at the frozen instant (every view has data).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from backend import ManualClock
from backend.model import BackfillProgress, parse_iso
from console import format as fmt
from console.app import SchedtuiApp
from console.screens import AuditDetails, HelpScreen, QuitPrompt
from console.screens.durable import SignalPrompt, StepsScreen
from console.timeline import ticks
from console.views import VIEWS, View
from console.views.audit import AuditView, detail_text
from console.views.durable import DurableView
from console.views.health import HealthRows
from console.widgets import ConsoleHeader, TimelineGrid
from console.widgets.command_line import CommandLine, commands_of, resolve
from console.widgets.line import Line
from tests.console_fixtures import FROZEN, WHERE, FlakyBackend, console_backend
from tests.console_scenes import OPERATOR_ZONE, make_ledger, settle
from tests.test_console import Notes
from tests.test_console_snapshots import screen_text

WRITTEN = [spec for spec in VIEWS if spec.make is not None]
SIZES = {"80x24": (80, 24), "120x32": (120, 32)}


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("habits-ledger"))


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    for file in ledger.glob("state.db*"):
        shutil.copy(file, tmp_path / file.name)
    return f"sqlite:///{tmp_path / 'state.db'}"


@asynccontextmanager
async def console(
    url: str, *, size: tuple[int, int] = (120, 32), read_only: bool = False, where: str = WHERE
) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], Notes]]:
    clock = ManualClock(FROZEN)
    backend = console_backend(url, clock, read_only=read_only)
    app = SchedtuiApp(backend, clock, where=where, read_only=read_only, operator_zone=OPERATOR_ZONE)
    notes = Notes(app)
    try:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            yield app, pilot, notes
    finally:
        await backend.close()


async def show(pilot: Pilot[Any], app: SchedtuiApp, view_id: str) -> View:
    app.action_show_view(view_id)
    await settle(pilot)
    return app.active_view


def rows(app: SchedtuiApp) -> list[str]:
    """The screen as text, row by row (as the terminal shows it)."""
    return screen_text(app.export_screenshot())


async def type_at_once(pilot: Pilot[Any], *keys: str) -> None:
    """Keys as a terminal delivers a burst (tmux send-keys, a paste, a fast typist): all in
    the app's queue before it handles the first, then the app settles."""
    app = pilot.app
    for key in keys:
        char = key if len(key) == 1 else {"enter": "\r", "colon": ":", "escape": "\x1b"}.get(key)
        app.post_message(events.Key(key, char))
    await settle(pilot)


# ----------------------------------------------------------------------------------------
# item 9: the footer
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("read_only", [False, True], ids=["operate", "read-only"])
@pytest.mark.parametrize("size", list(SIZES))
async def test_the_footer_always_shows_help_and_quit_and_only_what_the_view_handles(
    store_url: str, size: str, read_only: bool
) -> None:
    async with console(store_url, size=SIZES[size], read_only=read_only) as (app, pilot, notes):
        for spec in WRITTEN:
            view = await show(pilot, app, spec.id)
            footer = " " + rows(app)[-1].strip() + " "  # (the picture's text loses edge spaces)
            assert footer.endswith(" ? Help q Quit "), (spec.id, footer)
            assert footer.startswith(" READ-ONLY ") is read_only, (spec.id, footer)
            own = {app.key_display(key, alone=True) + " " + key.label for key in (*view.KEYS, *app.KEYS) if key.show}
            for other in WRITTEN:
                assert other.make is not None
                for key in other.make.KEYS:
                    item = f"{app.key_display(key, alone=True)} {key.label}"
                    if key.show and item not in own:
                        assert f" {item} " not in footer, f"{spec.id}'s footer offers {other.id}'s {item}"
                    if key.show and read_only and key.operates:
                        assert f" {item} " not in footer, f"{spec.id}'s footer offers {item}, refused while read-only"
            if read_only:  # nor do the views' own hints and titles offer a key refused now
                screen = "\n".join(rows(app)[:-1])
                for key in view.KEYS:
                    shown_key = app.key_display(key, alone=True)
                    assert not key.operates or f"{shown_key} {key.label.lower()}" not in screen, (spec.id, key.what)
                assert "releases the selected lock" not in screen
            shown = [key for key in view.KEYS if key.show and not (read_only and key.operates)]
            if shown:  # the view's own keys come first: its first one is always there
                assert f" {app.key_display(shown[0], alone=True)} {shown[0].label} " in footer, (spec.id, footer)


# ----------------------------------------------------------------------------------------
# item 10: k9s and htop habits
# ----------------------------------------------------------------------------------------
async def test_j_k_g_and_shift_g_move_in_every_views_table(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        for spec in WRITTEN:
            await show(pilot, app, spec.id)
            main = app.focused
            if isinstance(main, HealthRows):  # rows to read, not to pick: the keys scroll them
                size = app.size
                await pilot.resize_terminal(80, 14)  # fewer lines than rows, so that there is something to scroll
                await settle(pilot)
                assert main.max_scroll_y >= 2, spec.id
                for key, at in (("G", main.max_scroll_y), ("g", 0), ("j", 1), ("j", 2), ("k", 1), ("g", 0)):
                    await pilot.press(key)
                    await pilot.pause()
                    assert main.scroll_y == at, (spec.id, key)
                await pilot.resize_terminal(size.width, size.height)
                continue
            assert isinstance(main, (TimelineGrid, DataTable)), spec.id
            count = len(main.rows) if isinstance(main, TimelineGrid) else main.row_count
            assert count >= 3, spec.id
            for key, row in (("g", 0), ("j", 1), ("j", 2), ("k", 1), ("G", count - 1), ("k", count - 2), ("g", 0)):
                await pilot.press(key)
                await pilot.pause()
                assert main.cursor_row == row, (spec.id, key)


async def test_moving_in_an_empty_table_does_nothing(store_url: str) -> None:
    # (up, k and G on a table that a filter emptied: the highlight of no row crashed the console)
    async with console(store_url) as (app, pilot, notes):
        await type_at_once(pilot, "slash", *"no such schedule", "enter")
        table = app.query_one("SchedulesTable", DataTable)
        assert table.row_count == 0 and app.focused is table
        for key in ("up", "k", "G", "down", "j", "g", "end", "home"):
            await pilot.press(key)
            await settle(pilot)
        assert app.is_running and app.selected_name is None and notes.seen == []


async def test_the_command_line_switches_views_by_name_even_typed_at_once(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        await type_at_once(pilot, "colon", *"locks", "enter")
        assert app.active_view_id == "locks"
        line = app.query_one(CommandLine)
        assert not line.display and app.focused is not line  # closed, the focus back on a view
        for typed, view in (("jobs", "jobs"), ("au", "audit"), ("4", "durable"), ("TIMELINE", "timeline"), ("1", "schedules")):
            await type_at_once(pilot, "colon", *typed, "enter")
            assert app.active_view_id == view, typed
        assert not notes.titled("Command")
        await type_at_once(pilot, "colon", *"nope", "enter")
        views = ":schedules, :timeline, :jobs, :durable, :locks, :audit, :health"
        assert notes.titled("Command") == [f"no command “:nope”; try {views}, :help or :q"]
        await type_at_once(pilot, "colon", *"help", "enter")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("colon")  # a dialog's keys are its own
        assert not line.display
        await pilot.press("escape")
        await settle(pilot)
        # esc closes the line, and nothing runs
        await type_at_once(pilot, "colon", *"jobs", "escape")
        assert app.active_view_id == "schedules" and not line.display
        # in the filter, ":" is a character
        await pilot.press("slash", "colon", "x")
        assert app.query_one("#filter", Input).value == ":x" and not line.display


def test_commands_resolve_names_prefixes_and_numbers() -> None:
    commands = commands_of((spec.id, spec.key) for spec in WRITTEN)
    assert resolve(":locks", commands) == ("show_view('locks')", "")
    assert resolve("  Lo ", commands) == ("show_view('locks')", "")
    assert resolve("5", commands) == ("show_view('locks')", "")
    assert resolve("q", commands) == ("quit", "")
    assert resolve("qu", commands) == ("quit", "")
    assert resolve("", commands) == (None, "")
    action, why = resolve("t", {**commands, "tail": "tail"})
    assert action is None and why == "“:t” could be :tail or :timeline"
    # what names nothing is echoed as it was typed, not as it was matched
    assert resolve(":Nope", commands)[1].startswith("no command “:Nope”; try :schedules")
    assert resolve("T", {**commands, "tail": "tail"})[1] == "“:T” could be :tail or :timeline"


async def test_a_long_unknown_command_is_named_cut_short(store_url: str) -> None:
    """The notification names what was typed up to fmt.ECHO_CHARS, then an ellipsis (it
    repeated all 200 characters, over a dozen lines at 80 columns)."""
    async with console(store_url, size=(80, 24)) as (app, pilot, notes):
        typed = "abcdefghij" * 20
        await type_at_once(pilot, "colon", *typed, "enter")
        [said] = notes.titled("Command")
        assert said.startswith(f"no command “:{typed[: fmt.ECHO_CHARS - 1]}…”; try :schedules,"), said
        assert typed not in said


async def test_q_command_and_ctrl_c_quit_and_ask_only_while_a_backfill_started_here_runs(store_url: str) -> None:
    now = parse_iso(FROZEN)
    for keys in (("colon", "q", "enter"), ("ctrl+c",)):
        async with console(store_url) as (app, pilot, notes):
            exits: list[bool] = []

            def exit(*_: object, exits: list[bool] = exits, **__: object) -> None:
                exits.append(True)

            app.exit = exit  # type: ignore[method-assign]  # records the exit instead
            await type_at_once(pilot, *keys)
            assert exits == [True], keys
            exits.clear()
            app.backfills["b1"] = BackfillProgress("b1", "flaky-export", now - timedelta(hours=1), now, 6, 1, 0,
                                                   "running", "console", now)  # fmt: skip
            await type_at_once(pilot, *keys)
            assert isinstance(app.screen, QuitPrompt) and exits == [], keys


async def test_ctrl_c_quits_from_every_pop_up_too(store_url: str) -> None:
    """On a pop-up (help, a run's details, a prompt) ctrl+c did nothing: the screen's copy
    key took it before the app's quit."""
    for opening in (("question_mark",), ("enter",), ("e",)):  # help; the run's details; the disable's note
        async with console(store_url) as (app, pilot, notes):
            exits: list[bool] = []

            def exit(*_: object, exits: list[bool] = exits, **__: object) -> None:
                exits.append(True)

            app.exit = exit  # type: ignore[method-assign]  # records the exit instead
            app.action_select("heartbeat")
            await settle(pilot)
            await type_at_once(pilot, *opening)
            assert len(app.screen_stack) == 2, opening
            await type_at_once(pilot, "ctrl+c")
            assert exits == [True], opening


async def test_e_reenabling_names_the_note_it_clears(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        app.action_select("legacy-cleanup")
        await settle(pilot)
        view = app.view_of("legacy-cleanup")
        assert view is not None and not view.enabled and view.state_note is not None
        await pilot.press("e")
        await settle(pilot)
        (said,) = notes.titled("Enabled")
        assert said.startswith("legacy-cleanup enabled; note cleared: “paused during the session-store migration” (ops, ")
        # disabling without a note, then enabling: nothing to name
        await pilot.press("e")
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        assert "note cleared" not in notes.titled("Enabled")[-1]


# ----------------------------------------------------------------------------------------
# item 11: a cancelled execution's step
# ----------------------------------------------------------------------------------------
async def test_a_cancelled_executions_waiting_step_is_shown_cancelled(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        view = await show(pilot, app, "durable")
        assert isinstance(view, DurableView)
        row = next(i for i, e in enumerate(view.table.executions) if e.status == "cancelled")
        execution = await app.backend.get_execution(view.table.executions[row].id)
        assert execution.steps is not None
        waited = next(s for s in execution.steps if s.name == "approval")  # the signal it waited for
        assert (waited.status, waited.wake_at, waited.finished_at) == ("cancelled", None, execution.finished_at)
        assert {s.status for s in execution.steps if s is not waited} == {"succeeded"}  # the others as they were
        view.table.move_cursor(row=row)
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, StepsScreen)
        table = app.screen.query_one(DataTable)
        cells = [str(cell) for r in range(table.row_count) for cell in table.get_row_at(r)]
        assert "⊘ cancelled" in cells
        assert not any("waiting" in cell or "until" in cell for cell in cells), cells


# ----------------------------------------------------------------------------------------
# item 14: the smaller ones
# ----------------------------------------------------------------------------------------
async def test_the_schedules_title_counts_the_failing_ones(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        failing = [v.name for v in app.views if (v.last_run and v.last_run.status == "failed")
                   or (v.latest_manual and v.latest_manual.status == "failed")]  # fmt: skip
        assert len(failing) >= 2
        title = app.query_one("#schedules-title", Line).content.plain
        assert title.startswith(f"SCHEDULES {len(app.views)} · ✗ {len(failing)} failing"), title
        await pilot.press("slash", *"failed", "enter")
        await settle(pilot)
        title = app.query_one("#schedules-title", Line).content.plain
        assert title.startswith(f"SCHEDULES {len(failing)} of {len(app.views)}") and f"✗ {len(failing)} failing" in title


@pytest.mark.parametrize("size", list(SIZES))
async def test_the_locks_title_names_the_columns_off_screen(store_url: str, size: str) -> None:
    async with console(store_url, size=SIZES[size]) as (app, pilot, notes):
        await show(pilot, app, "locks")
        title = app.query_one("#locks-title", Line).content.plain
        if size == "80x24":
            assert title.endswith(" · → expires, last renewal off-screen (wider terminal, or ← →)"), title
        else:
            assert "off-screen" not in title, title


@pytest.mark.parametrize("size", list(SIZES))
async def test_the_timeline_axis_keeps_every_label_beside_now(store_url: str, size: str) -> None:
    async with console(store_url, size=SIZES[size]) as (app, pilot, notes):
        await show(pilot, app, "timeline")
        grid = app.query_one(TimelineGrid)
        for zoom in ("plus", "plus", "minus", "minus", "minus", "minus"):
            await pilot.press(zoom)
            await settle(pilot)
            assert grid.window is not None and grid.now is not None
            axis = grid.render_line(0).text[grid.name_width :]
            now = grid.window.index(grid.now)
            labels = [(i, text) for i, text in ticks(grid.window, grid.zone) if i + len(text) <= grid.window.cells]
            for i, text in labels:
                assert axis[i : i + len(text)] == text, (zoom, text, axis)
            if not any(i <= now < i + len(text) for i, text in labels):
                assert axis[now] == "▼", axis
            for i, text in ticks(grid.window, grid.zone):
                if i + len(text) > grid.window.cells:  # never a label cut at the edge
                    assert axis[i:].strip() == "", axis


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
@pytest.mark.parametrize("view_id", ["audit", "durable"])
async def test_the_audit_and_durable_titles_name_the_columns_off_screen(
    store_url: str, view_id: str, size: tuple[int, int]
) -> None:
    """As the Jobs title does: at 80 columns DETAIL (audit) and ERROR (durable) were pushed
    off with nothing saying so. Said before the durable title's keys, so that it is in sight."""
    async with console(store_url, size=size) as (app, pilot, notes):
        view = await show(pilot, app, view_id)
        assert isinstance(view, (AuditView, DurableView))
        hidden = view.table.hidden_columns()
        title = view.query_one(f"#{view_id}-title", Line).render().plain
        said = f" · → {', '.join(hidden)} off-screen (wider terminal, or ← →)"
        assert (said in title and title.index(said) < size[0] - 20) if hidden else "off-screen" not in title, title
        if size == (80, 24):
            assert hidden and hidden[-1] == ("detail" if view_id == "audit" else "error")


async def test_enter_on_an_audit_entry_opens_it_whole_until_esc(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        view = await show(pilot, app, "audit")
        assert isinstance(view, AuditView)
        entry = next(e for e in view.table.entries if e.detail and len(detail_text(e)) > 40)
        view.table.move_cursor(row=view.table.entries.index(entry))
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, AuditDetails) and app.screen.entry == entry
        body = str(app.screen.query_one("#audit-body").render())
        assert entry.detail is not None
        values = [v if isinstance(v, str) else json.dumps(v) for v in entry.detail.values() if v is not None]
        for part in (entry.actor, entry.action, entry.target, *entry.detail, *values):
            assert part in body, part
        await pilot.press("down", "j")  # it stays: keys scroll it
        assert isinstance(app.screen, AuditDetails)
        assert not [title for title, _ in notes.seen if title.startswith("Audit entry")]  # no passing toast
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, AuditDetails) and app.active_view_id == "audit"


@pytest.mark.parametrize("read_only", [False, True], ids=["operate", "read-only"])
@pytest.mark.parametrize("where", [WHERE, "/var/lib/schedtui/production/eu-west-1/replicas/primary/state.db"])
async def test_the_header_keeps_the_instance_at_120_columns(store_url: str, where: str, read_only: bool) -> None:
    async with console(store_url, where=where, read_only=read_only) as (app, pilot, notes):
        assert app.info is not None
        header = rows(app)[0]
        assert header.rstrip().endswith(f" {app.info.instance}"), header
        assert ("READ-ONLY" in header) is read_only and "timers off" in header and app.info.coordination in header
        assert header.count("state.db") == 1, header  # the path may give way: its end is kept
        assert ("…" in header) is (where != WHERE), header


@pytest.mark.parametrize("read_only", [False, True], ids=["operate", "read-only"])
@pytest.mark.parametrize("where", [WHERE, "/var/lib/schedtui/production/eu-west-1/replicas/primary/state.db"])
async def test_the_header_keeps_the_instance_at_80_columns(store_url: str, where: str, read_only: bool) -> None:
    """At 80 columns the instance was never in sight (the header was cut after the
    coordination): the store's kind, the coordination, the feed's word and, read-only, the
    badge the footer shows too give way first. What is true now stays."""
    async with console(store_url, size=(80, 24), where=where, read_only=read_only) as (app, pilot, notes):
        assert app.info is not None
        header = app.query_one(ConsoleHeader)
        text = header.render().plain
        assert len(text) <= 80 and text.endswith(f" {app.info.instance}"), text
        assert text.startswith("schedtui │ ● live │ ") and "⚑ 2" in text and "▲ 1 firing" in text, text
        assert "timers off" in text, text
        assert text.count("state.db") == 1, text
        assert app.query_one("#mode").display is read_only  # READ-ONLY is said in the footer


@pytest.mark.parametrize("size", list(SIZES))
async def test_a_lost_connection_keeps_the_instance_and_the_address_in_sight(store_url: str, size: str) -> None:
    """Lost at 80 columns, the header was "schedtui │ ✗ connection lost · stale, last good
    13s ago · retry in 4s │ ⚑ 1 │" and nothing more: with one console per server, the
    operator could not tell which one was down. The lost state says it in short words first."""
    clock = ManualClock(FROZEN)
    flaky: Any = FlakyBackend(console_backend(store_url, clock))
    app = SchedtuiApp(flaky, clock, where=FlakyBackend.URL, operator_zone=OPERATOR_ZONE)
    try:
        async with app.run_test(size=SIZES[size]) as pilot:
            await settle(pilot)
            header = app.query_one(ConsoleHeader)
            flaky.down = True
            await pilot.press("ctrl+r")
            await settle(pilot)
            for _ in range(4):  # the retries 1, 2, 5 and 5 s later fail too: 13 s stale
                assert header.state == "lost" and header.retry_at is not None
                clock.advance(header.retry_at - clock.now())
                app.tick()
                await settle(pilot)
            text = header.render().plain
            assert header.state == "lost" and len(text) <= SIZES[size][0], text
            assert text.endswith(" console") and "10.0.0.7:8080" in text and "⚑ 2" in text and "▲ 1 firing" in text, text
            # Its long words give way to short ones that say the same, its retry's countdown
            # last of all (it retries by itself).
            if size == "80x24":
                assert text.startswith("schedtui │ ✗ lost · stale 13s │ "), text
            else:
                assert text.startswith("schedtui │ ✗ connection lost · stale, last good 13s ago · retry in 5s │ "), text
    finally:
        await flaky.close()


async def test_the_signal_prompts_json_error_is_shown_whole(store_url: str) -> None:
    async with console(store_url, size=(80, 24)) as (app, pilot, notes):
        view = await show(pilot, app, "durable")
        assert isinstance(view, DurableView)
        row = next(i for i, e in enumerate(view.table.executions) if (e.waiting_for or "").startswith("signal:"))
        view.table.move_cursor(row=row)
        await pilot.press("a")
        await settle(pilot)
        assert isinstance(app.screen, SignalPrompt)
        await pilot.press(*"{'approved': true}", "enter")
        await settle(pilot)
        assert isinstance(app.screen, SignalPrompt)
        error = str(app.screen.query_one("#signal-error").render())
        assert error == "the payload is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
        screen = "".join(row.replace("│", "") for row in rows(app)).replace(" ", "")
        assert error.replace(" ", "") in screen
