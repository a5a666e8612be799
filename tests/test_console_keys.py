"""The console's keys follow from their declarations (console/keys.py and the backend's
declared actions), checked by iterating the declarations, never a list of keys written here:

* read-only: every key whose action is an ``operate`` one is refused, saying why, and does
  nothing; every other key runs;
* the footer of each view offers exactly the keys that view (or the app) handles, each with
  an action method that ``check_action`` allows, and none it refuses now;
* every dangerous action's key asks with the one :class:`~console.screens.confirm.Confirm`,
  in the declaration's words: ``enter``, ``n`` and ``esc`` leave it undone, ``y`` does it.

On the scenes' ledger at the frozen instant (every view has data).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from textual.actions import parse
from textual.dom import DOMNode
from textual.pilot import Pilot
from textual.widgets import Button, Input

from backend import ManualClock, NotFound
from backend.client.actions import action_of
from console.app import NAVIGATION, SchedtuiApp
from console.keys import Key
from console.screens import BackfillScreen, Confirm, HelpScreen
from console.views import VIEWS, View
from console.views.durable import ExecutionsTable
from console.views.jobs import JobsView
from console.widgets.footer import KeyFooter
from console.widgets.jobs import JobsTable
from tests.console_fixtures import FROZEN, WHERE, console_backend
from tests.console_scenes import OPERATOR_ZONE, make_ledger
from tests.test_console import Notes, settle

WRITTEN = [spec for spec in VIEWS if spec.make is not None]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("keys-ledger"))


@pytest.fixture
def store_url(ledger: Path, tmp_path: Path) -> str:
    for file in ledger.glob("state.db*"):
        shutil.copy(file, tmp_path / file.name)
    return f"sqlite:///{tmp_path / 'state.db'}"


@asynccontextmanager
async def console(url: str, *, read_only: bool = False) -> AsyncIterator[tuple[SchedtuiApp, Pilot[Any], Notes]]:
    clock = ManualClock(FROZEN)
    backend = console_backend(url, clock, read_only=read_only)
    app = SchedtuiApp(backend, clock, where=WHERE, read_only=read_only, operator_zone=OPERATOR_ZONE)
    notes = Notes(app)
    try:
        async with app.run_test(size=(120, 32)) as pilot:
            await settle(pilot)
            yield app, pilot, notes
    finally:
        await backend.close()


async def show(pilot: Pilot[Any], app: SchedtuiApp, view_id: str) -> View:
    app.action_show_view(view_id)
    await settle(pilot)
    return app.active_view


def help_text_of(app: SchedtuiApp) -> str:
    """What the help screen on top says, as plain text."""
    assert isinstance(app.screen, HelpScreen)
    return app.screen.text


def target_of(owner: DOMNode, key: Key) -> DOMNode:
    """Where the key's action method is: the app's (``app.x``), or its owner's."""
    return owner.app if parse(key.method)[0] == "app" else owner


def first_key(key: Key) -> str:
    return key.key.split(",")[0]


