"""``n`` / ``E`` on the schedules view: create a schedule at run time, edit a stored one
(``D`` deletes one after the console's one confirmation, :mod:`console.screens.confirm`).

The form previews the next five fires as the operator types, computed here with
:class:`backend.cron.Cron` (pure: nothing is asked of the backend until the form is
submitted); a bad cron, zone or payload is said inline, naming the value, and nothing is
sent. What the backend refuses (a name taken, an unknown queue) is said the same way and the
form stays as typed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any, Literal
from zoneinfo import available_timezones

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from backend.client.interface import Backend
from backend.cron import PLACEHOLDER_ZONES, Cron
from backend.errors import CronError, SchedtuiError
from backend.inputs import json_problem, parse_json
from backend.model import ScheduleView
from backend.scheduler.stored import MAX_DESCRIPTION, MAX_PAYLOAD_BYTES
from backend.schedules import MAX_NAME_CHARS
from console import format as fmt
from console.widgets.bounded import LINE_CHARS, BoundedInput
from console.widgets.button import PressButton
from console.widgets.tickbox import TickBox
from console.workers import work

__all__ = ["DEFINED_IN_CODE", "PREVIEW_COUNT", "SHOWN_PAYLOAD", "ScheduleForm", "defined_in_code", "stored_fields"]

PREVIEW_COUNT = 5
"""Fire times the form previews."""

SHOWN_PAYLOAD = 120
"""Characters of a stored payload :func:`stored_fields` shows (then its size)."""

TargetKind = Literal["queue", "durable"]


def defined_in_code(name: str) -> str:
    """What ``E`` and ``D`` say about a schedule written in code."""
    return f"{name} is defined in code: it can only be enabled or disabled here (e); edit or delete it in its code."


DEFINED_IN_CODE = "Defined in code"
"""The notification's title for :func:`defined_in_code`."""


def stored_fields(view: ScheduleView) -> str:
    """The fields of a schedule as the backend stored them, one per line (said after the
    form saves, so that what was typed can be checked against what was kept)."""
    payload = "none" if view.payload is None else _shown(json.dumps(view.payload, ensure_ascii=False))
    return "\n".join([
        f"cron {view.cron} in {view.timezone} · {'enabled' if view.enabled else 'disabled'}",
        f"payload {payload}",
        f"description {_shown(view.description)}" if view.description else "no description",
    ])


def _shown(text: str) -> str:
    """A long field in a notification: its start and its size (in full, a 1,000-character
    description made the toast taller than the screen, its title and cron cut off)."""
    return text if len(text) <= SHOWN_PAYLOAD else f"{text[:SHOWN_PAYLOAD]}… ({len(text.encode()):,} bytes in all)"


@cache
def _zones() -> list[str]:
    return sorted(available_timezones() - PLACEHOLDER_ZONES)


