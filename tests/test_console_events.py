"""The console on change signals, and its Audit view (key 6).

Live: a signal naming what is on screen makes the console read it again; nothing is read
while nothing changes; while the stream is down it polls, tries the stream again with
backoff, and the header says which. Against a real ``schedtui serve`` too: a Run now made
by another client shows up without polling. The Audit view: newest first, filtered, older
entries by keyset, an entry whole on ``enter``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import Engine, ManualClock
from backend.client.embedded import EmbeddedBackend
from backend.client.remote import RemoteBackend
from backend.errors import Unavailable
from backend.events.audit import os_user
from backend.events.bus import READY, Signal
from console.app import SchedtuiApp
from console.screens import AuditDetails
from console.views.audit import AuditTable, AuditView
from console.widgets import ConsoleHeader, RunsTable
from console.widgets.line import Line
from tests.console_fixtures import console_engine
from tests.servers import Server, start_server
from tests.test_console import Notes, cell, console, ledger, plain_at, settle, store_url  # noqa: F401  (fixtures)
from tests.test_contract import OPERATE, write_schedules


def header_text(app: SchedtuiApp) -> str:
    return app.query_one(ConsoleHeader).render().plain


class Reads:
    """Counts the schedule reads of a backend (one per refresh)."""

    def __init__(self, backend: Any) -> None:
        self.count = 0
        original = backend.list_schedules

        async def counting() -> Any:
            self.count += 1
            return await original()

        backend.list_schedules = counting


async def until(pilot: Any, condition: Any, timeout: float = 10) -> None:
    """Let the app run until ``condition()`` holds (the timeout only bounds a broken test)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await pilot.pause()


def refreshed(app: SchedtuiApp) -> asyncio.Future[None]:
    """Resolves at the app's next completed refresh."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    original = app.post_message

    def post(message: Any) -> bool:
        if isinstance(message, SchedtuiApp.Refreshed) and not fut.done():
            fut.set_result(None)
        return original(message)

    app.post_message = post  # type: ignore[method-assign]  # resolves the future, then posts
    return fut


# ---------------------------------------------------------------------------------------
# embedded: the engine's bus, and the file's change counter
# ---------------------------------------------------------------------------------------
async def test_signals_refresh_what_changed_and_nothing_is_read_while_nothing_does(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        assert "● live (events)" in header_text(app) and "ago" not in header_text(app)
        reads = Reads(app.backend)
        for _ in range(10):  # ten seconds of a quiet store: not one read
            clock.advance(1)
            app.tick()
            await settle(pilot)
        assert reads.count == 0
        # The engine disables a schedule (as a Python client sharing it would): the
        # schedules signal refreshes the table.
        assert isinstance(app.backend, EmbeddedBackend)
        engine = app.backend.engine
        done = refreshed(app)
        await engine.set_enabled("heartbeat", False, note="from elsewhere")
        await asyncio.wait_for(done, 10)
        assert cell(app, "heartbeat", "state") == "○ off" and reads.count >= 1


async def test_another_process_on_the_file_is_seen_without_polling(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        other = console_engine(store_url, ManualClock(clock.now()), "script")  # another writer, as another process
        await other.open()
        try:
            await other.set_enabled("flaky-export", False, note="paused by a script")
            done = refreshed(app)
            clock.advance(1)  # the watch looks at the file's change counter on the engine's clock
            app.tick()
            await asyncio.wait_for(done, 10)
            await settle(pilot)
            assert cell(app, "flaky-export", "state") == "○ off"
        finally:
            await other.stop(0)


class Switchable:
    """A backend whose change stream the test turns on and off; everything else passes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.up = False
        self.broken = asyncio.Event()
        self.read_only = inner.read_only

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        if not self.up:
            raise Unavailable("no event stream (test)")
        self.broken = asyncio.Event()
        yield [Signal("e-1", READY, "file")]
        await self.broken.wait()
        raise Unavailable("the event stream broke (test)")


async def test_it_polls_only_while_the_stream_is_down_and_says_so(store_url: str) -> None:
    from tests.console_fixtures import console_backend

    clock = ManualClock("2026-03-02T08:00:05Z")
    backend = Switchable(console_backend(store_url, clock))
    async with console(store_url, backend=backend, clock=clock) as (app, pilot, _, notes):
        assert "● live (polling)" in header_text(app)
        reads = Reads(backend.inner)
        clock.advance(1)
        app.tick()
        await settle(pilot)
        assert reads.count == 1  # polling: due every second

        backend.up = True
        clock.advance(2)  # tried again after 1 s (down still), then after 2 s more
        app.tick()
        await until(pilot, lambda: app.link.events_live)
        await settle(pilot)
        assert "● live (events)" in header_text(app)
        before = reads.count
        for _ in range(10):
            clock.advance(1)
            app.tick()
            await settle(pilot)
        assert reads.count == before  # no polling while signals flow

        backend.up = False
        backend.broken.set()
        await until(pilot, lambda: not app.link.events_live)
        await settle(pilot)
        # A stream that broke is news at once: not live, and the store is read at once.
        assert "◌ event stream dropped (polling)" in header_text(app) and "● live" not in header_text(app)
        assert reads.count == before + 1
        clock.advance(1)
        app.tick()
        await settle(pilot)
        assert reads.count > before + 1 and "◌ event stream dropped (polling)" in header_text(app)


