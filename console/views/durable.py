"""View 4: durable executions, newest first: status, the step each is at, what it waits
for and until when. ``enter`` opens the step timeline (``f`` there: failed only); ``a``
sends the signal the execution waits for (a payload prompt), ``c`` cancels it (after a
confirmation), ``R`` retries a failed one from its failed step."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import DataTable, Static

from backend.durable.model import Execution
from backend.errors import SchedtuiError
from backend.observability.logs import RunLog
from backend.safetext import in_line
from console import format as fmt
from console.keys import Key, action_key, bindings
from console.screens.confirm import Confirm
from console.screens.durable import SignalPrompt, StepsScreen
from console.screens.log import LogScreen
from console.views.base import View, details_key, filter_key
from console.widgets.line import Line
from console.widgets.palette import theme_color
from console.widgets.schedules import FreshTable
from console.workers import work

__all__ = ["EXECUTIONS_PAGE", "DurableView", "ExecutionsTable", "execution_matches"]

EXECUTIONS_PAGE = 200
"""Executions read on every refresh (the newest)."""

_STATUS_STYLE = {"failed": "bold red", "waiting": "yellow", "running": "cyan", "cancelled": "", "queued": ""}


def execution_matches(execution: Execution, needle: str) -> bool:
    """The filter: its text in the id, function, status, step, wait or error (any case)."""
    needle = needle.strip().lower()
    if not needle:
        return True
    fields = (execution.id, execution.function, execution.status, execution.current_step or "",
              execution.waiting_for or "", execution.error_tag or "", execution.error_message or "")  # fmt: skip
    return any(needle in field.lower() for field in fields)


def waiting_text(execution: Execution) -> str:
    """``signal approval``, ``retry fetch-31``, ``sleep cool-down``; ``-`` when not waiting."""
    return in_line(execution.waiting_for.replace(":", " ", 1)) if execution.waiting_for else "-"


class ExecutionsTable(FreshTable):
    """The executions, newest first; the error column takes the room the others leave."""

    DEFAULT_CSS = """
    ExecutionsTable {
        height: 1fr;
    }
    """

    COLUMNS = (
        ("id", "ID"), ("created", "CREATED"), ("function", "FUNCTION"), ("status", "STATUS"), ("step", "STEP"),
        ("waiting", "WAITING FOR"), ("until", "UNTIL"), ("error", "ERROR"),
    )  # fmt: skip
    ERROR_MIN = 8

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.executions: list[Execution] = []
        self._shown: list[tuple[str, tuple[Text, ...]]] = []

    def on_mount(self) -> None:
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    def _cells(self, e: Execution, created: str, now: datetime, others: int) -> tuple[Text, ...]:
        muted = Style(color=theme_color(self.app, "text-muted"))
        error = in_line(" ".join(filter(None, [e.error_tag and f"[{e.error_tag}]", e.error_message])))
        width = max(self.ERROR_MIN, self.size.width - 1 - 2 * len(self.COLUMNS) - others)
        if len(error) > width:
            error = error[: width - 1] + "…"
        return (
            Text(e.id[-6:], style=muted),
            Text(created, style=muted),
            Text(e.function, style="bold"),
            Text(f"{fmt.EXECUTION_GLYPHS.get(e.status, '?')} {e.status}", style=_STATUS_STYLE.get(e.status, "")),
            Text(e.current_step or "-"),
            Text(waiting_text(e)),
            Text(fmt.countdown(e.wake_at, now) if e.status == "waiting" and e.wake_at else "-"),
            Text(error, style="red" if error else ""),
        )

    def show(self, executions: list[Execution], zone: str, now: datetime) -> None:
        """Show ``executions``; the cursor stays on the same one when it is still there."""
        # The time alone for today's, the day too for older ones (the zone is on the tab line).
        created = [fmt.day_time(e.created_at, zone, now) for e in executions]
        others = (
            6 + max(map(len, created), default=8) + max((len(e.function) for e in executions), default=8) + 11
            + max((len(e.current_step or "-") for e in executions), default=4)
            + max((len(waiting_text(e)) for e in executions), default=11) + 9
        )  # fmt: skip
        shown = [(e.id, self._cells(e, at, now, others)) for e, at in zip(executions, created, strict=True)]
        if shown == self._shown:
            return
        selected = self.selected_execution.id if self.selected_execution is not None else None
        self.executions = list(executions)
        self._shown = shown
        self.replace_rows(shown, selected)

    @property
    def selected_execution(self) -> Execution | None:
        if not self.executions or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.executions[self.cursor_row]


class DurableView(View):
    """Durable executions, newest first (see the module docstring). The filter (``/``)
    narrows them by id, function, status, step, wait or error."""

    DEFAULT_CSS = """
    DurableView #durable-selected {
        height: auto;
        max-height: 2;
        background: $boost;
        padding: 0 1;
    }
    """

    view_id = "durable"
    topics: ClassVar[tuple[str, ...]] = ("durable",)

    KEYS = (
        details_key("the step timeline of the execution under the cursor (f there: failed only)", label="Steps"),
        action_key("signal_execution", "a", "Signal", help="send the signal the execution waits for (a payload prompt)"),
        action_key("cancel_execution", "c", "Cancel", help="cancel the execution under the cursor"),
        action_key("retry_execution", "R", "Retry", help="retry a failed execution from its failed step"),
        action_key("execution_log", "l", "Log", title="Execution log",
                   help="the log of the execution under the cursor"),
        filter_key("the executions by id, function, status, step, wait or error"),
        Key("right_square_bracket", "older_executions", "Older", ("list_executions",), show=False,
            help=f"older executions (the next {EXECUTIONS_PAGE}, by keyset)"),
        Key("left_square_bracket", "newer_executions", "Newer", ("list_executions",), show=False,
            help="newer executions (back towards the newest page)"),
    )  # fmt: skip
    BINDINGS = bindings(KEYS)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.executions: list[Execution] = []
        self.more = False
        self.next_before: str | None = None
        """Where the page after the one on screen begins (``None``: it is the oldest)."""
        self._pages: list[str | None] = [None]
        """The ``before`` of each page paged through, the one on screen last (``None``: the newest)."""
        self.moved: tuple[str, str | None] | None = None
        """The selected execution that left the list by itself (its status changed elsewhere
        under a filter, newer ones pushed it off the page) and the one the cursor fell on
        instead, until the operator moves the cursor or presses a key that acts (which then
        acts on nothing, saying so): ``c`` ``y`` typed ahead cancelled an execution nobody
        had picked, for good."""
        self._acted: str | None = None
        """The execution this console last acted on (its row going is no surprise)."""
        self._shown_of: tuple[str, str | None] | None = None
        """(filter, page) of the executions the table shows."""

    def compose(self) -> ComposeResult:
        yield Line("DURABLE", id="durable-title", classes="section")
        yield ExecutionsTable(id="durable-table")
        yield Static("", id="durable-selected", markup=False)

    @property
    def table(self) -> ExecutionsTable:
        return self.query_one(ExecutionsTable)

    def focus_main(self) -> None:
        self.table.focus()

    async def load(self) -> None:
        page = await self.console.backend.list_executions(limit=EXECUTIONS_PAGE, before=self._pages[-1])
        if not page.executions and len(self._pages) > 1:
            # The page's executions were pruned or deleted meanwhile: back to the newest.
            self._pages = [None]
            page = await self.console.backend.list_executions(limit=EXECUTIONS_PAGE)
        self.executions, self.next_before = page.executions, page.next_before
        self.more = page.next_before is not None

    def action_older_executions(self) -> None:
        """``]``: the next page of executions, further back (by keyset)."""
        if self.next_before is None:
            self.notify("No older executions.", severity="information")
            return
        self._pages.append(self.next_before)
        self.console.request_refresh()

    def action_newer_executions(self) -> None:
        """``[``: back towards the newest page."""
        if len(self._pages) == 1:
            self.notify("Already on the newest executions.", severity="information")
            return
        self._pages.pop()
        self.console.request_refresh()

    def show(self) -> None:
        console = self.console
        needle = console.filter_text.strip()
        shown = [e for e in self.executions if execution_matches(e, needle)]
        current = (needle, self._pages[-1])
        before = self.table.selected_execution if self._shown_of == current else None  # (another filter or page: no surprise)
        self.table.show(shown, console.display_zone, console.backend_now())
        self._shown_of = current if self.loaded else None
        landed = self.table.selected_execution
        if before is not None and shown and before.id not in {e.id for e in shown} and before.id != self._acted:
            self.moved = (before.id, landed.id if landed is not None else None)
            elsewhere = f"; the cursor is on {landed.id[-6:]} now" if landed is not None else ""
            self.notify(f"Execution {before.id[-6:]} is no longer shown: it changed elsewhere, or newer ones pushed it "
                        f"off the page{elsewhere}.", title="Execution gone", severity="warning", markup=False)  # fmt: skip
        self._show_selected()
        counts = {status: sum(1 for e in shown if e.status == status) for status in ("running", "waiting", "failed")}
        title = f"DURABLE {len(shown)}" + ("+" if self.more and not needle else "")
        title += "".join(f" · {n} {status}" for status, n in counts.items() if n)
        if not self.loaded:
            title = "DURABLE · reading…"
        if len(self._pages) > 1:
            title += f" · page {len(self._pages)} · {console.key_display(self.KEYS[-1], alone=True)} newer"
        if needle:
            title += f" · filter “{needle}” (esc clears)"
        # The paging keys where they apply: older while there is an older page (newer: above).
        hidden = {"filter", "newer_executions", *(() if self.more else ("older_executions",))}
        keys = " · " + " · ".join(f"{console.key_display(key, alone=True)} {key.label.lower()}" for key in self.KEYS
                                  if key.name not in hidden and console.refusal(key.name) is None)  # fmt: skip
        self._title(title, keys)
        self.call_after_refresh(self._title, title, keys)  # the columns' widths are known once laid out

    def _title(self, title: str, keys: str) -> None:
        """The title, then the columns that do not fit (before the keys, which the footer
        shows too: at 80 columns the end of the title is cut)."""
        self.query_one("#durable-title", Line).update(Content(title + self.table.off_screen() + keys))

    def tick(self, now: datetime) -> None:
        now = self.console.backend_now()  # (what the server's times are counted against)
        if self.executions:
            self.table.show(self.table.executions, self.console.display_zone, now)

    def _show_selected(self) -> None:
        e = self.table.selected_execution
        text = ""
        if e is not None:
            text = f"{e.id} · {e.function} · {e.status}"
            if e.schedule:
                text += f" · schedule {e.schedule}"
            if e.instance:
                text += f" · on {e.instance}"
            if e.error_message:
                text += f" · {e.error_message}"
            text = in_line(text)
        self.query_one("#durable-selected", Static).update(text)

    @on(DataTable.RowHighlighted, "#durable-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        selected = self.table.selected_execution
        if self.moved is not None and (selected.id if selected is not None else None) != self.moved[1]:
            self.moved = None  # the operator moved the cursor: what it is on now is chosen
        self._show_selected()

    @on(DataTable.RowSelected, "#durable-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.open_details()

    def on_resize(self) -> None:
        if self.executions:
            self.table._shown = []  # the error column's width changed
            self.show()

    # -- the timeline --------------------------------------------------------------------
    def open_details(self) -> None:
        execution = self.table.selected_execution
        if execution is None:
            self.notify("No execution selected.", severity="warning")
            return
        backend, execution_id = self.console.backend, execution.id

        async def read() -> Execution | None:
            _, detail = await self.attempt(backend.get_execution(execution_id))
            return detail

        # At once, read from within: the keys typed after enter go to it.
        self.app.push_screen(StepsScreen(execution, self.console.display_zone, self.console.backend_now(), read=read))

    def action_execution_log(self) -> None:
        """``l``: the log of the execution under the cursor."""
        execution = self._target("Log")
        if execution is None:
            return
        backend, execution_id = self.console.backend, execution.id

        async def read(after: int) -> RunLog:
            return await backend.execution_log(execution_id, after=after)

        self.app.push_screen(LogScreen(read, f"Log of {execution.function} · execution {execution_id}"))

    # -- actions -------------------------------------------------------------------------
    def _target(self, action: str) -> Execution | None:
        """The execution under the cursor; ``None``, saying so, when there is none."""
        execution = self.table.selected_execution
        if execution is None:
            self.notify(f"{action}: no execution selected.", severity="warning")
            return None
        if self.moved is not None:
            gone, _ = self.moved
            self.moved = None
            self.notify(f"{action}: not done. Execution {gone[-6:]} left the list and the cursor moved by itself. "
                        f"Press the key again to act on {execution.id[-6:]}.", title="Execution gone", severity="warning",
                        markup=False)  # fmt: skip
            return None
        return execution

    def action_signal_execution(self) -> None:
        """``a``: send the signal the selected execution waits for, with a payload."""
        execution = self._target("Signal")
        if execution is None:
            return
        waiting = execution.waiting_for or ""
        if execution.status != "waiting" or not waiting.startswith("signal:"):
            now = f"waiting for {waiting_text(execution)}" if execution.status == "waiting" else execution.status
            self.notify(f"Execution {execution.id[-6:]} waits for no signal ({now}).", title="Signal",
                        severity="warning", markup=False)  # fmt: skip
            return
        name = waiting.split(":", 1)[1]

        def send(answer: tuple[Any] | None) -> None:
            if answer is not None:
                self._send(execution.id, name, answer[0])

        self.app.push_screen(SignalPrompt(execution, name), send)

    @work(group="durable-action")
    async def _send(self, execution_id: str, name: str, payload: Any) -> None:
        self._acted = execution_id
        try:
            sent = await self.console.backend.signal_execution(execution_id, name, payload)
        except SchedtuiError as exc:
            self.console.report(exc)
            return
        note = " (it had one already: the first is kept)" if sent.duplicate else ""
        self.notify(f"{name} sent to {execution_id[-6:]}{note}", title="Signal sent", markup=False)
        self.console.request_refresh()

    def action_cancel_execution(self) -> None:
        """``c``: cancel the selected execution, once confirmed."""
        execution = self._target("Cancel")
        if execution is None:
            return
        if execution.done:
            self.notify(f"Execution {execution.id[-6:]} has finished ({execution.status}).", title="Cancel",
                        severity="warning")  # fmt: skip
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._cancel(execution.id)

        facts = [f"{execution.function}, {execution.status}" + (f", at step {execution.current_step}" if execution.current_step else "")]
        self.app.push_screen(Confirm.of("cancel_execution", {"execution_id": execution.id}, facts=facts), confirmed)

    @work(group="durable-action")
    async def _cancel(self, execution_id: str) -> None:
        self._acted = execution_id
        try:
            execution = await self.console.backend.cancel_execution(execution_id)
        except SchedtuiError as exc:
            self.console.report(exc)
            return
        what = "stops at its next step" if execution.status == "running" else execution.status
        self.notify(f"{execution.function} {execution_id[-6:]}: {what}", title="Cancelled", markup=False)
        self.console.request_refresh()

    def action_retry_execution(self) -> None:
        """``R``: retry the selected execution from its failed step."""
        execution = self._target("Retry")
        if execution is None:
            return
        if execution.status != "failed":
            self.notify(f"Only a failed execution can be retried; {execution.id[-6:]} is {execution.status}.",
                        title="Retry", severity="warning")  # fmt: skip
            return
        self._retry(execution.id)

    @work(group="durable-action")
    async def _retry(self, execution_id: str) -> None:
        self._acted = execution_id
        try:
            execution = await self.console.backend.retry_execution(execution_id)
        except SchedtuiError as exc:
            self.console.report(exc)
            return
        self.notify(f"{execution.function} {execution_id[-6:]}: queued again from its failed step", title="Retried",
                    markup=False)  # fmt: skip
        self.console.request_refresh()
