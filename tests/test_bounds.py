"""Upper bounds on every number a definition or a send takes, and what a refusal leaves:
a huge ``max_runtime``, ``lock_ttl``, alert seconds or job ``delay`` is refused naming the
value (before anything is written), a null for a field that is not nullable is refused
rather than taken for the default, an empty job key is refused, a row written before
the bounds existed neither stops an engine nor sticks, the alert evaluation survives a
failed round, and a create racing a delete of the same name answers with a refusal, not
a crash."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from backend import BadInput, DefinitionError, Engine, ManualClock, NotFound, RunContext, define_queue, define_schedule
from backend.alerts.evaluator import Evaluator
from backend.alerts.notifier import AlertSettings
from backend.alerts.policy import schedule_alerting
from backend.jobs import JobContext
from backend.jobs.definition import check_send
from backend.scheduler.stored import NameTaken, StoredSchedule, check_changes, check_spec
from tests.test_alerts import HOOK, Receiver
from tests.test_runtime_schedules import queue, spec, step

MAX_RUNTIME_LIMIT = 7 * 86_400  # (backend.schedules.MAX_RUNTIME_LIMIT, its value stated)
MAX_ALERT_SECONDS = 365 * 86_400  # (backend.alerts.policy.MAX_ALERT_SECONDS)


def _short(value: Any) -> str:
    return repr(value)[:24]


HUGE = [1e15, 3e11, 2**63, 10**400, MAX_RUNTIME_LIMIT + 1]


async def noop(ctx: RunContext) -> None:
    pass


async def job(ctx: JobContext) -> None:
    pass


def define(**extra: Any) -> Any:
    return define_schedule(name="job", cron="* * * * *", timezone="UTC", handler=noop, **extra)


# -- define_schedule ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", HUGE, ids=_short)
def test_a_huge_max_runtime_is_refused_naming_the_value_and_the_bound(value: Any) -> None:
    with pytest.raises(DefinitionError) as info:
        define(max_runtime=value)
    message = str(info.value)
    assert message.startswith("define_schedule('job'): max_runtime ")
    assert "at most 604,800 (7 days)" in message and len(message) < 200, message
    assert repr(value)[:10] in message


def test_the_bound_itself_is_accepted() -> None:
    assert define(max_runtime=MAX_RUNTIME_LIMIT).max_runtime == 7 * 86400
    assert define(max_runtime=timedelta(days=7)).max_runtime == 7 * 86400


@pytest.mark.parametrize("value", [10**400, 1e15, 86_401, 0, float("nan")], ids=_short)
def test_lock_ttl_is_bounded_with_or_without_a_lock(value: Any) -> None:
    with pytest.raises(DefinitionError, match="lock ttl"):
        define(lock_ttl=value)
    with pytest.raises(DefinitionError, match="lock ttl"):
        define(lock="l", lock_ttl=value)


# -- alert seconds -----------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["late", "disabled"])
@pytest.mark.parametrize("value", [99999999999999999, 1e300, 10**400, MAX_ALERT_SECONDS + 1, timedelta(days=400)], ids=_short)
def test_huge_alert_seconds_are_refused(key: str, value: Any) -> None:
    with pytest.raises(BadInput) as info:
        schedule_alerting({key: value})
    assert info.value.field == "alert" and f"alert {key} " in info.value.message
    assert "at most 31,536,000 (365 days)" in info.value.message and len(info.value.message) < 200
    with pytest.raises(DefinitionError, match=f"alert {key} "):
        define(alert={key: value})
    assert schedule_alerting({key: MAX_ALERT_SECONDS}) is not None


def test_a_queue_is_bounded_the_same_way() -> None:
    with pytest.raises(DefinitionError, match="alert window 99999999999999999 must be"):
        define_queue(name="q", handler=job, alert={"window": 99999999999999999})
    refused = "max_runtime 1000000000000000.0 must be a number of seconds or a timedelta, more than 0 and at most 604,800"
    with pytest.raises(DefinitionError, match=refused):
        define_queue(name="q", handler=job, max_runtime=1e15)


# -- sends -------------------------------------------------------------------------------------
@pytest.mark.parametrize("delay", [10**400, 2**63, 1e300, -(10**400)], ids=_short)
def test_a_huge_delay_is_refused_naming_it(delay: Any) -> None:
    with pytest.raises(BadInput) as info:
        check_send(delay=delay)
    assert info.value.field == "delay" and "is out of range: 0 to 2,592,000 seconds (30 days)" in info.value.message
    assert len(info.value.message) < 200, info.value.message


def test_an_empty_key_is_refused_like_a_cancel_by_it() -> None:
    with pytest.raises(BadInput) as info:
        check_send(key="")
    assert (info.value.field, info.value.message) == ("key", "key is empty")
    assert check_send(key=None).key is None


async def test_a_send_with_a_huge_delay_or_an_empty_key_queues_nothing(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine([queue()])
    await engine.open()
    with pytest.raises(BadInput, match="delay"):
        await engine.jobs.send("mail", {"n": 1}, delay=10**400)
    with pytest.raises(BadInput, match="key is empty"):
        await engine.jobs.send("mail", {"n": 1}, key="")
    assert (await engine.jobs.queue_views())[0].queued == 0


# -- stored schedules: bounds, nulls -----------------------------------------------------------
@pytest.mark.parametrize("value", [1e15, 3e11, 2**63])
async def test_a_stored_schedule_with_a_huge_max_runtime_is_refused_before_it_is_written(
    make_engine: Callable[..., Engine], clock: ManualClock, value: Any
) -> None:
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    with pytest.raises(BadInput) as info:
        await engine.create_schedule(spec("big", max_runtime=value))
    assert info.value.field == "max_runtime" and "7 days" in info.value.message
    with pytest.raises(BadInput, match="alert late"):
        await engine.create_schedule(spec("big", alert={"late": 99999999999999999}))
    assert (await engine.catalog.store.stored_schedules())[1] == []
    await engine.create_schedule(spec("big"))
    with pytest.raises(BadInput) as info:
        await engine.update_schedule("big", {"max_runtime": value, "description": "not this either"})
    assert info.value.field == "max_runtime"
    [row] = (await engine.catalog.store.stored_schedules())[1]
    assert (row.max_runtime, row.description, row.version) == (1800.0, None, 1)
    await step(engine, clock, 60)  # it still runs, and so does every other verb
    assert [s.name for s in (await engine.list_schedules())] == ["big"]
    await engine.delete_schedule("big")


NOT_NULLABLE = ["cron", "timezone", "enabled", "on_overlap", "backfill", "max_runtime"]


@pytest.mark.parametrize("key", NOT_NULLABLE)
def test_null_is_refused_for_a_field_that_is_not_nullable(key: str) -> None:
    current = check_spec(spec(enabled=False, on_overlap="queue", backfill="all", max_runtime=60))
    with pytest.raises(BadInput) as info:
        check_changes(current, {key: None})
    assert (info.value.field, info.value.message) == (key, f"{key} may not be null (leave it out to keep its value)")
    if key not in ("cron", "timezone"):  # (those two are required: "is required")
        with pytest.raises(BadInput) as info:
            check_spec({**spec(), key: None})
        assert (info.value.field, info.value.message) == (key, f"{key} may not be null (leave it out for its default)")


def test_null_still_clears_what_may_be_cleared() -> None:
    current = check_spec(spec(description="d", payload={"a": 1}, alert=False))
    changed = check_changes(current, {"description": None, "payload": None, "alert": None, "durable": None})
    assert (changed["description"], changed["payload"], changed["alert"], changed["queue"]) == (None, None, None, "mail")


async def test_enabled_null_neither_enables_a_disabled_schedule_nor_drops_its_note(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine([queue()])
    await engine.open()
    await engine.create_schedule(spec("reap", on_overlap="queue"))
    await engine.set_enabled("reap", False, note="incident 42")
    for changes in ({"enabled": None}, {"on_overlap": None}, {"backfill": None}, {"max_runtime": None}):
        with pytest.raises(BadInput) as info:
            await engine.update_schedule("reap", changes)
        assert info.value.field == next(iter(changes))
    view = await engine.get_schedule("reap")
    assert view.state_note is not None
    assert (view.enabled, view.state_note.note, view.on_overlap) == (False, "incident 42", "queue")
    with pytest.raises(BadInput) as info:
        await engine.create_schedule(spec("other", enabled=None))
    assert info.value.field == "enabled"
    assert [row.name for row in (await engine.catalog.store.stored_schedules())[1]] == ["reap"]


# -- rows written before the bounds ----------------------------------------------------------------
async def test_a_row_stored_before_the_bounds_neither_stops_an_engine_nor_sticks(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    operator = make_engine([queue()], instance="cli")
    await operator.open()
    good = (await operator.create_schedule(spec("good"))).name
    [row] = (await operator.catalog.store.stored_schedules())[1]
    for name, changes in (("big", {"max_runtime": 1e15}), ("late", {"alert": {"late": 99999999999999999}})):
        bad = replace(row, name=name, **changes)  # as an earlier version let it through
        assert await operator.catalog.store.create_stored_schedule(bad)
    engine = make_engine([queue()])
    await engine.start()  # used to die: OverflowError in the launcher
    await engine.quiesce()
    assert sorted(engine.schedules) == [good]
    # Not run, and not hidden either: listed with why (it vanished from every list before).
    assert "max_runtime 1000000000000000.0" in ((await engine.get_schedule("big")).problem or "")
    assert {s.name: s.problem is not None for s in await engine.list_schedules()} == {good: False, "big": True, "late": True}
    view = await engine.update_schedule("big", {"max_runtime": 600})  # corrected: it runs
    assert view.max_runtime_s == 600 and "big" in engine.schedules
    await engine.delete_schedule("late")  # or deleted
    assert sorted(r.name for r in (await engine.catalog.store.stored_schedules())[1]) == ["big", good]
    await step(engine, clock, 60)
    assert {s.name for s in await engine.list_schedules()} == {"big", good}


def test_a_stored_row_past_the_bounds_is_refused_when_read() -> None:
    now = datetime(2026, 3, 2, tzinfo=UTC)
    row = StoredSchedule(**check_spec(spec()), created_at=now, created_by="a", updated_at=now, updated_by="a")
    with pytest.raises(BadInput) as info:
        replace(row, max_runtime=1e15).to_schedule()
    assert info.value.field == "max_runtime"


# -- the alert evaluation ------------------------------------------------------------------------
async def fails(ctx: RunContext) -> None:
    raise RuntimeError("no")


async def test_the_alert_evaluation_survives_a_round_that_fails(
    make_engine: Callable[..., Engine],
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = Receiver()
    broken = {"rounds": 3}
    evaluate = Evaluator.evaluate

    async def flaky(self: Evaluator, *args: Any, **kwargs: Any) -> Any:
        if broken["rounds"] > 0:
            broken["rounds"] -= 1
            raise OverflowError("date value out of range")  # what a rule past the calendar raised
        return await evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "evaluate", flaky)
    engine = make_engine(
        [define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=fails)],
        alerting=AlertSettings(sinks=(HOOK,), poll=1.0),
        alert_transport=httpx.MockTransport(receiver),
    )
    caplog.set_level(logging.INFO, logger="schedtui.alerts")
    await engine.start()
    for _ in range(8):
        await asyncio.wait_for(step(engine, clock, 30), 10)
    assert broken["rounds"] == 0
    assert receiver.delivered() == [("failing:export", "firing")]
    failed = [r for r in caplog.records if "evaluation round failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None  # the traceback, once
    assert any("evaluation works again" in r.getMessage() for r in caplog.records)


# -- a create racing a delete ----------------------------------------------------------------------
async def test_creates_and_deletes_of_one_name_at_once_answer_or_refuse(make_engine: Callable[..., Engine]) -> None:
    """Every order of 3 creates and 3 deletes started together: each answers, or is
    refused (``NameTaken``, ``NotFound``); none crashes (it was a KeyError: the create's
    read of its own schedule came after a delete's)."""
    engine = make_engine([queue()])
    await engine.start()
    await engine.quiesce()
    crashed: list[BaseException] = []

    async def create() -> None:
        try:
            await engine.create_schedule(spec("race"))
        except (NameTaken, NotFound):
            pass
        except Exception as exc:
            crashed.append(exc)

    async def delete() -> None:
        try:
            await engine.delete_schedule("race")
        except NotFound:
            pass
        except Exception as exc:
            crashed.append(exc)

    async def listing() -> None:
        try:
            await engine.list_schedules()
        except Exception as exc:
            crashed.append(exc)

    orders = sorted(set(itertools.permutations("cccddd")))
    for order in orders * 3:
        await asyncio.gather(*(create() if op == "c" else delete() for op in order), listing())
    assert crashed == [], crashed[:3]


@pytest.mark.parametrize("value", [10**400, 1e15, float("nan"), float("inf"), -1])
def test_a_durable_functions_step_timeout_and_retry_waits_are_bounded(value: float) -> None:
    """A huge int reached math.isfinite (OverflowError, a traceback at import); 1e15 was
    taken, and every step's deadline then overflowed."""
    from backend.durable.definition import Retry, define_durable

    async def handler(ctx: Any, input: Any) -> None:
        pass

    refused = r"step_timeout .* must be a number of seconds or a timedelta, more than 0 and at most 31,622,400 \(366 days\)"
    with pytest.raises(DefinitionError, match=refused):
        define_durable(name="bounded", handler=handler, step_timeout=value)
    with pytest.raises(DefinitionError, match="max_delay .* must be a number of seconds or a timedelta, 0 or more and at most 31,622,400"):
        Retry(max_delay=value)
