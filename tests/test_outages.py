"""The outage log: each kind of trouble warned of once, then at most once a minute, and
ended only by a success of its own kind (see backend/runtime/outages.py)."""

from __future__ import annotations

import logging

import pytest

from backend import ManualClock, Unavailable
from backend.runtime.outages import OutageLog


@pytest.fixture
def outages(clock: ManualClock, caplog: pytest.LogCaptureFixture) -> OutageLog:
    caplog.set_level(logging.DEBUG, "schedtui")
    return OutageLog(clock)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_kind_that_keeps_failing_is_warned_of_once_a_minute_whatever_else_works(
    outages: OutageLog, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    full = Unavailable("could not extend file: No space left on device")
    for _ in range(119):  # two claims a second fail; the heartbeat and housekeeping go through
        outages.trouble("claim", "not firing 1 slot(s): cannot claim them", full)
        outages.trouble("claim", "not firing 1 slot(s): cannot claim them", full)
        outages.back("lease")
        outages.back("maintain")
        clock.advance(1)
    assert len(warnings(caplog)) == 2  # at 0 s and at 60 s
    assert "reachable again" not in caplog.text
    outages.back("claim", lost_slots=119)
    assert caplog.records[-1].getMessage().startswith("store reachable again after")
    assert "119 slot(s)" in caplog.records[-1].getMessage()
    outages.trouble("claim", "not firing 1 slot(s): cannot claim them", full)  # a new outage: warned at once
    assert len(warnings(caplog)) == 3


def test_the_store_is_reachable_again_once_every_kind_that_failed_works(
    outages: OutageLog, caplog: pytest.LogCaptureFixture
) -> None:
    for kind in ("claim", "jobs"):
        outages.trouble(kind, f"{kind} fails", Unavailable("the store is down"))
    outages.back("claim", lost_slots=3)
    assert "reachable again" not in caplog.text  # the job workers still fail
    outages.back("jobs")
    [back] = [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]
    assert "3 slot(s)" in back
    outages.back("jobs")
    assert caplog.text.count("reachable again") == 1
