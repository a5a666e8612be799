"""The console's Jobs view (key 3) under Pilot, at the frozen instant of the fixture ledger
(tests/console_fixtures.py: ``add_jobs``): queues with their counts, a queue's jobs by
status, a job's details, and every action (retry, delete, pause, send) with its read-only
refusal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, TextArea

from backend import ManualClock
from backend.client.interface import Backend
from backend.jobs.store import Finish, JobStore, NewJob
from backend.store import open_store
from console.app import SchedtuiApp
from console.screens.confirm import Confirm
from console.screens.jobs import JobDetails, SendJobScreen, TypedCount
from console.views.jobs import JobsView
from console.widgets.footer import KeyFooter
from console.widgets.jobs import JobsTable, QueuesTable
from console.widgets.line import Line
from tests.console_fixtures import FROZEN, WHERE, Held, console_backend, ledger_copy
from tests.console_scenes import make_ledger
from tests.test_console import Notes, settle

ZONE = "Europe/Berlin"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-jobs")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


@asynccontextmanager
async def jobs_view(
    url: str, *, size: tuple[int, int] = (120, 32), backend: Any = None, **kwargs: Any
) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], ManualClock, Notes, JobsView]]:
    clock = ManualClock(FROZEN)
    backend = backend or console_backend(url, clock, read_only=kwargs.get("read_only", False))
    app = SchedtuiApp(backend, clock, where=WHERE, operator_zone=ZONE, **kwargs)
    notes = Notes(app)
    try:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            await pilot.press("3")
            await settle(pilot)
            view = app.active_view
            assert isinstance(view, JobsView)
            yield app, pilot, clock, notes, view
    finally:
        await backend.close()


def rows(table: Any) -> list[list[str]]:
    return [[str(getattr(cell, "plain", cell)) for cell in table.get_row_at(i)] for i in range(table.row_count)]


async def store_of(url: str) -> Any:
    store = open_store(url, create=False)
    await store.open()
    return store


async def test_queues_with_their_counts_and_a_queues_jobs_by_status(store_url: str) -> None:
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        queues = rows(view.query_one(QueuesTable))
        assert queues == [
            ["mailer", "1/4", "4", "2", "4s", ""],
            ["thumbnails", "0/2", "5", "0", "2m", "‖ paused"],
            ["webhooks", "0/8", "0", "0", "-", ""],
        ]
        jobs = view.query_one(JobsTable)
        statuses = [r[0] for r in rows(jobs)]
        assert statuses == ["… queued"] * 3 + ["▶ running", "… queued", "✗ dead", "✗ dead"]
        assert [r[2] for r in rows(jobs)][:5] == ["due", "due", "in 5s", "15s running", "in 15s"]
        assert rows(jobs)[2][4] == "receipt:42" and rows(jobs)[5][1] == "3/3"
        assert "[SMTPConnectError] smtp.example.internal:587 refused the" in rows(jobs)[5][6]
        await pilot.press("enter")  # a queue: its jobs
        await settle(pilot)
        assert app.focused is jobs
        for status, count in (("queued", 4), ("running", 1), ("dead", 2), (None, 7)):
            await pilot.press("f")
            await settle(pilot)
            assert view.status == status and jobs.row_count == count
        await pilot.press("shift+tab")
        await settle(pilot)
        await pilot.press("down")  # thumbnails
        await settle(pilot)
        assert view.selected_queue == "thumbnails" and jobs.row_count == 5
        assert "‖ paused (P resumes)" in str(view.query_one("#jobs-title", Line).content)
        clock.advance(6)
        app.tick()
        await settle(pilot)
        assert rows(view.query_one(QueuesTable))[1][4] == "2m"


async def test_details_show_payload_attempts_and_a_countdown_to_the_next_try(store_url: str) -> None:
    async with jobs_view(store_url, size=(80, 24)) as (app, pilot, clock, notes, view):
        await pilot.press("enter", "down", "down", "down", "down")  # the job waiting for its second try
        await settle(pilot)
        job = view.query_one(JobsTable).selected_job
        assert job is not None and job.attempt == 1 and job.status == "queued"
        await pilot.press("enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, JobDetails)
        body = str(screen.query_one("#job-body").render())
        assert "attempt      1/3" in body and "next try     in 15s" in body
        assert '{"order": 43, "to": "cy@example.com"}' in body
        assert "SMTPConnectError: timed out after 30s waiting for the SMTP greeting" in body
        clock.advance(5)
        screen._tick()
        await settle(pilot)
        assert "next try     in 10s" in str(screen.query_one("#job-body").render())
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, JobDetails)


async def test_R_retries_the_selected_dead_job_and_refuses_a_live_one(store_url: str) -> None:
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("R")  # the first row: queued
        await settle(pilot)
        assert "only a dead job can be retried" in notes.seen[-1][1]
        await pilot.press("end")
        await settle(pilot)
        dead = view.query_one(JobsTable).selected_job
        assert dead is not None and dead.status == "dead"
        await pilot.press("R")
        await settle(pilot)
        assert notes.titled("Retried") == [f"mailer: job {dead.id} queued again with fresh attempts"]
        detail = await app.backend.get_job(dead.id)
        assert detail.job is not None and (detail.job.status, detail.job.attempt) == ("queued", 0)
        assert rows(view.query_one(QueuesTable))[0][3] == "1"


async def test_R_pressed_while_the_dead_jobs_are_being_read_says_so_and_retries_nothing(store_url: str) -> None:
    """``f f f R`` typed at once: the dead jobs were not read yet, and R answered "no dead
    job shown" under a title of six dead jobs. It says they are being read; once shown, R
    asks about them."""
    backend = Held(console_backend(store_url, ManualClock(FROZEN)), "list_jobs")
    async with jobs_view(store_url, backend=backend) as (app, pilot, clock, notes, view):
        await pilot.press("enter")  # the first queue's jobs
        await settle(pilot)
        backend.go.clear()
        await pilot.press("f", "f", "f", "R")  # dead, then R before the dead jobs are read
        await pilot.pause()
        assert view.status == "dead" and not isinstance(app.screen, (Confirm, TypedCount))
        assert notes.seen[-1][1].endswith("are still being read: press R again once they are shown.")
        backend.go.set()
        await settle(pilot)
        dead = view.query_one(JobsTable).row_count
        assert dead > 0
        await pilot.press("R")
        await settle(pilot)
        assert isinstance(app.screen, (Confirm, TypedCount))


async def test_columns_a_long_key_pushes_off_screen_are_named_in_the_title(store_url: str) -> None:
    """A job's key of 120 characters widened the KEY column: SCHEDULE and LAST ERROR went off
    an 80-column screen with nothing saying so."""
    store = await store_of(store_url)
    js: JobStore = store
    now = ManualClock(FROZEN).now()
    await js.send_jobs("webhooks", [NewJob("01KJPRZB00LONGKEY000000001", "{}", now, 1, key="k" * 120)], now)
    await store.close()
    async with jobs_view(store_url, size=(80, 24)) as (app, pilot, clock, notes, view):
        await pilot.press("down", "down", "enter")  # webhooks' jobs
        await settle(pilot)
        title = str(view.query_one("#jobs-title", Line).render())
        hidden = view.query_one(JobsTable).hidden_columns()
        assert hidden and f"→ {', '.join(hidden)} off-screen" in title, title


async def test_R_with_the_dead_filter_retries_every_dead_job_shown_typing_their_count(store_url: str) -> None:
    store = await store_of(store_url)
    js: JobStore = store
    ids = [f"01KJPRZB00DEAD{n:012d}" for n in range(28)]
    await js.send_jobs("webhooks", [NewJob(i, "{}", ManualClock(FROZEN).now(), 1) for i in ids], ManualClock(FROZEN).now())
    claimed = (await js.cycle_jobs([], {"webhooks": 8}, "w", "t", ManualClock(FROZEN).now())).claimed
    while claimed:
        now = ManualClock(FROZEN).now()
        await js.finish_jobs([Finish(c.id, c.queue, c.tries, "dead", 1, c.started_at, now, "w", "HTTPError", "410 Gone")
                              for c in claimed])
        claimed = (await js.cycle_jobs([], {"webhooks": 8}, "w", "t", now)).claimed
    await store.close()
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        await pilot.press("down", "down")  # webhooks
        await settle(pilot)
        await pilot.press("enter", "f", "f", "f")  # dead
        await settle(pilot)
        assert view.status == "dead" and view.query_one(JobsTable).row_count == 28
        await pilot.press("R")
        await settle(pilot)
        prompt = app.screen
        assert isinstance(prompt, TypedCount) and prompt.count == 28
        assert prompt.query_one("#typed", Input).has_focus
        assert prompt.query_one("#typed", Input).content_size.height == 1  # the digits typed show
        await pilot.press("2", "7", "enter")
        await settle(pilot)
        assert notes.seen[-1] == ("Not confirmed", "You typed 27; type 28 to confirm.")
        assert isinstance(app.screen, TypedCount)
        prompt.query_one("#typed", Input).value = ""
        await pilot.press("2", "8", "enter")
        await settle(pilot)
        assert notes.titled("Retried") == ["webhooks: 28 of 28 dead jobs queued again with fresh attempts"]
        assert view.query_one(JobsTable).row_count == 0
        assert rows(view.query_one(QueuesTable))[2][2:4] == ["28", "0"]


async def test_R_on_every_dead_job_shown_goes_on_past_one_retried_or_deleted_elsewhere_meanwhile(store_url: str) -> None:
    """While the question was up, another operator retried one of the dead jobs (or
    deleted one): y then retried none of the others, the batch ending at that job's "not
    dead" with nothing said of the rest. Each job still dead is retried; those that no
    longer are are counted, and left as they are."""
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        await pilot.press("enter", "f", "f", "f")  # mailer's dead jobs
        await settle(pilot)
        dead = [j.id for j in view.jobs_table.jobs.values() if j.status == "dead"]
        assert view.status == "dead" and len(dead) == 2
        await pilot.press("R")
        await settle(pilot)
        assert isinstance(app.screen, Confirm)
        await app.backend.retry_job("mailer", dead[0])  # elsewhere, while the question is up
        await pilot.press("y")
        await settle(pilot)
        for job_id in dead:
            detail = await app.backend.get_job(job_id)
            assert detail.job is not None and detail.job.status == "queued", job_id
        assert notes.titled("Retried") == ["mailer: 1 of 2 dead jobs queued again with fresh attempts"]
        assert notes.titled("Retry") == ["mailer: 1 of the 2 dead jobs asked about were no longer dead (retried or "
                                         "deleted elsewhere since): left as they are"]
        assert not notes.titled("Not dead")


async def test_x_deletes_after_asking_and_esc_keeps_the_job(store_url: str) -> None:
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        await pilot.press("enter")
        await settle(pilot)
        job = view.query_one(JobsTable).selected_job
        assert job is not None
        await pilot.press("x")
        await settle(pilot)
        question = app.screen
        assert isinstance(question, Confirm) and question.question == f"Delete job {job.id} of mailer?"
        await pilot.press("escape")
        await settle(pilot)
        assert (await app.backend.get_job(job.id)).job is not None
        await pilot.press("x")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
        assert notes.titled("Deleted") == [f"mailer: job {job.id} deleted"]
        with pytest.raises(Exception, match="no job with id"):
            await app.backend.get_job(job.id)
        assert view.query_one(JobsTable).row_count == 6


async def test_a_job_deleted_elsewhere_under_the_cursor_lets_no_key_act_on_the_row_it_fell_on(store_url: str) -> None:
    """The selected job was deleted from a shell: the cursor stayed on its row number, now
    another job's, without a word, and ``x`` ``y`` typed ahead deleted a job nobody had
    picked. Its going is said, and the next key that acts does nothing but say why."""
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("down")
        await settle(pilot)
        table = view.query_one(JobsTable)
        gone = table.selected_job
        assert gone is not None
        await app.backend.delete_job("mailer", gone.id)  # elsewhere: another operator, a shell
        app.request_refresh()
        await settle(pilot)
        landed = table.selected_job
        assert landed is not None and landed.id != gone.id
        (said,) = notes.titled("Job gone")
        assert said.startswith(f"Job {gone.id} is no longer shown") and landed.id in said
        await pilot.press("x")
        await settle(pilot)
        assert not isinstance(app.screen, Confirm)
        assert notes.titled("Job gone")[-1] == (f"Delete: not done. Job {gone.id} left the list and the cursor moved by "
                                                f"itself. Press the key again to act on job {landed.id}.")  # fmt: skip
        await pilot.press("x")  # again: the job under the cursor now is chosen
        await settle(pilot)
        assert isinstance(app.screen, Confirm) and landed.id in app.screen.question
        await pilot.press("escape")
        await settle(pilot)
        await pilot.press("x", "y")  # this console's own delete says nothing of the kind
        await settle(pilot)
        assert len(notes.titled("Job gone")) == 2


async def test_P_pauses_and_resumes_the_queue_and_p_still_pauses_refreshes(store_url: str) -> None:
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        await pilot.press("P")
        await settle(pilot)
        assert rows(view.query_one(QueuesTable))[0][5] == "‖ paused"
        assert (await app.backend.list_queues())[0].paused
        await pilot.press("P")
        await settle(pilot)
        assert not (await app.backend.list_queues())[0].paused and rows(view.query_one(QueuesTable))[0][5] == ""
        await pilot.press("p")
        await settle(pilot)
        assert app.paused


async def test_P_P_typed_before_the_first_answer_pauses_then_resumes(store_url: str) -> None:
    """The second P toggles from what the first asked, not from the list read before it:
    over a slow link P P paused the queue twice, where the operator had paused and resumed."""
    clock = ManualClock(FROZEN)
    backend = Held(console_backend(store_url, clock), "set_queue_paused")
    async with jobs_view(store_url, backend=backend) as (app, pilot, clock, notes, view):
        for first in (True, False):  # from running, then from paused
            if not first:
                await pilot.press("P")
                await settle(pilot)
                assert (await app.backend.list_queues())[0].paused
                backend.calls.clear()
            backend.go.clear()  # the first is not answered before the second P
            await pilot.press("P", "P")
            await pilot.pause()
            backend.go.set()
            await settle(pilot)
            assert [args for _, args in backend.calls] == [("mailer", first), ("mailer", not first)]
            assert (await app.backend.list_queues())[0].paused is not first
            assert rows(view.query_one(QueuesTable))[0][5] == ("" if first else "‖ paused")


async def test_the_footer_names_P_as_the_toggle_it_is_on_a_paused_queue(store_url: str) -> None:
    """P on a paused queue resumes it: the footer said "Pause queue" all the same. It says
    "Pause/resume", as e says "On/off" whatever the schedule's state."""
    async with jobs_view(store_url, size=(80, 24)) as (app, pilot, clock, notes, view):

        def offered() -> str:
            local, _, _ = app.query_one(KeyFooter).offered()
            [label] = [label for key, _, label in local if key == "P"]
            return label

        for paused in (True, False):
            await pilot.press("P")
            await settle(pilot)
            assert (await app.backend.list_queues())[0].paused is paused
            assert offered() == "Pause/resume"
            assert "P Pause/resume" in str(app.query_one(KeyFooter).render())  # it fits at 80 columns


