"""Typing at full speed: every key of a form in one go, as a terminal delivers what it read
in one read (a fast typist, a loaded machine), with nothing waited for between the keys;
then what was stored. No key may be lost or land in another field or on the view under a
dialog (:mod:`console.keygate`).

``pilot.press`` waits for the app to go idle after every key, which hides the race: these
tests hand the app all the keys before it handles the first."""

from __future__ import annotations

import ast
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Button, Input

import console as console_package
from backend import ManualClock
from console.app import SchedtuiApp
from console.screens.backfill import BackfillScreen
from console.screens.confirm import Confirm
from console.screens.prompt import NotePrompt
from console.screens.schedule_form import ScheduleForm
from console.widgets.button import PressButton
from tests.console_fixtures import FROZEN, Held, console_backend, ledger_copy
from tests.console_scenes import make_ledger
from tests.test_console import console, select, settle
from tests.test_console_schedule_form import schedules_view, stored


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-typing")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


_CHARACTERS = {"tab": "\t", "enter": "\r", "escape": "\x1b", "backspace": "\x7f"}


def key_event(key: str) -> events.Key:
    """The event a terminal's key makes: a character, or a named key (``tab``, ``ctrl+s``)."""
    if len(key) == 1:
        name = key if key.isalnum() else unicodedata.name(key).lower().replace("-", "_").replace(" ", "_")
        return events.Key(name, key)
    return events.Key(key, _CHARACTERS.get(key))


def type_fast(app: App[Any], *keys: str) -> None:
    """Hand the app every key at once (it reads them all before it handles the first)."""
    for key in keys:
        event = key_event(key)
        event.set_sender(app)
        app.post_message(event)


async def typed(pilot: Pilot[Any]) -> None:
    """Until the app has read every key handed to it and done all each does, then settled."""
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    await pilot.pause()  # the app has read them all
    await app.key_gate.done()
    await settle(pilot)


def chars(text: str) -> list[str]:
    return list(text)


async def manual_runs(backend: Any, name: str) -> list[Any]:
    return [r for r in (await backend.list_runs(name, limit=100)).runs if r.trigger == "manual"]


