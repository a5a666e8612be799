"""The console's scenes, shared by the snapshot tests and the screenshots script.

Each scene is an app over a copy of the fixture ledger at the frozen instant, plus what to
do before the picture is taken. Apps close their backend on exit: ``snap_compare`` and the
screenshots script run each app on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from backend import ManualClock
from console.app import SchedtuiApp
from tests.console_fixtures import (
    FROZEN,
    WHERE,
    FlakyBackend,
    build_ledger,
    console_backend,
)

RunBefore = Callable[[Pilot[Any]], Awaitable[None]]
SIZES = {"100x30": (100, 30), "80x24": (80, 24)}


def make_ledger(folder: Path) -> Path:
    """Build the fixture ledger once; returns the folder holding ``state.db``."""
    folder.mkdir(parents=True, exist_ok=True)
    asyncio.run(build_ledger(folder))
    return folder


def copy_ledger(ledger: Path) -> str:
    target = Path(tempfile.mkdtemp(prefix="schedtui-scene-"))
    for file in ledger.glob("state.db*"):
        shutil.copy(file, target / file.name)
    return f"sqlite:///{target / 'state.db'}"


async def settle(pilot: Pilot[Any]) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def _backfill(start: str, end: str = "now", confirm: str = "") -> RunBefore:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        app = pilot.app
        assert isinstance(app, SchedtuiApp)
        app.action_select("heartbeat")
        await settle(pilot)
        await pilot.press("b")
        await settle(pilot)
        screen = app.screen
        screen.query_one("#from").value = start  # type: ignore[attr-defined]
        screen.query_one("#to").value = end  # type: ignore[attr-defined]
        await settle(pilot)
        if confirm:
            screen.query_one("#confirm").value = confirm  # type: ignore[attr-defined]
            await settle(pilot)

    return run_before


async def _main(pilot: Pilot[Any]) -> None:
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


async def _help(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    await pilot.press("question_mark")
    await settle(pilot)


SCENES: dict[str, tuple[dict[str, Any], RunBefore]] = {
    "main": ({}, _main),
    "backfill-ok": ({}, _backfill("-1m")),
    "backfill-confirm": ({}, _backfill("-10m", confirm="60")),
    "backfill-refused": ({}, _backfill("-1h", "+1h")),
    "read-only": ({"read_only": True}, _main),
    "disconnected": ({"flaky": True}, _disconnected),
    "help": ({}, _help),
}
"""name -> (options, what to do before the picture)."""


def scene_app(ledger: Path, name: str) -> tuple[SchedtuiApp, RunBefore]:
    options, run_before = SCENES[name]
    url = copy_ledger(ledger)
    clock = ManualClock(FROZEN)
    read_only = bool(options.get("read_only"))
    backend: Any = console_backend(url, clock, read_only=read_only)
    where = WHERE
    if options.get("flaky"):
        backend = FlakyBackend(backend)
        where = FlakyBackend.URL
    app = SchedtuiApp(backend, clock, where=where, read_only=read_only, close_backend_on_exit=True)
    return app, run_before