async def test_n_sends_a_job_and_bad_input_sends_nothing(store_url: str) -> None:
    async with jobs_view(store_url, size=(80, 24)) as (app, pilot, clock, notes, view):
        await pilot.press("down", "down")  # webhooks, empty
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, SendJobScreen)
        for field in ("delay", "attempts", "key"):  # what is typed shows while it has the focus
            screen.query_one(f"#{field}", Input).focus()
            await pilot.pause()
            assert screen.query_one(f"#{field}", Input).content_size.height == 1, field
        screen.query_one("#payload", TextArea).text = '{"url": "https://example.com/hook"'
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert notes.seen[-1][0] == "Not sent" and "The payload is not JSON" in notes.seen[-1][1]
        screen.query_one("#payload", TextArea).text = '{"url": "https://example.com/hook"}'
        screen.query_one("#delay", Input).value = "99999999"
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert notes.seen[-1] == ("Not sent", "delay 99,999,999s is out of range: 0 to 2,592,000 seconds (30 days)")
        assert (await app.backend.list_jobs("webhooks")).jobs == []
        screen.query_one("#delay", Input).value = ""
        screen.query_one("#delay", Input).focus()
        await pilot.press("1", "e", "3")  # a character the field refuses is said, not only rung
        await settle(pilot)
        assert screen.query_one("#delay", Input).value == "13"
        assert notes.titled("Not taken") == ["The delay takes digits and a point: 'e' was not taken."]
        screen.query_one("#delay", Input).value = "60"
        screen.query_one("#key", Input).value = "hook-1"
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert not isinstance(app.screen, SendJobScreen)
        (sent,) = (await app.backend.list_jobs("webhooks")).jobs
        assert (sent.payload, sent.key, sent.max_attempts) == ({"url": "https://example.com/hook"}, "hook-1", 5)
        assert notes.titled("Sent") == [f"webhooks: job {sent.id} queued"]
        assert [r[2] for r in rows(view.query_one(JobsTable))] == ["in 1m"]
        await pilot.press("n")
        await settle(pilot)
        app.screen.query_one("#key", Input).value = "hook-1"
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert notes.titled("Duplicate") == [f"webhooks: a job with that key is there already: {sent.id}; nothing queued"]


