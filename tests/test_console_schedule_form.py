"""The schedules view's ``n`` / ``E`` / ``D`` under Pilot, against the real embedded backend
over a copy of the fixture ledger (tests/console_fixtures.py) at its frozen instant: a
schedule created through the form (its next fires previewed as typed), the inline errors
that keep it from being sent, the backend's refusals, editing and deleting a stored
schedule, and the refusals for schedules in code and for a read-only console; then the same
three through a real ``schedtui serve`` (RemoteBackend), audited."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Checkbox, Input, Select

from backend import Engine, ManualClock
from backend.client.remote import RemoteBackend
from backend.model import ScheduleView
from console import format as fmt
from console.app import SchedtuiApp
from console.screens.confirm import Confirm
from console.screens.schedule_form import SHOWN_PAYLOAD, ScheduleForm, stored_fields
from console.views.schedules import SchedulesView
from console.views.timeline import TimelineView
from console.widgets import DetailBar, SchedulesTable
from tests.console_fixtures import FROZEN, WHERE, console_backend, ledger_copy
from tests.console_scenes import make_ledger
from tests.servers import Server, start_server
from tests.test_cli import write_tree
from tests.test_console import Notes, settle
from tests.test_runtime_surfaces import DEFINITIONS, OPERATE

ZONE = "Europe/Berlin"
CODE_NAMES = ["daily-digest", "heartbeat", "flaky-export", "slow-reindex", "stuck-import", "billing-webhook",
              "legacy-cleanup"]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("console-schedule-form")) / "state.db"


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    return ledger_copy(ledger, tmp_path)


class Spy:
    """The real backend, with its schedule writes counted (what the form sent, if anything)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.read_only = inner.read_only
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create_schedule(self, spec: Any) -> Any:
        self.calls.append(("create", dict(spec)))
        return await self.inner.create_schedule(spec)

    async def update_schedule(self, name: str, changes: Any) -> Any:
        self.calls.append(("update", (name, dict(changes))))
        return await self.inner.update_schedule(name, changes)

    async def delete_schedule(self, name: str) -> None:
        self.calls.append(("delete", name))
        await self.inner.delete_schedule(name)


@asynccontextmanager
async def schedules_view(
    url: str, *, size: tuple[int, int] = (120, 32), read_only: bool = False
) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], Notes, Spy]]:
    clock = ManualClock(FROZEN)
    backend = Spy(console_backend(url, clock, read_only=read_only))
    app = SchedtuiApp(backend, clock, where=WHERE, operator_zone=ZONE, read_only=read_only)  # type: ignore[arg-type]  # a stand-in that counts writes
    notes = Notes(app)
    try:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            yield app, pilot, notes, backend
    finally:
        await backend.close()


async def type_into(pilot: Pilot[Any], selector: str, text: str) -> None:
    """Focus a field, clear it, and type ``text`` key by key (as an operator would)."""
    field = pilot.app.screen.query_one(selector, Input)
    field.focus()
    field.value = ""
    await pilot.pause()
    await pilot.press(*text)
    await settle(pilot)


def preview(app: SchedtuiApp) -> str:
    return str(app.screen.query_one("#preview").render())


def cell(app: SchedtuiApp, name: str, column: str) -> str:
    value = app.query_one(SchedulesTable).get_cell(name, column)
    return value if isinstance(value, str) else value.plain


def name_cell(app: SchedtuiApp, name: str) -> str:
    return cell(app, name, "name")


async def fill(pilot: Pilot[Any], *, name: str, cron: str, zone: str = "UTC", target: str = "mailer",
               payload: str = "") -> None:
    await type_into(pilot, "#name", name)
    await type_into(pilot, "#cron", cron)
    await type_into(pilot, "#zone", zone)
    await type_into(pilot, "#target", target)
    if payload:
        await type_into(pilot, "#payload", payload)