async def test_a_stream_silent_past_its_pings_makes_the_console_ask_the_server_once(store_url: str) -> None:
    """A frozen server keeps its stream open saying nothing; the stream is given up only
    after 40 s, and nothing was read meanwhile, so a frozen server showed as lost only once
    the polls after that had timed out. Once the stream is silent past its pings (20 s) the
    store is read once (a frozen server's read times out: lost at about 30 s); not again
    until a signal comes and silence follows it again."""
    from tests.console_fixtures import console_backend

    clock = ManualClock("2026-03-02T08:00:05Z")
    backend = Switchable(console_backend(store_url, clock))
    backend.up = True
    async with console(store_url, backend=backend, clock=clock) as (app, pilot, _, notes):
        await until(pilot, lambda: app.link.events_live)
        await settle(pilot)
        app.on_signals([])  # a ping
        await settle(pilot)
        reads = Reads(backend.inner)
        for _ in range(19):  # silent within its pings' allowance: nothing read
            clock.advance(1)
            app.tick()
            await settle(pilot)
        assert reads.count == 0
        for _ in range(15):
            clock.advance(1)
            app.tick()
            await settle(pilot)
        assert reads.count == 1  # asked once, at 20 s
        app.on_signals([])  # the server is there after all
        await settle(pilot)
        for _ in range(21):
            clock.advance(1)
            app.tick()
            await settle(pilot)
        assert reads.count == 2  # asked again after the next silence


async def test_a_dropped_stream_whose_polls_go_unanswered_is_not_called_calm(store_url: str) -> None:
    """A frozen server's stream is given up after its silence; the polls that take over
    hang as well. The header said "event stream dropped (polling) 25s ago" for as long as
    the polls took to fail (about 40 s), which reads as if the data were current: once a
    poll is late it says the server is waited for, as it does without a stream."""
    from tests.console_fixtures import console_backend

    clock = ManualClock("2026-03-02T08:00:05Z")
    backend = Switchable(console_backend(store_url, clock))
    backend.up = True
    async with console(store_url, backend=backend, clock=clock, refresh_interval=2) as (app, pilot, _, notes):
        await until(pilot, lambda: app.link.events_live)
        await settle(pilot)
        answer = asyncio.Event()
        listing = backend.inner.list_schedules

        async def hanging() -> Any:
            await answer.wait()  # a frozen server: the request hangs
            return await listing()

        backend.inner.list_schedules = hanging
        backend.up = False
        backend.broken.set()
        await until(pilot, lambda: not app.link.events_live)
        await pilot.pause()
        assert "◌ event stream dropped (polling)" in header_text(app)
        clock.advance(8)  # past the refresh interval and the 5 s a poll is given
        app.tick()
        await pilot.pause()
        shown = header_text(app)
        assert "◌ waiting for the server (stream dropped) last answer 8s ago" in shown, shown
        assert "event stream dropped (polling)" not in shown
        answer.set()  # it answers again
        await settle(pilot)
        assert "◌ event stream dropped (polling)" in header_text(app)


# ---------------------------------------------------------------------------------------
# remote: the server's event stream
# ---------------------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path: Path) -> Any:
    write_schedules(tmp_path)
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", OPERATE)  # fmt: skip
    yield srv
    srv.stop()


async def test_a_remote_console_shows_another_clients_run_without_polling(server: Server) -> None:
    backend = RemoteBackend(server.url, OPERATE)
    app = SchedtuiApp(backend, refresh_interval=3600)  # polling would take an hour
    try:
        async with app.run_test(size=(120, 32)) as pilot:
            await settle(pilot)
            await until(pilot, lambda: app.link.events_live)
            assert "● live (events)" in header_text(app)
            app.action_select("hourly")
            await settle(pilot)
            async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}) as other:
                fired = (await other.post("/inspect/schedules/hourly/fire")).json()["run_id"]
            # The signal, then the refresh it starts (a real server: nothing else to await).
            await until(pilot, lambda: any(r.id == fired for r in app.query_one(RunsTable).runs))
    finally:
        await backend.close()