async def test_read_only_refuses_every_job_action_saying_why(store_url: str) -> None:
    async with jobs_view(store_url, read_only=True) as (app, pilot, clock, notes, view):
        await pilot.press("enter", "end")
        await settle(pilot)
        for key in ("R", "x", "P", "n"):
            await pilot.press(key)
            await settle(pilot)
            assert notes.seen[-1][0] == "Read-only" and "the console was started with --read-only" in notes.seen[-1][1]
        assert not isinstance(app.screen, (Confirm, TypedCount, SendJobScreen))
        assert json.dumps([q.paused for q in await app.backend.list_queues()]) == "[false, true, false]"


async def test_help_lists_the_jobs_keys(store_url: str) -> None:
    async with jobs_view(store_url) as (app, pilot, clock, notes, view):
        sections = dict(app.help_keys())
        keys = [key for key, _ in sections["3 Jobs"]]
        assert keys[:5] == ["f", "R", "x", "P", "n"] and "enter" in keys


@pytest.mark.parametrize("size", [(80, 24), (120, 32)])
async def test_an_empty_store_says_how_queues_appear(tmp_path: Path, size: tuple[int, int]) -> None:
    from tests.console_fixtures import build_ledger

    url = await asyncio.to_thread(lambda: asyncio.run(build_ledger(tmp_path)))
    async with jobs_view(url, size=size) as (app, pilot, clock, notes, view):
        assert view.query_one(QueuesTable).row_count == 0
        assert "a queue is recorded when a process with its definition opens the store" in str(
            view.query_one("#queues-title", Line).content
        )
        await pilot.press("n")
        await settle(pilot)
        assert notes.seen[-1][1] == "Send: no queue selected."


