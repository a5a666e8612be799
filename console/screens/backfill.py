"""``b``: the range backfill dialog: a live plan (frozen to absolute times once shown), the
slots that already succeeded (skippable), what it may do to the live slots, a typed
confirmation, progress, and a stop that asks. On a schedule whose backfill runs (started
here or anywhere else), ``b`` reopens that backfill's progress instead."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Literal

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.css.query import NoMatches
from textual.markup import escape
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, ProgressBar, Static

from backend.client.interface import Backend
from backend.errors import BadInput, SchedtuiError, Unavailable
from backend.model import (
    BACKFILL_CONFIRM_ABOVE,
    BackfillPlan,
    BackfillProgress,
    ScheduleView,
)
from backend.timeparse import parse_when
from console import format as fmt
from console.screens.confirm import Confirm
from console.widgets.bounded import LINE_CHARS, NUMBER_CHARS, BoundedInput
from console.widgets.button import PressButton
from console.widgets.tickbox import TickBox
from console.workers import work

__all__ = ["BackfillScreen", "PlanState"]

PlanState = Literal["planning", "invalid", "ok", "confirm", "refused", "running", "done"]

POLL_SECONDS = 0.2
"""How often the progress is read while a backfill runs (display only)."""


class BackfillScreen(ModalScreen[None]):
    """From/to fields (ISO 8601, a date, ``now``, or ``-2d``/``-6h``), read in the schedule's
    zone; as the operator types, the plan: how many slots, the first and the last, how many
    already succeeded (a checkbox skips them), and, where it would be refused, why. The
    plan's range is absolute: ``now`` and ``-1h`` are read once, when the plan is shown, and
    the backfill fires exactly that range. Above 25 slots the count must be typed to
    confirm (a wrong count says why); then Backfill asks the console's one question (``y``
    starts it). Cancel has the focus; Esc cancels. Once started, a progress bar with a
    Stop button (``s``; it asks, in the words ``cancel_backfill`` declares) until done,
    then a summary. Given ``running``, a backfill of the schedule that already runs, it
    shows that one's progress (and its stop) instead of a plan."""

    DEFAULT_CSS = """
    BackfillScreen {
        align: center middle;
    }
    BackfillScreen > Vertical {
        width: 76;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    BackfillScreen .field {
        height: 1;
        margin-bottom: 1;
    }
    BackfillScreen .field Label {
        width: 9;
        padding: 0;
    }
    BackfillScreen Input {
        border: none;
        height: 1;
        width: 1fr;
        padding: 0 1;
        background: $boost;
    }
    BackfillScreen Input:focus {
        border: none;
        background: $primary 30%;
    }
    BackfillScreen .hint {
        color: $text-muted;
        width: 1fr;
        margin-bottom: 1;
    }
    BackfillScreen #plan {
        height: auto;
        min-height: 2;
        margin-bottom: 1;
    }
    BackfillScreen #confirm-row, BackfillScreen #skip {
        display: none;
    }
    BackfillScreen.-confirm #confirm-row, BackfillScreen.-succeeded #skip {
        display: block;
    }
    BackfillScreen #skip {
        border: none;
        padding: 0;
        margin-bottom: 1;
        height: 1;
        background: $surface;
    }
    BackfillScreen #confirm-hint {
        color: $text-warning;
        height: auto;
    }
    BackfillScreen #progress-box {
        display: none;
        height: auto;
        margin-bottom: 1;
    }
    BackfillScreen.-running #progress-box, BackfillScreen.-done #progress-box {
        display: block;
    }
    BackfillScreen.-running .form, BackfillScreen.-done .form {
        display: none;
    }
    BackfillScreen #stop {
        display: none;
    }
    BackfillScreen.-running #stop {
        display: block;
    }
    BackfillScreen #buttons {
        height: auto;
        align-horizontal: right;
    }
    BackfillScreen Button {
        min-width: 12;
        margin-left: 2;
    }
    BackfillScreen Button:focus {
        text-style: bold reverse;
    }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="close_backfill"),
        Binding("s", "stop", "Stop backfill", id="cancel_backfill"),
    ]
    AUTO_FOCUS = "#cancel"

    state: reactive[PlanState] = reactive("planning")
    """Where the dialog is: planning, invalid input, ok, needs confirmation, refused, running, done."""

    def __init__(
        self,
        backend: Backend,
        view: ScheduleView,
        now: Callable[[], datetime],
        *,
        start: str = "-1h",
        end: str = "now",
        on_started: Callable[[BackfillProgress], None] | None = None,
        on_finished: Callable[[BackfillProgress], None] | None = None,
        running: BackfillProgress | None = None,
        look: Callable[[], Awaitable[BackfillProgress | None]] | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.view = view
        """The schedule to backfill."""
        self.now = now
        """The backend's idea of now (relative times are read against it)."""
        self.initial = (start, end)
        self.plan: BackfillPlan | None = None
        """The latest plan for the fields as typed: its ``start``/``end`` are what fires."""
        self.progress: BackfillProgress | None = None
        """The running backfill, once confirmed."""
        self.on_started = on_started
        """Called with the progress when it starts and at every poll while it runs."""
        self.on_finished = on_finished
        self.running = running
        """A backfill of the schedule that was running when the dialog opened: shown, not planned."""
        self.look = look
        """Asks whether a backfill of the schedule runs (anywhere), once the dialog is open:
        until it answers nothing is planned, and if one runs it is shown instead. (Asked
        before opening it, over a slow link the keys typed after ``b`` reached the view
        under it, and the dialog opened late over whatever was on screen then.)"""
        self._polling = False

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as box:
            box.border_title = f"Backfill {self.view.name}"
            box.border_subtitle = "tab moves · esc cancels"
            yield Label(
                f"Fires every slot in (from, to] in order, as manual runs. Times without an offset are "
                f"read in {self.view.timezone}; also now, -6h, -2d.",
                classes="hint form",
            )
            with Horizontal(classes="field form"):
                yield Label("From")
                yield BoundedInput(self.initial[0], id="from", limit=LINE_CHARS, unit="characters", what="From")
            with Horizontal(classes="field form"):
                yield Label("To")
                yield BoundedInput(self.initial[1], id="to", limit=LINE_CHARS, unit="characters", what="To")
            yield Static(id="plan", classes="form")
            yield TickBox("Skip the slots that already succeeded", id="skip", classes="form", compact=True)
            with Horizontal(classes="field form", id="confirm-row"):
                yield Label("Confirm")
                yield BoundedInput(placeholder="type the slot count", id="confirm", restrict=r"[0-9,]*", restrict_says="digits",
                                   limit=NUMBER_CHARS, unit="characters", what="The count")
            yield Static("", id="confirm-hint", classes="form")
            with Vertical(id="progress-box"):
                yield ProgressBar(total=1, show_eta=False, id="bar")
                yield Static(id="counts")
            with Horizontal(id="buttons"):
                yield PressButton("Cancel", id="cancel", compact=True)
                yield PressButton("Stop backfill", id="stop", variant="error", compact=True)
                yield PressButton("Backfill", id="start", variant="warning", disabled=True, compact=True)

    def on_mount(self) -> None:
        if self.running is not None:
            self._show_running(self.running)
        elif self.look is not None:
            self._show_plan(Content.styled("looking for a backfill of it that runs already…", "$text-muted"))
            self._look(self.look)
        else:
            self.replan()

    def _show_running(self, running: BackfillProgress) -> None:
        self.running = running
        self.state = "running"
        self._show_progress(running)
        # Read again while it runs, for display (a timer: nothing here waits for its end).
        self.set_interval(POLL_SECONDS, self._tick, name="backfill progress")

    @work(exclusive=True, group="look")
    async def _look(self, look: Callable[[], Awaitable[BackfillProgress | None]]) -> None:
        try:
            running = await look()
        except SchedtuiError as exc:
            self.notify(exc.message, title=exc.title, severity="error", markup=False)
            running = None
        self.look = None
        if running is not None:
            self._show_running(running)
        else:
            self.replan()

    def _tick(self) -> None:
        if not self._polling:  # one read at a time: a slow server is not asked twice
            self._polling = True
            self._poll()

    # -- planning -----------------------------------------------------------------------
    @on(Input.Changed, "#from, #to")
    def _fields_changed(self) -> None:
        self.replan()

    @on(Input.Changed, "#confirm")
    def _confirm_changed(self) -> None:
        self._update_start()
        self._confirm_hint(submitted=False)

    @on(Checkbox.Changed, "#skip")
    def _skip_changed(self) -> None:
        if self.plan is not None:
            self._show_planned(self.plan)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if not self.query_one("#start", Button).disabled:
            self.action_start()
        elif event.input.id == "confirm":
            self._confirm_hint(submitted=True)

    @property
    def skipping(self) -> bool:
        return self.plan is not None and self.plan.already_succeeded > 0 and self.query_one("#skip", Checkbox).value

    @property
    def to_fire(self) -> int:
        """How many slots would fire: the plan's, less those skipped."""
        if self.plan is None:
            return 0
        return self.plan.count - (self.plan.already_succeeded if self.skipping else 0)

    def _typed(self) -> str:
        return self.query_one("#confirm", Input).value.replace(",", "").strip()

    def _confirm_hint(self, *, submitted: bool) -> None:
        """Say why a typed count does not confirm (never nothing)."""
        hint = self.query_one("#confirm-hint", Static)
        typed = self._typed()
        if self.state != "confirm" or self.plan is None or typed == str(self.to_fire) or (not typed and not submitted):
            hint.update("")
            return
        why = (f"You typed {typed}; type {self.to_fire}, the number of slots that would fire, to confirm."
               if typed else f"Type {self.to_fire}, the number of slots that would fire, to confirm.")
        hint.update(Content(why))
        if submitted:
            self.notify(why, title="Not confirmed", severity="warning", markup=False)

    def _range(self) -> tuple[datetime, datetime]:
        """The fields read now (relative times against the backend's now)."""
        now = self.now()
        zone = self.view.timezone
        start = parse_when(self.query_one("#from", Input).value, now=now, zone=zone, field="from", lower=True)
        end = parse_when(self.query_one("#to", Input).value, now=now, zone=zone, field="to")
        return start, end

    def replan(self) -> None:
        """Re-read the fields and ask the backend for the plan (nothing fires)."""
        if self.state in ("running", "done") or self.look is not None:
            return  # (still looking for a running one: planned once it answers)
        try:
            start, end = self._range()
        except BadInput as exc:
            self.plan = None
            self._show_plan(Content.from_markup(f"[b $text-error]✗[/] {escape(exc.message)}"))
            self.state = "invalid"
            return
        self.state = "planning"
        self._plan(start, end)

    @work(exclusive=True, group="plan")
    async def _plan(self, start: datetime, end: datetime) -> None:
        try:
            # Planned as if confirmed: the dialog asks for the count itself.
            plan = await self.backend.plan_backfill(self.view.name, start, end, confirm=True)
        except SchedtuiError as exc:
            self.plan = None
            self._show_plan(Content.from_markup(f"[b $text-error]✗ {escape(exc.title)}[/] {escape(exc.message)}"))
            self.state = "invalid"
            return
        self.plan = plan
        self._show_planned(plan)

    def _show_planned(self, plan: BackfillPlan) -> None:
        zone = self.view.timezone
        count = self.to_fire
        slots = f"[b]{plan.count_text() if count == plan.count else f'{count:,}'}[/b] slot{'s' if count != 1 else ''}"
        span = ""
        if plan.first is not None:
            span = f"\n  first {fmt.local_time(plan.first, zone)}"
            span += f"   last {fmt.local_time(plan.last, zone)}" if plan.last is not None else "   last …"
        # The range is read once, here: Backfill fires exactly this, however long the dialog stays open.
        frozen = (f"\n  [$text-muted]range ({fmt.local_time(plan.start, zone)} … {fmt.local_time(plan.end, zone)}]"
                  " as read now; edit a field to read it again[/]")
        done, live = "", self._live(plan)
        self.set_class(plan.already_succeeded > 0 and plan.refusal is None, "-succeeded")
        if plan.already_succeeded and plan.refusal is None:
            if self.skipping:
                done = f"\n  [$text-muted]{plan.already_succeeded:,} of the {plan.count:,} already succeeded: skipped[/]"
            else:
                done = (f"\n  [b $text-warning]{plan.already_succeeded:,} of them already succeeded[/] and would run again"
                        " [$text-muted](tick the box to skip them)[/]")
        if plan.refusal is not None:
            self._show_plan(Content.from_markup(f"[b $text-error]✗ refused[/] {slots}: {escape(plan.refusal)}{span}"))
            self.state = "refused"
        elif count == 0:
            self._show_plan(Content.from_markup(f"[b $text-warning]![/] every slot already succeeded: nothing to run{span}{done}"))
            self.state = "invalid"
        elif count > BACKFILL_CONFIRM_ABOVE:
            self._show_plan(
                Content.from_markup(
                    f"[b $text-warning]![/] {slots} — more than {BACKFILL_CONFIRM_ABOVE}: "
                    f"type [b]{count}[/b] below to confirm{span}{done}{live}{frozen}"
                )
            )
            self.state = "confirm"
        else:
            self._show_plan(Content.from_markup(f"[b $text-success]✓[/] {slots} would fire{span}{done}{live}{frozen}"))
            self.state = "ok"
        self._update_start()
        self._confirm_hint(submitted=False)

    @staticmethod
    def _live(plan: BackfillPlan) -> str:
        """What it may do to the schedule's live slots (the plan's estimate), in warning
        colours when it may skip some."""
        effect = plan.live_effect()
        if effect is None:
            return ""
        skips = plan.on_overlap == "skip" and plan.live_slots != 0
        return f"\n  [b $text-warning]! {escape(effect)}[/]" if skips else f"\n  [$text-muted]{escape(effect)}[/]"

    def _show_plan(self, content: Content) -> None:
        self.query_one("#plan", Static).update(content)

    def watch_state(self, state: PlanState) -> None:
        self.set_class(state == "confirm", "-confirm")
        self.set_class(state == "running", "-running")
        self.set_class(state == "done", "-done")
        with contextlib.suppress(NoMatches):  # (set before the dialog is composed)
            box = self.query_one("#dialog", Vertical)
            box.border_subtitle = {"running": "s stops · esc closes", "done": "esc closes"}.get(state, "tab moves · esc cancels")
        self._update_start()

    def _update_start(self) -> None:
        start = self.query_one("#start", Button)
        if self.state == "ok":
            start.disabled = False
        elif self.state == "confirm" and self.plan is not None:
            start.disabled = self._typed() != str(self.to_fire)
        else:
            start.disabled = True
        start.display = self.state not in ("running", "done")
        self.query_one("#cancel", Button).label = "Close" if self.state in ("running", "done") else "Cancel"

    # -- running ------------------------------------------------------------------------
    @on(Button.Pressed, "#start")
    def action_start(self) -> None:
        """Backfill the plan shown, once confirmed (the console's one confirmation, in the
        words ``start_backfill`` declares, with the plan's count and range)."""
        if self.query_one("#start", Button).disabled or self.state not in ("ok", "confirm") or self.plan is None:
            return
        plan, skip, count, zone = self.plan, self.skipping, self.to_fire, self.view.timezone
        facts = [f"{count:,} slot{'s' if count != 1 else ''} in ({fmt.local_time(plan.start, zone)} … "
                 f"{fmt.local_time(plan.end, zone)}]" + ("; those that already succeeded skipped" if skip else "") + "."]
        if plan.live_effect():
            facts.append(f"Live slots: {plan.live_effect()}.")

        def answer(yes: bool | None) -> None:
            if yes and self.plan is plan and self.state in ("ok", "confirm"):
                self._go(plan, skip)

        question = Confirm.of("start_backfill", {"name": self.view.name, "start": plan.start, "end": plan.end}, facts=facts)
        self.app.push_screen(question, answer)

    def _go(self, plan: BackfillPlan, skip: bool) -> None:
        self.state = "running"
        self._counts("starting…")
        self.query_one("#cancel", Button).focus()
        # The range shown, not the fields read again: "now" must not move under the operator.
        self._start(plan.start, plan.end, skip)

    @work(exclusive=True, group="backfill")
    async def _start(self, start: datetime, end: datetime, skip: bool = False) -> None:
        try:
            progress = await self.backend.start_backfill(self.view.name, start, end, confirm=True, skip_succeeded=skip)
        except SchedtuiError as exc:
            self.notify(exc.message, title=exc.title, severity="error", markup=False)
            self.state = "planning"
            self.replan()
            return
        self._show_progress(progress)
        if self.on_started is not None:
            self.on_started(progress)
        # The follow-up runs on the app, so it outlives this dialog if the operator closes it.
        self.app.run_worker(self._follow(progress), group="backfill-follow")

    @work(group="backfill-poll")
    async def _poll(self) -> None:
        try:
            if self.state != "running" or self.progress is None:
                return
            progress = await self.backend.backfill_progress(self.progress.id)
        except SchedtuiError:
            return  # still shown as it was; the next tick reads it again
        finally:
            self._polling = False
        if self.is_attached and self.state == "running":
            with contextlib.suppress(NoMatches):  # closing while it is drawn
                self._show_progress(progress)

    @on(Button.Pressed, "#stop")
    def action_stop(self) -> None:
        """``s``: stop the running backfill before its next slot, once the operator says
        yes (recorded ``cancelled``; the run in flight finishes on its own)."""
        progress = self.progress
        if self.state != "running" or progress is None:
            return
        zone = self.view.timezone
        facts = [f"{progress.name}: {progress.fired} of {progress.total} fired, {progress.failed} failed, "
                 f"{progress.remaining} to go, in ({fmt.local_time(progress.start, zone)} … "
                 f"{fmt.local_time(progress.end, zone)}]."]  # fmt: skip

        def answer(yes: bool | None) -> None:
            if yes and self.state == "running" and self.progress is not None and self.progress.id == progress.id:
                self.query_one("#stop", Button).disabled = True
                self._stop(progress.id)

        self.app.push_screen(Confirm.of("cancel_backfill", {"backfill_id": progress.id}, facts=facts), answer)

    @work(exclusive=True, group="backfill-stop")
    async def _stop(self, backfill_id: str) -> None:
        try:
            progress = await self.backend.cancel_backfill(backfill_id)
        except SchedtuiError as exc:
            self.query_one("#stop", Button).disabled = False
            self.notify(exc.message, title=exc.title, severity="error", markup=False)
            return
        self._show_progress(progress)

    async def _follow(self, progress: BackfillProgress) -> None:
        """Until the backfill ends: its progress on the dialog while it is open, and the
        app told when it ends. A store that does not answer for a moment, or the dialog
        closing while a progress is drawn, does not end the following (the app would
        otherwise keep the backfill as running, and ``q`` would ask about it for ever)."""
        trouble = False
        while progress.state == "running":
            await asyncio.sleep(POLL_SECONDS)  # polling for display; nothing to wait on
            try:
                progress = await self.backend.backfill_progress(progress.id)
            except Unavailable as exc:
                if not trouble:
                    self.app.notify(f"{exc.message}; still following the backfill", title=exc.title,
                                    severity="warning", markup=False)  # fmt: skip
                trouble = True
                continue
            except SchedtuiError as exc:
                self.app.notify(exc.message, title=exc.title, severity="error", markup=False)
                return
            trouble = False
            if self.is_attached:
                with contextlib.suppress(NoMatches):  # closing while it is drawn
                    self._show_progress(progress)
            if self.on_started is not None and progress.state == "running":
                self.on_started(progress)
        if self.on_finished is not None:
            self.on_finished(progress)

    def _show_progress(self, progress: BackfillProgress) -> None:
        self.progress = progress
        self.query_one("#bar", ProgressBar).update(total=max(progress.total, 1), progress=progress.fired)
        counts = (
            f"fired [b]{progress.fired}[/b]/{progress.total} · "
            f"[$text-success]succeeded {progress.succeeded}[/] · "
            f"[$text-error]failed {progress.failed}[/] · remaining {progress.remaining}"
        )
        if progress.state != "running":
            verdict = "[b $text-success]done[/]" if progress.state == "done" and not progress.failed else (
                f"[b reverse $text-warning] {progress.state} [/]"
            )
            stopped = ""
            if progress.state in ("cancelled", "abandoned"):
                stopped = f"\n{progress.remaining} slot(s) not fired"
                if progress.current is not None:
                    stopped += f"; the last started was {fmt.local_time(progress.current, self.view.timezone)}"
                stopped += " (a run in flight finishes on its own)"
            counts = f"Backfill {verdict}: {counts}{stopped}\n[$text-muted]esc or enter closes[/]"
            self.state = "done"
        else:
            zone = self.view.timezone
            counts += (f"\n[$text-muted]in ({fmt.local_time(progress.start, zone)} … {fmt.local_time(progress.end, zone)}]"
                       f" on {escape(progress.instance)}[/]"
                       "\n[$text-muted]s stops it (asks) · esc closes this; it goes on[/]")  # fmt: skip
        self._counts(counts)

    def _counts(self, markup: str) -> None:
        self.query_one("#counts", Static).update(Content.from_markup(markup))

    # -- leaving ------------------------------------------------------------------------
    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
