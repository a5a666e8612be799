"""What an operator on call trips over (issue 24): a backfill that must be stopped after
its dialog closed, what a backfill does to the live slots and how it ended, a token the
server refuses, and a server that dies and comes back.

Embedded consoles on the frozen fixture ledger (tests/test_console.py), and remote ones
against a real ``schedtui serve`` on a loopback port.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from textual.widgets import Input

from backend import ManualClock
from backend.client.remote import RemoteBackend
from backend.store import open_store
from console.app import SchedtuiApp
from console.commands import ConsoleCommands
from console.screens import BackfillScreen, Confirm, HelpScreen, QuitPrompt
from console.widgets import ConsoleHeader
from tests.console_fixtures import FROZEN, Held, console_backend
from tests.servers import Server, start_server
from tests.test_console import Notes, console, ledger, select, settle, store_url  # noqa: F401 - fixtures
from tests.test_console_events import header_text, until
from tests.test_contract import OPERATE, write_schedules


def plain(widget: Any) -> str:
    return str(widget.render().plain)


async def start_backfill(pilot: Any, name: str, start: str) -> BackfillScreen:
    """``b`` on ``name``, the range typed, Backfill, yes: the dialog of a running backfill
    (slow-reindex's runs wait 14 s on the frozen clock, so it stays running)."""
    await select(pilot, name)
    await pilot.press("b")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, BackfillScreen)
    screen.query_one("#from", Input).value = start
    await settle(pilot)
    screen.action_start()
    await pilot.pause()
    assert isinstance(pilot.app.screen, Confirm)
    await pilot.press("y")
    await pilot.pause()
    assert screen.state == "running"
    return screen


