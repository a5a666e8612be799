"""A paste far past the payload limit into the schedule form (issue 24, item 12): as 300 KB
of separate keys (a terminal without bracketed paste) and as one paste. The field keeps at
most the limit, one notification names it, and the console goes on answering keys."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.app import App
from textual.driver import Driver
from textual.widgets import Input

from backend.scheduler.stored import MAX_PAYLOAD_BYTES
from console.app import SchedtuiApp
from console.driver import batched
from console.screens.schedule_form import ScheduleForm
from console.widgets.bounded import BoundedInput, fit
from tests.console_scenes import make_ledger
from tests.test_console import settle
from tests.test_console_schedule_form import schedules_view
from tests.test_console_typing import type_fast, typed

SAID = (f"A schedule's payload holds at most {MAX_PAYLOAD_BYTES:,} bytes (64 KiB) of UTF-8; "
        "what was typed or pasted past that was not taken.")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-paste")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    for file in ledger.parent.glob("state.db*"):
        shutil.copy(file, tmp_path / file.name)
    return f"sqlite:///{tmp_path / 'state.db'}"


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

    driver = batched(Recorder)(FakeApp())  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    original = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal wakes
        wakes += 1
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        thread = threading.Thread(target=lambda: [driver.send_message(key) for key in sent])  # the reading thread
        thread.start()
        while thread.is_alive() or len(posted) < len(sent):
            await asyncio.sleep(0)  # the loop, taking each batch when woken
        thread.join()
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
    assert all(a is b for a, b in zip(posted, sent, strict=True))
    assert wakes < len(sent)


def test_the_app_reads_the_terminal_through_the_batching_driver() -> None:
    app = SchedtuiApp(object())  # type: ignore[arg-type]
    assert issubclass(app.driver_class, App().driver_class) and app.driver_class.__name__.startswith("Batched")
