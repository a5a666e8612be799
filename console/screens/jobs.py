"""The jobs view's dialogs: a job's details, sending a job, and the typed count before
retrying many dead jobs at once (above 25, as backfills ask; a delete asks with the one
:class:`~console.screens.confirm.Confirm`)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from backend.client.interface import Backend
from backend.errors import SchedtuiError
from backend.inputs import json_problem, parse_json
from backend.jobs.definition import MAX_KEY_BYTES, MAX_PAYLOAD_BYTES
from backend.jobs.model import Job, JobDetail, Sent
from console import format as fmt
from console.unprintable import escaped
from console.widgets.bounded import NUMBER_CHARS, BoundedInput, BoundedTextArea
from console.widgets.button import PressButton
from console.widgets.jobs import JOB_STATUS_COLORS, job_when
from console.workers import work

__all__ = ["JobDetails", "RETRY_CONFIRM_ABOVE", "SendJobScreen", "TypedCount"]

RETRY_CONFIRM_ABOVE = 25
"""Retrying more dead jobs than this at once asks for their count, typed."""
PAYLOAD_SHOWN = 4000
"""Characters of a payload the details show (the CLI's ``jobs show --json`` has it whole)."""


class JobDetails(ModalScreen[None]):
    """A job: every field, its payload, a countdown to its next try, and every attempt with
    its error. Read once when opened; the countdown ticks with the console's clock. A job
    that is gone (it succeeded, or was deleted) shows its attempts."""

    DEFAULT_CSS = """
    JobDetails {
        align: center middle;
    }
    JobDetails > VerticalScroll {
        width: 96;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="close_job")]

    def __init__(self, backend: Backend, job: Job, zone: str, now: Any) -> None:
        super().__init__()
        self.backend = backend
        self.job = job
        self.detail: JobDetail | None = None
        self.zone = zone
        """The display zone."""
        self.now = now
        """The console's clock (``now()``)."""

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"Job {self.job.id}"
            box.border_subtitle = "↑↓ scroll · esc closes"
            yield Static(self._body(), id="job-body")

    def on_mount(self) -> None:
        self.reload()
        self.set_interval(0.5, self._tick)

    def _tick(self) -> None:
        job = self.detail.job if self.detail is not None else self.job
        if job is not None and job.status != "dead":
            self.query_one("#job-body", Static).update(self._body())

    @work(exclusive=True, group="job-details")
    async def reload(self) -> None:
        try:
            self.detail = await self.backend.get_job(self.job.id)
        except SchedtuiError as exc:
            self.notify(exc.message, title=exc.title, severity="warning", markup=False)
            return
        self.query_one("#job-body", Static).update(self._body())

    def _body(self) -> Content:
        zone, now = self.zone, self.now()
        detail = self.detail
        job = detail.job if detail is not None else self.job
        label = "[$text-muted]{:<12}[/]".format

        def when(value: datetime | None) -> str:
            return fmt.local_time(value, zone) if value is not None else "-"

        lines = []
        if job is None:
            lines.append(f"{label('status')} [b]gone[/b] [$text-muted](it succeeded, or was deleted; its attempts remain)[/]")
        else:
            color = JOB_STATUS_COLORS.get(job.status, "foreground")
            lines += [
                f"{label('queue')} [b]{escaped(job.queue)}[/b]",
                f"{label('status')} [b ${color}]{job.status}[/]   {label('attempt')} [b]{job.attempt}/{job.max_attempts}[/b]",
            ]
            if job.status == "queued":
                nxt = job_when(job, now)
                lines.append(f"{label('next try')} [b]{escaped(nxt)}[/b] [$text-muted]({escaped(when(job.run_after))})[/]")
            elif job.status == "running":
                lines.append(f"{label('running')} {escaped(job_when(job, now))} on {escaped(job.instance or '?')}")
            if job.key:
                lines.append(f"{label('key')} {escaped(job.key)}")
            if job.cron:
                lines.append(f"{label('schedule')} {escaped(job.cron)}")
            lines.append(f"{label('created')} {escaped(when(job.created_at))}")
            if job.error_tag or job.error_message:
                lines.append(f"{label('last error')} [b reverse $text-error] {escaped(job.error_tag or '')} [/] "
                             f"[$text-error]{escaped(job.error_message or '')}[/]")
            payload = json.dumps(job.payload, separators=(", ", ": "), ensure_ascii=False)
            if len(payload) > PAYLOAD_SHOWN:
                payload = payload[:PAYLOAD_SHOWN] + f"\n… ({len(payload):,} characters; `schedtui jobs show {job.id} --json` has it all)"
            lines += ["", "[$text-muted]payload[/]", escaped(payload)]
        attempts = detail.attempts if detail is not None else []
        heading = f"[$text-muted]attempts ({len(attempts)}, kept 7 days)[/]" if attempts else "[$text-muted]no attempt has ended yet[/]"
        lines += ["", heading]
        for a in attempts:
            took = fmt.duration(round((a.finished_at - a.started_at).total_seconds() * 1000))
            mark = "[$text-success]✓[/]" if a.status == "succeeded" else "[b reverse $text-error]✗[/]"
            number = fmt.attempt_label(a, attempts)
            line = f"{mark} {number}  {escaped(fmt.local_time(a.started_at, zone))}  {took:>7}  {escaped(a.instance)}"
            if a.error_tag or a.error_message:
                why = ": ".join(filter(None, [a.error_tag, a.error_message]))
                line += f"\n     [$text-error]{escaped(why)}[/]"
            lines.append(line)
        return Content.from_markup("\n".join(lines))

    def action_close(self) -> None:
        self.dismiss(None)


class TypedCount(ModalScreen[bool]):
    """Before acting on more than :data:`RETRY_CONFIRM_ABOVE` jobs at once: the count must be
    typed, then enter (a wrong count says why and keeps asking), as a backfill of many slots
    asks. Esc cancels. Dismisses with whether the count was typed."""

    DEFAULT_CSS = """
    TypedCount {
        align: center middle;
    }
    TypedCount > Vertical {
        width: 64;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    TypedCount .hint {
        color: $text-muted;
    }
    TypedCount Input {
        border: none;
        height: 1;
        padding: 0 1;
        background: $boost;
    }
    TypedCount Input:focus {
        border: none;
        background: $primary 30%;
    }
    TypedCount #why {
        color: $text-warning;
        height: auto;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel_typed_count")]

    def __init__(self, question: str, detail: str, count: int) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.count = count

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Confirm"
            yield Label(Content(self.question), id="typed-question")
            yield Label(Content(self.detail))
            yield BoundedInput(placeholder=f"type {self.count} to confirm", id="typed", restrict=r"[0-9,]*", restrict_says="digits",
                               limit=NUMBER_CHARS, unit="characters", what="The count")
            yield Static("", id="why")
            yield Label(f"type {self.count}, then enter · esc cancels", classes="hint")

    @on(Input.Submitted, "#typed")
    def _typed(self, event: Input.Submitted) -> None:
        event.stop()
        typed = event.value.replace(",", "").strip()
        if typed == str(self.count):
            self.dismiss(True)
            return
        why = f"You typed {typed}; type {self.count} to confirm." if typed else f"Type {self.count} to confirm."
        self.query_one("#why", Static).update(why)
        self.notify(why, title="Not confirmed", severity="warning", markup=False)

    def action_cancel(self) -> None:
        self.dismiss(False)


class SendJobScreen(ModalScreen[Sent | None]):
    """Send a job: a payload (JSON) and, optionally, a delay, attempts and a key. The limits
    are the backend's: what it refuses is said in a notification and nothing is sent.
    Dismisses with what the send did, or ``None`` when cancelled."""

    DEFAULT_CSS = """
    SendJobScreen {
        align: center middle;
    }
    SendJobScreen > Vertical {
        width: 80;
        max-width: 100%;
        height: auto;
        max-height: 95%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    SendJobScreen .field {
        height: 1;
        margin-top: 1;
    }
    SendJobScreen .field Label {
        width: 10;
    }
    SendJobScreen Input {
        border: none;
        height: 1;
        width: 1fr;
        padding: 0 1;
        background: $boost;
    }
    SendJobScreen Input:focus {
        border: none;
        background: $primary 30%;
    }
    SendJobScreen TextArea, SendJobScreen TextArea:focus {
        height: 6;
        border: none;
        background: $boost;
    }
    SendJobScreen .hint {
        color: $text-muted;
    }
    SendJobScreen #problem {
        color: $text-warning;
        height: auto;
    }
    SendJobScreen #buttons {
        height: 1;
        margin-top: 1;
        align-horizontal: right;
    }
    SendJobScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="cancel_send"),
        Binding("ctrl+s", "send", "Send", id="send_job_now"),
    ]

    def __init__(self, backend: Backend, queue: str) -> None:
        super().__init__()
        self.backend = backend
        self.queue = queue

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Send a job to {self.queue}"
            box.border_subtitle = "ctrl+s sends · tab moves · esc cancels"
            yield Label(f"Payload (JSON, up to {MAX_PAYLOAD_BYTES // 1024} KiB)", classes="hint")
            yield BoundedTextArea("{}", limit=MAX_PAYLOAD_BYTES, what="A job's payload", id="payload", language=None,
                                  soft_wrap=True, show_line_numbers=False)
            with Horizontal(classes="field"):
                yield Label("Delay")
                yield BoundedInput(placeholder="seconds (0 to 30 days)", id="delay", restrict=r"[0-9.]*",
                                   restrict_says="digits and a point", limit=NUMBER_CHARS, unit="characters",
                                   what="The delay")
            with Horizontal(classes="field"):
                yield Label("Attempts")
                yield BoundedInput(placeholder="1-20 (blank: the queue's)", id="attempts", restrict=r"[0-9]*",
                                   restrict_says="digits", limit=NUMBER_CHARS, unit="characters", what="Attempts")
            with Horizontal(classes="field"):
                yield Label("Key")
                yield BoundedInput(placeholder="optional: one job per key while queued, running or dead", id="key",
                                   limit=MAX_KEY_BYTES, what="A job's key")
            yield Static("", id="problem")
            with Horizontal(id="buttons"):
                yield PressButton("Cancel", id="cancel", compact=True)
                yield PressButton("Send", id="send", variant="primary", compact=True)

    def _problem(self, text: str) -> None:
        """Say why nothing was sent, inline and in a notification; a long value it repeats
        (the backend's answer may echo the key) is cut (:func:`fmt.echoing`)."""
        text = fmt.echoing(text, *(field.value for field in self.query(Input)))
        self.query_one("#problem", Static).update(text)
        self.notify(text, title="Not sent", severity="warning", markup=False)

    def _fields(self) -> tuple[Any, float, int | None, str | None] | None:
        raw = self.query_one("#payload", TextArea).text
        try:
            payload = parse_json(raw) if raw.strip() else None
        except ValueError as exc:
            self._problem(f"The payload {json_problem(exc)}")
            return None
        delay_text = self.query_one("#delay", Input).value.strip()
        attempts_text = self.query_one("#attempts", Input).value.strip()
        try:
            delay = float(delay_text) if delay_text else 0.0
        except ValueError:
            self._problem(f'delay "{delay_text}" is not a number of seconds')
            return None
        attempts = int(attempts_text) if attempts_text else None
        key = self.query_one("#key", Input).value or None
        return payload, delay, attempts, key

    @on(Button.Pressed, "#send")
    def _send_pressed(self) -> None:
        self.action_send()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()

    def action_send(self) -> None:
        fields = self._fields()
        if fields is not None:
            self._send(*fields)

    @work(exclusive=True, group="send-job")
    async def _send(self, payload: Any, delay: float, attempts: int | None, key: str | None) -> None:
        try:
            sent = await self.backend.send_job(self.queue, payload, delay=delay, attempts=attempts, key=key)
        except SchedtuiError as exc:
            self._problem(exc.message)
            return
        self.dismiss(sent)

    def action_cancel(self) -> None:
        self.dismiss(None)
