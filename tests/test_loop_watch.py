"""The thread that ends the process when the lease lapses while the event loop is blocked
(see :mod:`backend.runtime.loopwatch`), on an injected lease clock; the real thing, with
real ``serve`` processes, is in ``test_liveness_fleet``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from backend.runtime.liveness import WorkLease
from backend.runtime.loopwatch import EXIT_LEASE_LAPSED, LoopWatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watch(busy: bool = True, end: bool = True) -> tuple[LoopWatch, Clock, list[int]]:
    clock = Clock()
    lease = WorkLease(timedelta(seconds=30), clock=clock)
    lease.enforced = True
    lease.renewed(lease.sending())
    ended: list[int] = []
    return LoopWatch(lease, lambda: busy, ended.append if end else None), clock, ended


def test_a_loop_blocked_past_the_lapse_with_a_handler_running_ends_the_process_before_the_window() -> None:
    watch, clock, ended = _watch()
    assert watch.grace == 1.0  # a third of the 10 s between the bound (20 s) and the window, at most 1 s
    for now in (19.0, 20.0, 20.9):  # the loop has until the grace to lapse the lease itself
        clock.now = now
        assert not watch.check()
    clock.now = 21.2  # first seen blocked: looked at again a grace later (a resumed process)
    assert not watch.check() and ended == []
    clock.now = 22.0
    assert not watch.check()
    clock.now = 22.3
    assert watch.check() and ended == [EXIT_LEASE_LAPSED]  # 22.3 s: before the others' 30 s


def test_a_loop_that_lapsed_the_lease_itself_is_left_to_do_its_work() -> None:
    watch, clock, ended = _watch()
    clock.now = 20.0
    watch.lease.check()  # what the loop's own watch does at the bound
    assert watch.lease.lapsed
    clock.now = 40.0
    assert not watch.check() and ended == []


def test_with_no_handler_running_a_blocked_loop_runs_nothing_twice() -> None:
    watch, clock, ended = _watch(busy=False)
    clock.now = 25.0
    assert not watch.check()
    clock.now = 29.0
    assert not watch.check() and ended == []


def test_a_renewal_meanwhile_starts_the_count_again() -> None:
    watch, clock, ended = _watch()
    clock.now = 21.5
    assert not watch.check()  # seen once
    watch.lease.renewed(21.5)
    clock.now = 41.0
    assert not watch.check()
    clock.now = 42.6
    assert not watch.check()  # seen again only now: a grace more
    clock.now = 43.7
    assert watch.check() and ended == [EXIT_LEASE_LAPSED]


def test_a_host_that_must_not_exit_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    watch, clock, _ = _watch(end=False)
    for now in (21.5, 23.0, 25.0):
        clock.now = now
        watch.check()
    told = [r for r in caplog.records if "the event loop has been blocked" in r.getMessage()]
    assert len(told) == 1 and told[0].levelname == "ERROR"
    assert "exit_when_lease_lapses=False" in told[0].getMessage()