# ---------------------------------------------------------------------------------------
# item 2: a running backfill can be reopened and stopped
# ---------------------------------------------------------------------------------------
async def test_b_reopens_a_running_backfill_and_s_stops_it_after_asking(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        first = await start_backfill(pilot, "slow-reindex", "-1m")
        assert first.progress is not None
        await pilot.press("escape")  # the dialog closes; the backfill goes on
        await pilot.pause()
        await pilot.press("b")  # it used to open a fresh plan, refused as "already running"
        # (not settle(): the app follows the backfill it started until it ends)
        await until(pilot, lambda: isinstance(app.screen, BackfillScreen) and app.screen is not first)
        screen = app.screen
        assert isinstance(screen, BackfillScreen) and screen is not first
        assert screen.state == "running" and screen.progress is not None and screen.progress.id == first.progress.id
        assert screen.query_one("#stop").region.area and not screen.query_one("#from").region.area  # no plan
        counts = plain(screen.query_one("#counts"))
        assert "fired 0/6" in counts and "s stops it (asks)" in counts
        await pilot.press("s")
        await pilot.pause()
        question = app.screen
        assert isinstance(question, Confirm) and question.action == "cancel_backfill"
        assert question.question == f"Stop backfill {first.progress.id}?"
        assert "the run in flight finishes on its own" in question.text and "slow-reindex: 0 of 6 fired" in question.text
        await pilot.press("y")
        await pilot.pause()
        await pilot.pause()
        assert screen.progress.state == "cancelled" and "cancelled" in plain(screen.query_one("#counts"))
        entries = (await app.backend.audit(limit=5)).entries
        assert entries[0].action == "schedule.backfill_cancel"
        clock.advance(30)  # the run in flight finishes; the backfill has ended
        await settle(pilot)


async def test_the_palette_stops_the_backfill_of_the_selected_schedule(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "heartbeat")
        provider = ConsoleCommands(app.screen)
        [nothing] = [hit async for hit in provider.search("stop backfill")]
        assert str(nothing.text) == "Stop backfill: heartbeat"
        await nothing.command()
        await settle(pilot)
        assert notes.titled("Stop backfill") == ["No backfill of heartbeat is running."]

        await start_backfill(pilot, "slow-reindex", "-1m")
        await pilot.press("escape")
        await pilot.pause()
        [hit] = [hit async for hit in ConsoleCommands(app.screen).search("stop backfill")]
        assert str(hit.text) == "Stop backfill: slow-reindex"
        await hit.command()
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and app.screen.action == "cancel_backfill"
        await pilot.press("y")
        await pilot.pause()
        await pilot.pause()
        [stopped] = notes.titled("Backfill stopped")
        assert stopped.startswith("slow-reindex: 0 fired, 0 failed, 6 not fired (cancelled")
        assert await app.backend.running_backfills("slow-reindex") == []
        clock.advance(30)
        await settle(pilot)


async def test_stop_backfill_answered_after_another_question_came_up_asks_nothing(store_url: str) -> None:  # noqa: F811
    """The palette's Stop backfill asks the server which backfill runs, then asks to stop
    it. Over a slow link the operator meanwhile opened another question (x on a job): the
    stop question came up on top of it, and the y meant for the job stopped the backfill.
    Now it asks nothing once another screen has come up, and says so."""
    clock = ManualClock(FROZEN)
    backend = Held(console_backend(store_url, clock), "running_backfills")
    async with console(store_url, backend=backend, clock=clock) as (app, pilot, clock, notes):
        await start_backfill(pilot, "slow-reindex", "-1m")
        await pilot.press("escape")
        await pilot.pause()
        [hit] = [hit async for hit in ConsoleCommands(app.screen).search("stop backfill")]
        backend.go.clear()  # the server has not answered yet
        await hit.command()
        await pilot.pause()
        await pilot.press("question_mark")  # another screen (a question, the help) comes up meanwhile
        await pilot.pause()
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        backend.go.set()
        await pilot.pause()
        await pilot.pause()
        assert app.screen is help_screen  # nothing on top of it to take its keys
        assert notes.titled("Stop backfill") == ["Not asked: another screen opened before the server answered. "
                                                 "Ask again to stop the backfill of slow-reindex."]
        await pilot.press("escape")
        await pilot.pause()
        await hit.command()  # asked again, nothing in between: the question
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and app.screen.action == "cancel_backfill"
        await pilot.press("y")
        await pilot.pause()
        await pilot.pause()
        assert await app.backend.running_backfills("slow-reindex") == []
        clock.advance(30)
        await settle(pilot)


@pytest.fixture
def server(tmp_path: Path) -> Any:
    write_schedules(tmp_path)
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", OPERATE)  # fmt: skip
    yield srv
    srv.stop()


async def test_a_remote_console_reopens_and_stops_a_backfill_another_client_started(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}) as other:
        started = await other.post("/inspect/schedules/slow/backfill",
                                   json={"from": "-30d", "to": "-1d", "confirm": True})  # 696 slots of 0.3 s each
        assert started.status_code == 202, started.text
        backfill_id = started.json()["id"]
    backend = RemoteBackend(server.url, OPERATE)
    app = SchedtuiApp(backend, refresh_interval=3600)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await select(pilot, "slow")
            await pilot.press("p")  # auto-refresh paused: the backfill's runs would keep it busy
            await pilot.press("b")
            await until(pilot, lambda: isinstance(app.screen, BackfillScreen))
            screen = app.screen
            assert isinstance(screen, BackfillScreen) and screen.state == "running"
            assert screen.progress is not None and screen.progress.id == backfill_id
            await pilot.press("s")
            await pilot.pause()
            assert isinstance(app.screen, Confirm)
            await pilot.press("y")
            await until(pilot, lambda: screen.progress is not None and screen.progress.state == "cancelled")
            assert await backend.running_backfills("slow") == []
    finally:
        await backend.close()


# ---------------------------------------------------------------------------------------
# items 7 and 8: what a backfill does to the live slots, and how it ended
# ---------------------------------------------------------------------------------------
async def test_the_plan_warns_of_the_live_slots_it_may_skip(store_url: str) -> None:
    async with console(store_url) as (app, pilot, clock, notes):
        await select(pilot, "slow-reindex")  # on_overlap skip; its runs took 15 s (14, seen in steps of 5)
        await pilot.press("b")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BackfillScreen)
        screen.query_one("#from", Input).value = "-1m"
        await settle(pilot)
        assert screen.plan is not None and screen.plan.run_seconds == 15 and screen.plan.live_slots == 9
        text = plain(screen.query_one("#plan"))
        assert "! may skip up to 9 live slots (on_overlap skip): due while it runs (about 1m 30s, 15s a run)" in text
        screen.action_start()
        await pilot.pause()
        question = app.screen
        assert isinstance(question, Confirm) and "Live slots: may skip up to 9 live slots" in question.text