class Calls:
    """Stands in for the action methods of keys (on the instance), recording each call."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self._patched: list[tuple[DOMNode, str]] = []

    def patch(self, node: DOMNode, key: Key) -> None:
        attribute = f"action_{key.name}"
        assert callable(getattr(node, attribute, None)), f"{key.what}: no {attribute} on {node}"

        def called(*_: object) -> None:
            self.made.append(key.name)

        setattr(node, attribute, called)
        self._patched.append((node, attribute))

    def restore(self) -> None:
        for node, attribute in self._patched:
            delattr(node, attribute)
        self._patched.clear()


# ----------------------------------------------------------------------------------------
# (a) read-only: the operate keys are refused, the others run
# ----------------------------------------------------------------------------------------
async def test_read_only_refuses_every_key_that_acts_and_runs_every_other(store_url: str) -> None:
    operate_seen: set[str] = set()
    async with console(store_url, read_only=True) as (app, pilot, notes):
        assert app.read_only
        for spec in WRITTEN:
            view = await show(pilot, app, spec.id)
            for owner, key in [*((view, k) for k in view.KEYS), *((app, k) for k in app.KEYS)]:
                active = app.screen.active_bindings.get(first_key(key))
                assert active is not None, f"{spec.id}: {key.what} ({key.key}) is not bound on screen"
                if active.binding.id != key.binding_id:
                    # A focused widget binds this key itself (a table's enter): it is the
                    # widget's to handle, and never one that acts.
                    assert not key.operates and isinstance(active.node, DOMNode) and active.node is not view, key
                    continue
                calls = Calls()
                calls.patch(target_of(owner, key), key)
                before = len(notes.seen)
                try:
                    await pilot.press(first_key(key))
                    await pilot.pause()
                finally:
                    calls.restore()
                said = notes.seen[before:]
                if key.operates:
                    operate_seen.add(key.name)
                    assert calls.made == [], f"{spec.id}: {key.what} ran while read-only"
                    assert said == [("Read-only", f"{key.what} does nothing here: the console was started with --read-only.")]
                    assert active.enabled is False  # left out of the footer
                else:
                    assert calls.made == [key.name], f"{spec.id}: {key.what} did not run"
                    assert all(title != "Read-only" for title, _ in said)
                    assert active.enabled
                assert not isinstance(app.screen, Confirm)
    # every key that acts, in every view, was tried
    every = SchedtuiApp.every_key()
    assert operate_seen == {name for name, key in every.items() if key.operates}
    assert {"release_lock", "delete_job", "run_now", "cancel_execution"} <= operate_seen  # it is not vacuous


async def test_read_only_says_so_and_the_footer_offers_no_key_it_refuses(store_url: str) -> None:
    async with console(store_url, read_only=True) as (app, pilot, notes):
        for spec in WRITTEN:
            view = await show(pilot, app, spec.id)
            refused = {key.binding_id for key in (*view.KEYS, *app.KEYS) if key.operates}
            assert str(app.query_one("#mode").render()) == " READ-ONLY ", spec.id
            local, everywhere, pinned = app.query_one(KeyFooter).offered()
            offered = {app.screen.active_bindings[key].binding.id for key, _, _ in (*local, *everywhere, *pinned)}
            assert offered and not offered & refused, spec.id
        await pilot.press("question_mark")
        await settle(pilot)
        help_text = help_text_of(app)
        assert "the console was started with --read-only: " in help_text
        for key in SchedtuiApp.every_key().values():
            if key.operates:
                assert f"{key.description}" in help_text and "read-only: does nothing" in help_text


# ----------------------------------------------------------------------------------------
# (b) the footer offers what the view on screen handles, and only that
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("read_only", [False, True])
async def test_each_views_footer_shows_only_the_keys_it_handles(store_url: str, read_only: bool) -> None:
    async with console(store_url, read_only=read_only) as (app, pilot, notes):
        for spec in WRITTEN:
            view = await show(pilot, app, spec.id)
            await pilot.pause()
            declared = {key.binding_id: key for key in (*view.KEYS, *app.KEYS) if key.show}
            shown = {active.binding.id: active for active in app.screen.active_bindings.values() if active.binding.show}
            assert set(shown) == set(declared), spec.id
            for binding_id, active in shown.items():
                assert binding_id is not None  # (the ids are the declared ones, checked above)
                key = declared[binding_id]
                namespace, name, parameters = parse(active.binding.action)
                node = app if namespace == "app" else active.node
                assert node is app or node is view, f"{spec.id}: {key.what} is bound on {node}"
                assert callable(getattr(node, f"action_{name}", None)), f"{spec.id}: {key.what} has no action_{name}"
                allowed = node.check_action(name, parameters)
                assert allowed is (None if read_only and key.operates else True), (spec.id, key.what)
            local, everywhere, pinned = app.query_one(KeyFooter).offered()
            footer = {app.screen.active_bindings[key].binding.id for key, _, _ in (*local, *everywhere, *pinned)}
            # what the footer may draw: every key of the view and the app but those refused now
            assert footer == {i for i, key in declared.items() if not (read_only and key.operates)}, spec.id
            # a view's keys are offered on that view only
            others = {k.binding_id for other in WRITTEN if other.id != spec.id and other.make is not None
                      for k in other.make.KEYS if k.show} - set(declared)  # fmt: skip
            assert not others & set(shown), spec.id


async def test_the_help_screen_lists_the_keys_from_the_declarations(store_url: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        await pilot.press("question_mark")
        await settle(pilot)
        sections = dict(app.help_keys())
        for spec in WRITTEN:
            assert spec.make is not None
            listed = sections[f"{spec.key} {spec.title}"]
            for key in spec.make.KEYS:
                line = (app.key_display(key, alone=True), key.description + (" (asks first)" if key.dangerous else ""))
                assert line in listed, (spec.id, key.what)
        everywhere = sections["Everywhere"]
        assert [k for k, _ in everywhere[:-1]] == [app.key_display(k, alone=True) for k in app.KEYS if k.name != "show_view"]
        body = help_text_of(app)
        assert "read-only" not in body  # not read-only: nothing said of it
        await pilot.press("escape")
        await settle(pilot)
        # the keys the help says the views' widgets handle are bound by a widget of that view
        assert set(NAVIGATION) <= {spec.id for spec in WRITTEN}
        for spec in WRITTEN:
            view = await show(pilot, app, spec.id)
            bound = {key for widget in view.query("*") if widget.can_focus for key in widget._bindings.key_to_bindings}
            bound |= set(app.screen._bindings.key_to_bindings)  # tab: the screen's focus_next
            for keys, what in NAVIGATION.get(spec.id, ()):
                assert set(keys) <= bound, f"{spec.id}: the help says {keys} {what}; no widget there binds it"


# ----------------------------------------------------------------------------------------
# (c) every dangerous action asks first, with the one confirmation
# ----------------------------------------------------------------------------------------
Scene = Callable[[SchedtuiApp, Pilot[Any]], Awaitable[tuple[dict[str, object], Callable[[], Awaitable[bool]]]]]
"""Puts the cursor on something the action applies to; returns the arguments the question
is rendered with, and whether the action has been done."""


async def _lock(app: SchedtuiApp, pilot: Pilot[Any]) -> tuple[dict[str, object], Callable[[], Awaitable[bool]]]:
    await show(pilot, app, "locks")  # the cursor on the first lock, nightly-rollup, held

    async def released() -> bool:
        locks = {lock.name: lock for lock in (await app.backend.list_locks()).locks}
        return locks["nightly-rollup"].holder is None

    return {"name": "nightly-rollup"}, released


async def _job(app: SchedtuiApp, pilot: Pilot[Any]) -> tuple[dict[str, object], Callable[[], Awaitable[bool]]]:
    view = await show(pilot, app, "jobs")
    assert isinstance(view, JobsView)
    view.query_one(JobsTable).focus()
    await settle(pilot)
    job = view.query_one(JobsTable).selected_job
    assert job is not None

    async def deleted() -> bool:
        try:
            return (await app.backend.get_job(job.id)).job is None
        except NotFound:  # gone with its attempts (it had none)
            return True

    return {"queue": job.queue, "job_id": job.id}, deleted


async def _execution(app: SchedtuiApp, pilot: Pilot[Any]) -> tuple[dict[str, object], Callable[[], Awaitable[bool]]]:
    await show(pilot, app, "durable")
    table = app.query_one(ExecutionsTable)
    index = next(i for i, e in enumerate(table.executions) if e.status == "waiting")
    table.move_cursor(row=index, animate=False)
    await settle(pilot)
    execution = table.executions[index]

    async def cancelled() -> bool:
        return (await app.backend.get_execution(execution.id)).status == "cancelled"

    return {"execution_id": execution.id}, cancelled


async def _stored_schedule(app: SchedtuiApp, pilot: Pilot[Any]) -> tuple[dict[str, object], Callable[[], Awaitable[bool]]]:
    await show(pilot, app, "schedules")
    await app.backend.create_schedule({"name": "reap-sessions", "cron": "*/15 * * * *", "timezone": "UTC", "queue": "mailer"})
    app.request_refresh()
    await settle(pilot)
    app.action_select("reap-sessions")
    await settle(pilot)

    async def deleted() -> bool:
        return "reap-sessions" not in {v.name for v in (await app.backend.list_schedules()).schedules}

    return {"name": "reap-sessions"}, deleted


async def _backfill(app: SchedtuiApp, pilot: Pilot[Any]) -> tuple[dict[str, object], Callable[[], Awaitable[bool]]]:
    await show(pilot, app, "schedules")
    app.action_select("heartbeat")
    await settle(pilot)

    async def started() -> bool:
        return any(run.trigger == "manual" for run in (await app.backend.list_runs("heartbeat")).runs if run.id not in before)

    before = {run.id for run in (await app.backend.list_runs("heartbeat")).runs}
    return {"name": "heartbeat"}, started


async def _backfill_form(app: SchedtuiApp, pilot: Pilot[Any]) -> None:
    """The backfill form is a form: its Backfill button is what asks."""
    form = app.screen
    assert isinstance(form, BackfillScreen)
    form.query_one("#from", Input).value = "-1m"
    await settle(pilot)
    form.query_one("#start", Button).press()
    await settle(pilot)


async def _lost_instance(app: SchedtuiApp, pilot: Pilot[Any]) -> tuple[dict[str, object], Callable[[], Awaitable[bool]]]:
    """A member killed five minutes ago on another host (its row left behind)."""
    store = app.backend.engine.store  # type: ignore[attr-defined]
    await store.heartbeat("web-3", "elsewhere", 4242, app.clock.now() - timedelta(minutes=5))
    app.refresh_instances()
    await settle(pilot)
    await show(pilot, app, "health")

    async def forgotten() -> bool:
        return "web-3" not in {i.name for i in await app.backend.instances()}

    return {"name": "web-3"}, forgotten


SCENES: dict[str, Scene] = {
    "release_lock": _lock,
    "delete_job": _job,
    "cancel_execution": _execution,
    "delete_schedule": _stored_schedule,
    "start_backfill": _backfill,
    "forget_instance": _lost_instance,
}
FORMS = {"start_backfill": _backfill_form}
"""Actions whose key opens a form first (it collects input); the form's submit asks."""


