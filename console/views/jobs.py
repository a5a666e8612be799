"""View 3: the job queues, and the selected queue's jobs.

A row per queue (running n/concurrency, queued, dead, how long the oldest due job has
waited, paused); under it the selected queue's jobs, newest first, filterable by status
(``f``) and paged by keyset (``]``/``[``). Enter on a queue goes to its jobs; Enter on a
job opens its details (payload, attempt k/N, the countdown to its next try, every
attempt's error). ``R`` retries the selected dead job, or, with the dead filter on, every
dead job shown (their count typed above 25); ``x`` deletes the selected job (asked first);
``P`` pauses or resumes the queue (``p`` stays the pause of refreshes); ``n`` sends a job.
Acting is refused, saying why, when the console is read-only.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from datetime import datetime
from typing import ClassVar, Final

from textual import on
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import DataTable

from backend.errors import NotFound, SchedtuiError
from backend.jobs.model import Job, JobsPage, NotDead, QueueView, Sent
from backend.observability.logs import RunLog
from backend.safetext import in_line
from console.keys import Key, action_key, bindings
from console.screens.confirm import Confirm
from console.screens.jobs import RETRY_CONFIRM_ABOVE, JobDetails, SendJobScreen, TypedCount
from console.screens.log import LogScreen
from console.views.base import View, details_key
from console.widgets.jobs import JobsTable, QueuesTable
from console.widgets.line import Line
from console.workers import work

__all__ = ["JOBS_PAGE", "JobsView", "STATUS_CYCLE"]

JOBS_PAGE: Final = 100
"""Jobs per page."""
STATUS_CYCLE: Final = (None, "queued", "running", "dead")
"""What ``f`` steps through: every job, then each status."""


class JobsView(View):
    """See the module."""

    view_id = "jobs"
    topics: ClassVar[tuple[str, ...]] = ("jobs",)

    KEYS = (
        Key("f", "cycle_status", "Status", ("list_jobs",), id="jobs_status",
            help="show every job, or only the queued, running or dead ones"),
        action_key("retry_job", "R", "Retry", help="retry the selected dead job (with the dead filter: every dead job shown)"),
        action_key("delete_job", "x", "Delete", help="delete the selected job"),
        Key("P", "toggle_queue_paused", "Pause/resume", ("pause_queue", "resume_queue"), title="Pause/resume",
            help="pause or resume the selected queue"),
        action_key("send_job", "n", "Send", help="send a job to the selected queue (a payload editor)"),
        Key("right_square_bracket", "older_jobs", "Older jobs", ("list_jobs",), show=False,
            help="older jobs (the next page, by keyset)"),
        Key("left_square_bracket", "newer_jobs", "Newer jobs", ("list_jobs",), show=False,
            help="newer jobs (back towards the newest page)"),
        details_key("a queue: its jobs; a job: its details (payload, attempts, next try)"),
        action_key("job_log", "l", "Log", title="Job log",
                   help="the log of the selected job's newest attempt"),
    )  # fmt: skip
    BINDINGS = bindings(KEYS)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.queues: list[QueueView] = []
        self.selected_queue: str | None = None
        self.status: str | None = None
        """The status filter of the jobs table (``None``: every job)."""
        self.page: JobsPage | None = None
        self._pages: list[str | None] = [None]
        self._page_of: tuple[str, str | None, str | None] | None = None
        """(queue, status, before) of the page on screen."""
        self.moved: tuple[str, str | None] | None = None
        """The selected job that left the page by itself (deleted, retried, done elsewhere)
        and the one the cursor fell on instead, until the operator moves the cursor or
        presses a key that acts (which then acts on nothing, saying so): ``x`` ``y`` typed
        ahead deleted a job nobody had picked."""
        self._deleting: str | None = None
        """The job this console is deleting (its row going is no surprise)."""
        self._shown_of: tuple[str | None, str | None, str | None] | None = None
        """(queue, status, before) of the jobs the table shows."""
        self._pausing: dict[str, tuple[int, bool]] = {}
        """Per queue, the last pause or resume sent and not answered yet (a number and the
        state it sets): ``P`` pressed again meanwhile toggles from that state (it toggled
        from the list read before, and ``P`` ``P`` paused twice), and the writes of one
        queue go one after another, in the order pressed."""
        self._pauses = itertools.count()
        self._pause_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def compose(self) -> ComposeResult:
        yield Line("QUEUES", id="queues-title", classes="section")
        yield QueuesTable(id="queues")
        yield Line("JOBS", id="jobs-title", classes="section")
        yield JobsTable(id="jobs-table")

    @property
    def queues_table(self) -> QueuesTable:
        return self.query_one(QueuesTable)

    @property
    def jobs_table(self) -> JobsTable:
        return self.query_one(JobsTable)

    def focus_main(self) -> None:
        self.queues_table.focus()

    # -- data ---------------------------------------------------------------------------
    async def load(self) -> None:
        backend = self.console.backend
        self.queues = await backend.list_queues()
        names = [q.name for q in self.queues]
        if self.selected_queue not in names:
            self.selected_queue = names[0] if names else None
            self._pages = [None]
        if self.selected_queue is not None:
            before = self._pages[-1]
            self.page = await backend.list_jobs(self.selected_queue, status=self.status, limit=JOBS_PAGE, before=before)
            self._page_of = (self.selected_queue, self.status, before)

    @work(exclusive=True, group="jobs")
    async def load_jobs(self) -> None:
        """Read the page of jobs for the selected queue and status (a selection changed)."""
        queue, status, before = self.selected_queue, self.status, self._pages[-1]
        if queue is None:
            return
        went, page = await self.attempt(self.console.backend.list_jobs(queue, status=status, limit=JOBS_PAGE, before=before))
        if not went or page is None:
            return
        if (queue, status, before) == (self.selected_queue, self.status, self._pages[-1]):
            self.page = page
            self._page_of = (queue, status, before)
            self._show_jobs()

    # -- drawing ------------------------------------------------------------------------
    def show(self) -> None:
        now = self.console.backend_now()
        self.queues_table.show(self.queues, now)
        shown = len(self.queues)
        paused = sum(1 for q in self.queues if q.paused)
        title = f"QUEUES {shown}" + (f" · {paused} paused" if paused else "")
        if not self.loaded:
            title = "QUEUES · reading…"
        elif not self.queues:
            title += " · none yet (a queue is recorded when a process with its definition opens the store)"
        self.query_one("#queues-title", Line).update(Content(title))
        if self.selected_queue is not None and self.selected_queue in self.queues_table.queues:
            table = self.queues_table
            if table.selected_name != self.selected_queue:
                table.move_cursor(row=table.get_row_index(self.selected_queue), animate=False, scroll=True)
        self._show_jobs()

    def _show_jobs(self) -> None:
        table = self.jobs_table
        now = self.console.backend_now()
        current = (self.selected_queue, self.status, self._pages[-1])
        jobs = self.page.jobs if self.page is not None and self._page_of == current else []
        before = table.selected_job if self._shown_of == current else None  # (a page of another filter: no surprise)
        table.show(jobs, now)
        self._shown_of = current if self._page_of == current else None
        landed = table.selected_job
        if before is not None and jobs and before.id not in table.jobs and before.id != self._deleting:
            self.moved = (before.id, landed.id if landed is not None else None)
            elsewhere = f"; the cursor is on job {landed.id} now" if landed is not None else ""
            self.notify(f"Job {before.id} is no longer shown: deleted, retried or finished elsewhere{elsewhere}.",
                        title="Job gone", severity="warning", markup=False)  # fmt: skip
        queue = self.selected_queue
        if queue is None:
            self.query_one("#jobs-title", Line).update(Content("JOBS"))
            return
        which = self.status or "all"
        key = self.shown_key
        title = f"JOBS of {queue} · {which} ({key('jobs_status')}) · {len(jobs)} shown"
        if len(self._pages) > 1:
            title += f" · page {len(self._pages)} ({key('newer_jobs')} newer)"
        if self.page is not None and self.page.next_before is not None:
            title += f" · {key('older_jobs')} older"
        view = next((q for q in self.queues if q.name == queue), None)
        if view is not None and view.paused:
            title += f" · ‖ paused ({key('toggle_queue_paused')} resumes)"
        self.query_one("#jobs-title", Line).update(Content(title + table.off_screen()))
        # (the columns' widths are known once the rows are laid out)
        self.call_after_refresh(lambda: self.query_one("#jobs-title", Line).update(Content(title + table.off_screen())))

    def tick(self, now: datetime) -> None:
        now = self.console.backend_now()  # (what the server's times are counted against)
        self.queues_table.tick(now)
        self.jobs_table.tick(now)

    # -- selection ------------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#queues")
    def _queue_highlighted(self, event: DataTable.RowHighlighted) -> None:
        name = getattr(event.row_key, "value", None)  # (no row: a key moved in an empty table)
        if name is None or name == self.selected_queue:
            return
        self.selected_queue = name
        self._pages = [None]
        self.page = None
        self._show_jobs()
        self.load_jobs()

    @on(DataTable.RowSelected, "#queues")
    def _queue_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.jobs_table.focus()

    @on(DataTable.RowHighlighted, "#jobs-table")
    def _job_highlighted(self, event: DataTable.RowHighlighted) -> None:
        job_id = getattr(event.row_key, "value", None)
        if self.moved is not None and job_id != self.moved[1]:
            self.moved = None  # the operator moved the cursor: what it is on now is chosen

    @on(DataTable.RowSelected, "#jobs-table")
    def _job_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.open_details()

    def open_details(self) -> None:
        if self.focused_table() is self.queues_table:
            self.jobs_table.focus()
            return
        job = self.jobs_table.selected_job
        if job is None:
            self.notify("No job selected.", severity="information")
            return
        console = self.console
        self.app.push_screen(JobDetails(console.backend, job, console.display_zone, console.clock.now))

    def focused_table(self) -> DataTable[object] | None:
        focused = self.app.focused
        return focused if isinstance(focused, DataTable) else None

    def action_cycle_status(self) -> None:
        """``f``: every job, then only queued, running, dead."""
        self.status = STATUS_CYCLE[(STATUS_CYCLE.index(self.status) + 1) % len(STATUS_CYCLE)]
        self._pages = [None]
        self.page = None
        self._show_jobs()
        self.load_jobs()

    def action_older_jobs(self) -> None:
        if self.page is None or self.page.next_before is None:
            self.notify("No older jobs.", severity="information")
            return
        self._pages.append(self.page.next_before)
        self.load_jobs()

    def action_newer_jobs(self) -> None:
        if len(self._pages) == 1:
            self.notify("Already on the newest jobs.", severity="information")
            return
        self._pages.pop()
        self.load_jobs()

    # -- acting -------------------------------------------------------------------------
    def _may_act(self, action: str) -> str | None:
        """The selected queue; ``None``, saying so, when there is none."""
        if self.selected_queue is None:
            self.notify(f"{action}: no queue selected.", severity="warning")
        return self.selected_queue

    def _job_for(self, action: str) -> tuple[str, Job] | None:
        queue = self._may_act(action)
        if queue is None:
            return None
        job = self.jobs_table.selected_job
        if job is None:
            self.notify(f"{action}: no job selected (Enter on a queue goes to its jobs).", severity="warning")
            return None
        if self.moved is not None:
            gone, _ = self.moved
            self.moved = None
            self.notify(f"{action}: not done. Job {gone} left the list and the cursor moved by itself. "
                        f"Press the key again to act on job {job.id}.", title="Job gone", severity="warning",
                        markup=False)  # fmt: skip
            return None
        return queue, job

    def action_job_log(self) -> None:
        """``l``: the log of the selected job's newest attempt."""
        selected = self._job_for("Log")
        if selected is None:
            return
        queue, job = selected
        backend, job_id = self.console.backend, job.id
        attempt: list[int | None] = [None]  # the attempt first read is the one followed

        async def read(after: int) -> RunLog:
            answer = await backend.job_log(job_id, attempt=attempt[0], after=after)
            attempt[0] = answer.attempt
            return answer

        self.app.push_screen(LogScreen(read, f"Log of job {job_id} · {queue}"))

    def action_retry_job(self) -> None:
        """``R``: retry the selected dead job; with the dead filter, every dead job shown."""
        if self.status == "dead" and self.focused_table() is not self.queues_table:
            queue = self._may_act("Retry")
            if queue is None:
                return
            if self._page_of != (self.selected_queue, self.status, self._pages[-1]):
                # (f pressed just before: the table still shows the jobs of before)
                self.notify(f"The dead jobs of {queue} are still being read: press R again once they are shown.",
                            severity="information", markup=False)  # fmt: skip
                return
            dead = [j for j in self.jobs_table.jobs.values() if j.status == "dead"]
            if not dead:
                self.notify("No dead job shown.", severity="information")
                return
            chosen: str = queue  # (narrowed for the closure)

            def answer(go: bool | None) -> None:
                if go:
                    self._retry(chosen, [j.id for j in dead])

            question = f"Retry the {len(dead)} dead jobs shown of {queue}?"
            detail = "Each goes back in the queue with fresh attempts."
            if len(dead) > RETRY_CONFIRM_ABOVE:  # as a backfill: the count typed, not a key pressed
                self.app.push_screen(TypedCount(question, detail, len(dead)), answer)
            else:
                self.app.push_screen(Confirm(question, detail), answer)
            return
        target = self._job_for("Retry")
        if target is None:
            return
        queue, job = target
        if job.status != "dead":
            self.notify(f"Job {job.id} is {job.status}: only a dead job can be retried.", severity="warning")
            return
        self._retry(queue, [job.id])

    @work(group="jobs-action")
    async def _retry(self, queue: str, ids: list[str]) -> None:
        done = moved = 0
        for job_id in ids:
            try:
                await self.console.backend.retry_job(queue, job_id)
            except (NotDead, NotFound) as exc:
                if len(ids) == 1:
                    self.console.report(exc)
                    break
                moved += 1  # (retried, deleted elsewhere since it was asked: the rest go on)
                continue
            except SchedtuiError as exc:
                self.console.report(exc)
                break
            done += 1
        if done:
            what = f"job {ids[0]}" if len(ids) == 1 else f"{done} of {len(ids)} dead jobs"
            self.notify(f"{queue}: {what} queued again with fresh attempts", title="Retried")
        if moved:
            self.notify(f"{queue}: {moved} of the {len(ids)} dead jobs asked about were no longer dead (retried or "
                        f"deleted elsewhere since): left as they are", title="Retry", severity="warning")  # fmt: skip
        self.console.request_refresh()

    def action_delete_job(self) -> None:
        """``x``: delete the selected job, after asking."""
        target = self._job_for("Delete")
        if target is None:
            return
        queue, job = target
        def answer(go: bool | None) -> None:
            if go:
                self._delete(queue, job)

        facts = [f"It is {job.status}, try {job.attempt}/{job.max_attempts}" + (f", key {in_line(job.key)}" if job.key else "") + "."]
        self.app.push_screen(Confirm.of("delete_job", {"queue": queue, "job_id": job.id}, facts=facts), answer)

    @work(group="jobs-action")
    async def _delete(self, queue: str, job: Job) -> None:
        self._deleting = job.id
        try:
            await self.console.backend.delete_job(queue, job.id)
        except SchedtuiError as exc:
            self.console.report(exc)
            return
        self.notify(f"{queue}: job {job.id} deleted", title="Deleted")
        self.console.request_refresh()

    def action_toggle_queue_paused(self) -> None:
        """``P``: pause or resume the selected queue."""
        queue = self._may_act("Pause/resume")
        if queue is None:
            return
        pending = self._pausing.get(queue)
        if pending is not None:
            paused = pending[1]
        else:
            view = next((q for q in self.queues if q.name == queue), None)
            paused = view.paused if view is not None else False
        mine = (next(self._pauses), not paused)
        self._pausing[queue] = mine
        self._pause(queue, mine)

    @work(group="jobs-action")
    async def _pause(self, queue: str, mine: tuple[int, bool]) -> None:
        try:
            async with self._pause_locks[queue]:  # (first come, first served: in the order pressed)
                view = await self.console.backend.set_queue_paused(queue, mine[1])
        except SchedtuiError as exc:
            self.console.report(exc)
            return
        finally:
            if self._pausing.get(queue) == mine:
                del self._pausing[queue]
        self.queues = [view if q.name == queue else q for q in self.queues]
        self.show()
        if view.paused:
            self.notify(f"{queue} paused: its jobs wait (running ones finish); {self.shown_key('toggle_queue_paused')} resumes",
                        title="Paused queue")  # fmt: skip
        else:
            self.notify(f"{queue} resumed", title="Resumed queue")
        self.console.request_refresh()

    def action_send_job(self) -> None:
        """``n``: send a job to the selected queue (a payload editor)."""
        queue = self._may_act("Send")
        if queue is None:
            return

        def sent(result: Sent | None) -> None:
            if result is None:
                return
            if result.duplicate:
                self.notify(f"{queue}: a job with that key is there already: {result.id}; nothing queued",
                            title="Duplicate", severity="warning", markup=False)
            else:
                self.notify(f"{queue}: job {result.id} queued", title="Sent")
            self.console.request_refresh()

        self.app.push_screen(SendJobScreen(self.console.backend, queue), sent)
