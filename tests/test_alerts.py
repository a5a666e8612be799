"""Alerts on the injected clock: the ``alert=`` option, each condition, the store's part
(both kinds), an engine evaluating and delivering to a webhook (a mock transport), the
read action over the API, the remote client and the CLI, the console's header, the
serve options and the Prometheus rule export."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from backend import DefinitionError, Engine, ManualClock, RunContext, define_durable, define_queue, define_schedule
from backend.alerts import conditions
from backend.alerts.evaluator import Evaluator
from backend.alerts.model import Alert, AlertsPage, AlertState, Condition, ordered
from backend.alerts.notifier import (
    CLAIM_BATCH,
    RETRY_AFTER_MAX,
    AlertSettings,
    Notifier,
    parse_sinks,
    retry_after,
    sink_of,
)
from backend.alerts.policy import DurableAlerting, QueueAlerting, ScheduleAlerting
from backend.alerts.rules import period, prometheus_rules, render_rules
from backend.alerts.store import AlertStore, DeadJobs, SlotRun, StuckCandidate, Success, Transition
from backend.api.app import create_app
from backend.client.embedded import EmbeddedBackend
from backend.client.remote import RemoteBackend
from backend.cron import Cron
from backend.errors import BadInput, Unavailable
from backend.events.audit import AuditLog
from backend.events.bus import EventBus
from backend.ids import IdFactory
from backend.jobs import JobContext
from backend.model import InstanceInfo, Role, Run, ScheduleState
from backend.observability.metrics import EngineMetrics
from backend.runtime.loops import Loops
from backend.store import Store, open_store
from console.cli.main import main
from console.cli.output import UsageError
from console.cli.parsing import notify_file_urls
from tests import pg
from tests.test_metrics import parse

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
HOOK = "https://hooks.example.test/services/T000/B000/secret-part"
TOKEN = "alerts-test-token"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


async def noop(ctx: RunContext | JobContext) -> None:  # a schedule's handler and a queue's
    pass


# ---------------------------------------------------------------------------------------
# the alert= option
# ---------------------------------------------------------------------------------------
def test_alert_option_defaults_overrides_and_off() -> None:
    plain = define_schedule(name="a", cron="* * * * *", timezone="UTC", handler=noop)
    assert plain.alert == ScheduleAlerting(failing=1, late=True, grace=None, disabled_after=86400.0)
    tuned = define_schedule(name="b", cron="* * * * *", timezone="UTC", handler=noop,
                            alert={"failing": 3, "late": timedelta(minutes=10), "disabled": False})  # fmt: skip
    assert tuned.alert == ScheduleAlerting(failing=3, late=True, grace=600.0, disabled_after=None)
    off = define_schedule(name="c", cron="* * * * *", timezone="UTC", handler=noop, alert=False)
    assert not off.alert.failing and not off.alert.late
    assert define_queue(name="q", handler=noop, alert={"dead_jobs": 5, "window": 60}).alert == QueueAlerting(5, 60.0)
    assert define_queue(name="q", handler=noop, alert=False).alert.dead_jobs == 0

    async def flow(ctx: Any, input: Any) -> None:
        pass

    assert define_durable(name="f", handler=flow, alert={"stuck": 90}).alert == DurableAlerting(True, 90.0)
    assert define_durable(name="f", handler=flow, alert={"stuck": 1}).alert.after == 1.0  # 1 is seconds, not True
    assert not define_durable(name="f", handler=flow, alert=False).alert.stuck
    assert plain.alert.resolve_after == 300.0
    for prompt in (0, 0.0, timedelta(0), False):
        quick = define_schedule(name="d", cron="* * * * *", timezone="UTC", handler=noop, alert={"resolve_after": prompt})
        assert quick.alert.resolve_after == 0.0, prompt
    slow = define_schedule(name="e", cron="* * * * *", timezone="UTC", handler=noop,
                           alert={"resolve_after": timedelta(hours=1)})  # fmt: skip
    assert slow.alert.resolve_after == 3600.0 and slow.alert.to_json() == {
        "failing": 1, "late": True, "disabled": 86400.0, "resolve_after": 3600.0,
    }  # (a stored schedule's alert key, read back the same)


@pytest.mark.parametrize(
    ("alert", "message"),
    [
        ({"failing": 0}, "alert failing 0 must be a whole number from 1 to 100"),
        ({"resolve_after": -1}, "alert resolve_after -1 must be a number of seconds or a timedelta, more than 0"),
        ({"resolve_after": True}, "alert resolve_after True must be a number of seconds or a timedelta, more than 0"),
        ({"resolve_after": "5m"}, "alert resolve_after '5m' must be a number of seconds or a timedelta, more than 0"),
        ({"late": -5}, "alert late -5 must be a number of seconds or a timedelta, more than 0"),
        ({"lateness": 5}, "alert has no option 'lateness' (known: failing, late, disabled, resolve_after)"),
        ("loud", "alert 'loud' must be False, True or a mapping"),
    ],
)
def test_a_bad_alert_option_is_refused_naming_the_schedule_and_the_value(alert: Any, message: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        define_schedule(name="nightly", cron="0 3 * * *", timezone="UTC", handler=noop, alert=alert)
    assert caught.value.message.startswith("define_schedule('nightly'): ")
    assert message in caught.value.message


def test_a_bad_queue_or_durable_alert_option_is_refused() -> None:
    with pytest.raises(DefinitionError, match=r"define_queue\('mail'\): alert dead_jobs 'many'"):
        define_queue(name="mail", handler=noop, alert={"dead_jobs": "many"})

    async def flow(ctx: Any, input: Any) -> None:
        pass

    refused = r"define_durable\('f'\): alert stuck 0 must be a number of seconds or a timedelta, more than 0"
    with pytest.raises(DefinitionError, match=refused):
        define_durable(name="f", handler=flow, alert={"stuck": 0})


# ---------------------------------------------------------------------------------------
# the conditions, as pure functions
# ---------------------------------------------------------------------------------------
def run(status: str, slot: str, tag: str | None = None, message: str | None = None) -> SlotRun:
    return SlotRun(status, at(slot), at(slot) + timedelta(seconds=1), tag, message)


def test_failing_needs_the_newest_n_slot_runs_all_failed() -> None:
    once = ScheduleAlerting()
    failed = run("failed", "2026-03-02T08:00:00Z", "ValueError", "boom")
    found = conditions.failing("job", once, [failed, run("succeeded", "2026-03-02T07:59:00Z")])
    assert found is not None and found.key == "failing:job"
    assert found.summary == "the newest run failed (slot 2026-03-02T08:00:00Z): [ValueError] boom"
    assert conditions.failing("job", once, [run("succeeded", "2026-03-02T08:00:00Z"), failed]) is None
    thrice = ScheduleAlerting(failing=3)
    two = [failed, run("failed", "2026-03-02T07:59:00Z")]
    assert conditions.failing("job", thrice, two) is None  # not enough runs yet
    assert conditions.failing("job", thrice, [*two, run("succeeded", "2026-03-02T07:58:00Z")]) is None
    found = conditions.failing("job", thrice, [*two, run("failed", "2026-03-02T07:58:00Z")])
    assert found is not None and found.summary.startswith("the 3 newest runs failed")
    assert conditions.failing("job", ScheduleAlerting(failing=0), [failed]) is None


def test_a_firing_failing_alert_holds_until_no_run_failed_for_resolve_after() -> None:
    """Pure: what fired holds while the newest run fails (even short of N in a row) and
    until the runs since the last failure have gone on for resolve_after; not firing, or
    with resolve_after 0, the condition alone decides."""
    twice = ScheduleAlerting(failing=2)  # resolve_after: 300 s
    newest_first = [run("succeeded", "2026-03-02T08:03:00Z"), run("succeeded", "2026-03-02T08:02:00Z"),
                    run("failed", "2026-03-02T08:01:00Z", "ValueError", "boom"), run("failed", "2026-03-02T08:00:00Z")]  # fmt: skip

    def judge(runs: list[SlotRun], now: str, policy: ScheduleAlerting = twice, firing: bool = True) -> str | None:
        found = conditions.failing("job", policy, runs, firing=firing, now=at(now))
        return None if found is None else found.summary

    # The first run that did not fail finished at 08:02:01: resolved at 08:07:01.
    holding = ("resolves at 2026-03-02T08:07:01Z if no slot run fails before; none has since slot "
               "2026-03-02T08:01:00Z ([ValueError] boom)")  # fmt: skip
    assert judge(newest_first, "2026-03-02T08:03:30Z") == holding
    assert judge(newest_first, "2026-03-02T08:07:00Z") == holding
    assert judge(newest_first, "2026-03-02T08:07:01Z") is None
    assert judge(newest_first, "2026-03-02T08:03:30Z", firing=False) is None  # (it never fired: nothing holds)
    assert judge(newest_first, "2026-03-02T08:03:30Z", ScheduleAlerting(failing=2, resolve_after=0)) is None
    # A failure again, short of two in a row: what fired holds on (it resolved at once before).
    again = [run("failed", "2026-03-02T08:04:00Z", "ValueError", "again"), *newest_first]
    assert judge(again, "2026-03-02T08:04:30Z") == "the newest run failed (slot 2026-03-02T08:04:00Z): [ValueError] again"
    assert judge(again, "2026-03-02T08:04:30Z", firing=False) is None
    # Nothing failed among the runs read (a long stretch of them): recovered.
    assert judge([run("succeeded", f"2026-03-02T08:{m:02d}:00Z") for m in range(59, 49, -1)], "2026-03-02T09:00:00Z") is None


HOURLY = Cron("0 * * * *", "UTC")


def late(now: str, *, success: str | None = None, enabled: bool = True, state: ScheduleState | None = None,
         baseline: str = "2026-03-01T00:00:00Z", policy: ScheduleAlerting | None = None,
         max_runtime: float = 1800) -> conditions.Finding | None:  # fmt: skip
    found = None if success is None else Success(at(success), at(success) + timedelta(seconds=30))
    return conditions.late(
        "hourly", HOURLY, max_runtime, policy or ScheduleAlerting(), at(now),
        enabled=enabled, state=state, baseline=at(baseline), success=found,
    )  # fmt: skip


def test_late_is_a_dead_mans_switch_with_a_grace_after_each_slot() -> None:
    # The default grace: the run's bound (30 min, under the hour between slots) and 5 min.
    assert conditions.late_grace(HOURLY, 1800, ScheduleAlerting(), at("2026-03-02T08:00:00Z")) == timedelta(minutes=35)
    assert late("2026-03-02T08:34:59Z", success="2026-03-02T07:00:00Z") is None  # 08:00's grace runs on
    found = late("2026-03-02T08:35:00Z", success="2026-03-02T07:00:00Z")
    assert found is not None and found.summary == (
        "no successful run since the slot of 2026-03-02T08:00:00Z (grace 35m); last success: slot 2026-03-02T07:00:00Z"
    )
    assert late("2026-03-02T08:35:00Z", success="2026-03-02T08:00:00Z") is None
    never = late("2026-03-02T08:35:00Z")
    assert never is not None and never.summary.endswith("no slot run has succeeded yet")
    # Slots before the fleet first saw the schedule (or before its last enable) do not count.
    assert late("2026-03-02T08:35:00Z", baseline="2026-03-02T08:10:00Z") is None
    enabled_late = ScheduleState("hourly", True, "ops", at("2026-03-02T08:10:00Z"))
    assert late("2026-03-02T08:35:00Z", state=enabled_late) is None
    assert late("2026-03-02T09:35:00Z", state=enabled_late) is not None
    # A grace given by the definition; a minute schedule's default is a minute and 5.
    assert late("2026-03-02T08:10:00Z", success="2026-03-02T07:00:00Z", policy=ScheduleAlerting(grace=600)) is not None
    assert conditions.late_grace(Cron("* * * * *", "UTC"), 1800, ScheduleAlerting(), T0) == timedelta(minutes=6)
    assert late("2026-03-02T10:00:00Z", policy=ScheduleAlerting(late=False)) is None


def test_a_schedule_disabled_at_run_time_is_late_only_once_it_stayed_disabled_a_day() -> None:
    state = ScheduleState("hourly", False, "alice", at("2026-03-02T08:00:00Z"), "incident 42")
    assert late("2026-03-02T20:00:00Z", enabled=False, state=state) is None
    found = late("2026-03-03T08:00:00Z", enabled=False, state=state)
    assert found is not None and found.summary == (
        'disabled by alice since 2026-03-02T08:00:00Z ("incident 42"): no slot runs (late after 1d disabled)'
    )
    assert late("2026-03-09T08:00:00Z", enabled=False, state=state, policy=ScheduleAlerting(disabled_after=None)) is None
    # Defined enabled=False and never enabled: it is not meant to run.
    assert late("2026-03-09T08:00:00Z", enabled=False, state=None) is None


def instance(name: str, beat: str, role: Role = "firing") -> InstanceInfo:
    return InstanceInfo(name, "host", 1, at(beat), role=role)


def test_instance_lost_names_each_silent_member_but_the_judge_and_observers() -> None:
    now, fresh = datetime(2026, 3, 2, 8, 1, tzinfo=UTC), timedelta(seconds=30)
    fleet = [
        instance("live", "2026-03-02T08:00:45Z"),
        instance("killed", "2026-03-02T08:00:20Z"),
        instance("waiting", "2026-03-02T07:50:00Z", "waiting"),
        instance("console", "2026-03-02T07:00:00Z", "observer"),
        instance("me", "2026-03-02T07:00:00Z"),  # (its own row: it is judging, so alive)
    ]
    found = conditions.instance_lost(fleet, now, fresh, "me")
    assert [(f.key, f.summary.split(" has ")[0]) for f in found] == [
        ("instance_lost:killed", "instance killed (host host, pid 1)"), ("instance_lost:waiting", "instance waiting (host host, pid 1)"),
    ]
    assert "2026-03-02T08:00:20Z" in found[0].summary and "did not stop cleanly" in found[0].summary
    # The host's name, without the boot and PID namespace the row's host also carries.
    shared = InstanceInfo("other", "web-1#boot-id#4026531836", 7, now - timedelta(minutes=1), role="firing")
    assert "(host web-1, pid 7)" in conditions.instance_lost([shared], now, fresh, "me")[0].summary
    # Its heartbeat read by the database server's clock: a member 40 s behind that beats is not lost.
    behind = InstanceInfo("behind", "h", 1, now - timedelta(seconds=45), role="firing", clock_offset_s=-40.0)
    assert conditions.instance_lost([behind], now, fresh, "me") == []


def test_not_firing_when_no_firing_member_has_a_fresh_heartbeat() -> None:
    fresh = timedelta(seconds=30)
    now = at("2026-03-02T08:01:00Z")
    assert conditions.not_firing([instance("a", "2026-03-02T08:00:45Z")], now, fresh) is None
    stale = conditions.not_firing(
        [instance("a", "2026-03-02T08:00:10Z"), instance("b", "2026-03-02T08:00:59Z", "waiting")], now, fresh
    )
    assert stale is not None and stale.key == "not_firing:fleet"
    assert stale.summary == "no firing instance has a heartbeat within 30s; the newest is a's, at 2026-03-02T08:00:10Z"
    only_waiting = conditions.not_firing([instance("b", "2026-03-02T08:00:59Z", "observer")], now, fresh)
    assert only_waiting is not None and "none registered as firing" in only_waiting.summary
    # A member alive but standing down because its clock is off fires nothing: the page says why.
    skewed = InstanceInfo("web-3", "host", 1, at("2026-03-02T08:00:59Z"), role="firing", clock_offset_s=-61.2, clock_off=True)
    standing = conditions.not_firing([skewed, instance("b", "2026-03-02T08:00:59Z", "observer")], now, fresh)
    assert standing is not None and standing.summary.startswith(
        "no instance fires: web-3 stands down, its clock is 61.2s behind the database server's"
    )
    assert conditions.not_firing([skewed, instance("a", "2026-03-02T08:00:45Z")], now, fresh) is None  # another fires
    # Every live instance off by the same: the database server's clock is the odd one out (it
    # halted the fleet, and each instance was told to fix its own time sync).
    alike = [InstanceInfo(name, "host", 1, at("2026-03-02T08:00:29Z"), role="firing", clock_offset_s=offset, clock_off=True)
             for name, offset in (("web-1", -30.2), ("web-2", -29.8))]  # fmt: skip
    halted = conditions.not_firing(alike, now, fresh)
    assert halted is not None and halted.summary == (
        "no instance fires: all 2 live instances stand down, their clocks 30s behind the database server's alike: "
        "its clock is likely the one that is off (check its time sync)"
    )


def test_dead_jobs_and_stuck_hold_past_their_thresholds() -> None:
    assert conditions.dead_jobs("mail", QueueAlerting(), DeadJobs(0, 4, at("2026-03-01T00:00:00Z"))) is None
    found = conditions.dead_jobs("mail", QueueAlerting(), DeadJobs(2, 5, at("2026-03-02T07:59:00Z")))
    assert found is not None and found.summary == (
        "2 jobs died within 1h, the newest at 2026-03-02T07:59:00Z; 5 dead in all"
    )
    assert conditions.dead_jobs("mail", QueueAlerting(dead_jobs=3), DeadJobs(2, 5, None)) is None
    now = at("2026-03-02T09:00:00Z")
    after = conditions.stuck_after(DurableAlerting(), 900)
    assert after == 1800
    waiting = StuckCandidate("01JD3Z6Q0V9W4C7PAXH3KJ1M2B", "flow", "waiting", at("2026-03-02T08:29:00Z"))
    found = conditions.stuck(waiting, after, now)
    assert found is not None and found.subject == waiting.id
    assert found.summary == "execution of flow waiting past its wake time 2026-03-02T08:29:00Z (stuck after 30m)"
    assert conditions.stuck(waiting, after, at("2026-03-02T08:58:00Z")) is None
    assert conditions.stuck(waiting, None, now) is None


def test_a_page_lists_firing_alerts_first_newest_first() -> None:
    def alert(key: str, state: AlertState, since: str) -> Alert:
        return Alert(key, "failing", "schedule", key, state, at(since), "", at(since))

    page = ordered([alert("a", "resolved", "2026-03-02T09:00:00Z"), alert("b", "firing", "2026-03-02T07:00:00Z"),
                    alert("c", "firing", "2026-03-02T08:00:00Z")])  # fmt: skip
    assert [a.key for a in page.alerts] == ["c", "b", "a"] and page.firing == 2
    assert AlertsPage.from_json(json.loads(json.dumps(page.to_json()))) == page


# ---------------------------------------------------------------------------------------
# the store's part, both kinds
# ---------------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        url = pg.database_for(tmp_path)
    else:
        url = f"sqlite:///{tmp_path / 'state.db'}"
    s = open_store(url)
    await s.open()
    yield s
    await s.close()


def transition(key: str, state: AlertState, when: datetime, tid: str) -> Transition:
    condition, subject = key.split(":")
    alert = Alert(key, cast(Condition, condition), "schedule", subject, state, when, f"{state} at {when:%H:%M}", when, tid)
    return Transition(alert, json.dumps({"transition": tid, "state": state}))


async def test_a_transition_is_written_once_with_an_outbox_row_per_known_sink(store: Store) -> None:
    alerts: Any = store
    assert isinstance(store, AlertStore)
    ids = IdFactory(lambda: T0)
    await alerts.register_sinks([("sink-a", "https://a/…"), ("sink-b", "https://b/…")], T0)
    await alerts.register_sinks([("sink-old", "https://old/…")], T0 - timedelta(days=2))
    first, second = ids(), ids()
    # Two instances propose the same transition at once: one wins, and only its rows exist.
    won = await alerts.write_transitions([transition("failing:job", "firing", T0, first)], sinks_after=T0 - timedelta(days=1))
    lost = await alerts.write_transitions([transition("failing:job", "firing", T0, second)], sinks_after=T0 - timedelta(days=1))
    assert won == ["failing:job"] and lost == []
    (stored,) = await alerts.list_alerts()
    assert (stored.state, stored.transition, stored.since) == ("firing", first, T0)
    # Ten more that all believed it resolved, each with newer facts, racing: none wins.
    racing = [
        alerts.write_transitions([transition("failing:job", "firing", T0 + timedelta(seconds=i), ids())], sinks_after=T0)
        for i in range(1, 11)
    ]
    assert await asyncio.gather(*racing) == [[]] * 10
    claimed = await alerts.claim_deliveries(["sink-a", "sink-b", "sink-old"], "i1", T0, T0 + timedelta(minutes=1), 10)
    assert sorted((d.transition, d.sink) for d in claimed) == [(first, "sink-a"), (first, "sink-b")]
    # A round that read its facts before the last change does not undo it.
    stale = await alerts.write_transitions([transition("failing:job", "resolved", T0, ids())], sinks_after=T0)
    assert stale == []
    later = T0 + timedelta(seconds=15)
    assert await alerts.write_transitions([transition("failing:job", "resolved", later, ids())], sinks_after=T0) == ["failing:job"]
    assert await alerts.list_alerts() == []
    (resolved,) = await alerts.list_alerts(resolved_after=T0)
    assert resolved.state == "resolved" and resolved.since == later
    # Summaries change without a transition, only under the same transition.
    again = T0 + timedelta(seconds=30)
    await alerts.write_transitions([transition("failing:job", "firing", again, third := ids())], sinks_after=T0)
    (firing,) = await alerts.list_alerts()
    newer = Alert(firing.key, firing.condition, firing.subject_kind, firing.subject, "firing", firing.since,
                  "3 runs failed", again + timedelta(seconds=1), third)  # fmt: skip
    assert await alerts.update_summaries([newer]) == 1
    assert (await alerts.list_alerts())[0].summary == "3 runs failed"


async def test_a_claim_is_exclusive_until_its_lease_runs_out(store: Store) -> None:
    alerts: Any = store
    await alerts.register_sinks([("sink-a", "https://a/…")], T0)
    tid = IdFactory(lambda: T0)()
    await alerts.write_transitions([transition("late:job", "firing", T0, tid)], sinks_after=T0)
    lease = timedelta(seconds=60)
    (mine,) = await alerts.claim_deliveries(["sink-a"], "i1", T0, T0 + lease, 10)
    assert (mine.attempts, mine.payload) == (1, json.dumps({"transition": tid, "state": "firing"}))
    assert await alerts.claim_deliveries(["sink-a"], "i2", T0 + timedelta(seconds=59), T0 + 2 * lease, 10) == []
    # i1 died: after the lease another instance takes it, with a greater claim number.
    (theirs,) = await alerts.claim_deliveries(["sink-a"], "i2", T0 + lease, T0 + 2 * lease, 10)
    assert theirs.token > mine.token and theirs.attempts == 2
    assert not await alerts.finish_delivery(mine, T0 + lease, retry_at=None, error=None)  # i1's record is refused
    retry = T0 + lease + timedelta(seconds=5)
    assert await alerts.finish_delivery(theirs, T0 + lease, retry_at=retry, error="HTTP 500")
    assert await alerts.claim_deliveries(["sink-a"], "i2", retry - timedelta(seconds=1), retry + lease, 10) == []
    (third,) = await alerts.claim_deliveries(["sink-a"], "i3", retry, retry + lease, 10)
    assert await alerts.finish_delivery(third, retry, retry_at=None, error=None)
    assert await alerts.claim_deliveries(["sink-a"], "i3", retry + 2 * lease, retry + 3 * lease, 10) == []


async def test_a_claim_given_back_is_due_at_once_and_its_attempt_not_counted(store: Store) -> None:
    alerts: Any = store
    await alerts.register_sinks([("sink-a", "https://a/…")], T0)
    await alerts.write_transitions([transition("late:job", "firing", T0, IdFactory(lambda: T0)())], sinks_after=T0)
    lease = timedelta(seconds=60)
    (mine,) = await alerts.claim_deliveries(["sink-a"], "i1", T0, T0 + lease, 10)
    assert await alerts.give_back_deliveries([mine]) == 1
    assert await alerts.give_back_deliveries([mine]) == 0  # (once: its attempt is not taken back twice)
    (theirs,) = await alerts.claim_deliveries(["sink-a"], "i2", T0, T0 + lease, 10)
    assert (theirs.attempts, theirs.token > mine.token) == (1, True)
    assert await alerts.give_back_deliveries([mine]) == 0  # another claim's row: left alone
    assert not await alerts.finish_delivery(mine, T0, retry_at=None, error=None)
    assert await alerts.finish_delivery(theirs, T0, retry_at=None, error=None)
    assert await alerts.give_back_deliveries([theirs]) == 0  # done


async def test_the_last_failure_is_found_however_many_runs_came_after_it(store: Store) -> None:
    """The newest failed slot run and the first slot run after it (Run now runs and those
    still running left out), whatever the number of runs since."""
    ids = IdFactory(lambda: T0)

    def slot(name: str, second: int, status: str, trigger: str = "self") -> Run:
        at = T0 + timedelta(seconds=second)
        return Run(ids(), name, at, cast(Any, status), cast(Any, trigger), "single", "i", at, at + timedelta(seconds=0.5),
                   "ValueError" if status == "failed" else None, "boom" if status == "failed" else None)  # fmt: skip

    runs = [slot("poll", 0, "failed"), slot("poll", 1, "failed"), slot("poll", 2, "succeeded", "manual"),
            slot("poll", 3, "running"), slot("poll", 5, "failed", "manual")]  # fmt: skip
    runs += [slot("poll", second, "succeeded") for second in range(4, 404)]
    runs += [slot("fine", second, "succeeded") for second in range(10)]
    store.save_runs(runs)
    await store.flush()
    found = await cast(AlertStore, store).last_failures(["poll", "fine", "unknown"])
    assert set(found) == {"poll"}
    failed, first_ok = found["poll"]
    assert (failed.status, failed.scheduled_at, failed.error_tag) == ("failed", T0 + timedelta(seconds=1), "ValueError")
    assert (first_ok.status, first_ok.scheduled_at) == ("succeeded", T0 + timedelta(seconds=4))


async def test_retention_drops_old_resolved_alerts_and_finished_deliveries(store: Store) -> None:
    alerts: Any = store
    ids = IdFactory(lambda: T0)
    await alerts.register_sinks([("known", "https://k/…"), ("orphan", "https://o/…")], T0)
    old, kept = ids(), ids()
    await alerts.write_transitions([transition("failing:old", "firing", T0, old)], sinks_after=T0)
    await alerts.write_transitions([transition("failing:old", "resolved", T0 + timedelta(seconds=1), ids())], sinks_after=T0)
    await alerts.write_transitions([transition("late:kept", "firing", T0, kept)], sinks_after=T0)
    for delivery in await alerts.claim_deliveries(["known"], "i1", T0, T0 + timedelta(minutes=1), 10):
        assert await alerts.finish_delivery(delivery, T0, retry_at=None, error=None)
    # Eight days on: the resolved alert and the delivered rows go; rows for a sink no
    # instance delivers to are given up first; the firing alert stays.
    later = T0 + timedelta(days=8)
    assert await alerts.prune_alerts(later - timedelta(days=7)) > 0
    assert [a.key for a in await alerts.list_alerts(resolved_after=T0 - timedelta(days=1))] == ["late:kept"]
    assert await alerts.claim_deliveries(["known", "orphan"], "i1", later, later + timedelta(minutes=1), 10) == []


# ---------------------------------------------------------------------------------------
# a receiver's Retry-After (a real local HTTP server, both stores, two instances)
# ---------------------------------------------------------------------------------------
class Limited:
    """A real HTTP receiver on 127.0.0.1: its first POST answered ``status`` with
    ``Retry-After: retry_after``, the next ones 202; it records when (on the test's clock)
    each came."""

    def __init__(self, clock: ManualClock, status: int, retry_after: str) -> None:
        self.clock, self.status, self.retry_after = clock, status, retry_after
        self.posts: list[datetime] = []
        limited = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                self.rfile.read(int(self.headers["content-length"]))
                limited.posts.append(limited.clock.now())
                self.send_response(limited.status if len(limited.posts) == 1 else 202)
                if len(limited.posts) == 1:
                    self.send_header("retry-after", limited.retry_after)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/limited"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), name="limited receiver", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "asked", "waited"),
    [
        (429, "120", 120.0),  # seconds
        (503, "120", 120.0),
        (429, "date:+120", 120.0),  # an HTTP date, 120 s after the answer
        (429, "99999999", RETRY_AFTER_MAX.total_seconds()),  # capped
        pytest.param(429, "9" * 400, RETRY_AFTER_MAX.total_seconds(), id="429-400 digits"),
        (429, "2", 5.0),  # shorter than the backoff: the backoff
        (429, "-30", 5.0),  # nonsense: the backoff
        (429, "in a minute", 5.0),
        (429, "date:-600", 5.0),  # a past date
        (500, "120", 5.0),  # (only a 429's or a 503's is honoured)
    ],
)
async def test_a_receivers_retry_after_holds_every_instance_back_until_then(
    store: Store, status: int, asked: str, waited: float
) -> None:
    """A receiver answering 429 (PagerDuty's rate limit) or 503 with ``Retry-After`` was
    sent the POST again after the fixed backoff (5 s), before the time it asked for. The
    wait it asks for (at most an hour; nonsense ignored) is now the outbox row's due time,
    never sooner than the backoff: neither this instance nor another claims it earlier,
    and it is sent once it is due."""
    clock = ManualClock(T0)
    if asked.startswith("date:"):
        asked = format_datetime(T0 + timedelta(seconds=int(asked[5:])), usegmt=True)
    receiver = Limited(clock, status, asked)
    ids = IdFactory(clock.now)
    settings = AlertSettings(sinks=(receiver.url,), backoff=5.0, attempts=5)
    notifiers = [
        Notifier(store=cast(AlertStore, store), clock=clock, loops=Loops(clock), instance=name,
                 sinks=parse_sinks([receiver.url]), settings=settings,
                 audit=AuditLog(store=store, clock=clock, new_id=ids, events=EventBus(), actor=name))
        for name in ("a", "b")
    ]  # fmt: skip
    try:
        for notifier in notifiers:
            await notifier.register(clock.now())
        await cast(AlertStore, store).write_transitions([transition("failing:s", "firing", T0, ids())],
                                                        sinks_after=T0 - timedelta(days=1))  # fmt: skip
        assert await notifiers[0].deliver_due() == 1 and receiver.posts == [T0]
        due = T0 + timedelta(seconds=waited)
        for early in sorted({T0 + timedelta(seconds=5), due - timedelta(seconds=1), due - timedelta(milliseconds=1)}):
            if early < due:
                clock.set(early)
                assert [await n.deliver_due() for n in notifiers] == [0, 0], early
        assert receiver.posts == [T0]  # nobody POSTed it again before it was due
        clock.set(due)
        assert await notifiers[1].deliver_due() == 1  # another instance, once it is due
        assert receiver.posts == [T0, due]
        assert [n.outcomes[n.sinks[next(iter(n.sinks))].shown, "delivered"] for n in notifiers] == [0, 1]
    finally:
        for notifier in notifiers:
            await notifier.stop(0)
        receiver.close()


def test_retry_after_is_read_as_seconds_or_a_date_and_nonsense_is_none() -> None:
    now = T0
    assert retry_after("30", now) == timedelta(seconds=30) and retry_after(" 1.5 ", now) == timedelta(seconds=1.5)
    assert retry_after(format_datetime(now + timedelta(minutes=2), usegmt=True), now) == timedelta(minutes=2)
    assert retry_after("Mon, 02 Mar 2026 08:02:00 -0000", now) == timedelta(minutes=2)
    assert retry_after("Fri, 02 Mar 9999 08:00:00 GMT", now) == RETRY_AFTER_MAX
    assert retry_after("1" * 5000, now) == RETRY_AFTER_MAX
    for nonsense in (None, "", "0", "-5", "1e9", "nan", "inf", "soon", "Mon, 99 Mar 2026 08:02:00 GMT",
                     "Mon, 02 Mar 99999 08:02:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT", "\x00\ud800"):  # fmt: skip
        assert retry_after(nonsense, now) is None, nonsense


# ---------------------------------------------------------------------------------------
# an engine evaluating and delivering (a mock webhook)
# ---------------------------------------------------------------------------------------
class Receiver:
    """A webhook: records each request; ``answers`` are the statuses of the next ones."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.answers: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.answers.pop(0) if self.answers else 200)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]

    def delivered(self) -> list[tuple[str, str]]:
        return [(b["key"], b["state"]) for b in self.bodies]


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def alerting_engine(make_engine: Callable[..., Engine], receiver: Receiver) -> Callable[..., Engine]:
    def make(definitions: list[Any], **settings: Any) -> Engine:
        settings.setdefault("sinks", (HOOK,))
        settings.setdefault("poll", 1.0)
        return make_engine(definitions, alerting=AlertSettings(**settings), alert_transport=httpx.MockTransport(receiver))

    return make


async def test_a_webhook_whose_request_fails_unexpectedly_fails_only_its_own_deliveries(
    make_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    """What a request raises outside httpx's errors (a URL it refuses was one) ended the
    delivery loop: no webhook got another alert. It fails that sink's delivery (retried,
    given up), and the others get every transition."""
    other = "https://other.example.test/hook"
    failing = {"now": True}

    def answer(request: httpx.Request) -> httpx.Response:
        if str(request.url) == other:
            raise RuntimeError("a request that breaks in an unforeseen way")
        return receiver(request)

    async def handler(ctx: RunContext) -> None:
        if failing["now"]:
            raise ValueError("broken")

    engine = make_engine([define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=handler)],
                         alerting=AlertSettings(sinks=(HOOK, other), poll=1.0), alert_transport=httpx.MockTransport(answer))
    await engine.start()
    await step(engine, clock, 30, times=8)
    assert receiver.delivered() == [("failing:export", "firing")]
    failing["now"] = False
    await step(engine, clock, 60, times=8)  # no run has failed since: resolved after 5 minutes
    assert receiver.delivered() == [("failing:export", "firing"), ("failing:export", "resolved")]


async def test_a_webhook_that_hangs_holds_back_no_other_webhooks_pages(tmp_path: Path, clock: ManualClock) -> None:
    """One webhook takes the POSTs and never answers (its timeout is long): the other gets
    every page meanwhile. Before, both sinks' rows were claimed in one batch and the next
    batch waited for the whole of it: each batch took the hanging one's timeout, and the
    healthy webhook's pages came minutes late."""
    hung = "https://hung.example.test/hook"
    store: Any = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    delivered: list[str] = []
    every_one, hanging = asyncio.Event(), []
    transitions = 3 * CLAIM_BATCH

    async def answer(request: httpx.Request) -> httpx.Response:
        if str(request.url) == hung:
            hanging.append(request)
            await asyncio.Event().wait()  # (never answers: cancelled at the end)
        delivered.append(json.loads(request.content)["transition"])
        if len(delivered) == transitions:
            every_one.set()
        return httpx.Response(200)

    ids = IdFactory(clock.now)
    settings = AlertSettings(sinks=(HOOK, hung), timeout=300.0, lease=600.0)
    audit = AuditLog(store=store, clock=clock, new_id=ids, events=EventBus(), actor="test")
    notifier = Notifier(store=store, clock=clock, loops=Loops(clock), instance="a", sinks=parse_sinks([HOOK, hung]),
                        settings=settings, audit=audit, transport=httpx.MockTransport(answer))  # fmt: skip
    loops: list[asyncio.Task[None]] = []
    try:
        await notifier.register(clock.now())
        written = [transition(f"failing:s{n}", "firing", clock.now(), ids()) for n in range(transitions)]
        await store.write_transitions(written, sinks_after=clock.now() - timedelta(days=1))
        loops = [asyncio.ensure_future(notifier.run(sink_id)) for sink_id in notifier.sinks]
        await asyncio.wait_for(every_one.wait(), 60)  # (a bound: the hanging POSTs take 300 s)
        assert sorted(delivered) == sorted(t.alert.transition for t in written)
        assert len(hanging) == CLAIM_BATCH  # its first batch, still waiting
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await notifier.stop(0)
        await store.close()


async def notifications(engine: Engine, *, zeros: bool = False) -> dict[str, float]:
    """``schedtui_alert_notifications_total`` of the test's webhook, by outcome, as scraped
    (those at 0 too with ``zeros``)."""
    _, samples = parse((await EngineMetrics(engine).render()).decode())
    shown = "https://hooks.example.test/… #" + sink_of(HOOK).id[:6]
    return {dict(labels)["outcome"]: n for (name, labels), n in samples.items()
            if name == "schedtui_alert_notifications_total" and dict(labels)["webhook"] == shown and (n or zeros)}  # fmt: skip


async def test_every_webhooks_notification_outcomes_show_from_zero(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    """A webhook's outcome series appeared at its first outcome, at 1: Prometheus's
    increase() sees no increase in a series that first appears at 1, so the exported
    SchedtuiNotificationsGivenUp rule (increase of given_up over 30 minutes) never paged
    for a webhook's first give-up since its instance started. Each shows from 0, before
    any POST, so that its first give-up is an increase."""
    engine = alerting_engine([define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails,
                                              alert={"late": False})], backoff=10, attempts=2)  # fmt: skip
    await engine.start()
    assert await notifications(engine, zeros=True) == {"delivered": 0, "retried": 0, "given_up": 0, "unrecorded": 0}
    receiver.answers = [503] * 2
    await fail_at_nine(engine, clock)
    await step(engine, clock, 10)
    assert await notifications(engine, zeros=True) == {"delivered": 0, "retried": 1, "given_up": 1, "unrecorded": 0}
    (rule,) = [r for r in prometheus_rules([], [], [], T0)["groups"][0]["rules"] if r["alert"] == "SchedtuiNotificationsGivenUp"]
    assert 'schedtui_alert_notifications_total{outcome="given_up"}' in rule["expr"]


async def step(engine: Engine, clock: ManualClock, seconds: float, times: int = 1) -> None:
    for _ in range(times):
        clock.advance(seconds)
        await engine.quiesce()


async def test_a_failing_schedule_fires_once_and_resolves_once(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    failing = {"now": True}

    async def handler(ctx: RunContext) -> None:
        if failing["now"]:
            raise ValueError("the export is broken")

    engine = alerting_engine([define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=handler)])
    await engine.start()
    await step(engine, clock, 30, times=8)  # four failed runs
    assert receiver.delivered() == [("failing:export", "firing")]
    page = await engine.alerts.page()
    (alert,) = page.alerts
    assert page.firing == 1 and alert.summary.endswith("[ValueError] the export is broken")
    assert re.match(r"the newest run failed \(slot 2026-03-02T08:0[34]:00Z\)", alert.summary)  # kept up to date
    body = receiver.bodies[0]
    assert set(body) == {"alert", "state", "subject_kind", "subject", "summary", "since", "instance", "key",
                         "transition", "text"}  # fmt: skip
    assert (body["alert"], body["subject_kind"], body["subject"], body["instance"]) == ("failing", "schedule", "export", "test-0")
    assert body["since"] in ("2026-03-02T08:01:00Z", "2026-03-02T08:01:30Z") and body["transition"] == alert.transition
    assert body["text"].startswith("▲ FIRING failing: schedule export: the newest run failed")
    request = receiver.requests[0]
    assert request.headers["idempotency-key"] == alert.transition
    assert request.headers["content-type"] == "application/json" and str(request.url) == HOOK
    failing["now"] = False
    await step(engine, clock, 30, times=4)
    # No run has failed since; it resolves once none has for resolve_after (5 minutes).
    assert receiver.delivered() == [("failing:export", "firing")]
    (recovering,) = (await engine.alerts.page()).alerts
    assert re.fullmatch(
        r"resolves at 2026-03-02T08:10:00(\.\d+)?Z if no slot run fails before; none has since slot "
        r"2026-03-02T08:04:00Z \(\[ValueError\] the export is broken\)", recovering.summary,
    ), recovering.summary
    await step(engine, clock, 30, times=7)  # 08:09:30: not yet
    assert receiver.delivered() == [("failing:export", "firing")]
    await step(engine, clock, 30, times=2)
    assert receiver.delivered() == [("failing:export", "firing"), ("failing:export", "resolved")]
    assert receiver.bodies[1]["text"].startswith("✓ RESOLVED failing: schedule export: the newest run did not fail")
    assert (await engine.alerts.page()).alerts == ()
    (resolved,) = (await engine.alerts.page(resolved=True)).alerts
    assert resolved.state == "resolved" and resolved.transition == receiver.bodies[1]["transition"]
    audit = (await engine.audit.list()).entries
    assert [(e.action, e.target, e.actor) for e in audit] == [("alert.notified", "failing:export", "test-0")] * 2
    assert await notifications(engine) == {"delivered": 2}
    assert audit[0].detail is not None and audit[0].detail["sink"] == "https://hooks.example.test/… #" + sink_of(HOOK).id[:6]
    assert "secret" not in json.dumps([e.to_json() for e in audit])


async def test_a_schedule_failing_every_other_run_pages_once_and_resolves_once_it_stops(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    """Each failure fired, each success that followed resolved: a schedule failing every
    other minute paged 30 times an hour. It now fires once and holds while runs go on
    failing now and then, resolving once none has failed for its resolve_after; with
    resolve_after 0 each run that does not fail resolves it, as before."""
    flapping = {"on": True}

    async def every_other(ctx: RunContext) -> None:
        if flapping["on"] and ctx.scheduled_at.minute % 2 == 0:
            raise ConnectionError("the vendor API dropped the connection")

    engine = alerting_engine([
        define_schedule(name="sync", cron="* * * * *", timezone="UTC", handler=every_other, alert={"late": False}),
        define_schedule(name="eager", cron="* * * * *", timezone="UTC", handler=every_other,
                        alert={"late": False, "resolve_after": 0}),
    ])  # fmt: skip
    await engine.start()
    await step(engine, clock, 30, times=40)  # 20 minutes: 10 failures and 10 successes each
    sync = [state for key, state in receiver.delivered() if key == "failing:sync"]
    eager = [state for key, state in receiver.delivered() if key == "failing:eager"]
    assert sync == ["firing"], sync
    assert len(eager) >= 17 and eager == ["firing", "resolved"] * (len(eager) // 2) + ["firing"] * (len(eager) % 2), eager
    flapping["on"] = False  # it stops failing: from the next run on, every one succeeds
    await step(engine, clock, 30, times=9)  # 4.5 minutes: not yet
    assert [state for key, state in receiver.delivered() if key == "failing:sync"] == ["firing"]
    await step(engine, clock, 30, times=4)
    assert [state for key, state in receiver.delivered() if key == "failing:sync"] == ["firing", "resolved"]
    eager = [state for key, state in receiver.delivered() if key == "failing:eager"]
    assert eager[-1] == "resolved"
    await step(engine, clock, 30, times=10)
    assert len(receiver.delivered()) == len(eager) + 2, "nothing more once they stopped failing"


async def test_an_every_second_schedule_failing_every_four_minutes_stays_one_alert(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    """Failures 250 s apart are closer than resolve_after (300 s): one alert, firing
    throughout, that resolves 300 s after the runs stop failing. Only the 200 newest runs
    were read back: once 200 had not failed (200 s at a run a second) the alert resolved,
    and the next failure fired it again, two pages every four minutes."""
    failing = {"on": True}

    async def poll(ctx: RunContext) -> None:
        if failing["on"] and (ctx.scheduled_at - T0).total_seconds() % 250 < 3:
            raise ConnectionError("the upstream dropped the connection")

    engine = alerting_engine([define_schedule(name="poll", cron="* * * * * *", timezone="UTC", handler=poll,
                                              alert={"late": False})], interval=5.0)  # fmt: skip
    await engine.start()
    await step(engine, clock, 1, times=1200)  # 20 minutes: a failure every 250 s
    assert receiver.delivered() == [("failing:poll", "firing")]
    failing["on"] = False  # the last failures: at 08:16:40 to 08:16:42
    await step(engine, clock, 1, times=250)  # 08:24:10: 5 minutes and more since the first run that did not fail
    assert receiver.delivered() == [("failing:poll", "firing"), ("failing:poll", "resolved")]
    resolved = (await engine.alerts.page(resolved=True)).alerts[0]
    assert at("2026-03-02T08:21:43Z") <= resolved.since <= at("2026-03-02T08:21:50Z"), resolved.since


async def fails(ctx: RunContext) -> None:
    raise RuntimeError("no")


async def fail_at_nine(engine: Engine, clock: ManualClock) -> None:
    """The hourly schedule fails at 09:00, and the round at 09:00:05 sees it (rounds come
    every 15 s from the last, here 08:59:50)."""
    await engine.start()
    clock.set("2026-03-02T08:59:50Z")
    await engine.quiesce()
    clock.set("2026-03-02T09:00:00Z")
    await engine.quiesce()
    clock.set("2026-03-02T09:00:05Z")
    await engine.quiesce()


async def failing_until(engine: Engine, clock: ManualClock, reached: asyncio.Event) -> None:
    """Move the clock half a minute at a time (the schedule fails, its alert fires) until
    ``reached`` is set (the delivery got that far, and waits there)."""
    while not reached.is_set():
        clock.advance(30)
        settled = asyncio.ensure_future(engine.quiesce())
        await asyncio.wait([settled, asyncio.ensure_future(reached.wait())], return_when=asyncio.FIRST_COMPLETED)
        settled.cancel()


async def stop_answering_once_alerts_stop(engine: Engine, grace: float, answer: asyncio.Event) -> None:
    """Stop ``engine`` with ``grace``, and set ``answer`` once its alerts have begun to stop."""
    stop_alerts = engine.alerts.stop
    stopping_alerts = asyncio.Event()

    async def stop_alerts_seen(grace: float) -> None:
        stopping_alerts.set()
        await stop_alerts(grace)

    engine.alerts.stop = stop_alerts_seen  # type: ignore[method-assign]
    stopping = asyncio.ensure_future(engine.stop(grace))
    await asyncio.wait_for(stopping_alerts.wait(), 10)  # (the timeouts only bound a broken test)
    answer.set()
    await asyncio.wait_for(stopping, 10)


@pytest.mark.parametrize("grace", [5, 0])
async def test_a_stop_lets_a_delivery_in_flight_end_within_its_grace(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, grace: float
) -> None:
    """A rolling restart's SIGTERM lands while a page is being POSTed. With a grace (longer
    than the POST's timeout by default) the POST ends and its outcome is recorded: before,
    the stop cut it short, the row stayed claimed for its lease (60 s), and another
    instance sent it again then, though the sink may have taken it. With no grace it is
    cut short, as before, and sent again once its lease runs out."""
    posted, answer = asyncio.Event(), asyncio.Event()

    async def slow_sink(request: httpx.Request) -> httpx.Response:
        posted.set()
        await answer.wait()
        return httpx.Response(200)

    engine = make_engine([define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=fails)],
                         alerting=AlertSettings(sinks=(HOOK,), poll=1.0), alert_transport=httpx.MockTransport(slow_sink))  # fmt: skip
    await engine.start()
    await failing_until(engine, clock, posted)  # the alert fires and is POSTed
    await stop_answering_once_alerts_stop(engine, grace, answer)
    after = make_engine([])
    await after.open()
    audit = [(e.action, e.target) for e in (await after.audit.list()).entries]
    assert audit == ([("alert.notified", "failing:export")] if grace else [])


@pytest.mark.parametrize("grace", [5, 0])
async def test_a_stop_with_a_claim_of_pages_on_its_way_sends_them_or_gives_them_back(
    make_engine: Callable[..., Engine], clock: ManualClock, store_url: str, grace: float
) -> None:
    """A rolling restart's SIGTERM lands while this instance's claim of a due page has
    committed and its answer is on its way. With a grace the page is POSTed within it; with
    none it is given back, and another instance sends it at once. Before, the stop dropped
    the answer: the row stayed claimed by a stopped instance for its lease (60 s), the page
    held back a minute."""
    received: list[str] = []

    async def sink(request: httpx.Request) -> httpx.Response:
        received.append(request.headers["schedtui-instance"])
        return httpx.Response(200)

    settings = AlertSettings(sinks=(HOOK,), poll=1.0)
    engine = make_engine([define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=fails)],
                         alerting=settings, alert_transport=httpx.MockTransport(sink), instance="a")  # fmt: skip
    store: Any = engine.store
    claim, committed, answer = store.claim_deliveries, asyncio.Event(), asyncio.Event()

    async def answers_late(*args: Any) -> Any:
        claimed = await claim(*args)
        if claimed:
            committed.set()
            await answer.wait()
        return claimed

    store.claim_deliveries = answers_late
    await engine.start()
    await failing_until(engine, clock, committed)  # the alert fires and is claimed
    await stop_answering_once_alerts_stop(engine, grace, answer)
    assert received == (["a"] if grace else [])
    other = make_engine([], alerting=settings, alert_transport=httpx.MockTransport(sink), instance="b")
    await other.start()
    await other.quiesce()  # the same instant: not a lease later
    assert received == ["a"] if grace else received == ["b"]
    audit = [(e.action, e.target, e.detail["attempt"] if e.detail else None) for e in (await other.audit.list()).entries]
    assert [entry for entry in audit if entry[0].startswith("alert.")] == [("alert.notified", "failing:export", 1)]


async def test_a_sink_that_fails_is_retried_with_backoff(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    engine = alerting_engine([define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails)], backoff=10)
    receiver.answers = [500, 500]
    await fail_at_nine(engine, clock)
    assert len(receiver.requests) == 1  # 500: again in 10 s
    await step(engine, clock, 9)
    assert len(receiver.requests) == 1
    await step(engine, clock, 1)
    assert len(receiver.requests) == 2  # 500 again: the next wait is 20 s
    await step(engine, clock, 19)
    assert len(receiver.requests) == 2
    await step(engine, clock, 1)
    assert len(receiver.requests) == 3  # accepted
    await step(engine, clock, 60, times=3)
    assert len(receiver.requests) == 3 and receiver.delivered() == [("failing:job", "firing")] * 3
    assert len({r.headers["idempotency-key"] for r in receiver.requests}) == 1  # one transition, resent as such
    audit = (await engine.audit.list()).entries
    assert [(e.action, e.detail["attempt"] if e.detail else None) for e in audit] == [("alert.notified", 3)]


async def test_a_sink_that_never_accepts_is_given_up_on_and_recorded(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    engine = alerting_engine([define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails)],
                             backoff=10, attempts=3)  # fmt: skip
    receiver.answers = [503] * 10
    await fail_at_nine(engine, clock)
    await step(engine, clock, 10)
    await step(engine, clock, 20)
    assert len(receiver.requests) == 3
    await step(engine, clock, 600, times=2)
    assert len(receiver.requests) == 3
    (gave_up,) = (await engine.audit.list()).entries
    assert (gave_up.action, gave_up.target) == ("alert.notify_failed", "failing:job")
    assert gave_up.detail is not None and (gave_up.detail["attempt"], gave_up.detail["error"]) == (3, "HTTP 503")
    # The paging path's own health, for an alert on it: the metric counts each outcome.
    assert await notifications(engine) == {"retried": 2, "given_up": 1}


class OutcomesRefused:
    """A store that refuses (:class:`Unavailable`) the next ``refusals`` outcome writes, the rest as it is."""

    def __init__(self, inner: Any, refusals: int) -> None:
        self.inner, self.refusals = inner, refusals

    async def finish_delivery(self, *args: Any, **kwargs: Any) -> bool:
        if self.refusals:
            self.refusals -= 1
            raise Unavailable("the store cannot be reached (a blip)")
        return cast(bool, await self.inner.finish_delivery(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_an_outcome_the_store_refuses_once_is_recorded_again_not_sent_again(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """The webhook accepted the POST and the store refused its outcome for a moment (a
    failover, a connection reset): the outcome was forgotten, the row stayed claimed, and
    once the lease ran out the page was sent again, a second page for a blip, uncounted
    in the metric. The outcome is recorded again at the next poll: one POST, one audit
    entry, one count, however long the clock goes on."""
    engine = alerting_engine([define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails)])
    await engine.start()
    notifier = engine.alerts.notifier
    assert notifier is not None
    notifier.store = cast(Any, OutcomesRefused(notifier.store, refusals=2))
    with caplog.at_level(logging.WARNING, logger="schedtui.alerts"):
        await fail_at_nine(engine, clock)
    assert receiver.delivered() == [("failing:job", "firing")]
    await step(engine, clock, 1, times=3)  # the polls: refused once more, then recorded
    await step(engine, clock, 61, times=3)  # past the claim's lease
    assert receiver.delivered() == [("failing:job", "firing")]
    audit = (await engine.audit.list()).entries
    assert [(e.action, e.target) for e in audit] == [("alert.notified", "failing:job")]
    assert await notifications(engine) == {"delivered": 1}
    assert "its outcome (delivered) cannot be recorded now" in caplog.text


async def test_a_claim_whose_answer_came_late_is_given_back_not_posted_past_its_lease(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A claim answered 55 s of its 60 s lease after it was asked (a store back from a
    failover, a pool starved of connections) left 5 s for a POST of a 10 s timeout: a
    receiver slow to answer (8 s) was still being sent to when the lease ran out, another
    instance claimed the row and POSTed it too, and the webhook took the page twice. A
    claim with less of its lease left than the POST's timeout is given back (due at once,
    its attempt not counted) and claimed again with a whole lease: one page."""
    store: Any = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    ids = IdFactory(clock.now)
    settings = AlertSettings(sinks=(HOOK,), timeout=10.0, lease=60.0)
    accepted: list[str] = []
    slow = {"claim": True, "answer": True}
    claim = store.claim_deliveries

    async def answers_late(*args: Any) -> Any:
        claimed = await claim(*args)
        if claimed and slow["claim"]:
            slow["claim"] = False
            clock.advance(55)  # its answer comes 55 s after it was asked
        return claimed

    def notifier(instance: str, claims: Any) -> Notifier:
        audit = AuditLog(store=store, clock=clock, new_id=ids, events=EventBus(), actor="test")
        return Notifier(store=claims, clock=clock, loops=Loops(clock), instance=instance, sinks=parse_sinks([HOOK]),
                        settings=settings, audit=audit, transport=httpx.MockTransport(answer))  # fmt: skip

    async def answer(request: httpx.Request) -> httpx.Response:
        if slow["answer"]:
            slow["answer"] = False
            clock.advance(8)  # a receiver slow to answer (within the timeout); meanwhile the lease runs out
            await other.deliver_due()  # and the other instance delivers what is due
        accepted.append(json.loads(request.content)["transition"])
        return httpx.Response(200)

    late, other = notifier("a", HeldClaims(store, answers_late)), notifier("b", store)
    try:
        await late.register(clock.now())
        (written,) = [transition("failing:s", "firing", clock.now(), ids())]
        await store.write_transitions([written], sinks_after=clock.now() - timedelta(days=1))
        await late.deliver_due()
        await other.deliver_due()
        assert accepted == [written.alert.transition]
        (notified,) = (await AuditLog(store=store, clock=clock, new_id=ids, events=EventBus(), actor="t").list()).entries
        assert notified.detail is not None and notified.detail["attempt"] == 1  # the one given back is not counted
    finally:
        await late.stop(0)
        await other.stop(0)
        await store.close()


class HeldClaims:
    """A store whose claims answer through ``claim``, the rest as it is."""

    def __init__(self, inner: Any, claim: Any) -> None:
        self.inner, self.claim_deliveries = inner, claim

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TricklingWebhook:
    """A real webhook on loopback that answers ``200`` a byte every ``every`` seconds: each
    read of its answer is quick, the whole one slow (a receiver behind a choking proxy)."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

    def __init__(self, every: float) -> None:
        self.every = every
        self.requests = 0
        self.done = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener:
            while not self.done.is_set():
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(65536)
                    self.requests += 1
                    for byte in self.ANSWER:  # (paced by the network it stands for)
                        if self.done.wait(self.every):
                            return
                        try:
                            conn.sendall(bytes([byte]))
                        except OSError:
                            break  # the client gave up on it

    def close(self) -> None:
        self.done.set()
        self.listener.close()
        self.thread.join(10)


async def test_the_timeout_bounds_the_whole_post_not_each_read_and_the_sink_is_retried(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """httpx's timeout bounds each read: a receiver answering a byte every 50 ms held a
    POST as long as it liked (75 s in an outside test, past the lease: another instance
    would send it again). The POST as a whole fails at the timeout, and is retried."""
    webhook = TricklingWebhook(every=0.05)  # its 52-byte answer: 2.6 s
    try:
        engine = make_engine([define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails)],
                             alerting=AlertSettings(sinks=(webhook.url,), poll=1.0, timeout=0.3, backoff=10, attempts=2))  # fmt: skip
        await fail_at_nine(engine, clock)
        assert webhook.requests == 1
        await step(engine, clock, 10)  # retried after its backoff: the same again
        assert webhook.requests == 2
        (gave_up,) = (await engine.audit.list()).entries
        assert gave_up.action == "alert.notify_failed" and gave_up.detail is not None
        assert (gave_up.detail["attempt"], gave_up.detail["error"]) == (2, "no answer within 0.3s")
    finally:
        webhook.close()


async def test_a_webhooks_answer_is_never_read_only_its_status(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    """The answer's body was read whole into memory: a receiver's gigabyte grew serve to
    2 GB (kept) and stalled its API. Only the status counts."""
    sent: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        for _ in range(64):
            sent.append(1)
            yield b"x" * (1 << 20)

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body()))
    engine = make_engine([define_schedule(name="job", cron="0 * * * *", timezone="UTC", handler=fails)],
                         alerting=AlertSettings(sinks=(HOOK,), poll=1.0), alert_transport=transport)  # fmt: skip
    await fail_at_nine(engine, clock)
    assert len(sent) <= 1  # (a first chunk made ready is no read)
    audit = (await engine.audit.list()).entries
    assert [(e.action, e.detail["attempt"] if e.detail else None) for e in audit] == [("alert.notified", 1)]


async def test_late_catches_a_schedule_that_never_runs(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    # External: fired by a platform scheduler that has stopped calling.
    schedule = define_schedule(name="nightly", cron="0 3 * * *", timezone="UTC", handler=noop, trigger="external",
                               alert={"late": 600})  # fmt: skip
    engine = alerting_engine([schedule])
    await engine.start()
    await engine.quiesce()
    clock.set("2026-03-03T03:09:59Z")
    await engine.quiesce()
    assert receiver.delivered() == []
    clock.set("2026-03-03T03:10:15Z")
    await engine.quiesce()
    assert receiver.delivered() == [("late:nightly", "firing")]
    assert receiver.bodies[0]["summary"] == (
        "no successful run since the slot of 2026-03-03T03:00:00Z (grace 10m); no slot run has succeeded yet"
    )
    # The platform fires the next slot: it succeeds, and the alert resolves.
    clock.set("2026-03-04T03:00:01Z")
    await engine.fire_external("nightly")
    await engine.quiesce()
    clock.advance(15)
    await engine.quiesce()
    assert receiver.delivered() == [("late:nightly", "firing"), ("late:nightly", "resolved")]


async def test_dead_jobs_and_stuck_executions_alert(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    async def broken(job: Any) -> None:
        raise RuntimeError("smtp down")

    queue = define_queue(name="mail", handler=broken, attempts=1)
    engine = alerting_engine([queue])
    await engine.start()
    sent = await engine.jobs.send("mail", {"to": "x"})
    await engine.quiesce()
    clock.advance(15)
    await engine.quiesce()
    assert receiver.delivered() == [("dead_jobs:mail", "firing")]
    assert receiver.bodies[0]["summary"].startswith("1 job died within 1h, the newest at ")
    await engine.jobs.delete("mail", sent.id)
    clock.advance(15)
    await engine.quiesce()
    assert receiver.delivered()[-1] == ("dead_jobs:mail", "resolved")


async def test_an_execution_no_instance_runs_is_stuck(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    engine = alerting_engine([])  # defines no durable function: nothing here runs "elsewhere"
    await engine.start()
    started = await engine.durable.start_execution("elsewhere", {"n": 1})
    # Only this execution's alert is the subject (a loaded machine may let this engine's own
    # heartbeat lag the stepped clock, and a not_firing alert come and go meanwhile).
    def stuck() -> list[tuple[str, str]]:
        return [d for d in receiver.delivered() if d[0].startswith("stuck:")]

    await step(engine, clock, 60 * 29)
    assert stuck() == []
    await step(engine, clock, 61)
    assert stuck() == [(f"stuck:{started.id}", "firing")]
    body = next(b for b in receiver.bodies if b["alert"] == "stuck")
    assert body["summary"].startswith("execution of elsewhere queued since 2026-03-02T08:00:00Z, not started")
    await engine.durable.cancel(started.id)
    await step(engine, clock, 15)
    assert stuck()[-1] == (f"stuck:{started.id}", "resolved")


async def test_an_instance_back_from_a_suspend_does_not_page_its_own_silence(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver
) -> None:
    # The only firing instance is suspended for a day (a laptop lid, a paused VM, SIGSTOP).
    # On resume its evaluation may run before its heartbeat loop: the stale beat it reads
    # is its own, and the fleet fires again the moment it beats.
    engine = alerting_engine([])
    await engine.start()
    await engine.quiesce()
    # The heartbeat loop is held back after the resume (it has not had its turn yet).
    resumed = asyncio.Event()
    beat_and_sweep = engine.registry.beat_and_sweep

    async def held_back(now: datetime, *, force: bool = False) -> list[Any]:
        await resumed.wait()
        return await beat_and_sweep(now, force=force)

    engine.registry.beat_and_sweep = held_back  # type: ignore[method-assign]  # held back until the test lets it go
    clock.advance(86_400)
    done = await engine.alerts.evaluate()
    assert done.won == [] and "not_firing:fleet" not in done.findings
    resumed.set()
    await engine.quiesce()
    assert receiver.delivered() == []
    # A fleet that really is silent still pages: an instance that no longer fires.
    engine.registry.member = False
    clock.advance(60)
    done = await engine.alerts.evaluate()
    assert [a.key for a in done.won] == ["not_firing:fleet"]


async def test_a_rule_that_raises_fails_itself_only_logged_once_and_when_it_works_again(
    alerting_engine: Callable[..., Engine],
    clock: ManualClock,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A schedule whose condition raised at every round failed every round: no other alert
    fired or resolved. Now that rule alone is skipped (its firing alert kept as it is),
    logged with its traceback once, and once more when it evaluates again."""
    raising = {"now": True}
    failing = conditions.failing

    def flaky(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "broken" and raising["now"]:
            raise OverflowError("date value out of range")  # a rule past the calendar, say
        return failing(name, *args, **kwargs)

    monkeypatch.setattr(conditions, "failing", flaky)
    caplog.set_level(logging.INFO, logger="schedtui.alerts")
    engine = alerting_engine([
        define_schedule(name=name, cron="* * * * *", timezone="UTC", handler=fails, alert={"late": False})
        for name in ("broken", "export")
    ])  # fmt: skip
    await engine.start()
    await step(engine, clock, 30, times=8)  # 16 rounds
    assert receiver.delivered() == [("failing:export", "firing")]
    assert engine.alerts.last_round is not None and engine.alerts.last_round.unevaluated == ["failing:broken"]

    def lines(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if text in r.getMessage()]

    (logged,) = lines("rule failing:broken")
    assert logged.levelno == logging.ERROR and logged.exc_info is not None  # the traceback, once
    assert "OverflowError: date value out of range" in logged.getMessage()
    assert lines("evaluation round failed") == []
    raising["now"] = False
    await step(engine, clock, 30, times=2)
    assert receiver.delivered() == [("failing:export", "firing"), ("failing:broken", "firing")]
    assert [r.levelno for r in lines("rule failing:broken")] == [logging.ERROR, logging.INFO]
    assert "evaluates again" in lines("rule failing:broken")[1].getMessage()
    raising["now"] = True  # its firing alert is kept while the rule cannot tell
    await step(engine, clock, 30, times=4)
    assert receiver.delivered() == [("failing:export", "firing"), ("failing:broken", "firing")]
    assert {a.key for a in (await engine.alerts.page()).alerts} == {"failing:broken", "failing:export"}
    assert [r.levelno for r in lines("rule failing:broken")] == [logging.ERROR, logging.INFO, logging.ERROR]


# ---------------------------------------------------------------------------------------
# the evaluator: several instances, gone subjects, a bounded number of statements
# ---------------------------------------------------------------------------------------
class Counting:
    """A store whose statements are counted (each read or write of the SQLite store)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.count = 0
        read, write = store._read, store._write

        async def counted_read(fn: Any) -> Any:
            self.count += 1
            return await read(fn)

        async def counted_write(fn: Any) -> Any:
            self.count += 1
            return await write(fn)

        store._read, store._write = counted_read, counted_write


def evaluator(store: Any, schedules: list[Any], *, instance: str = "a", fleet: list[InstanceInfo] | None = None,
              clock: ManualClock) -> Evaluator:  # fmt: skip
    async def read_fleet() -> list[InstanceInfo]:
        return fleet if fleet is not None else [InstanceInfo(instance, "h", 1, clock.now(), role="firing")]

    return Evaluator(
        store=store, instance=instance, new_id=IdFactory(clock.now), schedules={s.name: s for s in schedules},
        queues={}, functions={}, state_of=lambda name: None, is_enabled=lambda name: True, fleet=read_fleet,
        fresh=timedelta(seconds=30),
    )  # fmt: skip


async def test_a_round_costs_the_same_statements_for_one_schedule_or_two_hundred(tmp_path: Path, clock: ManualClock) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        counts = []
        for n in (1, 200):
            schedules = [define_schedule(name=f"s{n}-{i}", cron="* * * * *", timezone="UTC", handler=noop) for i in range(n)]
            ev = evaluator(store, schedules, clock=clock)
            await ev.evaluate(clock.now(), sinks_after=T0)  # the first round records when each was first seen
            counting = Counting(store)
            await ev.evaluate(clock.now(), sinks_after=T0)
            counts.append(counting.count)
        assert counts[0] == counts[1] <= 6
    finally:
        await store.close()


async def test_instances_evaluating_the_same_facts_make_one_transition(tmp_path: Path, clock: ManualClock) -> None:
    store: Any = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        await store.register_sinks([("sink", "https://h/…")], T0)
        stale = [InstanceInfo("gone", "h", 1, T0 - timedelta(minutes=5), role="firing")]
        a = evaluator(store, [], instance="a", fleet=stale, clock=clock)
        b = evaluator(store, [], instance="b", fleet=stale, clock=clock)
        first = await a.evaluate(clock.now(), sinks_after=T0)
        second = await b.evaluate(clock.now(), sinks_after=T0)
        assert sorted(x.key for x in first.won) == ["instance_lost:gone", "not_firing:fleet"]
        assert second.transitions == [] and second.won == []
        # Both read the same facts and propose at once: one wins.
        clock.advance(15)
        live = [InstanceInfo("back", "h", 1, clock.now(), role="firing")]
        a.fleet = b.fleet = lambda: _value(live)
        proposals = [await e.evaluate(clock.now(), sinks_after=T0) for e in (a, b)]
        assert [len(p.won) for p in proposals] == [2, 0]
        claimed = await store.claim_deliveries(["sink"], "a", clock.now(), clock.now() + timedelta(minutes=1), 10)
        assert sorted(json.loads(d.payload)["state"] for d in claimed) == ["firing", "firing", "resolved", "resolved"]
    finally:
        await store.close()


async def _value(value: Any) -> Any:
    return value


async def test_an_alert_about_a_schedule_no_longer_defined_resolves(tmp_path: Path, clock: ManualClock) -> None:
    store: Any = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        await store.write_transitions([transition("failing:old", "firing", T0 - timedelta(hours=1), "01KJPS22WGWA546BHC0B9HDTBJ")],
                                      sinks_after=T0)  # fmt: skip
        done = await evaluator(store, [], clock=clock).evaluate(clock.now(), sinks_after=T0)
        (gone,) = done.won
        assert (gone.key, gone.state, gone.summary) == ("failing:old", "resolved", "schedule old is no longer defined")
    finally:
        await store.close()


async def test_an_alert_about_a_stored_schedule_not_valid_here_is_left_as_it_is(tmp_path: Path, clock: ManualClock) -> None:
    """This instance cannot run it (another may, and may see it late): it cannot tell, and
    says nothing either way, never "no longer defined"."""
    store: Any = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        await store.write_transitions([transition("late:foreign", "firing", T0 - timedelta(hours=1), "01KJPS22WGWA546BHC0B9HDTBJ")],
                                      sinks_after=T0)  # fmt: skip
        ev = evaluator(store, [], clock=clock)
        ev.unrunnable = {"foreign": "timezone 'Mars/Olympus_Mons': unknown"}
        done = await ev.evaluate(clock.now(), sinks_after=T0)
        assert (done.transitions, [a.state for a in await store.list_alerts()]) == ([], ["firing"])
        ev.unrunnable = {}  # deleted: gone
        (gone,) = (await ev.evaluate(clock.now(), sinks_after=T0)).won
        assert (gone.state, gone.summary) == ("resolved", "schedule foreign is no longer defined")
    finally:
        await store.close()


async def test_an_alert_about_a_schedule_the_other_release_still_runs_is_left_as_it_is(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A rolling deploy that removes a failing schedule: the new release's instance resolved
    its alert as gone, the old one's fired it again, a page and its resolution every round
    for as long as both ran (outside attack: code changes between deploys). While a live
    firing instance defines it (the last to start with it, as the fleet's timings say),
    it is not gone."""
    store: Any = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        await store.write_transitions([transition("failing:fails", "firing", T0 - timedelta(hours=1), "01KJPS22WGWA546BHC0B9HDTBJ")],
                                      sinks_after=T0)  # fmt: skip
        fleet = [InstanceInfo("new", "h", 1, clock.now(), role="firing"), InstanceInfo("old", "h", 2, clock.now(), role="firing")]
        ev = evaluator(store, [], instance="new", fleet=fleet, clock=clock)

        async def owners() -> dict[str, str | None]:
            return {"fails": "old", "kept": "new"}

        ev.code_owners = owners
        for _ in range(3):
            done = await ev.evaluate(clock.now(), sinks_after=T0)
            assert (done.transitions, [a.state for a in await store.list_alerts()]) == ([], ["firing"])
            clock.advance(15)
        fleet[1] = replace(fleet[1], heartbeat_at=clock.now() - timedelta(seconds=31))  # the old release is gone
        fleet[0] = replace(fleet[0], heartbeat_at=clock.now())
        won = {a.key: a for a in (await ev.evaluate(clock.now(), sinks_after=T0)).won}
        assert sorted(won) == ["failing:fails", "instance_lost:old"]  # (killed, not stopped: it pages too)
        gone = won["failing:fails"]
        assert (gone.state, gone.summary) == ("resolved", "schedule fails is no longer defined")
    finally:
        await store.close()


async def test_an_engine_reads_who_defines_each_schedule_in_code(make_engine: Callable[..., Engine]) -> None:
    old = make_engine([define_schedule(name="fails", cron="* * * * *", timezone="UTC", handler=noop)], instance="old")
    await old.start()
    new = make_engine([], instance="new")
    await new.open()
    assert await new._code_owners() == {"fails": "old"}
    assert new.alerts.evaluator is None or new.alerts.evaluator.code_owners is not None


# ---------------------------------------------------------------------------------------
# the read action: API, remote client, CLI, console header
# ---------------------------------------------------------------------------------------
@pytest.fixture
async def firing_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store: Any = open_store(url)
    await store.open()
    await store.write_transitions([
        transition("failing:export", "firing", T0, "01KJPS22WGWA546BHC0B9HDTBJ"),
        transition("late:nightly", "firing", T0 + timedelta(minutes=1), "01KJPS22WGWA546BHC0B9HDTBK"),
    ], sinks_after=T0)  # fmt: skip
    await store.write_transitions([transition("late:nightly", "resolved", T0 + timedelta(minutes=2), "01KJPS22WGWA546BHC0B9HDTBM")],
                                  sinks_after=T0)  # fmt: skip
    await store.close()
    return url


async def test_alerts_over_the_api_and_the_remote_client(firing_store: str) -> None:
    clock = ManualClock(T0 + timedelta(minutes=5))
    backend = EmbeddedBackend(Engine([], firing_store, clock=clock))
    await backend.connect()
    try:
        transport = httpx.ASGITransport(app=create_app(backend, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://schedtui.test") as client:
            headers = {"authorization": f"Bearer {TOKEN}"}
            answer = (await client.get("/inspect/alerts", headers=headers)).json()
            assert answer["firing"] == 1 and [a["key"] for a in answer["alerts"]] == ["failing:export"]
            assert answer["alerts"][0] == {
                "key": "failing:export", "condition": "failing", "subject_kind": "schedule", "subject": "export",
                "state": "firing", "since": "2026-03-02T08:00:00Z", "summary": "firing at 08:00",
                "updated_at": "2026-03-02T08:00:00Z", "transition": "01KJPS22WGWA546BHC0B9HDTBJ",
            }  # fmt: skip
            both = (await client.get("/inspect/alerts?resolved=true", headers=headers)).json()
            assert [(a["key"], a["state"]) for a in both["alerts"]] == [("failing:export", "firing"), ("late:nightly", "resolved")]
            bad = await client.get("/inspect/alerts?resolved=maybe", headers=headers)
            assert bad.status_code == 422 and bad.json()["error"]["message"] == 'resolved "maybe" must be true or false'
            none = (await client.get("/inspect/alerts?resolved=false", headers=headers)).json()
            assert none == answer
            assert (await client.get("/inspect/alerts")).status_code == 401
        remote = RemoteBackend("http://schedtui.test", TOKEN, transport=transport)
        await remote.connect()
        assert "alerts" in remote.info().systems
        page = await remote.alerts(resolved=True)
        assert page == await backend.alerts(resolved=True) and page.firing == 1
        await remote.close()
    finally:
        await backend.close()


async def test_schedtui_alerts_prints_a_table_or_json(
    firing_store: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store: Any = open_store(firing_store)
    await store.open()
    now = datetime.now(UTC)  # the CLI's engine reads the real clock: "the last 24 hours" are today's
    await store.write_transitions([transition("late:daily", "firing", now - timedelta(minutes=2), "01KJPS22WGWA546BHC0B9HDTBR")],
                                  sinks_after=now)  # fmt: skip
    await store.write_transitions([transition("late:daily", "resolved", now - timedelta(minutes=1), "01KJPS22WGWA546BHC0B9HDTBS")],
                                  sinks_after=now)  # fmt: skip
    await store.close()
    empty = tmp_path / "defs"
    empty.mkdir()
    await asyncio.to_thread(run_cli, firing_store, empty, capsys)


def run_cli(firing_store: str, empty: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alerts", "--store", firing_store, "--schedules", str(empty), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["firing"] == 1 and printed["alerts"][0]["key"] == "failing:export"
    assert main(["alerts", "--store", firing_store, "--schedules", str(empty), "--resolved"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"▲ firing\s+failing\s+schedule export\s+2026-03-02 08:00:00 UTC\s+firing at 08:00", out)
    assert re.search(r"✓ resolved\s+late\s+schedule daily", out) and out.rstrip().endswith("1 firing")


def test_serve_refuses_a_bad_notify_option_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["serve", "--store", store, "--notify", "ftp://hooks.example/abc"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "schedtui: notify URL ftp://hooks.example is not an http:// or https:// URL with a host"
    )
    assert main(["serve", "--store", store, "--notify-file", str(tmp_path / "missing")]) == 2
    assert "cannot read --notify-file" in capsys.readouterr().err
    assert main(["serve", "--store", store, "--notify-timeout", "90"]) == 2
    assert "must be shorter than the claim lease (60s)" in capsys.readouterr().err
    assert main(["serve", "--store", store, "--alert-interval", "0"]) == 2
    assert "--alert-interval: 0 must be a positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://[::1/hook", "notify URL http://… is not a URL (Invalid IPv6 URL)"),
        ("http://[zz]/x", "notify URL http://… is not a URL ('zz' does not appear to be an IPv4 or IPv6 address)"),
        ("http://]x/", "notify URL http://… is not a URL (Invalid IPv6 URL)"),
        # What httpx refuses at its first request: taken, it ended the delivery loop of every webhook.
        ("http://127.0.0.1:9000/bad\x01x", "notify URL http://127.0.0.1:9000/… #"),
        ("https://hooks.exa\xadmple.com/services/T0/B0/x", "is refused by the HTTP client: Invalid IDNA hostname"),
    ],
)
def test_serve_refuses_a_notify_url_no_request_could_go_to_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, said: str
) -> None:
    """A bracketed host that is no address was a traceback (exit 1); a URL httpx refuses
    was taken, and its first delivery ended the loop that delivers to every webhook."""
    store = f"sqlite:///{tmp_path / 'x.db'}"
    (tmp_path / "hooks.txt").write_text(url + "\n")
    for option in (["--notify", url], ["--notify-file", str(tmp_path / "hooks.txt")]):
        assert main(["serve", "--store", store, *option]) == 2
        lines = [line for line in capsys.readouterr().err.strip().splitlines() if "warning: --notify" not in line]
        assert len(lines) == 1 and said in lines[0], lines  # (beside --notify's documented warning)
        assert "services/T0" not in lines[0] and "bad" not in lines[0].split("#")[0].split("9000")[-1]


@pytest.mark.parametrize(("url", "at"), [("https://hooks.example/T0/\udcffsecret", 26), ("https://hook\udce9.example/x", 13)])
def test_a_notify_url_that_is_not_utf8_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, at: int
) -> None:
    """An argument that is not UTF-8 (a Latin-1 terminal's é) reaches Python as a lone
    surrogate: hashing the URL raised UnicodeEncodeError, a traceback and exit 1."""
    assert main(["serve", "--store", f"sqlite:///{tmp_path / 'x.db'}", "--notify", url]) == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if "warning: --notify" not in line]
    assert len(lines) == 1 and "holds a byte that is not UTF-8 text" in lines[0], lines
    assert lines == [f"schedtui: notify URL https://… holds a byte that is not UTF-8 text (character {at}): give it as UTF-8"]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("alice:HookPass99@hooks.example/T0", "notify URL of 33 characters (not shown: it may hold its secret) is not"),
        ("https//hooks.slack.com/services/T0/B0/SEcret", "notify URL of 44 characters"),
        ("//bob:S3cretPw@alerts.internal/x", "notify URL of 32 characters"),
        ("ftp://carol:Pw123456@hooks.example/T0/B0", "notify URL ftp://hooks.example is not an http:// or https://"),
        ("http://dave:Pw123456@[::1/T0/B0", "notify URL http://… is not a URL (Invalid IPv6 URL)"),
    ],
)
def test_a_refused_notify_url_is_never_quoted(url: str, said: str) -> None:
    """Only its scheme and host are shown, when they parse: its user part and its path may
    be its secret (a mistyped scheme was quoted, credentials and path included)."""
    with pytest.raises(BadInput) as refused:
        sink_of(url)
    assert said in refused.value.message
    for secret in ("HookPass99", "T0", "SEcret", "S3cretPw", "Pw123456", "alice", "bob"):
        assert secret not in refused.value.message
    with pytest.raises(BadInput) as refused:
        parse_sinks(["https://ok.example/a", url])
    assert refused.value.message.endswith("(notify URL 2 of 2)")


def test_a_notify_file_takes_comments_after_a_url_and_refuses_other_text() -> None:
    content = "# the team's hooks\n\n  https://hooks.example.test/a/b  # ops channel\nhttp://127.0.0.1:9000/x\t#x\n"
    assert notify_file_urls(content, "hooks.txt") == ["https://hooks.example.test/a/b", "http://127.0.0.1:9000/x"]
    with pytest.raises(UsageError) as refused:
        notify_file_urls("https://a.test/1\nhttps://b.test/secret https://c.test/2\n", "hooks.txt")
    assert str(refused.value) == (
        'schedtui: --notify-file "hooks.txt" line 2: text after the URL that is not a # comment (one URL a line)'
    )
    with pytest.raises(BadInput, match=r"notify URL https://b.test/… holds a space"):
        sink_of("https://b.test/se cret")


async def test_a_webhooks_url_never_reaches_the_log_through_httpx(
    alerting_engine: Callable[..., Engine], clock: ManualClock, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx logs every request's URL at INFO, and a webhook's URL is its secret."""

    async def handler(ctx: RunContext) -> None:
        raise ValueError("broken")

    engine = alerting_engine([define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=handler)])
    with caplog.at_level(logging.INFO):
        await engine.start()
        await step(engine, clock, 30, times=8)
    assert receiver.delivered() == [("failing:export", "firing")]
    requests = [r for r in caplog.records if r.name == "httpx"]
    assert requests and all("HTTP Request: POST" in r.getMessage() for r in requests)
    assert HOOK not in caplog.text and urlsplit(HOOK).path not in caplog.text


def test_sinks_are_known_by_a_hash_and_shown_without_their_secret() -> None:
    sink = sink_of(HOOK)
    assert sink.url == HOOK and len(sink.id) == 16 and sink.shown == f"https://hooks.example.test/… #{sink.id[:6]}"
    assert sink_of("http://127.0.0.1:9000").shown.startswith("http://127.0.0.1:9000 #")
    assert len(parse_sinks([HOOK, HOOK + " ", "http://other.test/x"])) == 2
    with pytest.raises(BadInput, match=r"notify URL of 9 characters \(not shown: it may hold its secret\) is not"):
        sink_of("not a url")


async def test_the_console_header_counts_the_firing_alerts(firing_store: str) -> None:
    from console.app import SchedtuiApp
    from console.widgets import ConsoleHeader

    clock = ManualClock(T0 + timedelta(minutes=5))
    backend = EmbeddedBackend(Engine([define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=noop)],
                                     firing_store, clock=clock))  # fmt: skip
    app = SchedtuiApp(backend, clock, operator_zone="UTC")
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            header = app.query_one(ConsoleHeader)
            assert header.alerting == 1 and "⚑ 1 alerting" in header.render().plain
            # Another instance resolves it: the alerts signal reads the count again.
            store: Any = backend.engine.store
            await store.write_transitions([transition("failing:export", "resolved", clock.now(), "01KJPS22WGWA546BHC0B9HDTBQ")],
                                          sinks_after=T0)  # fmt: skip
            backend.engine.events.publish("alerts", "failing:export")
            await pilot.pause()
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            assert header.alerting == 0 and "alerting" not in header.render().plain
    finally:
        await backend.close()


# ---------------------------------------------------------------------------------------
# the Prometheus rule export
# ---------------------------------------------------------------------------------------
FAMILIES = {
    "schedtui_runs_total", "schedtui_schedule_last_success_timestamp_seconds", "schedtui_schedule_next_fire_timestamp_seconds",
    "schedtui_schedule_enabled", "schedtui_jobs", "schedtui_durable_executions", "schedtui_instances",
    "schedtui_lease_lapses_total", "schedtui_clock_offset_seconds", "schedtui_alert_notifications_total",
}  # fmt: skip


@pytest.mark.parametrize(
    ("cron", "zone", "hours"),
    [
        ("0 9 * * *", "Europe/Berlin", 25),  # the autumn day lasts 25 hours: on time, never late
        ("0 9 * * 1-5", "Europe/Berlin", 73),  # Friday to Monday across it
        ("0 9 * * *", "Australia/Lord_Howe", 24.5),  # a half-hour change
        ("0 */2 * * *", "Europe/Berlin", 3),  # real time: the spring gap
        ("0 9 * * *", "UTC", 24),
        ("*/5 * * * *", "Europe/Berlin", 1 / 12),  # every hour alike: no change to add
        ("0 9 1 6 *", "UTC", 366 * 24),  # yearly: one slot in the 400 days ahead, and the next after
        ("0 9 29 2 *", "UTC", 1461 * 24),  # a leap day: none in the 400 days ahead
    ],
)
def test_a_schedules_period_is_its_longest_gap_whatever_the_day_the_rules_are_made(cron: str, zone: str, hours: float) -> None:
    schedule = define_schedule(name="s", cron=cron, timezone=zone, handler=noop)
    made = datetime(2026, 12, 5, tzinfo=UTC)  # (Berlin's 25-hour day is 329 days ahead; 24 days of slots miss it)
    assert period(schedule, made) == pytest.approx(hours * 3600)


def test_the_prometheus_rules_cover_every_condition_with_the_overrides() -> None:
    async def flow(ctx: Any, input: Any) -> None:
        pass

    schedules = [
        define_schedule(name="nightly.report", cron="0 3 * * *", timezone="Europe/Berlin", handler=noop,
                        alert={"failing": 2, "late": 3600, "disabled": False}),
        define_schedule(name="quiet", cron="* * * * *", timezone="UTC", handler=noop, alert=False),
    ]  # fmt: skip
    queues = [define_queue(name="mail", handler=noop, alert={"dead_jobs": 3, "window": 7200})]
    functions = [define_durable(name="flow", handler=flow, alert={"stuck": 600})]
    text = render_rules("prometheus", schedules, queues, functions, T0, source="schedules")
    assert text.startswith("# schedtui's alert conditions as Prometheus alerting rules, from the definitions in schedules.")
    document = yaml.safe_load(text)
    assert document == prometheus_rules(schedules, queues, functions, T0)
    (group,) = document["groups"]
    rules = group["rules"]
    assert {r["alert"] for r in rules} == {
        "SchedtuiFailing", "SchedtuiLate", "SchedtuiNotFiring", "SchedtuiInstanceLost", "SchedtuiLeaseLapsed",
        "SchedtuiClockOffset",
        "SchedtuiNotificationsGivenUp", "SchedtuiDeadJobs", "SchedtuiStuck",
    }  # fmt: skip
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"} and rule["for"] == "1m"
        assert set(re.findall(r"\bschedtui_[a-z_]+", rule["expr"])) <= FAMILIES, rule["expr"]
        assert rule["expr"].count("(") == rule["expr"].count(")")
    def subject(rule: dict[str, Any]) -> str | None:
        labels: dict[str, str] = rule["labels"]
        return labels.get("schedule") or labels.get("queue") or labels.get("function")

    mine = {(r["alert"], subject(r)): r for r in rules if subject(r) and r["labels"].get("reason") != "disabled"}
    assert ">= 2 unless" in mine[("SchedtuiFailing", "nightly.report")]["expr"]
    assert "[50h]" in mine[("SchedtuiFailing", "nightly.report")]["expr"]  # two periods of its longest day (25 h)
    assert "> 93600 or" in mine[("SchedtuiLate", "nightly.report")]["expr"]  # that day and the hour's grace
    assert not any(r["labels"].get("schedule") == "quiet" for r in rules)  # alert=False: no rule
    assert not any(r["labels"].get("reason") == "disabled" and r["labels"].get("schedule") == "nightly.report" for r in rules)
    assert ">= 3" in mine[("SchedtuiDeadJobs", "mail")]["expr"] and "[2h]" in mine[("SchedtuiDeadJobs", "mail")]["expr"]
    assert "[10m]" in mine[("SchedtuiStuck", "flow")]["expr"]
    catch_all = [r for r in rules if r["alert"] == "SchedtuiFailing" and "schedule" not in r["labels"]]
    assert len(catch_all) == 1 and 'schedule!~"nightly\\\\.report|quiet"' in catch_all[0]["expr"]
    not_firing = next(r for r in rules if r["alert"] == "SchedtuiNotFiring")
    assert 'absent(schedtui_instances{role="firing"})' in not_firing["expr"]


def test_the_prometheus_rules_never_page_for_a_schedule_defined_disabled() -> None:
    """A schedule defined ``enabled=False`` is not meant to run and never late, as the
    engine says; its "disabled for too long" rule paged for it all the same."""
    schedules = [
        define_schedule(name="paused-by-design", cron="0 3 * * *", timezone="UTC", handler=noop, enabled=False),
        define_schedule(name="daily", cron="0 3 * * *", timezone="UTC", handler=noop),
    ]
    rules = prometheus_rules(schedules, [], [], T0)["groups"][0]["rules"]
    disabled = {r["labels"].get("schedule") for r in rules if r["labels"].get("reason") == "disabled"}
    assert "daily" in disabled and "paused-by-design" not in disabled
    late = [r for r in rules if r["alert"] == "SchedtuiLate" and r["labels"].get("schedule") == "paused-by-design"]
    assert late and all("schedtui_schedule_enabled" not in r["expr"] or "== 1" in r["expr"] for r in late)


def test_schedtui_alert_rules_prints_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.cron.py").write_text(
        "from backend import define_schedule\n"
        "async def h(ctx): pass\n"
        "hourly = define_schedule(name='hourly', cron='0 * * * *', timezone='UTC', handler=h)\n"
    )
    assert main(["alert-rules", "--provider", "prometheus", "--schedules", str(tmp_path)]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    assert any(r["labels"].get("schedule") == "hourly" for r in document["groups"][0]["rules"])
    assert main(["alert-rules", "--provider", "nagios", "--schedules", str(tmp_path)]) == 2
    assert "invalid choice: 'nagios'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# a stored schedule's alert option
# ---------------------------------------------------------------------------------------
async def test_a_stored_schedule_carries_its_alert_option(make_engine: Callable[..., Engine], tmp_path: Path) -> None:
    queue = define_queue(name="mail", handler=noop)
    engine = make_engine([queue])
    await engine.open()
    spec = {"name": "digest", "cron": "0 9 * * *", "timezone": "UTC", "queue": "mail", "alert": {"failing": 2, "late": False}}
    await engine.create_schedule(spec)
    assert engine.schedules["digest"].alert == ScheduleAlerting(failing=2, late=False)
    await engine.update_schedule("digest", {"alert": False})
    assert not engine.schedules["digest"].alert.failing
    with pytest.raises(BadInput) as caught:
        await engine.update_schedule("digest", {"alert": {"failing": "often"}})
    assert caught.value.field == "alert"
    assert caught.value.message == "alert failing 'often' must be a whole number from 1 to 100 (or False: off)"
    # Another engine on the same store reads it back.
    other = make_engine([queue])
    await other.open()
    assert not other.schedules["digest"].alert.failing and not other.schedules["digest"].alert.late
    await engine.update_schedule("digest", {"alert": None})
    await other.catalog.refresh()
    assert other.schedules["digest"].alert == ScheduleAlerting()


# ---------------------------------------------------------------------------------------
# the overdue slot, kept until it may change
# ---------------------------------------------------------------------------------------
@given(
    expr=st.sampled_from(["* * * * * *", "*/7 * * * * *", "* * * * *", "0,1 0 * * *", "*/10 9-17 * * 1-5", "30 2 * * *"]),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
    max_runtime=st.sampled_from([1.0, 30.0, 1800.0]),
    start=st.integers(0, 30 * 86400),
)
@settings(max_examples=200, deadline=None)
def test_the_overdue_slot_is_the_newest_slot_whose_grace_has_passed(expr: str, zone: str, max_runtime: float, start: int) -> None:
    """Against a walk back from ``now`` over every slot (what the condition did, and what
    held an engine's loop for seconds with a thousand every-second schedules)."""
    cron, policy = Cron(expr, zone), ScheduleAlerting()
    now = T0 + timedelta(seconds=start, microseconds=start % 7 * 100_000)
    newest = None
    for slot in itertools.islice(cron.occurrences_back(now), 200_000):
        if slot + conditions.late_grace(cron, max_runtime, policy, slot) <= now:
            newest = slot
            break
    found = conditions.overdue_slot(cron, max_runtime, policy, now)
    assert (found.slot if found is not None else None) == newest


@given(
    expr=st.sampled_from(["* * * * *", "0 * * * *", "0,1 0 * * *", "*/10 9-17 * * 1-5", "30 2 * * *", "0 0 1 * *"]),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
    grace=st.sampled_from([None, 60.0, 7200.0]),
    max_runtime=st.sampled_from([30.0, 1800.0, 86400.0]),
    start=st.integers(0, 400 * 86400),
    later=st.floats(0, 1),
)
@settings(max_examples=200, deadline=None)
def test_the_overdue_slot_stays_the_same_until_its_until(
    expr: str, zone: str, grace: float | None, max_runtime: float, start: int, later: float
) -> None:
    cron, policy = Cron(expr, zone), ScheduleAlerting(grace=grace)
    now = T0 + timedelta(seconds=start)
    found = conditions.overdue_slot(cron, max_runtime, policy, now)
    assert found is not None and found.slot + found.grace <= now < found.until
    then = now + (found.until - now) * later
    if then < found.until:
        assert conditions.overdue_slot(cron, max_runtime, policy, then) == conditions.Overdue(found.slot, found.grace, found.until)
