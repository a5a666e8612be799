"""A paste far past the payload limit into the schedule form (issue 24, item 12): as 300 KB
of separate keys (a terminal without bracketed paste) and as one paste. The field keeps at
most the limit, one notification names it, and the console goes on answering keys."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVarTuple

import pytest
from textual import events
from textual.app import App
from textual.driver import Driver
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input, TextArea

from backend.durable.model import Execution
from backend.durable.service import MAX_SIGNAL_BYTES
from backend.inputs import NOTE_MAX_CHARS
from backend.jobs.definition import MAX_KEY_BYTES
from backend.jobs.definition import MAX_PAYLOAD_BYTES as JOB_PAYLOAD_BYTES
from backend.scheduler.stored import MAX_DESCRIPTION, MAX_PAYLOAD_BYTES
from backend.schedules import MAX_NAME_CHARS
from console.app import SchedtuiApp
from console.driver import PasteAsText, batched
from console.screens.backfill import BackfillScreen
from console.screens.durable import SignalPrompt
from console.screens.jobs import SendJobScreen, TypedCount
from console.screens.prompt import NotePrompt
from console.screens.schedule_form import ScheduleForm
from console.widgets.bounded import LINE_CHARS, NUMBER_CHARS, BoundedInput, Unit, fit, said, size
from console.widgets.command_line import CommandLine
from tests.console_fixtures import FROZEN, ledger_copy
from tests.console_scenes import make_ledger
from tests.test_console import settle
from tests.test_console_schedule_form import schedules_view
from tests.test_console_typing import type_fast, typed

Ts = TypeVarTuple("Ts")  # a callback's arguments (the counted call_soon_threadsafe's)

SAID = (f"A schedule's payload holds at most {MAX_PAYLOAD_BYTES:,} bytes (64 KiB) of UTF-8; "
        "what was typed or pasted past that was not taken.")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-paste")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


def blob(size: int) -> str:
    """JSON text of ``size`` characters."""
    return '{"rows": "' + "x" * (size - 12) + '"}'


async def open_payload(app: SchedtuiApp, pilot: Any) -> BoundedInput:
    await pilot.press("n")
    await settle(pilot)
    field = app.screen.query_one("#payload", BoundedInput)
    field.focus()
    await settle(pilot)
    return field


async def test_300_kb_typed_as_keys_keeps_the_limit_and_the_console_answers(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await open_payload(app, pilot)
        text = blob(300_000)
        type_fast(app, *text)
        await typed(pilot)
        assert field.value == text[:MAX_PAYLOAD_BYTES]
        assert len(field.value.encode()) == MAX_PAYLOAD_BYTES
        assert field.refused == len(text) - MAX_PAYLOAD_BYTES
        assert notes.titled("Too long") == [SAID]  # said once, not once per key
        assert "is not JSON" in str(app.screen.query_one("#preview").render())
        # Still answering: tab moves on, and typing goes where it moved.
        type_fast(app, "tab", *"kept")
        await typed(pilot)
        description = app.screen.query_one("#description", Input)
        assert description.has_focus and description.value == "kept"
        type_fast(app, "escape")
        await typed(pilot)
        assert not isinstance(app.screen, ScheduleForm) and backend.calls == []


async def test_300_kb_pasted_at_once_keeps_the_limit(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await open_payload(app, pilot)
        text = blob(300_000)
        app.post_message(events.Paste(text))
        await typed(pilot)
        assert field.value == text[:MAX_PAYLOAD_BYTES]
        assert notes.titled("Too long") == [SAID]
        # Room made (a key that is not a character), then more past the limit: said again.
        type_fast(app, "backspace", "backspace", *"abc")
        await typed(pilot)
        assert field.value == text[: MAX_PAYLOAD_BYTES - 2] + "ab"
        assert notes.titled("Too long") == [SAID, SAID]


async def test_a_payload_that_fits_is_taken_whole_and_nothing_is_said(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await open_payload(app, pilot)
        text = blob(MAX_PAYLOAD_BYTES)
        type_fast(app, *text, "ctrl+s")
        await typed(pilot)
        assert field.value == text and notes.titled("Too long") == []


def test_the_limit_is_counted_in_bytes_and_never_cuts_a_character() -> None:
    assert fit("ééé", 5) == "éé"  # 2 bytes each: a third would need 6
    assert fit("ééé", 6) == "ééé"
    assert fit("a€b", 3) == "a"  # € is 3 bytes
    assert fit("abc", 0) == ""


async def test_the_driver_wakes_the_loop_once_per_batch_and_keeps_the_order() -> None:
    sent = [events.Key("x", "x") for _ in range(10_000)]
    posted: list[events.Key] = []
    wakes = 0

    class Recorder(Driver):  # what a driver must have; the batching is what is tested
        def write(self, data: str) -> None: ...
        def start_application_mode(self) -> None: ...
        def disable_input(self) -> None: ...
        def stop_application_mode(self) -> None: ...

    class FakeApp:
        def post_message(self, message: events.Key) -> bool:
            posted.append(message)
            return True

    driver = batched(Recorder)(FakeApp())  # type: ignore[arg-type]  # an app that only takes messages
    loop = asyncio.get_running_loop()
    original = loop.call_soon_threadsafe

    def counted(callback: Callable[[*Ts], object], *args: *Ts, context: contextvars.Context | None = None) -> asyncio.Handle:
        nonlocal wakes
        wakes += 1
        return original(callback, *args, context=context)

    def read() -> None:
        for key in sent:
            driver.send_message(key)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]  # counts the wake-ups
    try:
        thread = threading.Thread(target=read)  # the reading thread
        thread.start()
        while thread.is_alive() or len(posted) < len(sent):
            await asyncio.sleep(0)  # the loop, taking each batch when woken
        thread.join()
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]  # the loop's own again
    assert all(a is b for a, b in zip(posted, sent, strict=True))
    assert wakes < len(sent)


def test_the_app_reads_the_terminal_through_the_batching_driver() -> None:
    app = SchedtuiApp(object())  # type: ignore[arg-type]  # no backend: only its driver class is read
    assert issubclass(app.driver_class, App().driver_class) and app.driver_class.__name__.startswith("Batched")


# -- every other text field of the console -------------------------------------------------

EDITS_AT_MOST = 50
"""Edits a burst of keys far past a field's bound may make of it (it takes a burst in one: a
few, where a field that took each key alone made one per character)."""

BURST = 30_000
"""Keys typed at once into each bounded field: 30 times the largest bound (1,000). The
300 KB bursts above cover the size itself, once per kind of field that takes a payload."""


class Edits:
    """Counts the edits of a field (each posts ``Changed``); past :data:`EDITS_AT_MOST` it
    stops the field's work (a text area turns read-only, a line fails at once), so a field
    that takes every key alone fails the test rather than hangs it."""

    def __init__(self, field: Any) -> None:
        self.count = 0
        original = field.post_message

        def post_message(message: Any) -> bool:
            if isinstance(message, (Input.Changed, TextArea.Changed)):
                self.count += 1
                if self.count > EDITS_AT_MOST and isinstance(field, TextArea):
                    field.read_only = True  # what is left of the keys costs nothing; the test fails on what it took
                else:
                    assert self.count <= EDITS_AT_MOST, f"{self.count} edits of {field!r}: one per key"
            return bool(original(message))

        field.post_message = post_message


async def opened(app: SchedtuiApp, pilot: Any, screen: Screen[Any], selector: str) -> Widget:
    app.push_screen(screen)
    await settle(pilot)
    field = app.screen.query_one(selector)
    field.focus()
    await settle(pilot)
    return field


def execution() -> Execution:
    return Execution(id="01J0000000000000000000000X", function="release", status="waiting", input=None, output=None,
                     error_tag=None, error_message=None, schedule=None, scheduled_at=None, created_at=datetime.fromisoformat(FROZEN),
                     finished_at=None, waiting_for="signal:approve", wake_at=None, instance=None)


async def test_a_jobs_300_kb_payload_typed_as_lines_of_keys_keeps_the_jobs_limit(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await opened(app, pilot, SendJobScreen(app.backend, "mailer"), "#payload")
        assert isinstance(field, TextArea) and field.text == "{}"
        edits = Edits(field)
        field.move_cursor((0, 1))
        lines = ['  "row": "' + "y" * 990 + '",'] * 300  # a pretty-printed payload, ~300 KB, enter between lines
        keys = [key for line in lines for key in [*line, "enter"]]
        type_fast(app, *keys)
        await typed(pilot)
        text = "{" + "\n".join(lines) + "\n"
        assert field.text == "{" + text[1 : JOB_PAYLOAD_BYTES - 1] + "}"
        assert len(field.text.encode()) == JOB_PAYLOAD_BYTES
        assert notes.titled("Too long") == [said("A job's payload", JOB_PAYLOAD_BYTES)]
        assert "262,144 bytes (256 KiB)" in notes.titled("Too long")[0]
        assert edits.count <= EDITS_AT_MOST
        type_fast(app, "tab", *"12")  # still answering: tab moves on, and typing goes where it moved
        await typed(pilot)
        assert app.screen.query_one("#delay", Input).value == "12"
        type_fast(app, "escape")
        await typed(pilot)
        assert not isinstance(app.screen, SendJobScreen)


async def test_a_jobs_300_kb_payload_pasted_at_once_keeps_what_was_typed_before(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await opened(app, pilot, SendJobScreen(app.backend, "mailer"), "#payload")
        assert isinstance(field, TextArea)
        field.text = ""
        type_fast(app, *'{"a": 1, "b": "')
        await typed(pilot)
        app.post_message(events.Paste("z" * 300_000))
        await typed(pilot)
        assert field.text == '{"a": 1, "b": "' + "z" * (JOB_PAYLOAD_BYTES - 15)
        assert notes.titled("Too long") == [said("A job's payload", JOB_PAYLOAD_BYTES)]


async def test_a_signals_300_kb_payload_keeps_the_signal_limit(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await opened(app, pilot, SignalPrompt(execution(), "approve"), "#payload")
        assert isinstance(field, Input)
        edits = Edits(field)
        text = blob(300_000)
        type_fast(app, *text)
        await typed(pilot)
        assert field.value == text[:MAX_SIGNAL_BYTES] and edits.count <= EDITS_AT_MOST
        assert notes.titled("Too long") == [said("A signal's payload", MAX_SIGNAL_BYTES)]
        type_fast(app, "escape")
        await typed(pilot)
        assert not isinstance(app.screen, SignalPrompt)


Opener = Callable[[SchedtuiApp, Any], Awaitable[Widget]]


async def note(app: SchedtuiApp, pilot: Any) -> Widget:
    return await opened(app, pilot, NotePrompt("heartbeat"), "#note")


async def backfill_from(app: SchedtuiApp, pilot: Any) -> Widget:
    view = app.view_of("heartbeat")
    assert view is not None
    return await opened(app, pilot, BackfillScreen(app.backend, view, app.clock.now), "#from")


async def job_key(app: SchedtuiApp, pilot: Any) -> Widget:
    return await opened(app, pilot, SendJobScreen(app.backend, "mailer"), "#key")


async def job_delay(app: SchedtuiApp, pilot: Any) -> Widget:
    return await opened(app, pilot, SendJobScreen(app.backend, "mailer"), "#delay")


async def typed_count(app: SchedtuiApp, pilot: Any) -> Widget:
    return await opened(app, pilot, TypedCount("Retry 40 jobs?", "", 40), "#typed")


def form_field(selector: str) -> Opener:
    async def open_field(app: SchedtuiApp, pilot: Any) -> Widget:
        await pilot.press("n")
        await settle(pilot)
        field = app.screen.query_one(selector)
        field.focus()
        await settle(pilot)
        return field

    return open_field


async def filter_line(app: SchedtuiApp, pilot: Any) -> Widget:
    await pilot.press("slash")
    await settle(pilot)
    assert app.focused is not None and app.focused.id == "filter"
    return app.focused


async def command_line(app: SchedtuiApp, pilot: Any) -> Widget:
    await pilot.press("colon")
    await settle(pilot)
    assert isinstance(app.focused, CommandLine)
    return app.focused


FIELDS: list[tuple[str, Opener, str, int, str]] = [
    ("note", note, "A note", NOTE_MAX_CHARS, "characters"),
    ("backfill from", backfill_from, "From", LINE_CHARS, "characters"),
    ("job key", job_key, "A job's key", MAX_KEY_BYTES, "bytes"),
    ("job delay", job_delay, "The delay", NUMBER_CHARS, "characters"),
    ("typed count", typed_count, "The count", NUMBER_CHARS, "characters"),
    ("form name", form_field("#name"), "A name", MAX_NAME_CHARS, "characters"),
    ("form cron", form_field("#cron"), "A cron expression", LINE_CHARS, "characters"),
    ("form description", form_field("#description"), "A description", MAX_DESCRIPTION, "characters"),
    ("filter", filter_line, "The filter", LINE_CHARS, "characters"),
    ("command line", command_line, "A command", LINE_CHARS, "characters"),
]


@pytest.mark.parametrize(("opener", "what", "limit", "unit"), [case[1:] for case in FIELDS], ids=[c[0] for c in FIELDS])
async def test_every_text_field_refuses_a_burst_of_keys_past_its_bound(
    store_url: str, opener: Opener, what: str, limit: int, unit: Unit
) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await opener(app, pilot)
        assert isinstance(field, Input)
        field.value = ""
        edits = Edits(field)
        start = "12" if field.restrict else "é1"  # kept: what was typed before the paste
        type_fast(app, *start)
        await typed(pilot)
        assert limit * 30 <= BURST
        type_fast(app, *("9" * BURST))
        await typed(pilot)
        assert field.value.startswith(start) and size(field.value, unit) == limit
        assert notes.titled("Too long") == [said(what, limit, unit)] and edits.count <= EDITS_AT_MOST
        assert isinstance(field, BoundedInput) and (field.limit, field.what, field.unit) == (limit, what, unit)
        type_fast(app, "escape")  # still answering: esc closes what the field is in
        await typed(pilot)
        assert app.focused is not field


def test_what_the_notification_says() -> None:
    assert said("A job's key", 256) == "A job's key holds at most 256 bytes of UTF-8; what was typed or pasted past that was not taken."
    assert said("A note", 1000, "characters") == "A note holds at most 1,000 characters; what was typed or pasted past that was not taken."
    assert fit("ééé", 2, "characters") == "éé"


async def test_a_restricted_field_leaves_out_what_it_does_not_allow_from_a_burst(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        field = await job_delay(app, pilot)
        assert isinstance(field, BoundedInput)
        type_fast(app, *"1x2.5s")
        await typed(pilot)
        assert field.value == "12.5" and notes.titled("Too long") == []


def parsed(*reads: str) -> list[tuple[str, str | None]]:
    """What the terminal driver's parser makes of ``reads``: each event's kind and text."""
    parser = PasteAsText()
    made = [event for data in (*reads, "z") for event in parser.feed(data)]  # (a key after: the paste is flushed)
    return [(type(e).__name__, getattr(e, "text", None) or getattr(e, "key", None)) for e in made]


@pytest.mark.parametrize(
    ("reads", "pasted"),
    [
        # Text copied from a terminal with its colours, and with an ESC of its own: the ESC
        # began an escape sequence in Textual's parser, sent on as keys ahead of the paste
        # (a return in it submitted the form unasked; the text came out reordered).
        (["\x1b[200~first part\x1b-second\rtail\x1b[201~"], "first part-second\rtail"),
        (["\x1b[200~my\x1b[31mname\x1b[0m\x1b[201~"], "my[31mname[0m"),
        # The markers split over reads, as 4 KB reads of a long paste split them.
        (["\x1b[20", "0~abc\x1bdef\x1b[2", "01~"], "abcdef"),
        (["\x1b[200~x\x1b", "[201~"], "x"),
        (["\x1b[200~x\x1b[20", "1", "~"], "x"),
    ],
)
def test_an_escape_inside_a_paste_is_text_never_keys(reads: list[str], pasted: str) -> None:
    assert parsed(*reads) == [("Paste", pasted), ("Key", "z")]


def test_keys_outside_a_paste_are_keys_as_before() -> None:
    assert parsed("ab\t") == [("Key", "a"), ("Key", "b"), ("Key", "tab"), ("Key", "z")]
    assert parsed("a", "\x1b[200~p\x1b[201~", "b") == [("Key", "a"), ("Paste", "p"), ("Key", "b"), ("Key", "z")]


def test_the_terminal_driver_reads_with_that_parser() -> None:
    """The driver's input thread makes its parser by the module's name for it: the console
    puts its own there (a Textual that made it otherwise would drop the fix unsaid)."""
    import inspect

    from textual.drivers import linux_driver

    driver = batched(linux_driver.LinuxDriver)
    assert issubclass(driver, linux_driver.LinuxDriver)
    assert linux_driver.XTermParser is PasteAsText  # type: ignore[attr-defined]
    assert "XTermParser(" in inspect.getsource(linux_driver.LinuxDriver.run_input_thread)