class ScheduleForm(ModalScreen[ScheduleView | None]):
    """Name, cron, zone, target (a queue or a durable function), payload (JSON),
    description, enabled; under them the next five fires in the schedule's zone, or what is
    wrong. ``ctrl+s`` (or the button) creates it, or, editing a stored schedule, saves the
    fields that changed. Dismisses with the schedule as the backend stored it, or ``None``."""

    DEFAULT_CSS = """
    ScheduleForm {
        align: center middle;
    }
    ScheduleForm > Vertical {
        width: 80;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    ScheduleForm .field {
        height: 1;
    }
    ScheduleForm .field > Label {
        width: 13;
    }
    ScheduleForm Input {
        border: none;
        height: 1;
        width: 1fr;
        padding: 0 1;
        background: $boost;
    }
    ScheduleForm Input:focus {
        border: none;
        background: $primary 30%;
    }
    ScheduleForm Input:disabled {
        background: $surface;
        color: $text-muted;
    }
    ScheduleForm #kind {
        width: 14;
        margin-right: 1;
    }
    ScheduleForm #enabled {
        border: none;
        padding: 0;
        margin-left: 13;
        height: 1;
        background: $surface;
    }
    ScheduleForm #preview {
        height: auto;
        min-height: 6;
        margin-top: 1;
    }
    ScheduleForm #problem {
        color: $text-warning;
        height: auto;
    }
    ScheduleForm #buttons {
        height: 1;
        align-horizontal: right;
    }
    ScheduleForm Button {
        margin-left: 2;
    }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="cancel_schedule_form"),
        Binding("ctrl+s", "save", "Save", id="save_schedule"),
    ]

    def __init__(
        self,
        backend: Backend,
        now: Callable[[], datetime],
        *,
        queues: Sequence[str] = (),
        functions: Sequence[str] = (),
        editing: ScheduleView | None = None,
        zone: str = "UTC",
    ) -> None:
        super().__init__()
        self.backend = backend
        self.now = now
        """The backend's idea of now (the preview counts down from it)."""
        self.queues = list(queues)
        """The queues the backend knows (offered as targets; see :meth:`offer`)."""
        self.functions = list(functions)
        """The durable functions seen in the backend's executions (offered as targets)."""
        self.editing = editing
        """The stored schedule being edited (``None``: creating one)."""
        self.zone = editing.timezone if editing is not None else zone
        self.slots: list[datetime] = []
        """The previewed fires for the cron and zone as typed (empty while they are not valid)."""

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        view = self.editing
        target = view.target if view is not None else None
        kind: TargetKind = "durable" if target is not None and target.kind == "durable" else "queue"
        if target is None and not self.queues and self.functions:
            kind = "durable"
        with Vertical() as box:
            box.border_title = f"Edit {view.name}" if view is not None else "New schedule"
            box.border_subtitle = "ctrl+s saves · tab moves · esc cancels" if view is not None else (
                "ctrl+s creates · tab moves · esc cancels")
            with Horizontal(classes="field"):
                yield Label("Name")
                yield BoundedInput(view.name if view is not None else "", placeholder="e.g. reap-sessions", id="name",
                                   disabled=view is not None, limit=MAX_NAME_CHARS, unit="characters", what="A name")
            with Horizontal(classes="field"):
                yield Label("Cron")
                yield BoundedInput(view.cron if view is not None else "", placeholder="*/15 * * * *  (a 6th field first: seconds)",
                                   id="cron", limit=LINE_CHARS, unit="characters", what="A cron expression")
            with Horizontal(classes="field"):
                yield Label("Zone")
                yield BoundedInput(self.zone, placeholder="an IANA zone: UTC, Europe/Berlin…", id="zone",
                                   suggester=SuggestFromList(_zones(), case_sensitive=False), limit=LINE_CHARS,
                                   unit="characters", what="A zone")
            with Horizontal(classes="field"):
                yield Label("Target")
                yield Select([("queue", "queue"), ("durable", "durable")], value=kind, allow_blank=False,
                             id="kind", compact=True)
                known = self._names(kind)
                typed = target.name if target is not None and target.kind != "handler" else ""
                yield BoundedInput(typed or (known[0] if view is None and len(known) == 1 else ""),
                                   limit=MAX_NAME_CHARS, unit="characters", what="A target's name",
                                   placeholder=self._names_hint(kind), id="target",
                                   suggester=SuggestFromList(self._names(kind), case_sensitive=True))
            with Horizontal(classes="field"):
                yield Label("Payload")
                payload = "" if view is None or view.payload is None else json.dumps(view.payload, ensure_ascii=False)
                yield BoundedInput(payload, limit=MAX_PAYLOAD_BYTES, what="A schedule's payload",
                                   placeholder="JSON, sent with every fire (blank: none)", id="payload")
            with Horizontal(classes="field"):
                yield Label("Description")
                description = (view.description or "") if view is not None else ""
                yield BoundedInput(description, placeholder="optional", id="description", limit=MAX_DESCRIPTION,
                                   unit="characters", what="A description")
            yield TickBox("Enabled (fires on its schedule)", view.enabled if view is not None else True, id="enabled",
                           compact=True)
            yield Static(id="preview")
            yield Static("", id="problem")
            with Horizontal(id="buttons"):
                yield PressButton("Cancel", id="cancel", compact=True)
                yield PressButton("Save" if view is not None else "Create", id="save", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#cron" if self.editing is not None else "#name", Input).focus()
        self.show_preview()
        self.set_interval(1.0, self.show_preview)  # the countdowns, and slots that pass

    def _names(self, kind: str) -> list[str]:
        return self.queues if kind == "queue" else self.functions

    def _names_hint(self, kind: str) -> str:
        names = self._names(kind)
        if not names:
            return "a queue defined in code" if kind == "queue" else "a durable function defined in code"
        return "one of: " + ", ".join(names[:4]) + (", …" if len(names) > 4 else "")

    def offer(self, queues: Sequence[str], functions: Sequence[str]) -> None:
        """The targets the backend knows, read once the form was on screen (it opens at once,
        so that nothing typed meanwhile goes elsewhere). Fills in the target only while the
        operator has not been at it: the field is empty and does not have the focus."""
        self.queues, self.functions = list(queues), list(functions)
        field = self.query_one("#target", Input)
        untouched = self.editing is None and not field.value and not field.has_focus
        kind = self.query_one("#kind", Select)
        if untouched and not self.queues and self.functions and kind.value == "queue" and not kind.has_focus:
            kind.value = "durable"
        self._offer_names(str(kind.value), fill=untouched)

    def _offer_names(self, kind: str, *, fill: bool = False) -> None:
        field = self.query_one("#target", Input)
        known = self._names(kind)
        field.placeholder = self._names_hint(kind)
        field.suggester = SuggestFromList(known, case_sensitive=True)
        if fill and len(known) == 1:
            field.value = known[0]

    @on(Select.Changed, "#kind")
    def _kind_changed(self, event: Select.Changed) -> None:
        self._offer_names(str(event.value))

    # -- the preview ------------------------------------------------------------------------
    @on(Input.Changed, "#cron, #zone, #payload")
    def _changed(self) -> None:
        self.show_preview()

    def _cron(self) -> Cron | str:
        """The cron as typed, or why it cannot be one (naming the value)."""
        expr = self.query_one("#cron", Input).value.strip()
        zone = self.query_one("#zone", Input).value.strip()
        if not expr:
            return "Type a cron expression: minute hour day-of-month month day-of-week."
        if not zone:
            return "Type the zone the cron is read in (UTC, Europe/Berlin…)."
        try:
            return Cron(expr, zone)
        except CronError as exc:
            return fmt.echoing(exc.message, expr, zone)

    def _payload(self) -> tuple[bool, Any]:
        """(ok, the payload): blank is no payload; otherwise JSON."""
        raw = self.query_one("#payload", Input).value
        if not raw.strip():
            return True, None
        try:
            return True, parse_json(raw)
        except ValueError as exc:
            return False, f"payload {fmt.echo(raw.strip())} {json_problem(exc)}"

    def show_preview(self) -> None:
        cron = self._cron()
        preview = self.query_one("#preview", Static)
        lines: list[Content] = []
        if isinstance(cron, str):
            self.slots = []
            style = "$text-muted" if cron.startswith("Type ") else "bold $text-error"
            mark = "" if cron.startswith("Type ") else "✗ "
            lines.append(Content.assemble((mark, "bold $text-error"), (cron, style)))
        else:
            now = self.now()
            slots: list[datetime] = []
            after = now
            try:
                for _ in range(PREVIEW_COUNT):
                    after = cron.next(after)
                    slots.append(after)
            except ValueError:
                pass  # fewer than five before year 10000: show those
            self.slots = slots
            zone = cron.zone
            lines.append(Content.assemble(("next fires", "bold"), (f" in {cron.timezone}", "$text-muted")))
            for slot in slots:
                local = slot.astimezone(zone).strftime("%a %Y-%m-%d %H:%M:%S %Z")
                lines.append(Content.assemble("  ", local, "  ", (fmt.countdown(slot, now), "$text-muted")))
        ok, payload = self._payload()
        if not ok:
            lines.append(Content.assemble(("✗ ", "bold $text-error"), (str(payload), "bold $text-error")))
        preview.update(Content("\n").join(lines))

    # -- saving ---------------------------------------------------------------------------
    def _problem(self, text: str, title: str) -> None:
        """Say what keeps the form from being sent, inline and in a notification; a long
        value it repeats (a backend's answer may echo a field) is cut (:func:`fmt.echoing`)."""
        text = fmt.echoing(text, *(field.value.strip() for field in self.query(Input)))
        self.query_one("#problem", Static).update(Content(text))
        self.notify(text, title=title, severity="warning", markup=False)

    def _spec(self) -> dict[str, Any] | None:
        """The fields as the backend takes them, or ``None`` after saying what is wrong."""
        title = "Not saved" if self.editing is not None else "Not created"
        name = self.query_one("#name", Input).value.strip()
        if not name:
            self._problem("Type a name for the schedule.", title)
            return None
        cron = self._cron()
        if isinstance(cron, str):
            self._problem(cron, title)
            return None
        ok, payload = self._payload()
        if not ok:
            self._problem(str(payload), title)
            return None
        kind = str(self.query_one("#kind", Select).value)
        target = self.query_one("#target", Input).value.strip()
        if not target:
            self._problem(f"Type the {'queue' if kind == 'queue' else 'durable function'} it targets.", title)
            return None
        return {
            "name": name,
            "cron": self.query_one("#cron", Input).value.strip(),
            "timezone": self.query_one("#zone", Input).value.strip(),
            kind: target,
            "payload": payload,
            "description": self.query_one("#description", Input).value.strip() or None,
            "enabled": self.query_one("#enabled", Checkbox).value,
        }

    def _changes(self, view: ScheduleView, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of ``spec`` that differ from the stored schedule's."""
        changes: dict[str, Any] = {}
        for key, before in (("cron", view.cron), ("timezone", view.timezone), ("payload", view.payload),
                            ("description", view.description), ("enabled", view.enabled)):
            if spec[key] != before:
                changes[key] = spec[key]
        kind = "queue" if "queue" in spec else "durable"
        if view.target is None or (view.target.kind, view.target.name) != (kind, spec[kind]):
            changes[kind] = spec[kind]
        return changes

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()

    def action_save(self) -> None:
        spec = self._spec()
        if spec is None:
            return
        self.query_one("#problem", Static).update("")
        view = self.editing
        if view is None:
            self._create(spec)
            return
        changes = self._changes(view, spec)
        if not changes:
            self.notify(f"{view.name}: no field changed; nothing to save (esc leaves).", title="Nothing to save")
            return
        self._update(view.name, changes)

    @work(exclusive=True, group="schedule-form")
    async def _create(self, spec: dict[str, Any]) -> None:
        try:
            view = await self.backend.create_schedule(spec)
        except SchedtuiError as exc:
            self._problem(exc.message, exc.title if exc.title != "Error" else "Not created")
            return
        self.dismiss(view)

    @work(exclusive=True, group="schedule-form")
    async def _update(self, name: str, changes: dict[str, Any]) -> None:
        try:
            view = await self.backend.update_schedule(name, changes)
        except SchedtuiError as exc:
            self._problem(exc.message, exc.title if exc.title != "Error" else "Not saved")
            return
        self.dismiss(view)

    def action_cancel(self) -> None:
        self.dismiss(None)
