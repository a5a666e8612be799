"""The console against a real ``schedtui serve`` on a loopback port (RemoteBackend)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.client.remote import RemoteBackend
from console.app import SchedtuiApp
from console.screens.schedule_form import ScheduleForm
from console.widgets import ConsoleHeader, FleetBanner, RunsTable, SchedulesTable
from tests.servers import INSPECT_INFO, Server, cli_env, json_server, start_server
from tests.test_console import Notes, settle
from tests.test_console_schedule_form import fill
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


async def test_the_schedule_form_says_a_payload_json_cannot_carry_and_keeps_the_form(server: Server) -> None:
    """A payload of 1e309 (Python's JSON reads it as infinity): the remote client's JSON
    encoder raised a bare ValueError, which the form's worker (it catches SchedtuiError)
    let go, and ctrl+s did nothing, without a word. Now it is BadInput naming the payload,
    said as the backend's other refusals are, and nothing is sent."""
    backend = RemoteBackend(server.url, OPERATE)
    app = SchedtuiApp(backend, refresh_interval=60)
    notes = Notes(app)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("n")
            await settle(pilot)
            await fill(pilot, name="inf1", cron="0 9 * * 1", target="mailer", payload='{"a": 1e309}')
            await pilot.press("ctrl+s")
            await settle(pilot)
            assert isinstance(app.screen, ScheduleForm)
            assert notes.titled("Bad input") == ["payload is not JSON (Out of range float values are not JSON compliant)"]
            assert app.view_of("inf1") is None
        assert "inf1" not in {view.name for view in (await backend.list_schedules()).schedules}
    finally:
        await backend.close()


async def test_a_server_answering_json_of_another_shape_is_a_notification() -> None:
    """Past a real /inspect/info, a server that is not schedtui's answers {} to the
    console's reads: the KeyError went up out of its workers. Now it is the client's
    Unavailable, shown as a notification naming the route, and the console stays up."""
    answer = lambda method, path: INSPECT_INFO if path == "/inspect/info" else {}  # noqa: E731
    with json_server(answer) as url:
        backend = RemoteBackend(url, read_retries=())
        app = SchedtuiApp(backend, refresh_interval=60)
        notes = Notes(app)
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                await settle(pilot)
                said = notes.titled("Unavailable")
                assert said and said[0] == (f"{url} answered GET /inspect/schedules with JSON schedtui cannot read "
                                            '(no field "coordination"); is it a schedtui server? Retrying by itself; '
                                            "the data on screen is stale."), notes.seen
                assert app.is_running
        finally:
            await backend.close()


async def test_a_server_whose_clock_is_behind_is_judged_by_its_own_clock(tmp_path: Path) -> None:
    """A server 90 s behind the operator's machine: the first refresh judged its heartbeats
    by the operator's clock (read before the server's), so the console said "NOTHING IS
    FIRING" for its first 20 s; and its countdowns and ages ran on the operator's clock, a
    slot 11 s away shown in 1m 41s (an outside attack)."""
    write_schedules(tmp_path)
    server = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                          "--token", OPERATE, env=cli_env(SCHEDTUI_CLOCK_OFFSET_MS="-90000"))  # fmt: skip
    backend = RemoteBackend(server.url, OPERATE)
    app = SchedtuiApp(backend, refresh_interval=60)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            snapshot = await backend.list_schedules()
            assert abs((snapshot.now - app.clock.now()).total_seconds() + 90) < 5  # (the skew is there)
            assert app.fleet is not None and not app.fleet.silent, app.fleet
            assert not app.query_one(FleetBanner).has_class("-silent")
            table = app.query_one(SchedulesTable)
            assert table._now is not None and abs((table._now - snapshot.now).total_seconds()) < 5
    finally:
        await backend.close()
        server.stop()
