"""The console's Durable view (key 4) under Pilot at the fixture's frozen instant: the
executions with status, step, what they wait for and until when; the step timeline with
its failed-only filter; ``a`` signal with a payload prompt, ``c`` cancel after a
confirmation, ``R`` retry; bad input and a read-only console."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Input, Label, Static

from backend import Engine, ManualClock
from backend.durable import DurableContext, define_durable
from backend.durable.model import Execution, StepView
from console.app import SchedtuiApp
from console.cli.durable import execution_text
from console.screens.confirm import Confirm
from console.screens.durable import SignalPrompt, StepsScreen, step_rows
from console.views import durable as durable_view
from console.views.durable import DurableView, ExecutionsTable
from tests.console_fixtures import FROZEN, Held, add_timeline_history, build_ledger, console_backend, ledger_copy
from tests.durable_scenes import add_durable_history
from tests.test_console import console, settle


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("console-durable")
    url = asyncio.run(build_ledger(folder))
    asyncio.run(add_timeline_history(url))
    asyncio.run(add_durable_history(url))
    return folder / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


def table(app: SchedtuiApp) -> ExecutionsTable:
    return app.query_one(ExecutionsTable)


def row(app: SchedtuiApp, function: str, status: str) -> int:
    executions = table(app).executions
    return next(i for i, e in enumerate(executions) if (e.function, e.status) == (function, status))


def texts(app: SchedtuiApp, index: int) -> list[str]:
    cells = table(app).get_row_at(index)
    return [c if isinstance(c, str) else c.plain for c in cells]


async def on(pilot: Any, app: SchedtuiApp, function: str, status: str) -> None:
    table(app).move_cursor(row=row(app, function, status), animate=False)
    await settle(pilot)


async def test_the_view_lists_executions_with_status_step_wait_and_deadline(store_url: str) -> None:
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        assert isinstance(app.active_view, DurableView)
        executions = table(app).executions
        assert [(e.function, e.status) for e in executions] == [
            ("export", "running"), ("reindex", "queued"), ("nightly-sync", "waiting"), ("export", "waiting"),
            ("report", "failed"), ("release", "cancelled"), ("release", "waiting"), ("nightly-sync", "succeeded"),
        ]
        _, _, _, status, step, waiting, until, _ = texts(app, row(app, "release", "waiting"))
        assert (status, step, waiting, until) == ("◷ waiting", "approval", "signal approval", "in 2d 23h")
        assert texts(app, row(app, "nightly-sync", "waiting"))[5:7] == ["retry fetch-3", "in 3s"]
        assert "[ValueError]" in texts(app, row(app, "report", "failed"))[7]
        title = app.query_one("#durable-title").render()
        assert "DURABLE 8 · 1 running · 3 waiting · 1 failed" in str(title)
        clock.advance(2)
        app.tick()
        await settle(pilot)
        assert texts(app, row(app, "nightly-sync", "waiting"))[6] == "in 1s"  # the countdown ticks


async def test_enter_opens_the_step_timeline_and_f_keeps_the_failed(store_url: str) -> None:
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        await on(pilot, app, "nightly-sync", "succeeded")
        await pilot.press("enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, StepsScreen)
        steps = screen.query_one(DataTable)
        assert steps.row_count == 7
        retried = [c if isinstance(c, str) else c.plain for c in steps.get_row_at(2)]
        assert retried[:5] == ["3", "fetch-3", "step", "✓ succeeded", "2"]
        assert retried[7] == "[ConnectionError] attempt 1 failed: 502 Bad Gateway from partner API"
        await pilot.press("f")
        await settle(pilot)
        assert steps.row_count == 1 and "1 of 7 steps" in str(screen.query_one("#steps-hint", Label).render())
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, StepsScreen)
        await on(pilot, app, "report", "failed")
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("f")
        await settle(pilot)
        failed = app.screen.query_one(DataTable)
        assert [c if isinstance(c, str) else c.plain for c in failed.get_row_at(0)][1:4] == ["render", "step", "✗ failed"]


async def test_keys_typed_after_enter_go_to_the_steps_however_slow_the_server(store_url: str) -> None:
    """enter read the execution before opening its steps: over a slow link the keys typed
    after it reached the view under it (c asked to cancel the execution), and the steps
    opened late over that question. They open at once, read from within; a read that
    fails closes them, said as every failed read is."""
    backend = Held(console_backend(store_url, ManualClock(FROZEN)), "get_execution")
    async with console(store_url, size=(120, 32), backend=backend) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        await on(pilot, app, "export", "waiting")
        backend.go.clear()  # the server has not answered yet
        await pilot.press("enter", "c")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, StepsScreen) and screen.query_one(DataTable).row_count == 0
        assert "reading the steps" in str(screen.query_one("#steps-hint", Label).render())
        backend.go.set()
        await settle(pilot)
        assert app.screen is screen and len(app.screen_stack) == 2  # no question under it: c went to the steps
        assert screen.query_one(DataTable).row_count > 0 and "reading" not in str(screen.query_one("#steps-hint", Label).render())
        await pilot.press("escape")
        await settle(pilot)
        assert len(app.screen_stack) == 1
        # The read fails: the steps close, and the failure is said.
        await backend.inner.close()
        await pilot.press("enter")
        await settle(pilot)
        assert len(app.screen_stack) == 1 and notes.seen


async def test_a_wait_a_year_away_says_its_year_and_an_older_execution_its_day(store_url: str) -> None:
    """``ctx.wait_for("approval")`` with no timeout wakes at the 366-day limit: its step
    said "until 03-03 09:00:05" under "in 366d", read as tomorrow. And the CREATED column
    said the time of day alone, whatever the day."""

    async def gate(ctx: DurableContext, input: Any) -> Any:
        return await ctx.wait_for("approval")

    engine = Engine([define_durable(name="gate", handler=gate)], store_url, clock=ManualClock(FROZEN),
                    instance="web-1", coordination="advisoryLock", shutdown_grace=0, retention=None)  # fmt: skip
    await engine.start()
    await engine.durable.start_execution("gate")
    await engine.quiesce()
    await engine.stop()
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        assert texts(app, row(app, "gate", "waiting"))[1] == "09:00:05"  # today's (Europe/Berlin): the time alone
        await on(pilot, app, "gate", "waiting")
        await pilot.press("enter")
        await settle(pilot)
        steps = app.screen.query_one(DataTable)
        wait = [c if isinstance(c, str) else c.plain for c in steps.get_row_at(0)]
        assert wait[5:7] == ["09:00:05", "until 2027-03-03 09:00:05"], wait
        await pilot.press("escape")
        clock.advance(timedelta(days=1))
        app.tick()
        await settle(pilot)
        assert texts(app, row(app, "gate", "waiting"))[1] == "03-02 09:00:05"  # yesterday's: with its day


async def test_a_sends_the_awaited_signal_with_a_payload_and_refuses_bad_json(store_url: str) -> None:
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        await on(pilot, app, "export", "waiting")
        await pilot.press("a")
        await settle(pilot)
        assert not isinstance(app.screen, SignalPrompt)
        assert "waits for no signal (waiting for sleep cool-down)" in notes.titled("Signal")[-1]
        await on(pilot, app, "release", "waiting")
        waiting = table(app).selected_execution
        assert waiting is not None
        await pilot.press("a")
        await settle(pilot)
        assert isinstance(app.screen, SignalPrompt)
        for key in "{ok":
            await pilot.press(key)
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, SignalPrompt)  # bad JSON: it stays, with what was typed
        assert app.screen.query_one(Input).value == "{ok"
        assert "not JSON" in str(app.screen.query_one("#signal-error", Static).render())
        app.screen.query_one(Input).value = '{"by": "ops"}'
        await pilot.press("enter")
        await settle(pilot)
        assert not isinstance(app.screen, SignalPrompt)
        assert notes.titled("Signal sent") == [f"approval sent to {waiting.id[-6:]}"]
        execution = await app.backend.get_execution(waiting.id)
        assert any(line.message == "signal approval received" for line in execution.logs or [])


async def test_c_cancels_after_a_confirmation_and_r_retries_a_failed_one(store_url: str) -> None:
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        await on(pilot, app, "export", "waiting")
        sleeping = table(app).selected_execution
        assert sleeping is not None
        await pilot.press("c")
        await settle(pilot)
        question = app.screen
        assert isinstance(question, Confirm) and question.question == f"Cancel execution {sleeping.id}?"
        await pilot.press("escape")  # kept
        await settle(pilot)
        assert (await app.backend.get_execution(sleeping.id)).status == "waiting"
        await pilot.press("c")
        await settle(pilot)
        assert isinstance(app.screen, Confirm)
        await pilot.press("enter")  # kept too: only an explicit y cancels
        await settle(pilot)
        assert not isinstance(app.screen, Confirm)
        assert (await app.backend.get_execution(sleeping.id)).status == "waiting"
        assert not notes.titled("Cancelled")
        await pilot.press("c")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
        cancelled = await app.backend.get_execution(sleeping.id)
        assert (cancelled.status, cancelled.error_tag) == ("cancelled", "cancelled")
        assert notes.titled("Cancelled")
        await on(pilot, app, "nightly-sync", "succeeded")
        await pilot.press("R")
        await settle(pilot)
        assert "Only a failed execution can be retried" in notes.titled("Retry")[-1]
        await on(pilot, app, "report", "failed")
        failed = table(app).selected_execution
        assert failed is not None
        await pilot.press("R")
        await settle(pilot)
        assert (await app.backend.get_execution(failed.id)).status == "queued"
        assert notes.titled("Retried")


async def test_a_read_only_console_does_not_act(store_url: str) -> None:
    async with console(store_url, size=(80, 24), read_only=True) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        await on(pilot, app, "release", "waiting")
        for key in ("a", "c", "R"):
            await pilot.press(key)
            await settle(pilot)
        assert len(notes.titled("Read-only")) == 3 and not isinstance(app.screen, (SignalPrompt, Confirm))


async def test_the_filter_narrows_the_executions(store_url: str) -> None:
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        app.filter_text = "failed"
        await settle(pilot)
        app.active_view.show()
        await settle(pilot)
        assert [(e.function, e.status) for e in table(app).executions] == [("report", "failed")]


async def test_older_and_newer_page_through_every_execution_by_keyset(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the newest page (200; 3 here) ``]`` shows the next, older one, and ``[`` goes
    back; the title says which page; past the oldest and before the newest, a note."""
    monkeypatch.setattr(durable_view, "EXECUTIONS_PAGE", 3)
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        seen: list[list[str]] = []
        titles: list[str] = []
        for _ in range(3):
            seen.append([e.id for e in table(app).executions])
            titles.append(str(app.query_one("#durable-title").render()))
            await pilot.press("right_square_bracket")
            await settle(pilot)
        assert [len(ids) for ids in seen] == [3, 3, 2]
        every = [i for ids in seen for i in ids]
        assert len(set(every)) == 8 and every == sorted(every, reverse=True)  # newest first, each once
        assert "No older executions." in [message for _, message in notes.seen]
        assert ["] older" in t for t in titles] == [True, True, False]
        assert "page 3 · [ newer" in titles[2] and "page" not in titles[0]
        for _ in range(2):
            await pilot.press("left_square_bracket")
            await settle(pilot)
        assert [e.id for e in table(app).executions] == seen[0]
        assert "page" not in str(app.query_one("#durable-title").render())
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert "Already on the newest executions." in [message for _, message in notes.seen]


