"""The console against a real ``schedtui serve`` on a loopback port (RemoteBackend)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.client.remote import RemoteBackend
from console.app import SchedtuiApp
from console.widgets import ConsoleHeader, RunsTable, SchedulesTable
from tests.servers import Server, start_server
from tests.test_console import Notes, settle
from tests.test_contract import OPERATE, READ, write_schedules


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    write_schedules(tmp_path)
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", OPERATE, "--read-token", READ)
    yield srv
    srv.stop()


async def test_remote_console_reads_acts_and_survives_the_server_going_away(server: Server) -> None:
    # Its reads of the stopped server are retried after a tenth of the real waits (0.17 s, not 1.7 s).
    backend = RemoteBackend(server.url, OPERATE, read_retries=(0.02, 0.05, 0.1))
    app = SchedtuiApp(backend, refresh_interval=60)
    notes = Notes(app)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            header = app.query_one(ConsoleHeader)
            assert header.state == "live" and header.info is not None and header.info.kind == "remote"
            assert header.where == server.url and not app.read_only
            assert list(app.query_one(SchedulesTable).views) == ["ext", "failing", "hourly", "slow"]
            app.action_select("hourly")
            await settle(pilot)
            await pilot.press("r")
            await settle(pilot)
            runs = app.query_one(RunsTable).runs
            assert runs and runs[0].trigger == "manual" and runs[0].status == "succeeded"
            assert notes.titled("Run now: fired") and runs[0].id in notes.titled("Run now: fired")[0]
            server.stop()  # the server goes away: no crash, the header says so, data goes stale
            await pilot.press("ctrl+r")
            await settle(pilot)
            assert header.state == "lost"  # type: ignore[comparison-overlap]  # mypy keeps the earlier narrowing across the awaits
            assert app.query_one("#main").has_class("-stale")
            assert notes.titled("Unavailable") and "cannot reach" in notes.titled("Unavailable")[0]
            assert app.query_one(RunsTable).runs == runs
    finally:
        await backend.close()


async def test_remote_console_with_a_read_token_is_read_only(server: Server) -> None:
    backend = RemoteBackend(server.url, READ)
    app = SchedtuiApp(backend)
    notes = Notes(app)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.read_only
            await pilot.press("r")
            await settle(pilot)
            assert notes.titled("Read-only") == ["Run now does nothing here: the token may only read."]
    finally:
        await backend.close()
