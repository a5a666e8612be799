"""What the stores write of a handler's or a caller's text: valid text exactly as given
(ASCII, any other Unicode, tabs, escape sequences), and only what a store cannot keep (a
NUL, a lone surrogate) escaped, the same way on SQLite as on PostgreSQL, so that both show
the same thing. (Through a running server: tests/test_bad_text.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from backend import BadInput, Engine, define_queue
from backend.events.audit import AuditEntry, acting_as
from backend.ids import IdFactory, encode_id
from backend.jobs import JobContext
from backend.jobs.store import Finish, NewJob, QueueSpec
from backend.model import Run, ScheduleState
from backend.safetext import store_text
from backend.scheduler.stored import StoredSchedule, check_spec
from backend.store import Store, open_store
from tests import pg

VALID = ["", "plain ascii", "ünïcode ✓ 日本語 🎉", "tab\tnew\nline", "\x1b[1mbold\x1b[0m", "back\\slash \\0 \\ud800"]
#: Text no store can keep, and what each store writes of it.
INVALID = {
    "x \ud800": "x \\ud800",
    "a\x00b": "a\\0b",
    "both \udcff and \x00 ✓": "both \\udcff and \\0 ✓",
    "\ud83d\ude00 a pair": "\\ud83d\\ude00 a pair",  # (two lone halves: not the emoji they would make)
}


@pytest.mark.parametrize("text", VALID)
def test_valid_text_is_written_as_it_is(text: str) -> None:
    assert store_text(text) == text


@pytest.mark.parametrize(("text", "written"), INVALID.items())
def test_what_no_store_keeps_is_escaped(text: str, written: str) -> None:
    assert store_text(text) == written  # (both stores write through it)
    assert store_text(None) is None
    written.encode("utf-8")  # (it encodes)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.db'}"
    else:
        request.getfixturevalue("pg_server")
        url = pg.database_for(tmp_path)
    opened = open_store(url, create=True)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


T0 = datetime.now(UTC).replace(microsecond=0)
CASES = [(text, text) for text in VALID if text] + list(INVALID.items())


async def test_a_runs_error_and_traceback_round_trip(store: Store) -> None:
    make = IdFactory(lambda: T0)
    runs = {
        make(): (given, shown)
        for given, shown in CASES
    }  # fmt: skip
    store.save_runs([
        Run(id=id_, name="job", scheduled_at=T0, status="failed", trigger="manual", coordination_outcome="manual",
            instance="host:1", fired_at=T0, finished_at=T0 + timedelta(seconds=1), error_tag=f"Tag{given}",
            error_message=given, traceback=f"Traceback: {given}")
        for id_, (given, _) in runs.items()
    ])  # fmt: skip
    await store.flush()
    for id_, (_, shown) in runs.items():
        got = await store.get_run(id_)
        assert got is not None, id_
        assert (got.status, got.error_tag, got.error_message, got.traceback) == (
            "failed", f"Tag{shown}", shown, f"Traceback: {shown}",
        )  # fmt: skip


async def test_a_job_attempts_error_round_trips(store: Store) -> None:
    await store.define_queues([QueueSpec("mail", 50, 1, 60.0)], T0, update=False)  # type: ignore[attr-defined]
    ids = [encode_id(int(T0.timestamp() * 1000), low) for low in range(1, len(CASES) + 1)]
    await store.send_jobs("mail", [NewJob(id_, "{}", T0, None) for id_ in ids], T0)  # type: ignore[attr-defined]
    claimed = (await store.cycle_jobs([], {"mail": len(ids)}, "host:1", "token", T0)).claimed  # type: ignore[attr-defined]
    assert sorted(c.id for c in claimed) == ids
    finishes = [
        Finish(id_, "mail", 1, "dead", 1, T0, T0 + timedelta(seconds=1), "host:1", f"Tag{given}", given)
        for id_, (given, _) in zip(ids, CASES, strict=True)
    ]
    assert await store.finish_jobs(finishes) == [True] * len(ids)  # type: ignore[attr-defined]
    for id_, (_, shown) in zip(ids, CASES, strict=True):
        job = await store.get_job(id_)  # type: ignore[attr-defined]
        assert (job.status, job.error_tag, job.error_message) == ("dead", f"Tag{shown}", shown)
        _, [attempt] = await store.job_attempts(id_)  # type: ignore[attr-defined]
        assert (attempt.error_tag, attempt.error_message) == (f"Tag{shown}", shown)


async def test_an_audit_entrys_actor_and_target_round_trip(store: Store) -> None:
    ids = [encode_id(int(T0.timestamp() * 1000), low) for low in range(1, len(CASES) + 1)]
    for id_, (given, _) in zip(ids, CASES, strict=True):
        await store.append_audit(AuditEntry(id_, T0, f"by {given}", "schedule.disable", f"on {given}", {"note": given}))  # type: ignore[attr-defined]
    entries = {e.id: e for e in await store.list_audit(limit=100)}  # type: ignore[attr-defined]
    for id_, (_, shown) in zip(ids, CASES, strict=True):
        assert (entries[id_].actor, entries[id_].target) == (f"by {shown}", f"on {shown}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    request.getfixturevalue("pg_server")
    return pg.database_for(tmp_path)


async def _deliver(job: JobContext) -> None:
    pass


async def test_a_callers_lock_holder_state_and_catalog_author_are_written_escaped(store_url: str) -> None:
    """What Python code hands the engine past the API's and the CLI's checks: who changed
    a schedule's state (``set_enabled(by=…)``), who paused a queue
    (``jobs.set_paused(by=…)``) and who created or updated a stored schedule (an actor
    named by ``acting_as``, as the API names a token). SQLite wrote them escaped;
    PostgreSQL refused the statement (a NUL, a lone surrogate), and the action failed. A
    lock's holder (``locks.acquire(holder=…)``) is refused instead, naming it: it is shown
    in every table of locks."""
    engine = Engine([define_queue(name="mail", handler=_deliver)], open_store(store_url, create=True))
    await engine.open()
    try:
        for n, (given, shown) in enumerate(INVALID.items()):
            with pytest.raises(BadInput, match="holder"):
                await engine.locks.acquire(f"lock-{n}", holder=f"holder {given}")
            assert await engine.store.get_lock(f"lock-{n}") is None  # type: ignore[attr-defined]
            with acting_as(f"by {given}"):
                await engine.create_schedule({"name": f"job-{n}", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail"})
                await engine.set_enabled(f"job-{n}", False, by=f"disabler {given}")
                await engine.update_schedule(f"job-{n}", {"cron": "5 * * * *"})
            state = (await engine.store.get_states())[f"job-{n}"]
            assert (state.enabled, state.changed_by) == (False, f"disabler {shown}")
            _, rows = await engine.catalog.store.stored_schedules()
            (row,) = [r for r in rows if r.name == f"job-{n}"]
            assert (row.created_by, row.updated_by, row.version) == (f"by {shown}", f"by {shown}", 2)
            assert (await engine.jobs.set_paused("mail", n % 2 == 0, by=f"pauser {given}")).paused == (n % 2 == 0)
    finally:
        await engine.stop()


async def test_a_schedule_states_author_and_note_round_trip(store: Store) -> None:
    """(A note comes through check_note, which refuses both; the store writes it as the
    other store does all the same.)"""
    for n, (given, _) in enumerate(CASES):
        await store.set_state(ScheduleState(f"job-{n}", False, f"by {given}", T0, f"note {given}"))
    states = await store.get_states()
    for n, (_, shown) in enumerate(CASES):
        assert (states[f"job-{n}"].changed_by, states[f"job-{n}"].note) == (f"by {shown}", f"note {shown}")


async def test_a_stored_schedules_authors_and_description_round_trip(store: Store) -> None:
    """(The description comes through check_text, which refuses both.)"""
    for n, (given, _) in enumerate(INVALID.items()):
        spec = check_spec({"name": f"job-{n}", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail",
                           "description": "described"})  # fmt: skip
        row = StoredSchedule(**{**spec, "description": f"d {given}"}, created_at=T0, created_by=f"by {given}",
                             updated_at=T0, updated_by=f"by {given}")  # fmt: skip
        assert await store.create_stored_schedule(row)  # type: ignore[attr-defined]
        changed = replace(row, updated_by=f"then {given}", version=2)
        assert await store.update_stored_schedule(changed, 1) is not None  # type: ignore[attr-defined]
    _, rows = await store.stored_schedules()  # type: ignore[attr-defined]
    got = {r.name: (r.created_by, r.updated_by, r.description) for r in rows}
    assert got == {f"job-{n}": (f"by {shown}", f"then {shown}", f"d {shown}") for n, shown in enumerate(INVALID.values())}
