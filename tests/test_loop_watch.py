"""The thread that ends the process when the lease lapses while the event loop is blocked
(see :mod:`backend.runtime.loopwatch`), on an injected lease clock; the real thing, with
real ``serve`` processes, is in ``test_liveness_fleet``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from backend.runtime.liveness import WorkLease
from backend.runtime.loopwatch import EXIT_LEASE_LAPSED, LoopWatch, cpu_share


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


def holding_the_gil(preexec: Callable[[], None] | None = None) -> tuple[int, str, str, float]:
    """HOLDS_THE_GIL run to its end: its status, stdout, stderr and the CPU time it burnt
    (user and system: what the timer counts), the same whatever the machine's load."""
    import resource
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", HOLDS_THE_GIL], cwd=root, capture_output=True, text=True,
                          timeout=60, preexec_fn=preexec)  # fmt: skip  # (timeout: for a broken test only, it runs for hours)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.returncode, done.stdout, done.stderr, cpu


def test_a_handler_holding_the_gil_in_one_c_call_still_ends_the_process_before_the_window() -> None:
    """The watch is a Python thread: a handler stuck in one C call holding the GIL (a
    catastrophic regex, ``sum(range(10**10))``) stopped it and the heartbeat alike, and its
    job ran a second attempt elsewhere beside it. The CPU-time timer the watch keeps armed
    runs out instead: SIGPROF ends the process, every thread's traceback on stderr, once it
    has burnt what was left until the deadline (2.8 s of the 3 s window)."""
    import signal

    status, out, err, cpu = holding_the_gil()
    assert status == -signal.SIGPROF, (status, out, err)
    assert out == "holding\n"
    assert 'File "<string>", line 14 in <module>' in err, err  # the stuck frame, named
    assert cpu < 4, cpu  # (its start, then what was left until the deadline)


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


def test_the_share_of_a_core_is_the_smallest_quota_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    def write(relative: str, text: str) -> None:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)

    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    write("sys/kubepods/cpu.max", "max 100000\n")
    write("sys/kubepods/pod1/cpu.max", "50000 100000\n")  # the pod's limit: half a core
    write("sys/kubepods/pod1/ctr/cpu.max", "200000 100000\n")  # (two cores: the pod's is less)
    assert cpu_share(proc, tmp_path / "sys") == 0.5
    proc.write_text("12:pids:/x\n4:cpu,cpuacct:/docker/abc\n")  # v1
    write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "25000\n")
    write("sys/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cpu_share(proc, tmp_path / "sys") == 0.25
    write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")  # no quota
    assert cpu_share(proc, tmp_path / "sys") == 1.0
    write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "garbage\n")
    assert cpu_share(proc, tmp_path / "sys") == 1.0
    proc.write_text("0::/elsewhere\n")  # nothing to read
    assert cpu_share(proc, tmp_path / "sys") == 1.0
    assert cpu_share(tmp_path / "missing", tmp_path / "sys") == 1.0  # not Linux


def test_the_timer_is_set_to_what_is_left_times_the_share_of_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    set_to: list[float] = []
    monkeypatch.setattr(signal, "setitimer", lambda which, seconds: set_to.append(seconds))
    watch, clock, _ = _watch()
    watch._timer, watch.cpu_share = True, 0.25
    clock.now = 2.5
    watch.arm()
    assert set_to == [(22.5 - 2.5) * 0.25]  # 5 s of CPU time: 20 s at a quarter of a core


@pytest.fixture
def quarter_core() -> Iterator[Path]:
    """A cgroup (v1) whose processes may use a quarter of a core; skipped where none can be
    made (not root, no v1 cpu controller: CI runs as root on a machine like this one)."""
    folder = Path("/sys/fs/cgroup/cpu") / f"schedtui-test-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"no cgroup to limit the CPU of a process with: {exc}")
    try:
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("25000")
        yield folder
    finally:
        folder.rmdir()  # (its one process has exited)


def test_a_process_limited_to_a_quarter_of_a_core_ends_after_a_quarter_of_the_cpu_time(quarter_core: Path) -> None:
    """A container's CPU limit: the process may burn a quarter of a second of CPU a second,
    so the stuck handler's 2.8 s to the deadline came to 2.8 s of CPU time, 11 s of time,
    far past the window (3 s) where another instance retries its work. The timer is set to
    a quarter: the process ends once it has burnt what a quarter core burns until the
    deadline (counted in CPU time, so whatever else the machine runs)."""
    import signal

    def join() -> None:
        (quarter_core / "cgroup.procs").write_text(str(os.getpid()))

    status, out, err, cpu = holding_the_gil(join)
    assert status == -signal.SIGPROF, (status, out, err)
    assert cpu < 1.6, cpu  # (its start, then 0.7 s; without the share, 2.8 s)
