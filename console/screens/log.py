"""A log on screen: a run's, a job attempt's or a durable execution's (``l``).

The log is read once when the screen opens; while it is still running it is read again
every :data:`FOLLOW_EVERY_S` from where the last read stopped (its ``size``), and what came
is appended, as ``schedtui logs --follow`` does. The line above the log says whose it is,
its status and, once the log outgrew what is kept, how much was left out between its
first and last 32 KiB. Esc closes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Log, Static

from backend.errors import SchedtuiError
from backend.observability.logs import RunLog
from backend.safetext import in_lines
from console import format as fmt
from console.workers import work

__all__ = ["FOLLOW_EVERY_S", "LogScreen"]

#: How often a running log is read again (seconds).
FOLLOW_EVERY_S: Final = 1.0

Read = Callable[[int], Awaitable[RunLog]]
"""Reads the log past its first ``after`` bytes."""


class LogScreen(ModalScreen[None]):
    """See the module. ``read(after)`` reads the log; ``title`` says whose it is."""

    DEFAULT_CSS = """
    LogScreen {
        align: center middle;
    }
    LogScreen > Vertical {
        width: 100%;
        height: 100%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    LogScreen #log-status {
        height: auto;
        color: $text-muted;
    }
    LogScreen Log {
        height: 1fr;
        background: $surface;
        scrollbar-size: 1 1;
    }
    """

    BINDINGS = [Binding("escape,q", "close", "Close", id="close_log")]

    def __init__(self, read: Read, title: str) -> None:
        super().__init__()
        self.read = read
        self.title_text = title
        self.log_data: RunLog | None = None
        """The last answer read."""
        self.read_up_to = 0
        """Bytes of the log shown so far (where the next read starts)."""
        self._follow: Timer | None = None

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self.title_text
            box.border_subtitle = "↑↓ PgUp PgDn scroll · esc closes"
            yield Static("reading the log…", id="log-status", markup=False)
            yield Log(highlight=False, auto_scroll=True, id="log-text")

    def on_mount(self) -> None:
        self.reload()

    @work(exclusive=True, group="log")
    async def reload(self) -> None:
        """Read what came since the last read, append it, and follow while it runs."""
        try:
            answer = await self.read(self.read_up_to)
        except SchedtuiError as exc:
            self.notify(exc.message, title=exc.title, severity="warning", markup=False)
            self.query_one("#log-status", Static).update(f"cannot read the log: {exc.message}")
            return
        self.show(answer)

    def show(self, answer: RunLog) -> None:
        self.log_data = answer
        text = self.query_one("#log-text", Log)
        if answer.text:
            # A handler's colours and a progress bar's returns, as their escapes: written as
            # they are, they would reach the terminal (see console.unprintable).
            text.write(in_lines(answer.text.replace("\r\n", "\n")))
        self.read_up_to = answer.size
        self.query_one("#log-status", Static).update(self.status_line(answer))
        if answer.running and self._follow is None:
            self._follow = self.set_interval(FOLLOW_EVERY_S, self.reload, name="follow-log")
        elif not answer.running and self._follow is not None:
            self._follow.stop()
            self._follow = None

    @staticmethod
    def status_line(answer: RunLog) -> str:
        glyph = fmt.STATUS_GLYPHS.get(answer.status) or fmt.EXECUTION_GLYPHS.get(answer.status, "")
        parts = [f"{glyph} {answer.status}".strip()]
        if answer.kind == "job" and answer.attempt is not None:
            parts.append(f"attempt {answer.attempt}")
        if answer.kind == "durable":  # (its size is its newest line's number, not an amount)
            if not answer.size:
                parts.append("nothing written")
        else:
            parts.append(f"{_amount(answer.size)} written" if answer.size else "nothing written")
        if answer.omitted_bytes:
            parts.append(f"{_amount(answer.omitted_bytes)} ({answer.omitted_lines:,} lines) left out in the middle")
        if answer.running:
            parts.append("following…")
        return " · ".join(parts)

    def action_close(self) -> None:
        if self._follow is not None:
            self._follow.stop()
        self.dismiss(None)


def _amount(size: int) -> str:
    if size < 1024:
        return f"{size:,} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:,.1f} KiB"
    return f"{size / 1024 / 1024:,.1f} MiB"