async def test_the_create_form_typed_at_full_speed_stores_every_field(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        selected = app.selected_name
        assert selected is not None
        before = await manual_runs(backend, selected)
        type_fast(app, "n", *chars("reap-sessions"), "tab", *chars("*/15 * * * *"), "tab", *chars("Europe/Berlin"),
                  "tab", "tab", *chars("mailer"), "tab", *chars('{"older_than": "7d"}'), "tab",
                  *chars("Prunes sessions"), "ctrl+s")
        await typed(pilot)
        assert not isinstance(app.screen, ScheduleForm), notes.seen
        spec = {"name": "reap-sessions", "cron": "*/15 * * * *", "timezone": "Europe/Berlin", "queue": "mailer",
                "payload": {"older_than": "7d"}, "description": "Prunes sessions", "enabled": True}
        assert backend.calls == [("create", spec)]
        kept = {v.name: v for v in (await backend.list_schedules()).schedules}["reap-sessions"]
        assert (kept.cron, kept.timezone, kept.payload, kept.description, kept.enabled) == (
            "*/15 * * * *", "Europe/Berlin", {"older_than": "7d"}, "Prunes sessions", True)
        assert kept.target is not None and (kept.target.kind, kept.target.name) == ("queue", "mailer")
        # What was stored is said, field by field.
        assert notes.titled("Created") == [
            "reap-sessions → queue mailer; next fire in 14m 55s\n"
            "cron */15 * * * * in Europe/Berlin · enabled\n"
            'payload {"older_than": "7d"}\n'
            "description Prunes sessions"
        ]
        # The keys typed while the form opened went into it, not to the table under it
        # (where r is Run now and e disables).
        assert await manual_runs(backend, selected) == before
        selected_view = app.view_of(selected)
        assert selected_view is not None and selected_view.enabled


async def test_the_edit_form_typed_at_full_speed_saves_every_field(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await stored(app, pilot)  # reap-sessions: */15 * * * * UTC → queue mailer, "Prunes sessions"
        # E focuses the cron; tab selects each field's text, so typing replaces it.
        type_fast(app, "E", *chars("0 */2 * * *"), "tab", *chars("Europe/Berlin"), "tab", "tab", "tab",
                  *chars('{"older_than": "30d"}'), "tab", *chars("Prunes old sessions"), "ctrl+s")
        await typed(pilot)
        assert not isinstance(app.screen, ScheduleForm), notes.seen
        assert backend.calls == [("update", ("reap-sessions", {
            "cron": "0 */2 * * *", "timezone": "Europe/Berlin", "payload": {"older_than": "30d"},
            "description": "Prunes old sessions"}))]
        saved = notes.titled("Saved")
        assert len(saved) == 1 and 'payload {"older_than": "30d"}' in saved[0]
        assert "cron 0 */2 * * * in Europe/Berlin · enabled" in saved[0]


async def test_a_form_left_with_a_field_blank_says_payload_none(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        type_fast(app, "n", *chars("hourly"), "tab", *chars("0 * * * *"), "tab", "tab", "tab", *chars("mailer"),
                  "enter")
        await typed(pilot)
        assert notes.titled("Created") == [
            "hourly → queue mailer; next fire in 59m 55s\ncron 0 * * * * in UTC · enabled\npayload none\nno description"]


async def test_the_backfill_count_enter_and_y_at_full_speed_start_it(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        await pilot.press("b")  # which fields show depends on the plan the backend sends: read it
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BackfillScreen) and screen.state == "confirm"  # -1h: 360 slots
        before = len(await manual_runs(app.backend, "heartbeat"))
        # From cancel back to from (over the count and the skip box), the new start typed
        # over the old (focus selects it), at full speed.
        type_fast(app, "shift+tab", "shift+tab", "shift+tab", "shift+tab", *chars("-10m"))
        await typed(pilot)
        assert screen.query_one("#from", Input).value == "-10m"
        assert screen.state == "confirm" and screen.to_fire == 60
        type_fast(app, "tab", "tab", "tab", *chars("60"))  # to the count, and the count
        await typed(pilot)
        assert screen.query_one("#confirm", Input).value == "60"
        # Enter (Backfill asks) and y (yes) in one go: the y answers the question.
        type_fast(app, "enter", "y")
        await typed(pilot)
        assert not isinstance(app.screen, Confirm), notes.seen
        assert screen.query_one("#confirm", Input).value == "60"
        assert screen.state == "done"  # type: ignore[comparison-overlap]  # mypy keeps the earlier narrowing across the awaits
        assert screen.progress is not None and screen.progress.fired == 60
        assert len(await manual_runs(app.backend, "heartbeat")) == before + 60


async def test_enter_on_backfill_asks_again_however_soon_after_a_no(store_url: str) -> None:
    """Every enter on *Backfill* asks, every answer goes to the question it asked: typed in
    one go, three questions left (esc, n, enter) and the fourth answered y. Textual's button
    took no enter while its last press showed (0.2 s of wall clock): a burst inside that
    lost the question, its y went to the dialog under it and its esc closed that dialog."""
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        type_fast(app, "b")
        await typed(pilot)
        screen = app.screen
        assert isinstance(screen, BackfillScreen)
        screen.query_one("#from", Input).value = "-1m"
        await settle(pilot)
        assert screen.state == "ok"  # 6 slots: Backfill asks, with no count to type
        # However long a press shows, and however slow the machine: no key waits it out.
        start = screen.query_one("#start", Button)
        start.active_effect_duration = 3600
        asked: list[str | None] = []
        push_screen = app.push_screen

        def recording(dialog: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(dialog, Confirm):
                asked.append(dialog.action)
            return push_screen(dialog, *args, **kwargs)

        app.push_screen = recording  # type: ignore[method-assign,assignment]  # records the dialogs (push_screen is overloaded)
        type_fast(app, "tab", "enter", "escape", "enter", "n", "enter", "enter", "enter", "y")
        await typed(pilot)
        assert asked == ["start_backfill"] * 4
        assert screen.state in ("running", "done"), notes.seen
        assert app.screen is screen


def test_every_button_of_the_console_takes_every_enter() -> None:
    """The console makes its buttons as :class:`PressButton` (Textual's ``Button`` drops an
    enter that comes while the last press shows)."""
    root = Path(console_package.__file__).parent
    made: list[str] = []
    for file in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name.endswith("Button") and name != PressButton.__name__:
                    made.append(f"{file.relative_to(root)}:{node.lineno} {name}")
    assert made == []


async def test_the_disable_note_typed_at_full_speed_is_kept(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        type_fast(app, "e", *chars("vendor outage"), "enter")
        await typed(pilot)
        assert not isinstance(app.screen, NotePrompt)
        view = app.view_of("heartbeat")
        assert view is not None and not view.enabled
        assert view.state_note is not None and view.state_note.note == "vendor outage"


async def test_keys_typed_after_b_go_to_the_dialog_however_slow_the_server(store_url: str) -> None:
    """b asked the server whether a backfill of the schedule ran before opening its dialog:
    over a slow link the keys typed after it reached the view under it (esc, 3 for the
    jobs), and the dialog opened late over whatever was on screen then. It opens at once;
    the question is asked from within it."""
    backend = Held(console_backend(store_url, ManualClock(FROZEN)), "running_backfills")
    async with console(store_url, backend=backend) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        backend.go.clear()  # the server has not answered yet
        await pilot.press("b")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, BackfillScreen) and screen.plan is None  # nothing planned before it answers
        await pilot.press("escape", "3")  # the dialog closes; then the jobs view
        await pilot.pause()
        backend.go.set()
        await settle(pilot)
        assert len(app.screen_stack) == 1 and app.active_view_id == "jobs"
        await pilot.press("1")
        await settle(pilot)
        await pilot.press("b")  # answered at once: the plan as ever
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BackfillScreen) and screen.state == "confirm" and screen.plan is not None