def dangerous_keys() -> list[tuple[Key, str]]:
    return sorted({(key, action.name) for key in SchedtuiApp.every_key().values() for action in key.dangerous},
                  key=lambda pair: pair[1])  # fmt: skip


def test_every_dangerous_action_has_a_scene_here() -> None:
    declared = {name for _, name in dangerous_keys()}
    assert declared == set(SCENES), "a key performs a dangerous action this test does not try"
    assert declared >= {"release_lock", "delete_job", "cancel_execution", "delete_schedule"}


@pytest.mark.parametrize(("key", "action"), dangerous_keys(), ids=[action for _, action in dangerous_keys()])
async def test_a_dangerous_key_asks_and_only_y_does_it(store_url: str, key: Key, action: str) -> None:
    async with console(store_url) as (app, pilot, notes):
        arguments, done = await SCENES[action](app, pilot)
        danger = action_of(action).danger
        assert danger is not None  # a dangerous key's action
        question, detail = danger.render(arguments)

        async def ask() -> Confirm:
            await pilot.press(first_key(key))
            await settle(pilot)
            if action in FORMS:
                await FORMS[action](app, pilot)
            screen = app.screen
            assert isinstance(screen, Confirm), f"{key.what}: {type(screen).__name__} instead of the confirmation"
            assert (screen.action, screen.question, screen.detail) == (action, question, detail)
            return screen

        for answer in ("enter", "n", "escape"):
            await ask()
            await pilot.press(answer)
            await settle(pilot)
            assert not isinstance(app.screen, Confirm)
            assert not await done(), f"{answer} did {action}"
            if isinstance(app.screen, BackfillScreen):
                await pilot.press("escape")  # out of the form too, to start again
                await settle(pilot)
        await ask()
        await pilot.press("y")
        await settle(pilot)
        assert await done(), f"y did not {action}"


def test_the_readme_lists_every_key_with_its_action_and_binding_id() -> None:
    """The README's table of keys is written by hand: it must name every declared key by
    its binding id, on a line that names its actions."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `") and line.count("|") == 6]
    for key in SchedtuiApp.every_key().values():
        if key.name == "show_view":
            continue
        row = next((line for line in rows if f"`{key.binding_id}`" in line.rsplit("|", 2)[1]), None)
        assert row is not None, f"the README's keys do not list {key.binding_id}"
        for action in key.actions:
            assert f"`{action}`" in row, f"the README's row for {key.binding_id} does not name {action}"
