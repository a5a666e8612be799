"""The details of one run: every field of the ledger row, in the display zone, the
schedule's own zone and UTC; scrollable, with room for a traceback."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from backend.client.interface import Backend
from backend.errors import SchedtuiError
from backend.model import Run
from console import format as fmt
from console.unprintable import escaped
from console.widgets.palette import OUTCOME_COLORS, STATUS_COLORS
from console.widgets.runs import lag
from console.workers import work

__all__ = ["RunDetails"]


class RunDetails(ModalScreen[None]):
    """Shows a run; re-reads it from the backend once, so a run that was ``running`` when
    it was picked shows how it ended."""

    DEFAULT_CSS = """
    RunDetails {
        align: center middle;
    }
    RunDetails > VerticalScroll {
        width: 90;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [
        Binding("escape,enter,q", "close", "Close", id="close_details"),
    ]

    def __init__(self, backend: Backend, run: Run, zone: str, display_zone: str | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.run_data = run
        """The run shown (replaced by the fresh copy once it has been read)."""
        self.zone = zone
        """The schedule's own zone."""
        self.display_zone = display_zone or zone

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"Run {self.run_data.id}"
            box.border_subtitle = "↑↓ scroll · esc closes"
            yield Static(self._body(), id="run-body")

    def on_mount(self) -> None:
        self.reload()

    @work(exclusive=True, group="details")
    async def reload(self) -> None:
        try:
            run = await self.backend.get_run(self.run_data.id)
        except SchedtuiError as exc:
            self.notify(exc.message, title=exc.title, severity="warning", markup=False)
            return
        self.run_data = run
        self.query_one("#run-body", Static).update(self._body())

    def _body(self) -> Content:
        run = self.run_data
        zone = self.display_zone
        own = self.zone
        status_color = STATUS_COLORS.get(run.status, "foreground")
        outcome_color = OUTCOME_COLORS.get(run.coordination_outcome, "foreground")

        def when(label: str, value: object) -> str:
            from datetime import datetime

            if not isinstance(value, datetime):
                return f"[$text-muted]{label:<13}[/] -"
            also = f" · {fmt.local_time(value, own)}" if own != zone else ""
            return (
                f"[$text-muted]{label:<13}[/] {fmt.local_time(value, zone)}"
                f" [$text-muted]({escaped(value.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3])}Z{escaped(also)})[/]"
            )

        status_style = f"b{' reverse' if run.status == 'failed' else ''} ${status_color}"
        status_glyph = fmt.STATUS_GLYPHS.get(run.status, "?")
        outcome_glyph = fmt.OUTCOME_GLYPHS.get(run.coordination_outcome, "?")
        lines = [
            f"[$text-muted]{'schedule':<13}[/] [b]{escaped(run.name)}[/b]",
            f"[$text-muted]{'status':<13}[/] [{status_style}]{status_glyph} {run.status}[/]",
            f"[$text-muted]{'trigger':<13}[/] {run.trigger}",
            f"[$text-muted]{'coordination':<13}[/] [${outcome_color}]{outcome_glyph} {run.coordination_outcome}[/]",
            f"[$text-muted]{'instance':<13}[/] {escaped(run.instance)}",
            when("scheduled at", run.scheduled_at),
            when("fired at", run.fired_at) + (f" [$text-muted]lag[/] {lag(run)}" if run.fired_at else ""),
            when("finished at", run.finished_at),
            f"[$text-muted]{'duration':<13}[/] {fmt.duration(run.duration_ms)}",
        ]
        if run.error_tag or run.error_message:
            lines.append(f"[$text-muted]{'error':<13}[/] [b reverse $text-error] {escaped(run.error_tag or '')} [/]")
            if run.error_message:
                lines.append("")
                lines.append(f"[$text-error]{escaped(run.error_message)}[/]")
        # Where the traceback goes once the ledger keeps it (the runner's issue): any
        # ``traceback`` the run carries is shown here, whole; this screen scrolls.
        traceback = getattr(run, "traceback", None)
        if isinstance(traceback, str) and traceback:
            lines += ["", "[$text-muted]traceback[/]", f"[$text-error]{escaped(traceback)}[/]"]
        return Content.from_markup("\n".join(lines))

    def action_close(self) -> None:
        self.dismiss(None)