async def quit_during_a_backfill(pilot: Any) -> str:
    """Start a backfill of slow-reindex over the last minute here, close its screen and
    press q: the backfill's id (the quit question is up)."""
    screen = await start_backfill(pilot, "slow-reindex", "-1m")
    assert screen.progress is not None
    await pilot.press("escape")
    await pilot.pause()
    await pilot.press("q")
    await pilot.pause()
    return screen.progress.id


async def test_stopping_a_backfill_and_quitting_records_how_it_really_ended(store_url: str) -> None:
    """q, then c (stop it and quit): the end in the audit log counts the run the quit
    interrupted, as the ledger does."""
    async with console(store_url) as (app, pilot, clock, notes):
        backfill_id = await quit_during_a_backfill(pilot)
        assert isinstance(app.screen, QuitPrompt)
        await pilot.press("c")
        await pilot.pause()
        await pilot.pause()
    store: Any = open_store(store_url)
    await store.open()
    try:
        entries = [e for e in await store.list_audit(limit=10) if e.detail and e.detail.get("backfill_id") == backfill_id]
        assert [e.action for e in entries] == ["schedule.backfill_end", "schedule.backfill_cancel", "schedule.backfill"]
        assert entries[0].detail == {"backfill_id": backfill_id, "state": "cancelled", "total": 6, "fired": 1,
                                     "succeeded": 0, "failed": 1, "not_fired": 5, "failed_by": {"interrupted": 1}}  # fmt: skip
    finally:
        await store.close()


async def test_the_quit_question_follows_the_backfill_while_it_is_open(store_url: str) -> None:
    """q asks with the backfill's count; its count moves on while the question is open (it
    said the count read when q was pressed), and a backfill that ends meanwhile is said to
    have ended (it was still said to run)."""
    async with console(store_url) as (app, pilot, clock, notes):
        backfill_id = await quit_during_a_backfill(pilot)
        prompt = app.screen
        assert isinstance(prompt, QuitPrompt)

        def fact() -> str:
            return " ".join(str(label.render()) for label in prompt.query(".fact"))

        assert "slow-reindex (0 of 6 fired" in fact() and "slow-reindex (0 of 6 fired" in prompt.text
        clock.advance(15)  # the first slot's run (14 s on this clock) ends; the next fires
        await until(pilot, lambda: "slow-reindex (0 of 6 fired" not in fact())
        assert isinstance(app.screen, QuitPrompt) and "of 6 fired" in fact() and fact() in prompt.text
        await app.backend.cancel_backfill(backfill_id)  # stopped elsewhere (the palette, the CLI)
        await until(pilot, lambda: not fact())
        assert str(prompt.query_one("#confirm-question").render()) == "Quit? The backfill started here has ended meanwhile."
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, QuitPrompt)
        clock.advance(30)  # the run in flight finishes
        await settle(pilot)


# ---------------------------------------------------------------------------------------
# item 3: a token the server refuses, or wants
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("token", "says"), [("not-the-token", "✗ token refused"), (None, "✗ no token sent")])
async def test_a_refused_or_missing_token_is_said_in_the_header_with_how_to_give_one(
    server: Server, token: str | None, says: str
) -> None:
    backend = RemoteBackend(server.url, token)
    clock = ManualClock("2026-03-02T08:00:00Z")
    app = SchedtuiApp(backend, clock)
    notes = Notes(app)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            header = app.query_one(ConsoleHeader)
            text = header_text(app)
            assert header.state == "refused" and says in text, text
            assert "restart with --token-file PATH or $SCHEDTUI_TOKEN" in text  # whole, at 80 columns
            assert "not connected" not in text
            everything = text + " ".join(message for _, message in notes.seen)
            assert "Authorization" not in everything and "Bearer" not in everything
            clock.advance(120)
            app.tick()
            await settle(pilot)
            assert says in header_text(app)  # it stays (not a toast), and nothing retries it
            assert app.link.retry_at is None
    finally:
        await backend.close()


