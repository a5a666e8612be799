"""PagerDuty as a sink (``--notify pagerduty://ROUTING_KEY``), on the injected clock with a
mock of its Events API v2: the URL's checks, the events a firing and a resolution send,
and the property that matters to a pager: the incident PagerDuty holds ends in the
alert's own state, whatever order the deliveries' retries land in."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from backend import Engine, ManualClock, RunContext, define_schedule
from backend.alerts import pagerduty
from backend.alerts.notifier import AlertSettings, sink_of
from backend.errors import BadInput

KEY = "R0UT1NGKEY0123456789abcdefABCDEF"
PD = f"pagerduty://{KEY}"


class PagerDuty:
    """The Events API v2 as far as an incident goes: an accepted ``trigger`` opens (or
    folds into) the incident of its ``dedup_key``, an accepted ``resolve`` closes it. An
    event whose action is in ``refusing`` is answered 503 and changes nothing (the network
    or PagerDuty failing at the moments that event's attempts were made)."""

    def __init__(self) -> None:
        self.refusing: set[str] = set()
        self.requests: list[httpx.Request] = []
        self.accepted: list[dict[str, Any]] = []
        self.open: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        event = json.loads(request.content)
        if event["event_action"] in self.refusing:
            return httpx.Response(503)
        self.accepted.append(event)
        if event["event_action"] == "trigger":
            self.open.add(event["dedup_key"])
        else:
            self.open.discard(event["dedup_key"])
        return httpx.Response(202, json={"status": "success", "dedup_key": event["dedup_key"]})


@pytest.fixture
def pd() -> PagerDuty:
    return PagerDuty()


failing = {"now": True}


async def export(ctx: RunContext) -> None:
    if failing["now"]:
        raise ValueError("the export is broken")


@pytest.fixture
def engine(make_engine: Callable[..., Engine], pd: PagerDuty) -> Engine:
    failing["now"] = True
    settings = AlertSettings(sinks=(PD,), poll=1.0, backoff=10, backoff_max=60)
    schedule = define_schedule(name="export", cron="* * * * *", timezone="UTC", handler=export)
    return make_engine([schedule], alerting=settings, alert_transport=httpx.MockTransport(pd))


async def step(engine: Engine, clock: ManualClock, seconds: float, times: int = 1) -> None:
    for _ in range(times):
        clock.advance(seconds)
        await engine.quiesce()


def test_a_pagerduty_url_takes_a_routing_key_and_a_host_and_never_shows_the_key() -> None:
    sink = sink_of(PD)
    assert (sink.url, sink.routing_key) == ("https://events.pagerduty.com/v2/enqueue", KEY)
    assert sink.shown == f"pagerduty://events.pagerduty.com #{sink.id[:6]}" and KEY not in repr(sink)
    eu = sink_of(f"{PD}@events.eu.pagerduty.com")
    assert eu.url == "https://events.eu.pagerduty.com/v2/enqueue" and eu.id != sink.id
    for bad, said in [
        ("pagerduty://", "not 0 character(s)"),
        ("pagerduty://" + KEY[:10], "not 10 character(s)"),
        ("pagerduty://" + KEY + "!", "not 33 character(s)"),
        (f"{PD}@", "names no host"),
        (f"{PD}@bad/host", "@bad/host names no host"),
        (f"{PD} # the on-call", "holds a space"),
    ]:
        with pytest.raises(BadInput, match="^notify URL pagerduty://…") as refused:
            sink_of(bad)
        assert said in refused.value.message and KEY not in refused.value.message, bad


def test_a_dedup_key_fits_pagerdutys_bound_and_tells_long_subjects_apart() -> None:
    assert pagerduty.dedup_key("failing:export") == "schedtui:failing:export"
    long_a, long_b = "stuck:" + "a" * 300, "stuck:" + "a" * 299 + "b"
    assert len(pagerduty.dedup_key(long_a)) == pagerduty.DEDUP_MAX
    assert pagerduty.dedup_key(long_a) != pagerduty.dedup_key(long_b)


async def test_a_failing_schedule_triggers_an_incident_and_its_recovery_resolves_it(
    engine: Engine, clock: ManualClock, pd: PagerDuty, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await engine.start()
    await step(engine, clock, 30, times=4)  # two failed runs: failing fires
    (trigger,) = pd.accepted
    assert str(pd.requests[0].url) == "https://events.pagerduty.com/v2/enqueue"
    assert (trigger["routing_key"], trigger["event_action"], trigger["dedup_key"]) == (KEY, "trigger", "schedtui:failing:export")
    payload = trigger["payload"]
    assert payload["summary"].startswith("failing: schedule export: the newest run failed")
    assert (payload["source"], payload["severity"], payload["component"], payload["group"]) == (
        "schedule export", "error", "export", "schedule",
    )
    (alert,) = (await engine.alerts.page()).alerts
    assert payload["timestamp"] == alert.to_json()["since"]
    assert payload["custom_details"]["transition"] == alert.transition
    assert pd.open == {"schedtui:failing:export"}
    failing["now"] = False
    await step(engine, clock, 30, times=14)  # resolve_after: 5 minutes without a failure
    assert [e["event_action"] for e in pd.accepted] == ["trigger", "resolve"]
    assert pd.accepted[1] == {"routing_key": KEY, "dedup_key": "schedtui:failing:export", "client": "schedtui",
                              "event_action": "resolve"}  # fmt: skip
    assert pd.open == set()
    audit = [(e.action, e.detail["sink"] if e.detail else None) for e in (await engine.audit.list()).entries]
    shown = sink_of(PD).shown
    assert audit == [("alert.notified", shown)] * 2
    assert KEY not in caplog.text and KEY not in json.dumps([e.to_json() for e in (await engine.audit.list()).entries])


async def test_a_trigger_whose_delivery_outlasts_its_alert_resolves_the_incident_instead(
    engine: Engine, clock: ManualClock, pd: PagerDuty
) -> None:
    """PagerDuty acts on events as they arrive. The firing's attempts failed, the
    resolution's first one went through, and the firing's next retry came after it: sent
    as it was (a trigger), it would open an incident that nothing resolves. Each delivery
    sends the alert's state at delivery, so the incident ends closed, as the alert is."""
    pd.refusing = {"trigger"}
    await engine.start()
    await step(engine, clock, 30, times=4)
    assert pd.requests and not pd.accepted  # the trigger's attempts fail
    failing["now"] = False
    for _ in range(20):  # until it resolves (5 minutes without a failure)
        await step(engine, clock, 30)
        if not (await engine.alerts.page()).alerts:
            break
    assert [e["event_action"] for e in pd.accepted] == ["resolve"]  # the resolution's first attempt
    pd.refusing = set()
    await step(engine, clock, 60, times=3)  # the firing's row is retried (its backoff is at most 60 s)
    assert [e["event_action"] for e in pd.accepted] == ["resolve", "resolve"]  # both rows: the state now
    assert pd.open == set()
    # It fires again later: its trigger goes out, and the incident opens.
    failing["now"] = True
    await step(engine, clock, 30, times=4)
    assert pd.accepted[-1]["event_action"] == "trigger" and pd.open == {"schedtui:failing:export"}