def test_a_step_left_open_in_an_execution_that_ended_is_shown_ended() -> None:
    """A sleep recorded ``waiting`` in an execution that failed ``nondeterministic`` (the
    code changed under it) was shown "◷ waiting until …" in ``durable show`` and the
    console's timeline: it waits for nothing (outside attack: code changes between deploys)."""
    at = datetime(2026, 3, 2, 8, tzinfo=UTC)
    steps = [
        StepView(1, "fetch", "step", "succeeded", 1, at, at),
        StepView(2, "nap", "sleep", "waiting", 1, at, None, wake_at=datetime(2026, 3, 3, tzinfo=UTC)),
    ]
    execution = Execution(id="01J0000000000000000000000X", function="release", status="failed", input=None, output=None,
                          error_tag="nondeterministic", error_message="reached step c where nap is recorded",
                          schedule=None, scheduled_at=None, created_at=at, finished_at=at, waiting_for=None, wake_at=None,
                          instance=None, steps=steps)  # fmt: skip
    [_, nap] = step_rows(execution, "UTC", at, failed_only=False)
    assert nap[3] == "⊘ ended" and not nap[6].startswith("until")
    text = execution_text(execution, at)
    assert "⊘ ended" in text and "until" not in text.split("nap", 1)[1].splitlines()[0]
    waiting = dataclasses.replace(execution, status="waiting", error_tag=None, error_message=None)
    assert step_rows(waiting, "UTC", at, failed_only=False)[1][3] == "◷ waiting"  # (one that waits is shown waiting)