def test_the_header_names_the_ways_the_console_takes_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from console.cli.parsing import parse_args

    (tmp_path / "token").write_text("from-the-file\n")
    args = parse_args(["console", "--url", "http://127.0.0.1:1", "--token-file", str(tmp_path / "token")])
    assert args.token == "from-the-file"
    monkeypatch.setenv("SCHEDTUI_TOKEN", "from-the-environment")
    assert parse_args(["console", "--url", "http://127.0.0.1:1"]).token == "from-the-environment"


# ---------------------------------------------------------------------------------------
# item 6: a server that dies and comes back
# ---------------------------------------------------------------------------------------
def retry_due(header: ConsoleHeader) -> datetime:
    """When the header's next retry is due (it has one: the server is lost)."""
    assert header.retry_at is not None
    return header.retry_at


async def test_a_dropped_stream_turns_the_header_at_once_and_a_restarted_server_is_found_within_5s(
    tmp_path: Path,
) -> None:
    write_schedules(tmp_path)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    server = start_server(tmp_path, "--schedules", "schedules", "--store", store, "--token", OPERATE)
    port = server.url.rsplit(":", 1)[1]
    clock = ManualClock("2026-03-02T08:00:00Z")  # every deadline (polls, retries) waits for the test
    # Each poll of the stopped server retries its reads (a tenth of the real waits: 0.17 s, not 1.7 s).
    backend = RemoteBackend(server.url, OPERATE, read_retries=(0.02, 0.05, 0.1))
    app = SchedtuiApp(backend, clock, refresh_interval=2)
    try:
        async with app.run_test(size=(120, 32)) as pilot:
            header = app.query_one(ConsoleHeader)
            # (the header says what the link knows once it has drawn it: a refresh after)
            await until(pilot, lambda: app.link.events_live and "● live (events)" in header_text(app))
            await asyncio.to_thread(server.stop)
            # The stream's end is the news: not a poll on the clock (which does not move).
            await until(pilot, lambda: header.state in ("dropped", "lost"))
            assert "● live" not in header_text(app)
            if header.state == "dropped":  # the server, asked at once, answered while it stopped
                assert "◌ event stream dropped" in header_text(app)
                clock.advance(2)  # the next poll finds it gone
                app.tick()
            await until(pilot, lambda: header.state == "lost")
            delays = [retry_due(header) - clock.now()]
            for _ in range(4):  # each retry due on the clock fails; the wait stops growing at 5 s
                clock.set(retry_due(header))
                failures = app.link.failures
                app.tick()
                await until(pilot, lambda f=failures: app.link.failures > f)
                delays.append(retry_due(header) - clock.now())
            assert [d.total_seconds() for d in delays] == [1, 2, 5, 5, 5]
            server = start_server(tmp_path, "--schedules", "schedules", "--store", store, "--token", OPERATE,
                                  "--port", port)  # fmt: skip
            clock.set(retry_due(header))  # at most 5 s after it came back
            app.tick()
            await until(pilot, lambda: header.state == "live")
            # its stream too, at once: the clock has not moved
            await until(pilot, lambda: app.link.events_live and "● live (events)" in header_text(app))
    finally:
        await backend.close()
        server.stop()


async def test_polls_the_server_does_not_answer_stop_the_header_saying_live(store_url: str) -> None:
    from tests.console_fixtures import console_backend

    clock = ManualClock("2026-03-02T08:00:05Z")
    backend = console_backend(store_url, clock)
    answer = asyncio.Event()
    answer.set()
    listing = backend.list_schedules

    async def slow() -> Any:
        await answer.wait()  # a server that died without a word: the request hangs
        return await listing()

    backend.list_schedules = slow  # type: ignore[method-assign]  # a server that stops answering
    async with console(store_url, backend=backend, clock=clock, live_events=False) as (app, pilot, _, notes):
        assert "● live (polling)" in header_text(app)
        answer.clear()
        clock.advance(1)
        app.tick()  # a poll is due: it hangs
        await pilot.pause()
        clock.advance(5)
        app.tick()
        await pilot.pause()
        assert "● live (polling)" in header_text(app)  # 6 s: within the refresh interval and 5 s
        clock.advance(2)
        app.tick()
        await pilot.pause()
        assert "● live" not in header_text(app) and "◌ waiting for the server" in header_text(app)
        answer.set()
        await settle(pilot)
        assert "● live (polling)" in header_text(app)