# ---------------------------------------------------------------------------------------
# the Audit view
# ---------------------------------------------------------------------------------------
def audit_rows(app: SchedtuiApp) -> list[tuple[str, str, str]]:
    table = app.query_one(AuditTable)
    return [(e.actor, e.action, e.target) for e in table.entries]


async def test_the_audit_view_lists_who_did_what_newest_first_and_filters(store_url: str) -> None:
    async with console(store_url, size=(120, 32)) as (app, pilot, clock, notes):
        await pilot.press("e")  # disable the selected schedule (daily-digest), as this console's user
        await settle(pilot)
        await pilot.press("enter")  # no note
        await settle(pilot)
        await pilot.press("6")
        await settle(pilot)
        assert isinstance(app.active_view, AuditView)
        assert audit_rows(app) == [
            (os_user(), "schedule.disable", "daily-digest"),
            ("alice", "schedule.fire", "daily-digest"),
            ("ops", "schedule.disable", "legacy-cleanup"),
        ]
        table = app.query_one(AuditTable)
        assert plain_at(table, 2, 4).startswith("note=paused during the session-store migration")
        assert plain_at(table, 2, 0) == "03-02 08:59:00"  # in the zone on the tab line
        title = app.query_one("#audit-title", Line).render().plain
        assert title == "AUDIT 3 · newest first · all read"

        await pilot.press("slash", *"alice", "enter")
        await settle(pilot)
        assert audit_rows(app) == [("alice", "schedule.fire", "daily-digest")]
        assert "AUDIT 1 of 3 · filter “alice”" in app.query_one("#audit-title", Line).render().plain
        await pilot.press("enter")  # the entry whole
        await settle(pilot)
        assert isinstance(app.screen, AuditDetails)
        body = str(app.screen.query_one("#audit-body").render())
        assert "alice" in body and "schedule.fire" in body and "daily-digest" in body and "run_id" in body
        await pilot.press("escape")  # closes the entry
        await settle(pilot)
        assert not isinstance(app.screen, AuditDetails) and len(audit_rows(app)) == 1
        await pilot.press("escape")  # clears the filter
        await settle(pilot)
        assert len(audit_rows(app)) == 3


async def test_the_audit_view_follows_new_entries_and_reads_older_ones(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("console.views.audit.AUDIT_PAGE", 2)
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("6")
        await settle(pilot)
        assert audit_rows(app) == [("alice", "schedule.fire", "daily-digest"), ("ops", "schedule.disable", "legacy-cleanup")]
        assert app.query_one(AuditView).next_before is None or len(audit_rows(app)) == 2
        assert isinstance(app.backend, EmbeddedBackend)
        engine: Engine = app.backend.engine
        done = refreshed(app)
        await engine.run_now("heartbeat")  # the audit signal brings it in
        await asyncio.wait_for(done, 10)
        await settle(pilot)
        assert audit_rows(app)[0][1:] == ("schedule.fire", "heartbeat") and len(audit_rows(app)) == 2
        await pilot.press("right_square_bracket")  # older
        await settle(pilot)
        assert [a for _, a, _ in audit_rows(app)] == ["schedule.fire", "schedule.fire", "schedule.disable"]
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert notes.seen[-1] == ("", "No older entries.")


async def test_on_the_health_view_signals_refresh_at_most_every_five_seconds(store_url: str) -> None:
    """Its activity read counts the hour's runs and job attempts. Re-read as soon as the
    one in flight was done whenever a signal had come meanwhile (always, under steady
    work), one console kept the serve busy: 40-50% of a core at 150 jobs/s, 92% with a
    full hour (an outside soak run). Signals in between are answered by one refresh."""
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        reads = 0
        original = app.backend.activity

        async def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await original(*args, **kwargs)

        app.backend.activity = counting  # type: ignore[method-assign]
        for _ in range(20):  # a burst within the five seconds of the switch's read
            app.on_signals([Signal("", "jobs", "mail")])
            await settle(pilot)
        assert reads == 0
        clock.advance(5)
        app.tick()
        await settle(pilot)
        assert reads == 1  # the one the burst owed
        clock.advance(5)
        app.tick()
        await settle(pilot)
        assert reads == 1  # (nothing came since)
        app.on_signals([Signal("", "jobs", "mail")])
        await settle(pilot)
        assert reads == 2  # five seconds after the last: at once
        await pilot.press("1")  # the Schedules view reads its list as the signals come
        await settle(pilot)
        schedule_reads = Reads(app.backend)
        for _ in range(3):
            app.on_signals([Signal("", "runs", "heartbeat")])
            await settle(pilot)
        assert schedule_reads.count == 3
