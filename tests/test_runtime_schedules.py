"""Schedules created at run time, on the engine and the manual clock: armed on creation,
re-armed on an update without a slot fired twice or lost, stopped on deletion, picked up
by another engine sharing the store on its state poll."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from backend import BadInput, Engine, ManualClock, NotFound, Unavailable
from backend.durable import DurableContext, define_durable
from backend.events.audit import acting_as
from backend.jobs import JobContext, define_queue
from backend.model import ScheduleView
from backend.scheduler.stored import DefinedInCode, NameTaken, NotValidHere, StoredSchedule, check_spec
from backend.schedules import QueueTarget, RunContext
from tests.conftest import all_runs
from tests.test_engine import schedule

UTC = UTC


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


async def _job(ctx: JobContext) -> None:
    pass


def queue() -> Any:
    return define_queue(name="mail", handler=_job)


def spec(name: str = "reap", cron: str = "* * * * *", **extra: Any) -> dict[str, Any]:
    return {"name": name, "cron": cron, "timezone": "UTC", "queue": "mail", **extra}


def slots(runs: list[Any]) -> list[str]:
    return [r.scheduled_at.strftime("%H:%M") for r in runs if r.trigger == "self"]


async def step(engine: Engine, clock: ManualClock, seconds: float) -> None:
    """Move the clock in steps of at most a second (the state poll's interval), letting
    the engine do what each calls for."""
    while seconds > 0:
        clock.advance(min(seconds, 1.0))
        seconds -= 1.0
        await engine.quiesce()


async def test_created_schedule_is_armed_and_fires_on_its_slot(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    view = await engine.create_schedule(spec(payload={"older_than": "7d"}))
    assert (view.source, view.target and view.target.to_json()) == ("store", {"kind": "queue", "name": "mail"})
    assert view.next_fire_at == at("2026-03-02T08:01:00Z")
    await step(engine, clock, 60)
    await step(engine, clock, 60)
    assert slots(await all_runs(engine, "reap")) == ["08:01", "08:02"]
    assert {r.status for r in await all_runs(engine, "reap")} == {"succeeded"}


async def test_a_slot_won_where_its_durable_function_is_not_defined_starts_it_for_an_instance_that_is(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A stored schedule made through an instance of the new release, whose durable
    function only that release defines: the old instances that won its slots failed them,
    NotFound, and no execution was ever started (outside attack: code changes between
    deploys). The slot starts its execution, which waits for an instance that defines it."""

    async def flow(ctx: DurableContext, input: Any) -> str:
        return "done"

    async def other(ctx: DurableContext, input: Any) -> None:
        pass

    new = make_engine([define_durable(name="newfn", handler=flow)], instance="new")
    await new.open()
    await new.create_schedule({"name": "nf", "cron": "* * * * *", "timezone": "UTC", "durable": "newfn"})
    await new.stop()
    old = make_engine([define_durable(name="other", handler=other)], instance="old")
    await old.start()
    await step(old, clock, 60)
    [run] = [r for r in await all_runs(old, "nf") if r.trigger == "self"]
    assert (run.status, run.error_tag, run.instance) == ("succeeded", None, "old"), run.error_message
    [execution] = (await old.durable.list("newfn"))[0]
    assert execution.status == "queued"  # waiting for an instance that defines it
    await old.stop()
    newer = make_engine([define_durable(name="newfn", handler=flow)], instance="new-2")
    await newer.start()
    await newer.quiesce()
    assert (await newer.durable.get(execution.id)).status == "succeeded"


async def test_a_stored_schedule_a_code_schedule_shadows_can_be_deleted_and_the_code_one_runs_on(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A deploy added to the code a schedule named as a stored one: the stored row was
    ignored (rightly), but could not be deleted (`"dup" is defined in code`), every verb
    warned of it, and a rollback of that code brought it back (outside attack: code changes
    between deploys)."""
    first = make_engine([queue()], instance="first")
    await first.open()
    await first.create_schedule(spec(name="dup"))
    await first.stop()
    engine = make_engine([queue(), schedule(name="dup", cron="0 * * * *")], instance="second")
    with caplog.at_level(logging.WARNING, "schedtui"):
        await engine.start()
        await engine.quiesce()
    assert any("(delete the stored one: schedtui schedules delete dup)" in r.getMessage() for r in caplog.records)
    with pytest.raises(DefinedInCode):
        await engine.update_schedule("dup", {"cron": "*/5 * * * *"})  # (the code's is not edited here)
    await engine.delete_schedule("dup")
    assert (await engine.catalog.store.stored_schedules())[1] == []
    view = await engine.get_schedule("dup")
    assert (view.source, view.cron) == ("code", "0 * * * *")  # the code's runs on
    clock.set("2026-03-02T08:59:58Z")
    await step(engine, clock, 3)
    assert slots(await all_runs(engine, "dup")) == ["09:00"]
    with pytest.raises(DefinedInCode):
        await engine.delete_schedule("dup")  # nothing stored by that name now: the code's, as before


async def test_an_instances_own_change_is_applied_without_reading_every_row_again(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each create, update or delete read every stored row again: 5,000 schedules created
    one after another through the API read 12.5 million rows, each create took 84 ms at
    5,500, and a core stayed busy (outside attack: run-time schedules at scale). The
    instance's own change is applied by itself when it is the only one since its last read;
    another instance's change between makes it read them all, as before."""
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    store: Any = engine.catalog.store
    reads: list[int] = []
    read_all = store.stored_schedules

    async def counted() -> Any:
        version, rows = await read_all()
        reads.append(len(rows))
        return version, rows

    monkeypatch.setattr(store, "stored_schedules", counted)
    for n in range(20):
        await engine.create_schedule(spec(name=f"s{n}"))
    await engine.update_schedule("s3", {"cron": "*/2 * * * *"})
    await engine.delete_schedule("s4")
    assert reads == []
    other = make_engine([queue()], instance="other")
    await other.open()
    await other.create_schedule(spec(name="theirs"))
    await engine.create_schedule(spec(name="mine"))  # two changes since this instance's last read
    assert reads == [21]
    assert sorted(engine.catalog.rows) == sorted([*(f"s{n}" for n in range(20) if n != 4), "theirs", "mine"])
    assert engine.schedules["s3"].cron.expr == "*/2 * * * *" and "s4" not in engine.schedules
    await step(engine, clock, 60)
    assert slots(await all_runs(engine, "s0")) == ["08:01"] and slots(await all_runs(engine, "theirs")) == ["08:01"]


async def test_update_of_cron_rearms_and_a_slot_due_during_it_fires_once(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec())
    await step(engine, clock, 60)  # 08:01 fired
    clock.set("2026-03-02T08:02:00.500Z")  # 08:02 is due; the update comes before the timer loop runs
    view = await engine.update_schedule("reap", {"cron": "*/2 * * * *"})
    assert view.cron == "*/2 * * * *"
    await engine.quiesce()
    await step(engine, clock, 120)
    assert slots(await all_runs(engine, "reap")) == ["08:01", "08:02", "08:04"]


async def test_update_to_a_cron_without_the_armed_slot_loses_nothing_new(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec(cron="0 * * * *"))  # hourly: armed at 09:00
    clock.set("2026-03-02T08:10:30Z")
    await engine.update_schedule("reap", {"cron": "* * * * *"})
    await engine.quiesce()
    await step(engine, clock, 60)
    assert slots(await all_runs(engine, "reap")) == ["08:11"]


async def test_delete_stops_it_and_disable_enable_works(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec())
    await step(engine, clock, 60)
    await engine.set_enabled("reap", False)
    await step(engine, clock, 60)
    await engine.set_enabled("reap", True)
    await step(engine, clock, 60)
    await engine.delete_schedule("reap")
    await step(engine, clock, 120)
    assert slots(await all_runs(engine, "reap")) == ["08:01", "08:03"]
    assert "reap" not in engine.schedules
    with pytest.raises(NotFound):
        await engine.delete_schedule("reap")


class HeldSends:
    """Holds each job a run of ``trigger`` (a backfill's: ``manual``) sends until the test
    lets it go, noting its slot and payload: the run stays in flight meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, trigger: str = "manual") -> None:
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        self.sent: list[tuple[str, Any]] = []
        real = QueueTarget.__call__

        async def held(target: QueueTarget, ctx: RunContext) -> None:
            if ctx.trigger == trigger:
                self.entered.set()
                await self.go.wait()
                self.sent.append((ctx.scheduled_at.strftime("%H:%M"), ctx.payload))
            await real(target, ctx)

        monkeypatch.setattr(QueueTarget, "__call__", held)


@pytest.mark.parametrize("again", [False, True])
@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_backfill_stops_once_its_schedule_is_deleted(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch, again: bool, where: str
) -> None:
    # It fired every slot of its range for a schedule deleted while it ran: jobs sent for a
    # schedule that no longer existed, and, created again under its name, runs of another
    # timing in the new one's ledger. ``elsewhere``: the backfill runs on an engine that
    # only opened (``schedtui backfill``), which follows no change otherwise, and another
    # process deletes the schedule.
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec())
    backfiller = engine
    if where == "elsewhere":
        backfiller = make_engine([queue()], instance="cli")
        await backfiller.open()
    sends = HeldSends(monkeypatch)
    backfill = await backfiller.start_backfill("reap", at("2026-03-02T07:40:00Z"), at("2026-03-02T07:48:00Z"))
    await sends.entered.wait()  # its first run (07:41) is in flight
    await engine.delete_schedule("reap")
    if again:
        clock.advance(1)  # (its run still in flight)
        await engine.create_schedule(spec(cron="0 0 1 1 *", payload={"new": True}))
    sends.go.set()
    ended = await backfiller.wait_backfill(backfill.id)
    await engine.quiesce()
    assert sends.sent == [("07:41", None)]  # the run in flight finishes; nothing after it
    assert (ended.state, ended.fired, ended.remaining) == ("cancelled", 1, 7)
    manual = [r.scheduled_at.strftime("%H:%M") for r in await all_runs(engine, "reap") if r.trigger == "manual"]
    assert manual == ["07:41"]


async def test_a_backfill_fires_its_next_slots_by_the_schedules_definition_now(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec(payload={"v": 1}))
    sends = HeldSends(monkeypatch)
    backfill = await engine.start_backfill("reap", at("2026-03-02T07:40:00Z"), at("2026-03-02T07:43:00Z"))
    await sends.entered.wait()
    await engine.update_schedule("reap", {"payload": {"v": 2}})
    sends.go.set()
    assert (await engine.wait_backfill(backfill.id)).state == "done"
    assert sends.sent == [("07:41", {"v": 1}), ("07:42", {"v": 2}), ("07:43", {"v": 2})]


@pytest.mark.parametrize("change", ["update", "delete and create again"])
async def test_a_slot_queued_behind_a_run_of_the_old_definition_runs_by_the_new_one(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    # The queue's next slot started with the definition of the run that ended before it: a
    # slot due after the change sent the old payload (or, after a delete, the deleted
    # schedule's job).
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec(on_overlap="queue", payload={"v": 1}))
    sends = HeldSends(monkeypatch, trigger="self")
    clock.advance(60)
    await sends.entered.wait()  # 08:01 in flight
    if change == "update":
        await engine.update_schedule("reap", {"payload": {"v": 2}})
    else:
        await engine.delete_schedule("reap")
        await engine.create_schedule(spec(on_overlap="queue", payload={"v": 2}))
    clock.advance(60)
    await engine.quiesce(runs=False)  # 08:02 queued behind it
    sends.go.set()
    await engine.quiesce()
    assert sends.sent == [("08:01", {"v": 1}), ("08:02", {"v": 2})]


@pytest.mark.parametrize("change", ["delete", "delete and create again", "disable"])
async def test_a_catch_up_fires_no_slot_of_a_schedule_deleted_or_disabled_while_it_runs(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    # A start's catch-up (backfill="all") fired every slot of the downtime, one after
    # another, after the schedule was deleted (its jobs sent for a schedule that was gone)
    # or disabled (a disabled schedule does not fire).
    first = make_engine([queue()], instance="one")
    await first.start()
    await first.quiesce()
    await first.create_schedule(spec(backfill="all", payload={"v": 1}))
    await step(first, clock, 60)
    await first.stop()
    clock.advance(300)  # 08:02 to 08:06 missed
    sends = HeldSends(monkeypatch, trigger="self")
    engine = make_engine([queue()], instance="two")
    await engine.start()
    await sends.entered.wait()  # the catch-up's first run (08:02) in flight
    if change == "disable":
        await engine.set_enabled("reap", False)
    else:
        await engine.delete_schedule("reap")
    if change == "delete and create again":
        await engine.create_schedule(spec(cron="0 0 1 1 *", payload={"v": 2}))
    sends.go.set()
    await engine.quiesce()
    assert sends.sent == [("08:02", {"v": 1})]
    runs = {r.scheduled_at.strftime("%H:%M"): r.status for r in await all_runs(engine, "reap")}
    # (each slot keeps its row: those not started are recorded missed, as a deleted
    # schedule's queued firings are)
    assert runs == {"08:01": "succeeded", "08:02": "succeeded", **dict.fromkeys(["08:03", "08:04", "08:05", "08:06"], "missed")}


async def test_a_change_of_timing_while_a_catch_up_runs_fires_no_slot_of_the_new_timing_from_before_it(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The catch-up, ending, armed the changed schedule from its own last slot: 08:07 of
    # the new timing, already past when the change was made at 08:07:30, fired.
    first = make_engine([queue()], instance="one")
    await first.start()
    await first.quiesce()
    await first.create_schedule(spec(cron="*/2 * * * *", backfill="all"))
    await step(first, clock, 120)
    await first.stop()
    clock.set("2026-03-02T08:06:10Z")  # 08:04 and 08:06 missed
    sends = HeldSends(monkeypatch, trigger="self")
    engine = make_engine([queue()], instance="two")
    await engine.start()
    await sends.entered.wait()  # 08:04 in flight
    clock.set("2026-03-02T08:07:30Z")
    await engine.update_schedule("reap", {"cron": "* * * * *"})
    sends.go.set()
    await engine.quiesce()
    clock.set("2026-03-02T08:08:00Z")
    await engine.quiesce()
    assert slots(await all_runs(engine, "reap")) == ["08:02", "08:04", "08:06", "08:08"]


async def test_a_slot_skipped_behind_a_run_of_the_old_definition_names_that_run(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run in flight was looked for by its definition: after a change, the skipped slot
    # said "a run was still in flight", naming none.
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec(payload={"v": 1}))
    sends = HeldSends(monkeypatch, trigger="self")
    clock.advance(60)
    await sends.entered.wait()  # 08:01 in flight
    await engine.update_schedule("reap", {"payload": {"v": 2}})
    clock.advance(60)
    await engine.quiesce(runs=False)
    sends.go.set()
    await engine.quiesce()
    runs = {r.scheduled_at.strftime("%H:%M"): r for r in await all_runs(engine, "reap")}
    assert (runs["08:02"].status, runs["08:02"].error_message) == ("skipped", f"run {runs['08:01'].id} was still in flight")


@pytest.mark.parametrize("call", ["create", "update"])
async def test_a_create_or_update_deleted_before_its_answer_answers_what_it_wrote(
    make_engine: Callable[..., Engine], clock: ManualClock, call: str
) -> None:
    """A delete from another request landed between the write and the read of its answer:
    the create answered 404 "no schedule named", though it had made the schedule (and
    audited so); its caller, who may send it again, was told it did nothing. It answers
    with what it wrote, and no next fire (it is gone)."""
    engine = make_engine([queue()])
    await engine.start()
    if call == "update":
        await engine.create_schedule(spec())
    record = engine.audit.record

    async def deleted_meanwhile(action: str, *args: Any, **kwargs: Any) -> Any:
        if action == f"schedule.{call}":
            await engine.delete_schedule("reap")  # another request to the same serve, meanwhile
        return await record(action, *args, **kwargs)

    engine.audit.record = deleted_meanwhile  # type: ignore[method-assign]
    if call == "create":
        view = await engine.create_schedule(spec(description="made"))
    else:
        view = await engine.update_schedule("reap", {"description": "made"})
    assert (view.name, view.description, view.source, view.next_fire_at) == ("reap", "made", "store", None)
    engine.audit.record = record  # type: ignore[method-assign]
    await step(engine, clock, 2)
    assert "reap" not in engine.schedules
    entries = [(e.action, e.target) for e in (await engine.audit.list()).entries]
    assert ("schedule.delete", "reap") in entries and (f"schedule.{call}", "reap") in entries


async def test_an_update_meeting_another_writers_change_is_applied_to_it_not_refused(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Two PATCHes of one schedule at once: the second to write found the version moved on
    and answered 503 "changed by someone else at the same moment" (126 times in an
    outside test's churn). It reads the row again and applies its changes to it: both
    changes are kept; only a row that keeps changing under it is refused."""
    engine, other = make_engine([queue()]), make_engine([queue()])
    await engine.start()
    await other.open()
    await engine.create_schedule(spec())
    write = engine.store.update_stored_schedule  # type: ignore[attr-defined]
    writes = 0

    async def another_writer_first(row: Any, version: int) -> Any:
        nonlocal writes
        writes += 1
        if writes == 1:
            await other.update_schedule("reap", {"description": "theirs"})  # lands between the read and the write
        return await write(row, version)

    engine.store.update_stored_schedule = another_writer_first  # type: ignore[attr-defined]
    view = await engine.update_schedule("reap", {"payload": {"mine": True}})
    assert (view.description, view.payload, writes) == ("theirs", {"mine": True}, 2)

    async def always_another(row: Any, version: int) -> Any:
        await other.update_schedule("reap", {"description": f"theirs {version}"})
        return await write(row, version)

    engine.store.update_stored_schedule = always_another  # type: ignore[attr-defined]
    with pytest.raises(Unavailable, match='"reap" was changed by someone else at the same moment, 3 times; try again'):
        await engine.update_schedule("reap", {"payload": None})


async def test_refusals_name_the_value(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([queue(), schedule("coded")])
    await engine.open()
    cases = [
        (spec(cron="61 * * * *"), "cron"),
        ({**spec(), "timezone": "Mars/Olympus"}, "timezone"),
        (spec(queue="nowhere"), "queue"),
        ({**spec(), "durable": "flow"}, "durable"),
        (spec(on_overlap="sometimes"), "on_overlap"),
        (spec(max_runtime=-1), "max_runtime"),
        (spec(colour="red"), "colour"),
        ({"name": "x y", "cron": "* * * * *", "timezone": "UTC", "queue": "mail"}, "name"),
    ]
    for bad, field in cases:
        with pytest.raises(BadInput) as caught:
            await engine.create_schedule(bad)
        assert caught.value.field == field, (bad, caught.value)
    assert "nowhere" in str(await _refusal(engine, spec(queue="nowhere")))
    # A bad expression is said in the zone given (it said tz="UTC", whatever the zone).
    never = await _refusal(engine, {**spec(cron="0 0 31 2 *"), "timezone": "Australia/Lord_Howe"})
    assert never.field == "cron" and 'never fires' in str(never), never
    assert '(tz="Australia/Lord_Howe")' in str(never) and "UTC" not in str(never), never
    with pytest.raises(NameTaken):
        await engine.create_schedule(spec(name="coded"))
    with pytest.raises(DefinedInCode):
        await engine.update_schedule("coded", {"cron": "5 * * * *"})
    with pytest.raises(DefinedInCode):
        await engine.delete_schedule("coded")
    await engine.create_schedule(spec())
    assert (await engine.create_schedule(spec())).name == spec()["name"]  # the same again: a retry
    with pytest.raises(NameTaken):
        await engine.create_schedule(spec(cron="5 * * * *"))  # another schedule of that name
    with acting_as("bob"):
        with pytest.raises(NameTaken):
            await engine.create_schedule(spec())  # another author's
    await engine.disable("reap")
    with pytest.raises(NameTaken):
        await engine.create_schedule(spec())  # disabled since: not a retry of its create
    await engine.enable("reap")
    assert (await engine.create_schedule(spec())).enabled
    await engine.update_schedule(spec()["name"], {"description": "changed"})
    with pytest.raises(NameTaken):
        await engine.create_schedule(spec())  # changed since: not a retry of its create
    with pytest.raises(NotFound):
        await engine.update_schedule("ghost", {"cron": "5 * * * *"})


async def _refusal(engine: Engine, bad: dict[str, Any]) -> BadInput:
    try:
        await engine.create_schedule(bad)
    except BadInput as exc:
        return exc
    raise AssertionError("not refused")


async def test_another_engine_picks_up_create_update_delete_on_its_poll(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    firer = make_engine([queue()])
    await firer.start()
    await firer.quiesce()
    operator = make_engine([queue()], instance="cli")
    await operator.open()
    clock.set("2026-03-02T08:00:59.500Z")
    await firer.quiesce()
    await operator.create_schedule(spec())  # 08:01 comes due before the firer's next poll
    await step(firer, clock, 1)
    assert "reap" in firer.schedules
    await step(firer, clock, 58)  # 08:01:58.5, a poll before 08:02
    await operator.update_schedule("reap", {"cron": "*/3 * * * *"})  # 08:02 is not a slot of it
    await step(firer, clock, 62)  # 08:03:00.5: 08:03 fired
    await operator.delete_schedule("reap")
    await step(firer, clock, 1)
    assert "reap" not in firer.schedules
    await step(firer, clock, 180)
    assert slots(await all_runs(firer, "reap")) == ["08:01", "08:03"]


async def test_a_schedule_another_process_just_created_is_acted_on_through_the_api(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The API checks a route's schedule first (its zone, for times typed): a schedule
    another process created a moment before, not yet read here, was "no schedule named",
    while the same disable through the engine read the catalog again and found it."""
    import httpx

    from backend.api.app import create_app
    from backend.client.embedded import EmbeddedBackend

    server = make_engine([queue()])
    await server.open()
    operator = make_engine([queue()], instance="cli")
    await operator.open()
    await operator.create_schedule(spec())  # before the server's next poll
    assert "reap" not in server.schedules
    app = create_app(EmbeddedBackend(server), token="t")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                 headers={"Authorization": "Bearer t"}) as http:  # fmt: skip
        answer = await http.post("/inspect/schedules/reap/disable", json={"note": "at once"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["enabled"] is False
        gone = await http.post("/inspect/schedules/nowhere/disable", json={})
        assert gone.status_code == 404


async def test_a_schedule_deleted_and_created_again_between_two_polls_is_followed(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The new row starts again at version 1, as the one this instance had read: it used
    to keep the old definition (firing on the old cron) until the schedule changed again."""
    firer = make_engine([queue()])
    await firer.start()
    await firer.quiesce()
    operator = make_engine([queue()], instance="cli")
    await operator.open()
    await operator.create_schedule(spec(cron="*/2 * * * *"))
    await step(firer, clock, 1)
    assert firer.schedule("reap").cron.expr == "*/2 * * * *"
    await operator.delete_schedule("reap")
    await operator.create_schedule(spec(cron="0 9 * * *", description="again"))
    await step(firer, clock, 1)
    assert firer.schedule("reap").cron.expr == "0 9 * * *"
    assert (await firer.get_schedule("reap")).next_fire_at == at("2026-03-02T09:00:00Z")
    await step(firer, clock, 240)  # no slot of the old */2 definition fires
    assert slots(await all_runs(firer, "reap")) == []


async def test_a_restart_catches_up_no_slot_from_before_a_change_of_timing(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The catch-up at start judges the slots since the last run by the definition it
    finds: one that lay before the change of cron or zone was never the schedule's."""
    first = make_engine([queue()])
    await first.start()
    await first.create_schedule(spec(cron="10 * * * *", backfill="all"))
    clock.set("2026-03-02T08:10:00Z")
    await first.quiesce()  # 08:10 fires
    clock.set("2026-03-02T08:20:00Z")
    await first.update_schedule("reap", {"cron": "15,25 * * * *"})  # 08:15 is past at the change
    await first.update_schedule("reap", {"payload": {"n": 1}})  # (not a change of timing)
    await first.quiesce()
    await first.stop()
    clock.set("2026-03-02T08:30:00Z")  # 08:25 came due after the change, while no instance ran
    second = make_engine([queue()])
    await second.start()
    await second.quiesce()
    assert slots(await all_runs(second, "reap")) == ["08:10", "08:25"]
    rows = {row.name: row for row in (await second.store.stored_schedules())[1]}  # type: ignore[attr-defined]
    assert rows["reap"].timing_changed_at == at("2026-03-02T08:20:00Z")


async def test_a_schedule_created_again_catches_up_only_its_own_slots(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Its runs are recorded under the same name as the deleted namesake's: an instance
    that starts must not take the last of those for where the new one left off (it would
    fire, or record missed, every slot the schedule did not exist for)."""
    first = make_engine([queue()])
    await first.start()
    await first.create_schedule(spec(backfill="all"))
    await step(first, clock, 60)  # 08:01 fires
    await first.delete_schedule("reap")
    await step(first, clock, 29 * 60)  # 08:30: no schedule
    await first.create_schedule(spec(backfill="all"))
    await first.stop()
    clock.advance(150)  # 08:32:30: 08:31 and 08:32 were due while no instance ran
    second = make_engine([queue()])
    await second.start()
    await second.quiesce()
    assert slots(await all_runs(second, "reap")) == ["08:01", "08:31", "08:32"]


async def test_a_schedules_alerts_are_read_back_as_they_apply(make_engine: Callable[..., Engine]) -> None:
    """A stored schedule's ``alert`` reached no read but the audit log."""
    engine = make_engine([queue()])
    await engine.start()
    await engine.create_schedule(spec(name="strict", alert={"failing": 3, "late": 600}))
    await engine.create_schedule(spec(name="quiet", alert=False))
    await engine.create_schedule(spec(name="plain"))
    views = {v.name: v for v in await engine.list_schedules()}
    assert views["strict"].alert == {"failing": 3, "late": 600.0, "disabled": 86400.0, "resolve_after": 300.0}
    assert views["quiet"].alert is False
    assert views["plain"].alert == {"failing": 1, "late": True, "disabled": 86400.0, "resolve_after": 300.0}
    assert ScheduleView.from_json(views["strict"].to_json()).alert == views["strict"].alert  # (the remote client's)


async def test_an_empty_description_is_none_so_the_command_line_can_clear_one(make_engine: Callable[..., Engine]) -> None:
    """``--description null`` is that text; the command line has no null for a text."""
    engine = make_engine([queue()])
    await engine.start()
    assert (await engine.create_schedule(spec(description=""))).description is None
    assert (await engine.update_schedule("reap", {"description": "kept"})).description == "kept"
    assert (await engine.update_schedule("reap", {"description": ""})).description is None


async def reap_fired_once(make_engine: Callable[..., Engine], clock: ManualClock) -> Engine:
    """A started engine whose stored schedule "reap" (every minute) fired its 08:01 slot."""
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    await engine.create_schedule(spec())
    await step(engine, clock, 60)
    return engine


async def test_a_stored_row_not_valid_here_is_listed_with_why_never_run_and_can_be_corrected(
    make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A row another release wrote (a zone this machine's time zone database lacks, a bound
    of a newer release): the running definition stops, the schedule stays listed with why
    (not hidden), every action but an update or a delete is refused naming the problem,
    and an update that corrects it runs it again."""
    engine = await reap_fired_once(make_engine, clock)
    row = engine.catalog.rows["reap"]
    written = await engine.catalog.store.update_stored_schedule(
        replace(row, timezone="Mars/Olympus_Mons", updated_at=clock.now(), updated_by="a newer release"), row.version
    )
    assert written is not None
    await step(engine, clock, 180)  # the poll reads the row; 08:02-08:04 are not fired
    assert slots(await all_runs(engine, "reap")) == ["08:01"]
    assert any("Mars/Olympus_Mons" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)

    listed = {v.name: v for v in await engine.list_schedules()}
    view = listed["reap"]
    assert view.problem is not None and "Mars/Olympus_Mons" in view.problem
    assert (view.timezone, view.next_fire_at, view.source) == ("Mars/Olympus_Mons", None, "store")
    assert view.last_run is not None and view.last_run.scheduled_at == at("2026-03-02T08:01:00Z")
    assert (await engine.get_schedule("reap")).problem == view.problem
    assert engine.upcoming("reap") == []
    assert ScheduleView.from_json(view.to_json()) == view
    for act in (
        lambda: engine.run_now("reap"),
        lambda: engine.set_enabled("reap", False),
        lambda: engine.start_backfill("reap", at("2026-03-02T07:00:00Z"), at("2026-03-02T08:00:00Z")),
    ):
        with pytest.raises(NotValidHere, match="Mars/Olympus_Mons"):
            await act()

    fixed = await engine.update_schedule("reap", {"timezone": "Europe/Paris"})
    assert fixed.problem is None and fixed.next_fire_at is not None
    await step(engine, clock, 60)
    assert slots(await all_runs(engine, "reap"))[-1] == fixed.next_fire_at.astimezone(UTC).strftime("%H:%M")


async def test_a_row_not_valid_here_at_start_is_listed_and_can_be_deleted(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    first = make_engine([queue()])
    await first.start()
    await first.quiesce()
    row = StoredSchedule(**{**check_spec(spec()), "max_runtime": 30 * 86400.0}, created_at=clock.now(),
                         created_by="a newer release", updated_at=clock.now(), updated_by="a newer release")  # fmt: skip
    assert await first.catalog.store.create_stored_schedule(row)
    await first.stop()
    engine = make_engine([queue()])
    await engine.start()
    await step(engine, clock, 120)
    assert await all_runs(engine, "reap") == []
    view = await engine.get_schedule("reap")
    assert view.problem is not None and "max_runtime" in view.problem
    await engine.delete_schedule("reap")
    assert "reap" not in {v.name for v in await engine.list_schedules()}
    with pytest.raises(NotFound):
        await engine.get_schedule("reap")


async def test_a_payload_nested_past_the_bound_is_refused_but_a_stored_one_still_runs(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """An operator's payload nests 64 levels at most; a row an earlier release stored deeper
    is no row "not valid here" after the upgrade: it runs as it did."""
    deep: Any = 1
    for _ in range(65):
        deep = [deep]
    engine = await reap_fired_once(make_engine, clock)
    with pytest.raises(BadInput, match="64 levels deep at most"):
        await engine.create_schedule(spec(name="deep", payload=deep))
    with pytest.raises(BadInput, match="64 levels deep at most"):
        await engine.update_schedule("reap", {"payload": deep})
    row = engine.catalog.rows["reap"]
    written = await engine.catalog.store.update_stored_schedule(
        replace(row, payload=deep, updated_at=clock.now(), updated_by="an earlier release"), row.version
    )
    assert written is not None
    await step(engine, clock, 60)
    assert (await engine.get_schedule("reap")).problem is None
    assert slots(await all_runs(engine, "reap"))[-2:] == ["08:01", "08:02"]


async def test_a_zone_unreadable_for_want_of_descriptors_leaves_the_schedule_running_and_is_applied_later(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update read while the process is out of file descriptors (its new zone's file
    cannot be opened): not taken for a row not valid here, the running definition kept, and
    the update applied at the next poll once the descriptors are back."""
    import backend.cron

    engine = await reap_fired_once(make_engine, clock)
    row = engine.catalog.rows["reap"]
    assert await engine.catalog.store.update_stored_schedule(
        replace(row, cron="0 9 * * *", timezone="Asia/Kathmandu", updated_at=clock.now(), updated_by="elsewhere"), row.version
    )
    real = ZoneInfo

    def short(name: str) -> Any:
        if name == "Asia/Kathmandu":
            raise OSError(errno.EMFILE, "Too many open files")
        return real(name)

    monkeypatch.setattr(backend.cron, "ZoneInfo", short)
    await step(engine, clock, 60)
    assert engine.catalog.invalid == {} and engine.schedules["reap"].timezone == "UTC"
    assert slots(await all_runs(engine, "reap")) == ["08:01", "08:02"]  # the old definition runs on
    monkeypatch.setattr(backend.cron, "ZoneInfo", real)
    await step(engine, clock, 2)
    assert engine.schedules["reap"].timezone == "Asia/Kathmandu" and engine.catalog.invalid == {}
    assert (await engine.get_schedule("reap")).next_fire_at == at("2026-03-03T03:15:00Z")
