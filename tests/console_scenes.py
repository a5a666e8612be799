"""The console's scenes, shared by the snapshot tests and the screenshots script.

Each scene is an app over a copy of the fixture ledger at the frozen instant, plus what to
do before the picture is taken. Apps close their backend on exit: ``snap_compare`` and the
screenshots script run each app on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Checkbox, Input
from textual.worker import WorkerCancelled

from backend import ManualClock, Unauthorized
from backend.model import BackfillProgress
from console.app import SchedtuiApp
from console.widgets.schedules import FreshTable
from tests.console_fixtures import (
    FROZEN,
    WHERE,
    FlakyBackend,
    add_jobs,
    add_locks,
    add_timeline_history,
    build_ledger,
    console_backend,
)
from tests.durable_scenes import add_durable_history
from tests.log_scenes import add_run_logs

RunBefore = Callable[[Pilot[Any]], Awaitable[None]]
SIZES = {"120x32": (120, 32), "80x24": (80, 24)}
OPERATOR_ZONE = "Europe/Berlin"
"""The operator's zone in every scene (not the machine's): times on screen are CET."""


def make_ledger(folder: Path) -> Path:
    """Build the fixture ledger once, with the timeline's hour of history; returns the
    folder holding ``state.db``."""
    folder.mkdir(parents=True, exist_ok=True)
    url = asyncio.run(build_ledger(folder))
    asyncio.run(add_timeline_history(url))
    asyncio.run(add_jobs(url))
    asyncio.run(add_locks(url))
    asyncio.run(add_durable_history(url))
    asyncio.run(add_alerts(url))
    asyncio.run(add_run_logs(url))
    return folder


#: Where the scenes' copies of the ledger go: one folder per process, removed when it exits
#: (each copy was left in the system's temporary folder, some 180 of them a suite run).
_COPIES: Path | None = None


def copy_ledger(ledger: Path) -> str:
    global _COPIES
    if _COPIES is None:
        _COPIES = Path(tempfile.mkdtemp(prefix="schedtui-scenes-"))
        atexit.register(shutil.rmtree, _COPIES, True)
    target = Path(tempfile.mkdtemp(prefix="scene-", dir=_COPIES))
    for file in ledger.glob("state.db*"):
        shutil.copy(file, target / file.name)
    return f"sqlite:///{target / 'state.db'}"


async def settle(pilot: Pilot[Any]) -> None:
    """Until the app has been quiet twice in a row: no worker running, no refresh under
    way (a loaded machine may start one a moment after the workers were waited for), no
    table with rows still to measure (a picture taken before would show narrow columns)."""
    quiet = 0
    for _ in range(50):
        for screen in pilot.app.screen_stack:  # a blinking cursor's phase would be in the picture
            for field in screen.query(Input):
                field.cursor_blink = False
        await pilot.pause()
        try:
            await pilot.app.workers.wait_for_complete()
        except WorkerCancelled:  # (an exclusive worker replaced by a newer one: wait for that)
            quiet = 0
            continue
        await pilot.pause()
        busy = (
            getattr(pilot.app, "_refreshing", False)
            or any(worker.state.name in ("PENDING", "RUNNING") for worker in pilot.app.workers)
            or any(table.measuring for screen in pilot.app.screen_stack for table in screen.query(FreshTable))
        )
        quiet = 0 if busy else quiet + 1
        if quiet >= 2:
            return


def _keys(*keys: str) -> RunBefore:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run_before


async def _selected(pilot: Pilot[Any], name: str) -> SchedtuiApp:
    """The app, settled, with the cursor on schedule ``name``."""
    await settle(pilot)
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    app.action_select(name)
    await settle(pilot)
    return app


def _select(name: str) -> RunBefore:
    async def run(pilot: Pilot[Any]) -> None:
        await _selected(pilot, name)

    return run


def _backfill(start: str, end: str = "now", confirm: str = "", skip: bool = False, name: str = "flaky-export") -> RunBefore:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = await _selected(pilot, name)
        await pilot.press("b")
        await settle(pilot)
        screen = app.screen
        screen.query_one("#from", Input).value = start
        screen.query_one("#to", Input).value = end
        await settle(pilot)
        if skip:
            screen.query_one("#skip", Checkbox).value = True
            await settle(pilot)
        if confirm:
            screen.query_one("#confirm", Input).value = confirm
            await settle(pilot)

    return run_before


def _new_schedule(cron: str, zone: str = "Europe/Berlin", payload: str = '{"older_than": "7d"}') -> RunBefore:
    """``n``, the form filled in as an operator would have typed it (the preview follows)."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)
        screen = pilot.app.screen
        for field, value in (("name", "reap-sessions"), ("cron", cron), ("zone", zone), ("target", "mailer"),
                             ("payload", payload), ("description", "Prunes expired sessions")):
            screen.query_one(f"#{field}", Input).value = value
        cron_field = screen.query_one("#cron", Input)
        cron_field.focus()
        await settle(pilot)
        cron_field.action_end()  # the cursor after what was typed (focus selected it all)
        await settle(pilot)

    return run_before


