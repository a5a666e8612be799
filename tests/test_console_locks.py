"""The console's Locks view (key 5) under Pilot, on the fixture ledger at the frozen time,
and the header's owned counts in ``cluster`` coordination."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from backend.client.interface import ConnectionInfo
from backend.locks import LockStore
from backend.model import InstanceInfo, ScheduleView
from backend.store import open_store
from console.fleet import fleet_of
from console.screens.confirm import Confirm
from console.views.locks import LocksTable
from console.widgets import ConsoleHeader
from tests.console_fixtures import add_locks
from tests.test_console import console, ledger, settle, store_url  # noqa: F401 - fixtures

UTC = UTC


def cells(app: Any, name: str) -> list[str]:
    table = app.query_one(LocksTable)
    return [table.get_cell(name, key).plain for key, _, _ in table.COLUMNS]


async def holder_of(url: str, name: str) -> str | None:
    store = open_store(url)
    await store.open()
    try:
        lock = await cast(LockStore, store).get_lock(name)
        assert lock is not None
        return lock.holder
    finally:
        await store.close()


async def test_the_locks_view_shows_holders_tokens_and_expiries_counting_down(store_url: str) -> None:  # noqa: F811
    await add_locks(store_url)
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("5")
        await settle(pilot)
        assert app.active_view_id == "locks"
        assert list(app.query_one(LocksTable).locks) == ["nightly-rollup", "partner-sync", "reindex"]
        held = cells(app, "nightly-rollup")
        assert held[:2] == ["nightly-rollup", "web-2:77 (rollup)"] and held[3:] == ["● held", "in 58s", "2s ago"]
        assert cells(app, "partner-sync")[3:] == ["⚠ expired", "expired 1m 5s ago", "1m 35s ago"]
        assert cells(app, "reindex")[1] == "-" and cells(app, "reindex")[3:] == ["○ free", "released 18m ago", "-"]
        tokens = [int(cells(app, name)[2]) for name in ("nightly-rollup", "partner-sync", "reindex")]
        assert len(set(tokens)) == 3
        clock.advance(5)
        app.tick()  # countdowns and ages move with the clock, between refreshes
        assert cells(app, "nightly-rollup")[4:] == ["in 53s", "7s ago"]
        assert notes.seen == []


async def test_an_expiry_phrase_always_fits_its_column_whole(store_url: str) -> None:  # noqa: F811
    """Two units while they fit the EXPIRES column, else the larger one alone: the table
    cut 'released 18m 17s ago' to 'released 18m 17s a'."""
    await add_locks(store_url)
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        await pilot.press("5")
        await settle(pilot)
        table = app.query_one(LocksTable)
        width = dict((key, width) for key, _, width in LocksTable.COLUMNS)["expires"]
        seen = []
        for step in (17, 9 * 60 + 4, 3600 + 37, 2 * 86400 + 3600 * 5):
            clock.advance(step)
            app.tick()
            await pilot.pause()
            for name in ("partner-sync", "reindex"):
                phrase = cells(app, name)[4]
                assert len(phrase) <= width and phrase.endswith(" ago"), phrase
                seen.append(phrase)
        assert seen[:4] == ["expired 1m 22s ago", "released 18m ago", "expired 10m ago", "released 27m ago"]
        assert table.row_count == 3


async def test_x_asks_then_releases_the_selected_lock_by_force(store_url: str) -> None:  # noqa: F811
    await add_locks(store_url)
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("5")
        await settle(pilot)
        await pilot.press("x")  # the cursor is on the first lock, nightly-rollup
        await settle(pilot)
        assert isinstance(app.screen, Confirm)
        await pilot.press("n")  # no: nothing happens
        await settle(pilot)
        assert await holder_of(store_url, "nightly-rollup") == "web-2:77 (rollup)"
        await pilot.press("x")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
        assert await holder_of(store_url, "nightly-rollup") is None
        [message] = notes.titled("Lock released")
        assert message.startswith('Lock "nightly-rollup" released (was held by web-2:77 (rollup), token ')
        assert cells(app, "nightly-rollup")[3] == "○ free"
        await pilot.press("down", "down")
        await pilot.press("x")  # reindex is free: nothing to release, no question
        await settle(pilot)
        assert not isinstance(app.screen, Confirm)
        assert notes.titled("Release") == ['Lock "reindex" is not held; nothing to release.']


async def test_x_in_read_only_says_why_and_releases_nothing(store_url: str) -> None:  # noqa: F811
    await add_locks(store_url)
    async with console(store_url, read_only=True) as (app, pilot, clock, notes):
        await pilot.press("5")
        await settle(pilot)
        await pilot.press("x")
        await settle(pilot)
        assert not isinstance(app.screen, Confirm)
        assert notes.titled("Read-only") == ["Release does nothing here: the console was started with --read-only."]
    assert await holder_of(store_url, "nightly-rollup") == "web-2:77 (rollup)"


def test_in_cluster_mode_the_header_says_how_many_schedules_each_instance_owns() -> None:
    now = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)

    def view(name: str, owner: str | None) -> ScheduleView:
        return ScheduleView(name, "* * * * *", "UTC", "self", "skip", "skip", 60.0, None, None, True, None, None, None,
                            owner=owner, sharded=True)  # fmt: skip

    views = [view("a", "web-1"), view("b", "web-1"), view("c", "web-2"), view("d", None)]
    beats = [InstanceInfo(name, "host", 1, now - timedelta(seconds=2)) for name in ("web-1", "web-2")]
    info = ConnectionInfo("remote", "http://x", "cluster", "web-1", False)
    fleet = fleet_of(beats, now, info, views)
    assert fleet.owned == {"web-1": 2, "web-2": 1}
    text = ConsoleHeader._fleet(fleet)
    assert "web-1 ◈2, web-2 ◈1" in text
    plain = ScheduleView("a", "* * * * *", "UTC", "self", "skip", "skip", 60.0, None, None, True, None, None, None)
    assert fleet_of(beats, now, info, [plain]).owned is None  # not in the other modes


async def test_x_confirmed_after_the_lock_changed_hands_releases_nothing_and_says_so(store_url: str) -> None:  # noqa: F811
    """The question names a holder and a token; by the time of ``y`` another run took the
    lock (a new token). The release refuses (the lease confirmed is gone), never cutting
    the new holder's."""
    await add_locks(store_url)
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("5")
        await settle(pilot)
        await pilot.press("x")  # nightly-rollup, held by web-2:77 (rollup)
        await settle(pilot)
        assert isinstance(app.screen, Confirm)
        locks = cast(Any, app.backend).engine.locks
        await locks.release("nightly-rollup")  # meanwhile: freed, and taken by the next run
        taken = await locks.acquire("nightly-rollup", ttl=300, holder="web-3:12 (rollup)")
        assert taken is not None
        await pilot.press("y")
        await settle(pilot)
        assert await holder_of(store_url, "nightly-rollup") == "web-3:12 (rollup)"
        assert notes.titled("Lock released") == []
        assert notes.titled("Refused") == [f'lock "nightly-rollup" is held by web-3:12 (rollup) (token {taken.token}) '
                                           "now, no longer token 1: nothing was released; look again"]
        await taken.release()


async def test_a_holder_name_is_drawn_escaped_never_as_a_terminal_command(store_url: str) -> None:  # noqa: F811
    """A holder an older release stored with an escape sequence and a bidirectional override
    (written here by the store, past the engine's check): the Locks view and its release
    question show them as escapes; drawn as they are, they reach the operator's terminal."""
    frozen = datetime.fromisoformat("2026-03-02T08:00:00+00:00")
    store: Any = open_store(store_url)
    await store.open()
    await store.acquire_lock("evil", "x\x1b]0;pwned\x07\u202eabc", timedelta(hours=1), frozen)
    await store.close()
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("5")
        await settle(pilot)
        assert cells(app, "evil")[1].startswith("x\\x1b]0;pwned\\x07")
        assert not any(c in "".join(cells(app, "evil")) for c in "\x1b\x07\u202e")
        app.query_one(LocksTable).move_cursor(row=list(app.query_one(LocksTable).locks).index("evil"))
        await pilot.press("x")
        await settle(pilot)
        question = app.screen
        assert isinstance(question, Confirm)
        shown = " ".join(str(fact) for fact in question.facts)
        assert "x\\x1b]0;pwned\\x07\\u202eabc" in shown and "\x1b" not in shown and "\u202e" not in shown