async def test_create_through_the_form_previews_fires_and_lists_it_as_stored(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        assert all("⊕" not in name_cell(app, n) for n in CODE_NAMES)
        await pilot.press("n")
        await settle(pilot)
        form = app.screen
        assert isinstance(form, ScheduleForm)
        assert form.queues == ["mailer", "thumbnails", "webhooks"]
        await fill(pilot, name="reap-sessions", cron="*/15 * * * *", zone="Europe/Berlin",
                   payload='{"older_than": "7d"}')
        # 08:00:05 UTC is 09:00:05 in Berlin: the next five quarters, in the schedule's zone.
        shown = preview(app)
        assert "next fires in Europe/Berlin" in shown
        for line in ("Mon 2026-03-02 09:15:00 CET  in 14m 55s", "Mon 2026-03-02 09:30:00 CET  in 29m 55s",
                     "Mon 2026-03-02 10:15:00 CET  in 1h 14m"):
            assert line in shown
        assert len(form.slots) == 5
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert not isinstance(app.screen, ScheduleForm)
        assert backend.calls == [("create", {
            "name": "reap-sessions", "cron": "*/15 * * * *", "timezone": "Europe/Berlin", "queue": "mailer",
            "payload": {"older_than": "7d"}, "description": None, "enabled": True,
        })]
        assert notes.titled("Created") == ["reap-sessions → queue mailer; next fire in 14m 55s\n"
                                           "cron */15 * * * * in Europe/Berlin · enabled\n"
                                           'payload {"older_than": "7d"}\nno description']
        view = app.view_of("reap-sessions")
        assert view is not None and view.source == "store" and view.payload == {"older_than": "7d"}
        assert name_cell(app, "reap-sessions") == "reap-sessions ⊕"
        assert app.selected_name == "reap-sessions"
        assert "stored → queue mailer" in app.query_one(DetailBar).render().plain
        stored = [v for v in (await backend.list_schedules()).schedules if v.name == "reap-sessions"]
        assert stored and stored[0].source == "store" and stored[0].target is not None
        assert (stored[0].target.kind, stored[0].target.name) == ("queue", "mailer")


async def test_bad_cron_zone_or_payload_is_said_inline_and_nothing_is_sent(store_url: str) -> None:
    async with schedules_view(store_url, size=(80, 24)) as (app, pilot, notes, backend):
        await pilot.press("n")
        await settle(pilot)
        await fill(pilot, name="reap-sessions", cron="0 25 * * *")
        assert 'invalid cron expression "0 25 * * *" (tz="UTC"): hour 25 out of range' in preview(app)
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert isinstance(app.screen, ScheduleForm)
        assert backend.calls == []
        assert any("hour 25 out of range" in m for m in notes.titled("Not created"))
        await type_into(pilot, "#cron", "0 9 * * 1-5")
        await type_into(pilot, "#zone", "Mars/Base")
        assert 'unknown timezone "Mars/Base"' in preview(app)
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert backend.calls == []
        await type_into(pilot, "#zone", "UTC")
        assert "Mon 2026-03-02 09:00:00 UTC" in preview(app)
        await type_into(pilot, "#payload", "{older: 7}")
        assert "payload {older: 7} is not JSON" in preview(app)
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert backend.calls == [] and isinstance(app.screen, ScheduleForm)
        assert any("payload {older: 7} is not JSON" in m for m in notes.titled("Not created"))
        # Nothing typed was lost.
        screen = app.screen
        assert [screen.query_one(f"#{f}", Input).value for f in ("name", "cron", "zone", "target", "payload")] == [
            "reap-sessions", "0 9 * * 1-5", "UTC", "mailer", "{older: 7}"]


async def test_a_refusal_from_the_backend_names_the_value_and_keeps_the_form(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await pilot.press("n")
        await settle(pilot)
        await fill(pilot, name="heartbeat", cron="0 * * * *")  # a schedule in code has that name
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert len(backend.calls) == 1 and isinstance(app.screen, ScheduleForm)
        assert notes.titled("Name taken") == ['a schedule named "heartbeat" is defined in code']
        assert "heartbeat" in str(app.screen.query_one("#problem").render())
        await type_into(pilot, "#name", "hourly-report")
        await type_into(pilot, "#target", "no-such-queue")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert len(backend.calls) == 2 and isinstance(app.screen, ScheduleForm)
        assert notes.titled("Bad input") == ['queue "no-such-queue" is not defined here nor recorded in the store']
        assert app.screen.query_one("#cron", Input).value == "0 * * * *"
        assert app.view_of("hourly-report") is None and app.view_of("heartbeat") is not None


async def test_what_a_worker_did_not_expect_is_a_notification_and_keeps_the_form(store_url: str) -> None:
    """The form's worker caught the backend's refusals only: anything else (the remote
    client's ValueError for a payload of 1e309, since fixed) vanished into Textual's log,
    and ctrl+s did nothing, without a word. Every console worker now says what escaped it."""
    async with schedules_view(store_url) as (app, pilot, notes, backend):

        async def breaks(spec: Any) -> Any:
            backend.calls.append(("create", dict(spec)))
            raise ValueError("Out of range float values are not JSON compliant")

        backend.create_schedule = breaks  # type: ignore[method-assign]  # a client bug, reached
        await pilot.press("n")
        await settle(pilot)
        await fill(pilot, name="reap-sessions", cron="0 9 * * 1")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert len(backend.calls) == 1 and isinstance(app.screen, ScheduleForm)
        assert notes.titled("Unexpected error") == ["ValueError: Out of range float values are not JSON compliant"]
        assert app.screen.query_one("#name", Input).value == "reap-sessions"


async def test_a_long_bad_value_is_named_cut_short_in_the_notification(store_url: str) -> None:
    """A long value typed or pasted into a field and refused is repeated up to
    fmt.ECHO_CHARS, then an ellipsis (the notification repeated all of it): the console's
    own checks (cron, payload) and the backend's answers (an unknown queue) alike."""
    async with schedules_view(store_url, size=(80, 24)) as (app, pilot, notes, backend):
        await pilot.press("n")
        await settle(pilot)
        await fill(pilot, name="reap-sessions", cron="0 9 * * 1")
        screen = app.screen
        cron = "0 9 * * " + "MON," * 60 + "XYZ"
        payload = '{"ids": [' + "12345, " * 60 + "oops]}"
        target = "partner-feed-" + "x" * 100
        for field, value, title in (("#cron", cron, "Not created"), ("#payload", payload, "Not created"),
                                    ("#target", target, "Bad input")):
            screen.query_one(field, Input).value = value
            await settle(pilot)
            await pilot.press("ctrl+s")
            await settle(pilot)
            said = notes.titled(title)[-1]
            assert fmt.echo(value) in said and value not in said, said
            assert len(said) < 200 and said in str(screen.query_one("#problem").render())
            screen.query_one(field, Input).value = {"#cron": "0 9 * * 1", "#payload": "", "#target": "mailer"}[field]
            await settle(pilot)
        assert [call for call, _ in backend.calls] == ["create"]  # only the unknown queue reached it
        assert fmt.echo(cron) == cron[: fmt.ECHO_CHARS - 1] + "…"


async def stored(app: SchedtuiApp, pilot: Pilot[Any], name: str = "reap-sessions") -> None:
    """A stored schedule made through the backend (not the form: not counted), then selected."""
    spy = app.backend
    assert isinstance(spy, Spy)
    await spy.inner.create_schedule({"name": name, "cron": "*/15 * * * *", "timezone": "UTC", "queue": "mailer",
                                       "description": "Prunes sessions"})
    app.request_refresh()
    await settle(pilot)
    app.action_select(name)
    await settle(pilot)
    assert app.selected_name == name


async def test_edit_prefills_the_stored_schedule_and_sends_only_what_changed(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await stored(app, pilot)
        await pilot.press("E")
        await settle(pilot)
        form = app.screen
        assert isinstance(form, ScheduleForm) and form.editing is not None
        values = [form.query_one(f"#{f}", Input).value for f in ("name", "cron", "zone", "target", "description")]
        assert values == ["reap-sessions", "*/15 * * * *", "UTC", "mailer", "Prunes sessions"]
        assert form.query_one("#name", Input).disabled and form.query_one("#kind", Select).value == "queue"
        await type_into(pilot, "#cron", "0 */2 * * *")
        assert "Mon 2026-03-02 10:00:00 UTC  in 1h 59m" in preview(app)
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert not isinstance(app.screen, ScheduleForm)
        assert backend.calls[-1] == ("update", ("reap-sessions", {"cron": "0 */2 * * *"}))
        view = app.view_of("reap-sessions")
        assert view is not None and view.cron == "0 */2 * * *" and view.source == "store"
        assert notes.titled("Saved") == ["reap-sessions → queue mailer; next fire in 1h 59m\n"
                                         "cron 0 */2 * * * in UTC · enabled\npayload none\ndescription Prunes sessions"]
        fresh = [v for v in (await backend.list_schedules()).schedules if v.name == "reap-sessions"]
        assert fresh[0].cron == "0 */2 * * *"


async def test_delete_asks_first_and_only_y_deletes(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await stored(app, pilot)
        for no in ("enter", "n", "escape"):
            await pilot.press("D")
            await settle(pilot)
            question = app.screen
            assert isinstance(question, Confirm) and question.question == 'Delete schedule "reap-sessions"?'
            assert "It starts queue mailer on every slot." in question.text and "its runs stay in the ledger" in question.text
            await pilot.press(no)
            await settle(pilot)
            assert not isinstance(app.screen, Confirm) and backend.calls == []
        await pilot.press("D", "y")
        await settle(pilot)
        assert not isinstance(app.screen, Confirm)
        assert backend.calls == [("delete", "reap-sessions")]
        assert app.view_of("reap-sessions") is None
        assert "reap-sessions" not in app.query_one(SchedulesTable).views
        assert notes.titled("Deleted") == ["reap-sessions deleted; its runs stay in the ledger"]
        assert "reap-sessions" not in [v.name for v in (await backend.list_schedules()).schedules]
        # Esc leaves a stored schedule alone.
        await stored(app, pilot, "other")
        await pilot.press("D", "escape")
        await settle(pilot)
        assert app.view_of("other") is not None and backend.calls == [("delete", "reap-sessions")]


async def test_a_schedule_deleted_elsewhere_under_the_cursor_lets_no_key_act_on_the_row_it_fell_on(
    store_url: str,
) -> None:
    """Deleted from another console (or the CLI) while selected, its row went and the
    cursor fell silently on another schedule, on which the operator's next ``r`` fired.
    Now the console says so at once, and the next key that acts does nothing but say so
    again; the press after it, or any after a move of the cursor, acts."""
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await stored(app, pilot)
        await backend.inner.delete_schedule("reap-sessions")  # elsewhere: not through this view
        app.request_refresh()
        await settle(pilot)
        landed = app.selected_name
        assert landed is not None and landed != "reap-sessions"
        assert notes.titled("Schedule deleted") == [f"reap-sessions is gone: it was deleted elsewhere; the cursor is on {landed} now."]
        runs_before = len((await backend.list_runs(landed)).runs)
        for key, action in (("r", "Run now"), ("e", "Enable/disable"), ("l", "Run log"), ("D", "Delete schedule")):
            await pilot.press(key)
            await settle(pilot)
            assert len(app.screen_stack) == 1, key
            assert notes.titled("Schedule deleted")[-1] == (
                f"{action}: not done. reap-sessions was deleted elsewhere and the cursor moved by itself. "
                f"Press the key again to act on {landed}."
            )
            app.query_one(SchedulesView).left.moved = ("reap-sessions", landed)  # as it was: each key is refused once
        assert len((await backend.list_runs(landed)).runs) == runs_before and backend.calls == []
        await pilot.press("e")  # refused once…
        await settle(pilot)
        assert len(app.screen_stack) == 1
        await pilot.press("e")  # …then acts on the schedule under the cursor (a disable asks)
        await settle(pilot)
        assert len(app.screen_stack) == 2  # (the disable's prompt for a note)
        await pilot.press("escape")
        await settle(pilot)
        # A move of the cursor is a choice: nothing is refused after it.
        await backend.inner.create_schedule({"name": "other", "cron": "*/15 * * * *", "timezone": "UTC",
                                             "queue": "mailer"})
        app.request_refresh()
        await settle(pilot)
        app.action_select("other")
        await settle(pilot)
        await backend.inner.delete_schedule("other")
        app.request_refresh()
        await settle(pilot)
        await pilot.press("j")
        await settle(pilot)
        assert app.query_one(SchedulesView).left.moved is None
        # A schedule this console deletes is no surprise: no warning.
        await stored(app, pilot, "mine")
        await pilot.press("D", "y")
        await settle(pilot)
        assert notes.titled("Schedule deleted")[-1].startswith("other is gone")
        assert app.query_one(SchedulesView).left.moved is None


async def test_on_the_timeline_too_a_schedule_deleted_under_the_cursor_lets_no_key_act_on_the_row_it_fell_on(
    store_url: str,
) -> None:
    """The timeline's r, e, b act on its selected schedule as the Schedules view's do: one
    deleted elsewhere while selected there let the cursor fall silently on the next row,
    and r fired that schedule, which nobody had picked."""
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await pilot.press("2")
        await settle(pilot)
        await stored(app, pilot)
        await backend.inner.delete_schedule("reap-sessions")  # elsewhere: the CLI, another console
        app.request_refresh()
        await settle(pilot)
        landed = app.selected_name
        assert landed is not None and landed != "reap-sessions"
        assert notes.titled("Schedule deleted") == [f"reap-sessions is gone: it was deleted; the cursor is on {landed} now."]
        runs_before = len((await backend.list_runs(landed)).runs)
        timeline = app.active_view
        assert isinstance(timeline, TimelineView)
        for key, action in (("r", "Run now"), ("e", "Enable/disable"), ("b", "Backfill")):
            await pilot.press(key)
            await settle(pilot)
            assert len(app.screen_stack) == 1, key
            assert notes.titled("Schedule deleted")[-1] == (
                f"{action}: not done. reap-sessions was deleted and the cursor moved by itself. "
                f"Press the key again to act on {landed}."
            )
            timeline.left.moved = ("reap-sessions", landed)  # as it was: each key is refused once
        assert len((await backend.list_runs(landed)).runs) == runs_before
        await pilot.press("r")  # refused once…
        await settle(pilot)
        await pilot.press("r")  # …then acts on the schedule under the cursor
        await settle(pilot)
        assert len((await backend.list_runs(landed)).runs) == runs_before + 1
        # A move of the cursor is a choice: nothing is refused after it.
        await stored(app, pilot, "other")
        await backend.inner.delete_schedule("other")
        app.request_refresh()
        await settle(pilot)
        await pilot.press("k")
        await settle(pilot)
        assert timeline.left.moved is None


@pytest.mark.parametrize("view_key", ["1", "2"])
async def test_a_schedule_that_leaves_the_filter_by_itself_lets_no_key_act_on_the_row_the_cursor_fell_on(
    store_url: str, view_key: str
) -> None:
    """Under /disabled, the selected schedule enabled elsewhere (or, under /failed, its
    next run succeeding) left the rows, and the cursor fell silently on another disabled
    one: e, meant to enable the first, enabled that one. The Schedules view and the
    timeline say so at once, and the next key that acts does nothing but say so; a
    filter being typed is the operator's own doing and says nothing."""
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        for name in ("heartbeat", "flaky-export"):
            await backend.inner.set_enabled(name, False)
        await pilot.press(view_key)
        await settle(pilot)
        app.filter_text = "disabled"
        await settle(pilot)
        app.action_select("flaky-export")
        await settle(pilot)
        assert app.selected_name == "flaky-export" and not notes.titled("Schedule left the filter")
        await backend.inner.set_enabled("flaky-export", True)  # elsewhere
        app.request_refresh()
        await settle(pilot)
        landed = app.selected_name
        assert landed is not None and landed != "flaky-export"
        assert notes.titled("Schedule left the filter") == [
            f"flaky-export no longer matches the filter “disabled”; the cursor is on {landed} now."
        ]
        await pilot.press("e")
        await settle(pilot)
        assert len(app.screen_stack) == 1
        assert notes.titled("Schedule left the filter")[-1] == (
            f"Enable/disable: not done. flaky-export left the filter “disabled” and the cursor moved by itself. "
            f"Press the key again to act on {landed}."
        )
        view = app.view_of(landed)
        assert view is not None and not view.enabled  # not enabled by the e meant for flaky-export
        # Typing another filter drops rows by the operator's own doing: nothing said.
        app.filter_text = "heartbeat"
        await settle(pilot)
        app.filter_text = "nothing-matches"
        await settle(pilot)
        assert len(notes.titled("Schedule left the filter")) == 2


async def test_schedules_in_code_can_only_be_enabled_or_disabled(store_url: str) -> None:
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        app.action_select("heartbeat")
        await settle(pilot)
        for key in ("E", "D"):
            await pilot.press(key)
            await settle(pilot)
            assert not isinstance(app.screen, (ScheduleForm, Confirm))
        said = ("heartbeat is defined in code: it can only be enabled or disabled here (e); "
                "edit or delete it in its code.")
        assert notes.titled("Defined in code") == [said, said]
        assert backend.calls == []


async def test_read_only_refuses_create_edit_and_delete(store_url: str) -> None:
    async with schedules_view(store_url, read_only=True) as (app, pilot, notes, backend):
        for key in ("n", "E", "D"):
            await pilot.press(key)
            await settle(pilot)
            assert not isinstance(app.screen, (ScheduleForm, Confirm))
        assert notes.titled("Read-only") == [
            f"{what} does nothing here: the console was started with --read-only."
            for what in ("Create schedule", "Edit schedule", "Delete schedule")
        ]
        assert backend.calls == []


@pytest.fixture
def rt_server(tmp_path: Path) -> Iterator[Server]:
    write_tree(tmp_path, DEFINITIONS)
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", f"alice={OPERATE}")
    yield srv
    assert srv.stop() == 0, srv.log_text()


async def test_create_edit_and_delete_against_a_real_server(rt_server: Server) -> None:
    backend = RemoteBackend(rt_server.url, OPERATE)
    app = SchedtuiApp(backend, refresh_interval=60)
    notes = Notes(app)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("n")
            await settle(pilot)
            assert isinstance(app.screen, ScheduleForm) and app.screen.queues == ["mail"]
            await fill(pilot, name="reap-sessions", cron="*/15 * * * *", target="mail", payload='{"older_than": "7d"}')
            await pilot.press("ctrl+s")
            await settle(pilot)
            assert not isinstance(app.screen, ScheduleForm), notes.seen
            assert name_cell(app, "reap-sessions") == "reap-sessions ⊕"
            await pilot.press("E")
            await settle(pilot)
            await type_into(pilot, "#cron", "0 3 * * *")
            await pilot.press("ctrl+s")
            await settle(pilot)
            listed = {v.name: v for v in (await backend.list_schedules()).schedules}
            assert listed["reap-sessions"].cron == "0 3 * * *" and listed["reap-sessions"].source == "store"
            assert listed["reap-sessions"].payload == {"older_than": "7d"}
            await pilot.press("D")
            await settle(pilot)
            await pilot.press("y")
            await settle(pilot)
            assert "reap-sessions" not in {v.name for v in (await backend.list_schedules()).schedules}
            assert notes.titled("Deleted") == ["reap-sessions deleted; its runs stay in the ledger"]
            actions = [e.action for e in (await backend.audit()).entries if e.target == "reap-sessions"]
            assert actions == ["schedule.delete", "schedule.update", "schedule.create"]
    finally:
        await backend.close()


def test_what_was_stored_is_said_field_by_field_and_a_long_payload_by_its_size() -> None:
    view = ScheduleView(name="bulk", cron="0 3 * * *", timezone="UTC", trigger="self", on_overlap="skip",
                        backfill="skip", max_runtime_s=60.0, description=None, payload={"ids": list(range(100))},
                        enabled=False, state_note=None, next_fire_at=None, last_run=None)
    lines = stored_fields(view).splitlines()
    assert lines[0] == "cron 0 3 * * * in UTC · disabled"
    assert lines[1].startswith('payload {"ids": [0, 1, 2') and lines[1].endswith("… (399 bytes in all)")
    assert len(lines[1]) < SHOWN_PAYLOAD + 40
    assert lines[2] == "no description"
    # A long description likewise: in full, 1,000 characters made the toast taller than an
    # 80x24 screen, its title and the cron line cut off above the first row.
    described = stored_fields(dataclasses.replace(view, description="N" * 1000)).splitlines()
    assert described[2] == f"description {'N' * SHOWN_PAYLOAD}… (1,000 bytes in all)"


async def test_the_enabled_box_says_ticked_or_not_without_colour(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under NO_COLOR the box itself differs: ``▐X▌`` ticked, ``▐ ▌`` not (Textual's drew
    ``▐X▌`` both ways, the X's colour alone telling them apart)."""
    monkeypatch.setenv("NO_COLOR", "1")
    async with schedules_view(store_url, size=(80, 24)) as (app, pilot, notes, backend):
        assert app.no_color
        await pilot.press("n")
        await settle(pilot)
        box = app.screen.query_one("#enabled", Checkbox)

        def drawn() -> str:
            return box.render().plain

        assert box.value and drawn().startswith("▐X▌ Enabled")
        box.focus()
        await pilot.press("space")
        await settle(pilot)
        assert not box.value and drawn().startswith("▐ ▌ Enabled")
        await pilot.press("space")
        await settle(pilot)
        assert box.value and drawn().startswith("▐X▌ Enabled")


async def test_a_stored_schedule_not_valid_here_shows_why_refuses_run_now_and_is_corrected_by_edit(store_url: str) -> None:
    """A row another release wrote (a zone this machine lacks): listed as invalid with why
    in the detail bar, Run now refused in a notification naming the zone, and the edit form
    corrects it."""
    async with schedules_view(store_url) as (app, pilot, notes, backend):
        await stored(app, pilot)
        engine: Engine = backend.inner.engine
        row = engine.catalog.rows["reap-sessions"]
        assert await engine.catalog.store.update_stored_schedule(dataclasses.replace(row, timezone="Mars/Olympus_Mons"), row.version)
        app.request_refresh()
        await settle(pilot)
        assert [cell(app, "reap-sessions", key) for key in ("state", "next")] == ["✗ invalid", "not run"]
        detail = app.query_one(DetailBar).render().plain
        assert "✗ not valid here; not run: E edits, D deletes · timezone 'Mars/Olympus_Mons'" in detail
        await pilot.press("r")
        await settle(pilot)
        assert any("Mars/Olympus_Mons" in message for _, message in notes.seen)
        assert await engine.store.list_runs("reap-sessions", limit=5) == []
        await pilot.press("E")
        await settle(pilot)
        await type_into(pilot, "#zone", "UTC")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert backend.calls[-1] == ("update", ("reap-sessions", {"timezone": "UTC"}))
        assert cell(app, "reap-sessions", "state") == "● on"
