"""The Durable view's dialogs: an execution's step timeline and the signal's payload (a
cancel asks with the console's one confirmation, :mod:`console.screens.confirm`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any  # noqa: F401 - used in a string annotation (ModalScreen["tuple[Any] | None"])

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Label, Static

from backend.durable.model import Execution, StepView
from backend.durable.service import MAX_SIGNAL_BYTES
from backend.inputs import json_problem, parse_json
from backend.safetext import in_line
from console import format as fmt
from console.widgets.bounded import BoundedInput
from console.workers import work

__all__ = ["SignalPrompt", "StepsScreen", "step_rows"]


def step_rows(execution: Execution, zone: str, now: datetime, *, failed_only: bool) -> list[tuple[str, ...]]:
    """The timeline's rows: position, name, kind, status, attempt, start (the time alone
    on ``now``'s day), duration or what it waits until (with its year when far from
    ``now``), error. ``failed_only``
    keeps the steps with a failed attempt: failed, waiting for a retry, or succeeded after one."""
    rows: list[tuple[str, ...]] = []
    for step in execution.steps or []:
        if failed_only and not _failed(step):
            continue
        status = fmt.step_status(step.status, execution.status)
        waits = status == "waiting" and step.wake_at is not None
        rows.append(
            (
                str(step.seq),
                step.name,
                step.kind + (" ¹" if step.at_most_once else ""),
                f"{fmt.STEP_GLYPHS.get(status, '?')} {status}",
                str(step.attempt),
                # Today's start, the time alone: room at 80 columns for a wait's year.
                fmt.day_time(step.started_at, zone, now) if step.started_at is not None else "-",
                f"until {fmt.short_time(step.wake_at, zone, now).rsplit(' ', 1)[0]}" if waits else fmt.duration(step.duration_ms),
                in_line(" ".join(filter(None, [step.error_tag and f"[{step.error_tag}]", step.error_message]))),
            )
        )
    return rows


def _failed(step: StepView) -> bool:
    """A step that failed, or had a failed attempt (waiting for its retry, or retried)."""
    return step.status == "failed" or step.error_tag is not None


class StepsScreen(ModalScreen[None]):
    """``enter`` on an execution: its steps in the order the code reached them (name,
    attempt, duration, status, error); ``f`` shows the failed ones only."""

    DEFAULT_CSS = """
    StepsScreen {
        align: center middle;
    }
    StepsScreen > Vertical {
        width: 100%;
        max-width: 118;
        height: 90%;
        border: round $accent;
        background: $surface;
        padding: 0 1;
    }
    StepsScreen #steps-head {
        height: auto;
    }
    StepsScreen DataTable {
        height: 1fr;
    }
    StepsScreen .hint {
        color: $text-muted;
    }
    """

    BINDINGS = [
        Binding("f", "toggle_failed", "Failed only", id="steps_failed_only"),
        Binding("escape,enter,q", "close", "Close", id="steps_close"),
    ]

    def __init__(
        self, execution: Execution, zone: str, now: datetime, *, read: Callable[[], Awaitable[Execution | None]] | None = None
    ) -> None:
        super().__init__()
        self.execution = execution
        self.zone = zone
        self.now = now
        self.failed_only = False
        self.read = read
        """Reads the execution with its steps, once the screen is open (``None`` back: it
        could not, and said why; the screen closes). Read before opening it, over a slow
        link the keys typed after ``enter`` reached the view under it (``c`` asked to
        cancel) and the steps opened late over whatever was on screen then."""

    def compose(self) -> ComposeResult:
        e = self.execution
        with Vertical() as box:
            box.border_title = f"Steps of {e.function} · {e.id}"
            yield Static(self._head(), id="steps-head", markup=False)
            yield DataTable(id="steps-table", cursor_type="row", zebra_stripes=False)
            yield Label("f failed only · esc closes", classes="hint", id="steps-hint")

    def _head(self) -> str:
        e = self.execution
        parts = [f"{fmt.EXECUTION_GLYPHS.get(e.status, '?')} {e.status}"]
        if e.waiting_for:
            parts.append(f"waiting for {e.waiting_for.replace(':', ' ')} {fmt.countdown(e.wake_at, self.now)}")
        if e.schedule:
            parts.append(f"started by schedule {e.schedule}")
        if e.instance:
            parts.append(f"on {e.instance}")
        lines = [" · ".join(parts), f"input {json.dumps(e.input, ensure_ascii=False)}"]
        if e.status == "succeeded":
            lines.append(f"output {json.dumps(e.output, ensure_ascii=False)}")
        if e.error_tag or e.error_message:
            lines.append(f"error [{e.error_tag}] {e.error_message}")
        return "\n".join(in_line(line) for line in lines)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label in ("#", "STEP", "KIND", "STATUS", "TRY", "STARTED", "TOOK", "ERROR"):
            table.add_column(label)
        self._fill()
        table.focus()
        if self.read is not None:
            self.query_one("#steps-hint", Label).update(Content("reading the steps… · esc closes"))
            self._read(self.read)

    @work(exclusive=True, group="steps-read")
    async def _read(self, read: Callable[[], Awaitable[Execution | None]]) -> None:
        execution = await read()
        self.read = None
        if execution is None:
            if self.is_current:
                self.dismiss(None)
            return
        self.execution = execution
        self.query_one("#steps-head", Static).update(self._head())
        self._fill()

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        if self.read is not None:
            return  # (the list's execution has no steps: they are being read)
        rows = step_rows(self.execution, self.zone, self.now, failed_only=self.failed_only)
        for row in rows:
            status = row[3]
            style = "bold red" if "failed" in status else "yellow" if "waiting" in status else "dim" if "cancelled" in status else ""
            table.add_row(*row[:3], Text(status, style=style), *row[4:])
        hint = "f all steps" if self.failed_only else "f failed only"
        shown = f"{len(rows)} of {len(self.execution.steps or [])} steps · " if self.failed_only else ""
        empty = "no step failed · " if self.failed_only and not rows else ""
        self.query_one("#steps-hint", Label).update(Content(f"{empty}{shown}{hint} · ¹ at most once · esc closes"))

    def action_toggle_failed(self) -> None:
        self.failed_only = not self.failed_only
        self._fill()

    def action_close(self) -> None:
        self.dismiss(None)


class SignalPrompt(ModalScreen["tuple[Any] | None"]):
    """``a``: the payload of the signal an execution waits for, as JSON (empty: null).
    Dismisses with ``(payload,)``, or ``None`` when cancelled; text that is not JSON
    keeps the prompt open, saying why, and loses nothing typed."""

    DEFAULT_CSS = """
    SignalPrompt {
        align: center middle;
    }
    SignalPrompt > Vertical {
        width: 72;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    SignalPrompt .hint {
        color: $text-muted;
    }
    SignalPrompt #signal-error {
        color: $error;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel_signal")]

    def __init__(self, execution: Execution, signal: str) -> None:
        super().__init__()
        self.execution = execution
        self.signal = signal

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Send {self.signal} to {self.execution.function}"
            yield Label(f"Execution {self.execution.id} waits for the signal {self.signal}.")
            yield Label("Payload, as JSON (empty: null):")
            yield BoundedInput(placeholder='e.g. {"approved": true, "by": "ops"}', id="payload", limit=MAX_SIGNAL_BYTES,
                               what="A signal's payload")
            yield Static("", id="signal-error", markup=False)  # wraps: a Label cut the JSON error
            yield Label("enter sends · esc cancels", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            self.dismiss((None,))
            return
        try:
            value = parse_json(text)
        except ValueError as exc:
            self.query_one("#signal-error", Static).update(f"the payload {json_problem(exc)}")
            return
        self.dismiss((value,))

    def action_cancel(self) -> None:
        self.dismiss(None)
