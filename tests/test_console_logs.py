"""The console's log screen (``l``) under Pilot, over the fixture ledger at its frozen
instant (tests/log_scenes.py gives flaky-export's newest run its log): a schedule's newest
run, the run under the cursor of the runs, a job's newest attempt, a durable execution;
a running log is followed; esc closes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Log

from backend import ManualClock
from backend.observability.logs import LogTarget, StoredLog
from backend.store import open_store
from console.app import SchedtuiApp
from console.screens.log import LogScreen
from console.views.jobs import JobsView
from console.views.schedules import SchedulesView
from console.widgets import RunsTable
from tests.console_fixtures import FROZEN, WHERE, console_backend, ledger_copy
from tests.console_scenes import make_ledger
from tests.log_scenes import HEAD, OMITTED_BYTES, TAIL
from tests.test_console import Notes, settle

AT = datetime.fromisoformat(FROZEN.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-logs")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


@asynccontextmanager
async def console(url: str) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], Notes]]:
    backend = console_backend(url, ManualClock(FROZEN))
    app = SchedtuiApp(backend, ManualClock(FROZEN), where=WHERE, operator_zone="Europe/Berlin")
    notes = Notes(app)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            yield app, pilot, notes
    finally:
        await backend.close()


async def write(url: str, *logs: StoredLog, finish: Any = None) -> None:
    store: Any = open_store(url, create=False)
    await store.open()
    try:
        await store.save_logs(list(logs))
        if finish is not None:
            store.save_runs([finish])
            await store.flush()
    finally:
        await store.close()


def shown(app: SchedtuiApp) -> tuple[LogScreen, str]:
    """The log screen on top, and the text its log widget holds."""
    screen = app.screen
    assert isinstance(screen, LogScreen)
    return screen, "\n".join(screen.query_one(Log).lines)  # (a text ending in a newline: a last line "")


async def test_l_on_a_schedule_shows_its_newest_runs_log_and_esc_closes(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        app.action_select("flaky-export")
        await settle(pilot)
        await pilot.press("l")
        await settle(pilot)
        screen, text = shown(app)
        assert text.startswith(HEAD.splitlines()[0]) and text.endswith(TAIL)
        assert f"[… {OMITTED_BYTES:,} bytes (1,162 lines) left out" in text
        status = str(screen.query_one("#log-status").render())
        assert "✗ failed" in status and "left out in the middle" in status and "following" not in status
        assert screen.log_data is not None and not screen.log_data.running
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, LogScreen)


async def test_l_in_the_runs_shows_the_run_under_the_cursor(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        app.action_select("flaky-export")
        await settle(pilot)
        runs = app.query_one(RunsTable)
        runs.focus()
        await pilot.press("down")  # the run before the newest
        await settle(pilot)
        chosen = runs.selected_run
        assert chosen is not None
        await pilot.press("l")
        await settle(pilot)
        screen, text = shown(app)
        assert text == "" and "nothing written" in str(screen.query_one("#log-status").render())
        assert chosen.id in str(screen.query_one("Vertical").border_title)


async def test_a_running_log_is_followed_until_its_run_ends(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        app.action_select("daily-digest")  # its newest run runs now, on web-2
        await settle(pilot)
        view = app.active_view
        assert isinstance(view, SchedulesView)
        newest = view.recent[0]
        assert newest.status == "running"
        target = LogTarget("run", newest.id)
        await write(store_url, StoredLog(target, "first\n", "", 6, 0, 0, False, AT))
        await pilot.press("l")
        await settle(pilot)
        screen, text = shown(app)
        assert text == "first\n" and screen.log_data is not None and screen.log_data.running
        assert "following" in str(screen.query_one("#log-status").render())
        assert screen._follow is not None  # read again every second
        finished = newest.finish("succeeded", AT + timedelta(seconds=1))
        await write(store_url, StoredLog(target, "first\nsecond\n", "", 13, 0, 0, True, AT), finish=finished)
        screen.reload()  # (what the follow timer does)
        await settle(pilot)
        screen, text = shown(app)
        assert text == "first\nsecond\n" and screen.read_up_to == 13
        assert screen.log_data is not None and not screen.log_data.running and screen._follow is None


async def test_l_on_a_job_and_on_a_durable_execution(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        await pilot.press("3")
        await settle(pilot)
        await pilot.press("enter")  # the queue's jobs
        await settle(pilot)
        view = app.active_view
        assert isinstance(view, JobsView)
        job = view.jobs_table.selected_job
        assert job is not None
        await write(store_url, StoredLog(LogTarget("job", job.id, 7, max(job.attempt, 1)), "<<job says>>\n", "", 13, 0, 0,
                                         True, AT))  # fmt: skip
        await pilot.press("l")
        await settle(pilot)
        screen, text = shown(app)
        assert text == "<<job says>>\n" and job.id in str(screen.query_one("Vertical").border_title)
        await pilot.press("escape", "4", *["down"] * 7)  # the report that failed: its retries are in its log
        await settle(pilot)
        await pilot.press("l")
        await settle(pilot)
        screen, text = shown(app)
        assert screen.log_data is not None and screen.log_data.kind == "durable"
        assert text == screen.log_data.text and "\n" in text
        assert notes.seen == []