async def test_an_execution_that_leaves_the_list_under_the_cursor_lets_no_key_act_on_the_one_it_fell_on(
    store_url: str,
) -> None:
    """Under the filter "waiting", the selected execution signalled or cancelled elsewhere
    left the list and the cursor fell silently on the next one, which ``c`` ``y`` then
    cancelled for good. Now the console says so at once, and the next key that acts does
    nothing but say so; the press after it, or any after a move of the cursor, acts. What
    this console does itself is no surprise."""
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("4")
        await settle(pilot)
        app.filter_text = "waiting"
        app.active_view.show()
        await settle(pilot)
        waiting = table(app).executions
        assert len(waiting) >= 3 and all(e.status == "waiting" for e in waiting)
        table(app).move_cursor(row=0, animate=False)
        await settle(pilot)
        gone = waiting[0]
        await app.backend.cancel_execution(gone.id)  # elsewhere: the CLI, another console
        app.request_refresh()
        await settle(pilot)
        landed = table(app).selected_execution
        assert landed is not None and landed.id != gone.id
        assert notes.titled("Execution gone") == [
            f"Execution {gone.id[-6:]} is no longer shown: it changed elsewhere, or newer ones pushed it off the page; "
            f"the cursor is on {landed.id[-6:]} now."
        ]
        view = app.active_view
        assert isinstance(view, DurableView)
        for key, action in (("c", "Cancel"), ("a", "Signal"), ("R", "Retry"), ("l", "Log")):
            await pilot.press(key)
            await settle(pilot)
            assert len(app.screen_stack) == 1, key
            assert notes.titled("Execution gone")[-1] == (
                f"{action}: not done. Execution {gone.id[-6:]} left the list and the cursor moved by itself. "
                f"Press the key again to act on {landed.id[-6:]}."
            )
            view.moved = (gone.id, landed.id)  # as it was: each key is refused once
        # A move of the cursor is a choice: nothing is refused after it.
        there, back = ("down", "up") if table(app).cursor_row == 0 else ("up", "down")
        await pilot.press(there)
        await settle(pilot)
        assert view.moved is None
        await pilot.press(back)
        await settle(pilot)
        assert table(app).selected_execution == landed
        view.moved = (gone.id, landed.id)
        await pilot.press("c", "y")  # refused once…
        await settle(pilot)
        assert (await app.backend.get_execution(landed.id)).status == "waiting"
        await pilot.press("c", "y")  # …then acts on the execution under the cursor, no surprise
        await settle(pilot)
        assert (await app.backend.get_execution(landed.id)).status == "cancelled"
        assert len(notes.titled("Execution gone")) == 6 and view.moved is None