async def test_a_lost_connection_leaves_the_jobs_on_screen_stale_and_comes_back(store_url: str) -> None:
    from tests.console_fixtures import FlakyBackend

    clock = ManualClock(FROZEN)
    backend = FlakyBackend(console_backend(store_url, clock))
    app = SchedtuiApp(cast(Backend, backend), clock, where=WHERE, operator_zone=ZONE)  # a stand-in, not a Backend subclass
    notes = Notes(app)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("3")
            await settle(pilot)
            view = app.active_view
            assert isinstance(view, JobsView) and view.query_one(JobsTable).row_count == 7
            backend.down = True
            await pilot.press("ctrl+r")
            await settle(pilot)
            assert app.query_one("#main").has_class("-stale") and view.query_one(JobsTable).row_count == 7
            assert notes.seen[-1][0] == "Unavailable"
            backend.down = False
            await pilot.press("ctrl+r")
            await settle(pilot)
            assert not app.query_one("#main").has_class("-stale") and notes.titled("Reconnected")
    finally:
        await backend.close()


async def test_a_view_whose_first_read_has_not_answered_says_reading_not_none(store_url: str) -> None:
    """Behind a slow link the first read of the view switched to takes seconds: its title
    said "QUEUES 0 · none yet" meanwhile (and "DURABLE 0", "AUDIT 0 · all read"), which
    reads at 3 AM as "there are none". It says it is reading until the read answers."""
    clock = ManualClock(FROZEN)
    backend: Any = console_backend(store_url, clock)
    answer = asyncio.Event()
    reads = {name: getattr(backend, name) for name in ("list_queues", "list_executions", "audit")}

    def slowed(read: Any) -> Any:
        async def slow(*args: Any, **kwargs: Any) -> Any:
            await answer.wait()
            return await read(*args, **kwargs)

        return slow

    for name, read in reads.items():
        setattr(backend, name, slowed(read))
    app = SchedtuiApp(backend, clock, where=WHERE, operator_zone=ZONE)
    try:
        async with app.run_test(size=(120, 32)) as pilot:
            await settle(pilot)
            titles = {}
            for key, title in (("3", "#queues-title"), ("4", "#durable-title"), ("6", "#audit-title")):
                await pilot.press(key)
                await pilot.pause()
                titles[key] = str(app.active_view.query_one(title, Line).content)
            assert [titles[key].split(" · ")[:2] for key in "346"] == [["QUEUES", "reading…"], ["DURABLE", "reading…"],
                                                                       ["AUDIT", "reading…"]]
            answer.set()
            await settle(pilot)
            assert str(app.active_view.query_one("#audit-title", Line).content).startswith("AUDIT ")
            await pilot.press("3")
            await settle(pilot)
            assert str(app.active_view.query_one("#queues-title", Line).content).startswith("QUEUES 3 · 1 paused")
    finally:
        await backend.close()
