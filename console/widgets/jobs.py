"""The job queue's tables: one row per queue, and the selected queue's jobs.

Like the schedules table, each redraws only the cells that changed, and the columns that
change with time alone (how long the oldest due job waits, a queued job's countdown to its
next try, how long a running one has run) are recomputed on every tick.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType

from backend.jobs.model import Job, QueueView
from backend.safetext import in_line
from console import format as fmt
from console.widgets.palette import FAILED_EMPHASIS, theme_color
from console.widgets.schedules import FreshTable

__all__ = ["JOB_STATUS_COLORS", "JobsTable", "QueuesTable", "job_status_text", "job_when"]

JOB_STATUS_COLORS = {"queued": "text-secondary", "running": "text-primary", "dead": "text-error"}
JOB_STATUS_GLYPHS = {"queued": "…", "running": "▶", "dead": "✗"}
ERROR_MAX = 60


def job_status_text(app: object, status: str) -> Text:
    """``✗ dead`` in its colour (dead bold and reversed, as a failure is)."""
    from textual.app import App

    assert isinstance(app, App)
    style = Style(color=theme_color(app, JOB_STATUS_COLORS.get(status, "foreground")))
    if status == "dead":
        style += FAILED_EMPHASIS
    return Text(f"{JOB_STATUS_GLYPHS.get(status, '?')} {status}", style=style)


def job_when(job: Job, now: datetime) -> str:
    """What the job waits for: ``due``, ``in 18s`` (its first or next try), ``12s`` (running
    for), or nothing (dead)."""
    if job.status == "queued":
        return "due" if job.run_after <= now else fmt.countdown(job.run_after, now)
    if job.status == "running" and job.started_at is not None:
        return f"{fmt.age(job.started_at, now)} running"
    return ""


def short_id(job_id: str) -> str:
    """The end of a job's id (its random part): enough to tell jobs apart on screen; the
    details show it whole."""
    return "…" + job_id[-8:]


class QueuesTable(FreshTable):
    """One row per queue: running n/concurrency, queued, dead, how long the oldest due job
    has waited, paused."""

    DEFAULT_CSS = """
    QueuesTable {
        height: auto;
        max-height: 40%;
        min-height: 3;
    }
    """

    COLUMNS = (
        ("name", "QUEUE", None),
        ("running", "RUNNING", 9),
        ("queued", "QUEUED", 8),
        ("dead", "DEAD", 7),
        ("oldest", "OLDEST DUE", 11),
        ("state", "STATE", 8),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.queues: dict[str, QueueView] = {}
        self._shown: dict[str, tuple[Text, ...]] = {}

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    @property
    def selected_name(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None

    def _cells(self, queue: QueueView, now: datetime) -> tuple[Text, ...]:
        muted = theme_color(self.app, "text-muted")
        full = queue.running >= queue.concurrency
        return (
            Text(queue.name, style="bold"),
            Text(f"{queue.running}/{queue.concurrency}", style="bold" if full else ""),
            Text(f"{queue.queued:,}"),
            Text(f"{queue.dead:,}", style=Style(color=theme_color(self.app, "text-error"), bold=True) if queue.dead else muted),
            Text(fmt.age(queue.oldest_queued_at, now) if queue.oldest_queued_at else "-", style="" if queue.oldest_queued_at else muted),
            Text("‖ paused", style=Style(color=theme_color(self.app, "text-warning"), bold=True)) if queue.paused else Text(""),
        )

    def show(self, queues: list[QueueView], now: datetime) -> None:
        names = [q.name for q in queues]
        self.queues = {q.name: q for q in queues}
        if names != list(self._shown):
            selected = self.selected_name
            self.clear()
            self._shown = {}
            for queue in queues:
                cells = self._cells(queue, now)
                self._shown[queue.name] = cells
                self.add_row(*cells, key=queue.name)
            self.measure_now()
            if selected in self._shown:
                self.move_cursor(row=self.get_row_index(selected), animate=False, scroll=True)
            return
        for queue in queues:
            self._update_row(queue.name, self._cells(queue, now))

    def _update_row(self, name: str, cells: tuple[Text, ...]) -> None:
        old = self._shown[name]
        for (key, _, width), new_cell, old_cell in zip(self.COLUMNS, cells, old, strict=False):
            if new_cell != old_cell:
                self.update_cell(name, key, new_cell, update_width=width is None)
        self._shown[name] = cells

    def tick(self, now: datetime) -> None:
        for name, queue in self.queues.items():
            if name in self._shown and queue.oldest_queued_at is not None:
                self._update_row(name, self._cells(queue, now))


_ENDS: list[BindingType] = [
    Binding("home", "scroll_top", "First", show=False),
    Binding("end", "scroll_bottom", "Last", show=False),
]


class JobsTable(FreshTable):
    """A page of one queue's jobs, newest first: status, attempt k/N, what it waits for,
    the end of its id, its key, the schedule that sent it, and the last error."""

    DEFAULT_CSS = """
    JobsTable {
        height: 1fr;
        min-height: 3;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = _ENDS

    COLUMNS = (
        ("status", "STATUS", 9),
        ("attempt", "TRY", 5),
        ("when", "WHEN", 12),
        ("id", "ID", 9),
        ("key", "KEY", None),
        ("cron", "SCHEDULE", None),
        ("error", "LAST ERROR", None),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.jobs: dict[str, Job] = {}
        self._shown: dict[str, tuple[Text, ...]] = {}

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    @property
    def selected_job(self) -> Job | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None
        return self.jobs.get(key or "")

    def _cells(self, job: Job, now: datetime) -> tuple[Text, ...]:
        muted = theme_color(self.app, "text-muted")
        error = in_line(" ".join(filter(None, [job.error_tag and f"[{job.error_tag}]", job.error_message])))
        if len(error) > ERROR_MAX:
            error = error[: ERROR_MAX - 1] + "…"
        last_try = job.attempt >= job.max_attempts and job.status != "dead"
        return (
            job_status_text(self.app, job.status),
            Text(f"{job.attempt}/{job.max_attempts}", style="bold" if last_try else ""),
            Text(job_when(job, now)),
            Text(short_id(job.id), style=muted),
            Text(in_line(job.key or "")),
            Text(job.cron or "", style=muted),
            Text(error, style=Style(color=theme_color(self.app, "text-error")) if error else muted),
        )

    def show(self, jobs: list[Job], now: datetime) -> None:
        ids = [j.id for j in jobs]
        self.jobs = {j.id: j for j in jobs}
        if ids != list(self._shown):
            selected = self.selected_job
            self.clear()
            self._shown = {}
            for job in jobs:
                cells = self._cells(job, now)
                self._shown[job.id] = cells
                self.add_row(*cells, key=job.id)
            self.measure_now()
            if selected is not None and selected.id in self._shown:
                self.move_cursor(row=self.get_row_index(selected.id), animate=False, scroll=True)
            return
        for job in jobs:
            self._update_row(job.id, self._cells(job, now))

    def _update_row(self, job_id: str, cells: tuple[Text, ...]) -> None:
        old = self._shown[job_id]
        for (key, _, width), new_cell, old_cell in zip(self.COLUMNS, cells, old, strict=False):
            if new_cell != old_cell:
                self.update_cell(job_id, key, new_cell, update_width=width is None)
        self._shown[job_id] = cells

    def tick(self, now: datetime) -> None:
        first = max(0, int(self.scroll_y) - 1)
        last = first + self.size.height + 1
        for job_id in list(self._shown)[first:last]:
            job = self.jobs.get(job_id)
            if job is not None and job.status != "dead":
                self._update_row(job_id, self._cells(job, now))