def _created() -> RunBefore:
    """The form filled in as for ``schedule-create``, then ``ctrl+s``: the notification says
    what was stored, field by field."""
    fill = _new_schedule("*/15 * * * *")

    async def run_before(pilot: Pilot[Any]) -> None:
        await fill(pilot)
        await pilot.press("ctrl+s")
        await settle(pilot)

    return run_before


async def _quit_during_backfill(pilot: Pilot[Any]) -> None:
    """``q`` while a backfill started here runs (embedded: quitting would abandon it)."""
    await settle(pilot)
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    at = app.clock.now()
    app.backfills["b1"] = BackfillProgress(id="b1", name="flaky-export", start=at, end=at, total=30, fired=12,
                                           failed=3, state="running", instance="console", started_at=at)
    await pilot.press("q")
    await settle(pilot)


async def _disconnected(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    backend = app.backend
    assert isinstance(backend, FlakyBackend)
    backend.down = True
    await pilot.press("ctrl+r")
    await settle(pilot)


class _Refusing(FlakyBackend):
    """A server that refuses the console's token: every call is a 401."""

    def _check(self) -> None:
        raise Unauthorized(f"{self.URL} refused the token given", token_sent=True)


async def _backfill_running(pilot: Pilot[Any]) -> None:
    """``b`` on a schedule whose backfill (started elsewhere) runs: its progress, and its stop."""
    await settle(pilot)
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    now = app.clock.now()  # slow-reindex's runs wait on the frozen clock: it stays running
    await app.backend.start_backfill("slow-reindex", now - timedelta(minutes=1), now)
    app.action_select("slow-reindex")
    await settle(pilot)
    await pilot.press("b")
    await settle(pilot)


async def _nothing_fires(pilot: Pilot[Any]) -> None:
    """90 s later, and no engine has sent a heartbeat: the fleet is silent, schedules overdue."""
    await settle(pilot)
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    assert isinstance(app.clock, ManualClock)
    app.clock.advance(90)
    app.on_signals([])  # the event stream's ping (it pinged all along, in real time)
    await pilot.press("ctrl+r")
    await settle(pilot)
    app.tick()
    await settle(pilot)


async def _run_log(pilot: Pilot[Any]) -> None:
    """``l`` on flaky-export's row: the log of its newest run (failed, more than a run keeps)."""
    await _selected(pilot, "flaky-export")
    await pilot.press("l")
    await settle(pilot)


async def _timeline(pilot: Pilot[Any]) -> None:
    """The timeline at one hour, the cursor on a failed cell of flaky-export."""
    await settle(pilot)
    for key in ("2", "plus", "plus", "down", "down"):
        await pilot.press(key)
        await settle(pilot)
    app = pilot.app
    assert isinstance(app, SchedtuiApp)
    from console.widgets import TimelineGrid

    grid = app.query_one(TimelineGrid)
    assert grid.window is not None
    from datetime import datetime

    grid.cursor_cell = grid.window.index(datetime.fromisoformat("2026-03-02T07:22:00+00:00"))
    grid.action_step(-1)
    grid.action_step(1)
    await settle(pilot)


SCENES: dict[str, tuple[dict[str, Any], RunBefore]] = {
    "main": ({}, _keys()),
    "timeline": ({}, _timeline),
    "jobs": ({}, _keys("3")),
    "job-details": ({}, _keys("3", "enter", "end", "enter")),
    "job-send": ({}, _keys("3", "n")),
    "durable": ({}, _keys("4")),
    "durable-steps": ({}, _keys("4", "down", "down", "down", "down", "down", "down", "down", "enter")),
    "durable-failed-only": ({}, _keys("4", "down", "down", "down", "down", "down", "down", "down", "enter", "f")),
    "durable-signal": ({}, _keys("4", "down", "down", "down", "down", "down", "down", "a", "o", "k")),
    "locks": ({}, _keys("5")),
    "confirm": ({}, _keys("5", "x")),
    "audit": ({}, _keys("6")),
    "audit-filter": ({}, _keys("6", "slash", "c", "a", "r", "o", "l", "enter", "down")),
    "health": ({}, _keys("7")),
    "health-no-color": ({"no_color": True}, _keys("7")),
    "audit-entry": ({}, _keys("6", "down", "down", "enter")),
    "durable-cancelled": ({}, _keys("4", "down", "down", "down", "down", "down", "enter")),
    "command-line": ({}, _keys("colon", "l", "o")),
    "read-only-locks": ({"read_only": True}, _keys("5")),
    "schedule-create": ({}, _new_schedule("*/15 * * * *")),
    "schedule-create-error": ({}, _new_schedule("0 25 * * *")),
    "schedule-created": ({}, _created()),
    "quit-backfill": ({}, _quit_during_backfill),
    "backfill-ok": ({}, _backfill("-1m")),
    "backfill-confirm": ({}, _backfill("2026-03-02T07:50:00Z", "2026-03-02T07:55:00Z", confirm="29")),
    "backfill-refused": ({}, _backfill("-1h", "+1h")),
    "backfill-live-slots": ({}, _backfill("-1m", name="slow-reindex")),
    "backfill-running": ({}, _backfill_running),
    "token-refused": ({"refused": True}, _keys()),
    "read-only": ({"read_only": True}, _keys()),
    "disconnected": ({"flaky": True}, _disconnected),
    "nothing-fires": ({}, _nothing_fires),
    "no-color": ({"no_color": True}, _keys()),
    "help": ({}, _keys("question_mark")),
    "alerting": ({"alerts": True}, _keys()),
    "run-log": ({}, _run_log),
    "run-log-no-color": ({"no_color": True}, _run_log),
    "clock-off": ({"clock_off": True}, _keys("7")),
    "schedule-not-valid-here": ({"foreign_row": True}, _select("weekly-archive")),
}
"""name -> (options, what to do before the picture)."""


async def add_alerts(url: str) -> None:
    """Two alerts firing (as an evaluating ``serve`` would have written them)."""
    from datetime import datetime, timedelta

    from backend.alerts.model import Alert
    from backend.alerts.store import Transition
    from backend.store import open_store

    store: Any = open_store(url)
    await store.open()
    at = datetime.fromisoformat(FROZEN.replace("Z", "+00:00"))
    firing = [
        Alert("failing:flaky-export", "failing", "schedule", "flaky-export", "firing", at - timedelta(minutes=3),
              "the newest run failed (slot 2026-03-02T07:59:50Z): [ExportError] upstream 503", at, "01KJPS22WGWA546BHC0B9HDTB1"),
        Alert("dead_jobs:mailer", "dead_jobs", "queue", "mailer", "firing", at - timedelta(minutes=1),
              "1 job died within 1h, the newest at 2026-03-02T07:59:04Z; 1 dead in all", at, "01KJPS22WGWA546BHC0B9HDTB2"),
    ]  # fmt: skip
    await store.write_transitions([Transition(alert, "{}") for alert in firing], sinks_after=at)
    await store.close()


async def add_clock_off(url: str) -> None:
    """A PostgreSQL fleet's heartbeat rows: web-2's clock agrees with the database server's,
    web-3's is a minute behind it, so it stands down (as its heartbeat says)."""
    from datetime import datetime

    from backend.store import Membership, open_store

    store: Any = open_store(url)
    await store.open()
    at = datetime.fromisoformat(FROZEN.replace("Z", "+00:00"))
    await store.heartbeat("web-2", "web-2.internal", 4242, at, Membership("firing", "advisoryLock", at, 0.004))
    behind = timedelta(seconds=61.24)  # (its stamps are its clock's: a minute behind)
    await store.heartbeat("web-3", "web-3.internal", 977, at - timedelta(seconds=2) - behind,
                          Membership("firing", "advisoryLock", at, -61.24, True))  # fmt: skip
    await store.close()


async def add_foreign_row(url: str) -> None:
    """A stored schedule as a newer release wrote it: a 14-day watchdog, past this
    release's bound of 7 days (not valid here)."""
    from datetime import datetime

    from backend.scheduler.stored import StoredSchedule, check_spec
    from backend.store import open_store

    store: Any = open_store(url)
    await store.open()
    at = datetime.fromisoformat(FROZEN.replace("Z", "+00:00")) - timedelta(hours=2)
    spec = check_spec({"name": "weekly-archive", "cron": "0 3 * * 0", "timezone": "Europe/Berlin", "queue": "mailer",
                       "description": "Archives last week's exports"})
    row = StoredSchedule(**{**spec, "max_runtime": 14 * 86400.0}, created_at=at, created_by="deploy@web-9",
                         updated_at=at, updated_by="deploy@web-9")  # fmt: skip
    assert await store.create_stored_schedule(row)
    await store.close()


def scene_app(ledger: Path, name: str) -> tuple[SchedtuiApp, RunBefore]:
    options, run_before = SCENES[name]
    url = copy_ledger(ledger)
    if options.get("alerts"):
        asyncio.run(add_alerts(url))
    if options.get("clock_off"):
        asyncio.run(add_clock_off(url))
    if options.get("foreign_row"):
        asyncio.run(add_foreign_row(url))
    clock = ManualClock(FROZEN)
    read_only = bool(options.get("read_only"))
    backend: Any = console_backend(url, clock, read_only=read_only)
    where = WHERE
    if options.get("flaky"):
        backend = FlakyBackend(backend)
        where = FlakyBackend.URL
    if options.get("refused"):
        backend = _Refusing(backend)
        where = FlakyBackend.URL
    if options.get("no_color"):
        os.environ["NO_COLOR"] = "1"  # Textual reads it when the app is made
    try:
        app = SchedtuiApp(backend, clock, where=where, read_only=read_only, close_backend_on_exit=True,
                          operator_zone=OPERATOR_ZONE)
    finally:
        if options.get("no_color"):
            del os.environ["NO_COLOR"]
    return app, run_before
