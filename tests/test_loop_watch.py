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


HOLDS_THE_GIL = """
import os, sys, time
from datetime import timedelta
from backend.runtime.liveness import WorkLease, boot_clock
from backend.runtime.loopwatch import LoopWatch

lease = WorkLease(timedelta(seconds=3), clock=boot_clock)
lease.enforced = True
lease.renewed(lease.sending())
watch = LoopWatch(lease, lambda: True, os._exit, hard_stop=True)
watch.start()
time.sleep(0.5)  # (the watch has armed its timer)
print("holding", flush=True)
sum(range(10**12))  # one C call that never lets the GIL go: hours
print("returned", flush=True)
"""


def test_a_handler_holding_the_gil_in_one_c_call_still_ends_the_process_before_the_window() -> None:
    """The watch is a Python thread: a handler stuck in one C call holding the GIL (a
    catastrophic regex, ``sum(range(10**10))``) stopped it and the heartbeat alike, and its
    job ran a second attempt elsewhere beside it. The CPU-time timer the watch keeps armed
    runs out instead: SIGPROF ends the process, every thread's traceback on stderr."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HOLDS_THE_GIL], cwd=root, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - began
    assert done.returncode == -signal.SIGPROF, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "holding\n"
    assert 'File "<string>", line 14 in <module>' in done.stderr, done.stderr  # the stuck frame, named
    assert took < 10, took  # (a bound for a broken test only: without the timer it runs for hours)


def test_a_frozen_process_burns_no_cpu_and_is_left_to_stop_its_handlers_itself() -> None:
    """SIGSTOP (a suspended VM) past the deadline: the timer counts CPU time, not time, so
    the process thawed is not ended by it; its loop stops its handlers itself."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = HOLDS_THE_GIL.replace("sum(range(10**12))", "sys.stdin.readline()")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "holding\n"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(4)  # (a freeze past the 2.8 s deadline: a real wait is what is tested)
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("go on\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "returned\n"
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


def test_the_timer_runs_to_the_deadline_only_while_the_lease_is_held() -> None:
    watch, clock, _ = _watch()
    assert watch.deadline() == 20.0 + 2.5  # the bound, then two graces and a half: before 30 s
    clock.now = 10.0
    watch.lease.renewed(watch.lease.sending())
    assert watch.deadline() == 32.5  # moved by the renewal
    clock.now = 30.0
    watch.lease.check()
    assert watch.lease.lapsed and watch.deadline() is None  # the loop stops its own work
