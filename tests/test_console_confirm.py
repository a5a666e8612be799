"""The console's confirmations (issue 24, items 4 and 5).

Every question shows its whole text, wrapped, at 80x24 and 120x32: nothing of a warning is
cut. And one convention everywhere: ``y`` does it; ``n``, ``esc`` and ``enter`` leave it
(a stray enter never does anything dangerous). Each dialog is driven through the console
as an operator would reach it, the keys typed at full speed."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.app import App
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Input

from backend.model import BackfillProgress
from console.screens.backfill import BackfillScreen
from console.screens.confirm import Confirm
from console.screens.quit import QuitPrompt
from console.views.durable import ExecutionsTable
from console.widgets.jobs import JobsTable
from tests.console_fixtures import ledger_copy
from tests.console_scenes import make_ledger
from tests.test_console import console, select, settle
from tests.test_console_typing import type_fast, typed

SIZES = [(80, 24), (120, 32)]
AT = datetime(2026, 3, 2, 8, 0, 5, tzinfo=UTC)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-confirm")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


def screen_rows(app: App[Any]) -> list[str]:
    """The screen as text, row by row (what a screenshot shows, without its colours)."""
    out = Console(width=app.size.width, height=app.size.height, file=io.StringIO(), record=True,
                  color_system=None, force_terminal=True, legacy_windows=False)
    out.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return out.export_text().splitlines()


def shown(app: App[Any]) -> str:
    """What the dialog on top shows inside its border, its lines joined by spaces."""
    box = app.screen.query_one(Vertical).region
    rows = screen_rows(app)[box.y + 1 : box.bottom - 1]
    inside = [row[box.x + 1 : box.right - 1].strip(" │") for row in rows]
    return " ".join(line for line in inside if line)


def words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def running(name: str = "slow-reindex") -> BackfillProgress:
    return BackfillProgress(id="b1", name=name, start=AT, end=AT, total=6, fired=2, failed=0, state="running",
                            instance="console", started_at=AT)


DIALOGS: dict[str, Callable[[], Screen[Any]]] = {
    "release a lock": lambda: Confirm.of("release_lock", {"name": "nightly-rollup"},
                                 facts=["Held by web-2:77 (rollup) (token 1); its lease runs in 58s."]),
    "delete a job": lambda: Confirm.of("delete_job", {"queue": "mailer", "job_id": "01KJPRZFW8YBBWF1CZNVPC7Y0C"},
                               facts=["It is running, try 1/3, key invoice-2026-03-02-0042."]),
    "cancel an execution": lambda: Confirm.of("cancel_execution", {"execution_id": "01KJPRZFW8YBBWF1CZNVPC7Y0C"},
                                      facts=["export, waiting, at step wait-for-approval"]),
    "delete a schedule": lambda: Confirm.of("delete_schedule", {"name": "reap-sessions"},
                                    facts=["It starts queue mailer on every slot."]),
    "start a backfill": lambda: Confirm.of("start_backfill", {"name": "flaky-export", "start": AT, "end": AT},
                                   facts=["30 slots in (2026-03-02 02:50:00 EST … 2026-03-02 02:55:00 EST]; "
                                          "those that already succeeded skipped."]),
    "quit during a backfill (embedded)": lambda: QuitPrompt([running(), running("flaky-export")], embedded=True),
    "quit during a backfill (remote)": lambda: QuitPrompt([running()], embedded=False),
}


class Host(App[None]):
    """Nothing but the dialog, on a screen of the size under test."""


def text_of(dialog: Screen[Any]) -> str:
    assert isinstance(dialog, (Confirm, QuitPrompt))
    return dialog.text


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("name", list(DIALOGS))
async def test_every_question_shows_its_whole_text(name: str, size: tuple[int, int]) -> None:
    dialog = DIALOGS[name]()
    app = Host()
    async with app.run_test(size=size) as pilot:
        await app.push_screen(dialog)
        await pilot.pause()
        on_screen = words(shown(app))
        for line in text_of(dialog).splitlines():
            assert words(line) in on_screen, f"cut at {size}: {line!r} not in {on_screen!r}"
        assert isinstance(dialog, (Confirm, QuitPrompt))
        assert words(dialog.HINT) in on_screen
        # Wrapped inside the screen, never wider than it.
        box = dialog.query_one(Vertical).region
        assert box.x >= 0 and box.right <= size[0] and box.bottom <= size[1]


# -- one convention: y does it; n, esc and enter leave it ------------------------------------
LEAVE = ["enter", "n", "escape"]


async def test_deleting_a_job(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        type_fast(app, "3", "enter")  # the jobs view; enter on the first queue goes to its jobs
        await typed(pilot)
        job = app.query_one(JobsTable).selected_job
        assert job is not None
        for no in LEAVE:
            type_fast(app, "x", no)
            await typed(pilot)
            assert not isinstance(app.screen, Confirm)
            assert (await app.backend.get_job(job.id)).job is not None
        type_fast(app, "x", "y")
        await typed(pilot)
        with pytest.raises(Exception, match="no job with id"):
            await app.backend.get_job(job.id)


async def test_cancelling_a_durable_execution(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        type_fast(app, "4")
        await typed(pilot)
        executions = app.query_one(ExecutionsTable)
        row = next(i for i, e in enumerate(executions.executions) if e.status == "waiting")
        executions.move_cursor(row=row, animate=False)
        await settle(pilot)
        waiting = executions.selected_execution
        assert waiting is not None
        for no in LEAVE:
            type_fast(app, "c", no)
            await typed(pilot)
            assert not isinstance(app.screen, Confirm)
            assert (await app.backend.get_execution(waiting.id)).status == "waiting"
        type_fast(app, "c", "y")
        await typed(pilot)
        assert (await app.backend.get_execution(waiting.id)).status == "cancelled"


async def test_releasing_a_lock(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        type_fast(app, "5")  # the cursor on the first lock, nightly-rollup, held
        await typed(pilot)
        for no in LEAVE:
            type_fast(app, "x", no)
            await typed(pilot)
            assert not isinstance(app.screen, Confirm)
            assert not notes.titled("Lock released")
        type_fast(app, "x", "y")
        await typed(pilot)
        [released] = notes.titled("Lock released")
        assert released.startswith('Lock "nightly-rollup" released')


async def test_deleting_a_schedule(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await app.backend.create_schedule({"name": "reap-sessions", "cron": "*/15 * * * *", "timezone": "UTC",
                                           "queue": "mailer"})
        app.request_refresh()
        await settle(pilot)
        await select(pilot, "reap-sessions")
        for no in LEAVE:
            type_fast(app, "D", no)
            await typed(pilot)
            assert not isinstance(app.screen, Confirm) and app.view_of("reap-sessions") is not None
        type_fast(app, "D", "y")
        await typed(pilot)
        assert app.view_of("reap-sessions") is None


async def test_starting_a_backfill(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        type_fast(app, "b")
        await typed(pilot)
        dialog = app.screen
        assert isinstance(dialog, BackfillScreen)
        dialog.query_one("#from", Input).value = "-1m"
        await settle(pilot)
        assert dialog.state == "ok"
        for no in LEAVE:
            type_fast(app, "tab", "enter", no)  # Cancel → Backfill, pressed: it asks
            await typed(pilot)
            # (isinstance again: mypy takes the identity check for a narrowing to Screen[object])
            assert app.screen is dialog and isinstance(dialog, BackfillScreen) and dialog.state == "ok"
            type_fast(app, "shift+tab")  # back to Cancel
            await typed(pilot)
        type_fast(app, "tab", "enter", "y")
        await typed(pilot)
        assert dialog.state in ("running", "done")


async def test_quitting_while_a_backfill_started_here_runs(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        app.backfills["b1"] = running()  # as if started from this console, and still running
        exits: list[object] = []
        app.exit = lambda *args, **kwargs: exits.append(args)  # type: ignore[method-assign]  # records the exit instead
        for no in LEAVE:
            type_fast(app, "q", no)
            await typed(pilot)
            assert not isinstance(app.screen, QuitPrompt) and exits == []
        type_fast(app, "q", "q")  # q again is no answer, and no second question
        await typed(pilot)
        assert isinstance(app.screen, QuitPrompt) and len(app.screen_stack) == 2 and exits == []
        type_fast(app, "y")
        await typed(pilot)
        assert not isinstance(app.screen, QuitPrompt) and exits == [()]
