"""What the console does to schedules: run now, enable and disable, backfill and stop one,
and quitting while a backfill started here runs (a part of :class:`~console.app.SchedtuiApp`:
the keys run on the schedules and the timeline alike, on the schedule selected).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from textual.app import App

from backend.client.interface import Backend, ConnectionInfo
from backend.clock import Clock
from backend.errors import NotFound, SchedtuiError
from backend.model import BackfillProgress, Run, ScheduleView, StateNote
from backend.safetext import in_line
from console import format as fmt
from console.screens.backfill import BackfillScreen
from console.screens.confirm import Confirm
from console.screens.prompt import NotePrompt
from console.screens.quit import QuitPrompt
from console.views.schedules import SchedulesView
from console.workers import work

if TYPE_CHECKING:
    from console.views import View

__all__ = ["ScheduleActions"]


class ScheduleActions(App[None]):
    """The actions on the selected schedule (see the module docstring): a part of the app,
    which sets up what is declared here (:meth:`SchedtuiApp.__init__` calls :meth:`_init_actions`)."""

    backend: Backend
    clock: Clock
    info: ConnectionInfo | None
    views: list[ScheduleView]
    read_only: bool
    backfills: dict[str, BackfillProgress]
    """Backfills started from this console that are still running."""
    _toggling: dict[str, tuple[int, bool]]
    """Per schedule, the last enable or disable sent and not answered yet (a number and
    the state it sets): ``e`` pressed again meanwhile toggles from that state, and the
    writes of one schedule go one after another, in the order pressed."""

    def _init_actions(self) -> None:
        self.backfills = {}
        self._toggling = {}
        self._toggles = itertools.count()
        self._toggle_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    if TYPE_CHECKING:  # the app's

        @property
        def active_view(self) -> View: ...

        def view_widget(self, view_id: str) -> View: ...

        def backend_now(self) -> datetime: ...

        def request_refresh(self) -> None: ...

        def report(self, exc: BaseException) -> None: ...

        def _target(self, action: str) -> ScheduleView | None: ...

        def _read_only_reason(self) -> str | None: ...

    def action_run_now(self) -> None:
        """``r``: fire the selected schedule once, now; no dialog."""
        view = self._target("Run now")
        if view is not None:
            self._run_now(view.name)

    @work(group="action")
    async def _run_now(self, name: str) -> None:
        try:
            run = await self.backend.run_now(name)
        except SchedtuiError as exc:
            self.report(exc)
            return
        self.notify(f"{name}: run {run.id}", title="Run now: fired")
        self.views = [replace(v, latest_manual=run) if v.name == name else v for v in self.views]
        self.active_view.show()
        schedules = self.view_widget("schedules")
        if isinstance(schedules, SchedulesView):
            schedules.show_new_run(run)
        self._follow_run(run, name)
        self.request_refresh()

    @work(group="follow")
    async def _follow_run(self, run: Run, name: str) -> None:
        try:
            final = await self.backend.wait_run(run.id)
        except SchedtuiError as exc:
            self.report(exc)
            return
        glyph = fmt.STATUS_GLYPHS.get(final.status, "?")
        detail = f" [{final.error_tag}] {in_line(final.error_message or '')}" if final.error_tag else ""  # (as the runs show it)
        self.notify(
            f"{name}: run {final.id} {glyph} {final.status} in {fmt.duration(final.duration_ms)}{detail}",
            title="Run finished",
            severity="information" if final.status == "succeeded" else "warning",
            markup=False,
        )
        self.request_refresh()

    def action_toggle_enabled(self) -> None:
        """``e``: enable or disable; disabling asks for an optional note (Enter skips it)."""
        view = self._target("Enable/disable")
        if view is None:
            return
        pending = self._toggling.get(view.name)
        if not (pending[1] if pending is not None else view.enabled):
            self._set_enabled(view.name, True, None, clears=view.state_note)
            return

        def disable(note: str | None) -> None:
            if note is not None:
                self._set_enabled(view.name, False, note or None)

        self.push_screen(NotePrompt(view.name), disable)

    def _set_enabled(self, name: str, enabled: bool, note: str | None, *, clears: StateNote | None = None) -> None:
        mine = (next(self._toggles), enabled)
        self._toggling[name] = mine
        self._send_enabled(name, mine, note, clears)

    @work(group="action")
    async def _send_enabled(self, name: str, mine: tuple[int, bool], note: str | None, clears: StateNote | None) -> None:
        enabled = mine[1]
        try:
            async with self._toggle_locks[name]:  # (first come, first served: in the order pressed)
                view = await self.backend.set_enabled(name, enabled, note=note)
        except SchedtuiError as exc:
            self.report(exc)
            return
        finally:
            if self._toggling.get(name) == mine:
                del self._toggling[name]
        if view.enabled:
            nxt = f"; next fire {fmt.countdown(view.next_fire_at, self.clock.now())}" if view.next_fire_at else ""
            cleared = ""
            if clears is not None and clears.note:  # the note said why it was off: say it is gone
                cleared = f"; note cleared: “{fmt.cut(clears.note, fmt.NOTE_CHARS)}” ({clears.by}, {fmt.ago(clears.at, self.clock.now())})"
            self.notify(f"{name} enabled{cleared}{nxt}", title="Enabled", markup=False)
        else:
            # (A note of 1,000 characters in full made a toast taller than the screen: its title cut off.)
            self.notify(f"{name} disabled" + (f": {fmt.cut(note, fmt.NOTE_CHARS)}" if note else ""), title="Disabled", markup=False)
        self.views = [view if v.name == name else v for v in self.views]
        self.active_view.show()
        self.request_refresh()

    def action_backfill(self) -> None:
        """``b``: the backfill dialog for the selected schedule; while a backfill of it runs
        (started here or anywhere), that one's progress, where ``s`` stops it."""
        view = self._target("Backfill")
        if view is not None:
            self._open_backfill(view)

    async def _running_backfill(self, name: str) -> BackfillProgress | None:
        """The backfill running for schedule ``name`` on any instance, if any."""
        started_here = [p for p in self.backfills.values() if p.name == name and p.state == "running"]
        try:
            running = await self.backend.running_backfills(name)
        except NotFound:  # a server older than this console: it cannot say
            return started_here[0] if started_here else None
        return running[0] if running else None

    def _open_backfill(self, view: ScheduleView) -> None:
        """The dialog at once (the keys typed next go to it), which then asks whether a
        backfill of the schedule runs already, and shows that one if so."""

        def started(progress: BackfillProgress) -> None:
            self.backfills[progress.id] = progress
            self._backfills_moved()

        def finished(progress: BackfillProgress) -> None:
            self.backfills.pop(progress.id, None)
            self._backfills_moved()
            self.notify(
                f"{progress.name}: {progress.fired} fired, {progress.succeeded} succeeded, "
                f"{progress.failed} failed, {progress.remaining} not fired ({progress.state})",
                title="Backfill finished" if progress.state == "done" else f"Backfill {progress.state}",
                severity="information" if progress.state == "done" and not progress.failed else "warning",
            )
            self.request_refresh()

        def look() -> Awaitable[BackfillProgress | None]:
            return self._running_backfill(view.name)

        self.push_screen(
            BackfillScreen(self.backend, view, self.backend_now, on_started=started, on_finished=finished, look=look)
        )

    def action_stop_backfill(self) -> None:
        """The palette's "Stop backfill": stop the backfill running for the selected
        schedule, wherever it runs, once the operator says yes (``cancel_backfill``'s question)."""
        view = self._target("Stop backfill")
        if view is None:
            return
        if self.read_only:
            self.notify(f"Stop backfill does nothing here: {self._read_only_reason()}.", title="Read-only",
                        severity="warning")  # fmt: skip
            return
        self._stop_backfill(view, self.screen, len(self.screen_stack))

    @work(group="backfill-open", exclusive=True)
    async def _stop_backfill(self, view: ScheduleView, screen: object, depth: int) -> None:
        try:
            progress = await self._running_backfill(view.name)
        except SchedtuiError as exc:
            self.report(exc)
            return
        if self.screen is not screen or len(self.screen_stack) != depth:
            # Another screen came up meanwhile (a slow server): asked now, this question
            # would land on top of it, where a y meant for its question would stop the backfill.
            self.notify(f"Not asked: another screen opened before the server answered. Ask again to stop the backfill "
                        f"of {view.name}.", title="Stop backfill", severity="warning", markup=False)  # fmt: skip
            return
        if progress is None:
            self.notify(f"No backfill of {view.name} is running.", title="Stop backfill", severity="warning")
            return
        zone = view.timezone
        facts = [f"{progress.name}: {progress.fired} of {progress.total} fired, {progress.failed} failed, "
                 f"{progress.remaining} to go, in ({fmt.local_time(progress.start, zone)} … "
                 f"{fmt.local_time(progress.end, zone)}], on {progress.instance}."]  # fmt: skip

        def answer(yes: bool | None) -> None:
            if yes:
                self._cancel_backfill(progress.id)

        self.push_screen(Confirm.of("cancel_backfill", {"backfill_id": progress.id}, facts=facts), answer)

    @work(group="action")
    async def _cancel_backfill(self, backfill_id: str) -> None:
        try:
            progress = await self.backend.cancel_backfill(backfill_id)
        except SchedtuiError as exc:
            self.report(exc)
            return
        self.notify(f"{progress.name}: {progress.fired} fired, {progress.failed} failed, {progress.remaining} not fired "
                    f"({progress.state}; a run in flight finishes on its own)", title="Backfill stopped")  # fmt: skip
        self.request_refresh()

    def _running_here(self) -> list[BackfillProgress]:
        """The backfills started from this console that still run, as last read."""
        return [p for p in self.backfills.values() if p.state == "running"]

    def _backfills_moved(self) -> None:
        """A backfill started here moved on or ended: an open quit question says so."""
        for screen in self.screen_stack:
            if isinstance(screen, QuitPrompt):
                screen.show(self._running_here())

    async def action_quit(self) -> None:
        """``q``: quit; asks first while a backfill started here is running."""
        running = self._running_here()
        if not running:
            self.exit()
            return
        embedded = self.info is not None and self.info.kind == "embedded"

        def answer(choice: str | None) -> None:
            if choice == "quit":
                self.exit()
            elif choice == "cancel":
                self._cancel_backfills_and_quit(self._running_here())  # those running now, not when asked

        self.push_screen(QuitPrompt(running, embedded=embedded), answer)

    @work(group="action")
    async def _cancel_backfills_and_quit(self, running: list[BackfillProgress]) -> None:
        for progress in running:
            try:
                await self.backend.cancel_backfill(progress.id)
            except SchedtuiError as exc:
                self.report(exc)
                return
        self.exit()

