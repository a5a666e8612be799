"""A thread that ends the process when the lease lapses while the event loop is blocked.

The lease is watched on the event loop (:meth:`WorkLease.watch`): at a lapse the engine
cancels its async handlers, and ends the process if sync handlers still run (a thread
cannot be stopped). None of that can happen while an async handler blocks the loop (a
``time.sleep``, a blocking client, a CPU-bound loop in an ``async def``): the heartbeat
stops with it, the other instances take its work over once the window has passed, and
the blocked handler runs on beside its retry. It did: an async job handler that blocked
the loop for 8 s on a fleet whose window is 3 s ran its second attempt elsewhere for
4.4 s while the first was still running, and then this instance took the job back
(attempt 3) while the second ran.

So a thread, which a blocked loop does not stop, looks at the lease on the same clock:
once the renewal bound has passed by more than a grace the loop would have needed to lapse
the lease itself, the loop is blocked; and if a handler is running, the process ends (exit
code :data:`EXIT_LEASE_LAPSED`) before the window is over, as it does for a sync handler at
a lapse. The grace is a third of what is left of the window after the bound (a second at
most); the thread looks twice, a grace apart (a process that has just resumed lets its
loop stop its handlers itself), so the process is gone before the others may take its
work over.

That thread is Python: it needs the GIL, which a handler stuck in one C call never hands
back (a catastrophic regex, ``sum(range(10**10))``, an extension that does not release
it), and then neither the heartbeat nor the thread runs. A job whose handler held the GIL
30 s ran a second attempt elsewhere beside it. So the thread also keeps a CPU-time timer
armed (``ITIMER_PROF``, :attr:`LoopWatch.hard_stop`): each round it sets it to what is
left until its own deadline. A process stuck in C burns CPU without a round, the timer
runs out, and the kernel's ``SIGPROF`` ends the process, after faulthandler (which needs
no GIL) wrote every thread's traceback to stderr (the stuck handler's frame is in it). A
process frozen (SIGSTOP, a suspended VM) burns none: thawed, its loop stops its handlers
itself, as above. The timer is only armed where ``SIGPROF`` is unhandled (a profiler that
samples with it keeps it) and the lease is held.

CPU time runs slower than time where the process may use less than a core: a container's
CPU limit (a quota of 0.5 CPU counts a second of CPU time in two seconds), so the timer
is set to what is left times the share of a core the quota allows (:func:`cpu_share`,
read once from the process's cgroups, v1 or v2). A machine merely overloaded gives the
stuck thread less CPU too, with no quota to read: there the timer ends the process late,
by how overloaded it is.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from backend.runtime.liveness import WorkLease

__all__ = ["EXIT_LEASE_LAPSED", "LoopWatch", "cpu_share"]

log = logging.getLogger("schedtui.engine")

#: The exit code of a process that ends itself because its lease lapsed while handlers it
#: cannot stop ran (EX_TEMPFAIL: a supervisor may start it again at once).
EXIT_LEASE_LAPSED: Final = 75


class LoopWatch:
    """Watches ``lease`` from a thread of its own (see the module). ``busy()`` says whether a
    handler is running; ``end`` ends the process (``None``: only log, for hosts that must
    not exit: ``Engine(exit_when_lease_lapses=False)``)."""

    def __init__(
        self, lease: WorkLease, busy: Callable[[], bool], end: Callable[[int], None] | None = os._exit, *, hard_stop: bool = False
    ) -> None:
        self.lease = lease
        self.busy = busy
        self.end = end
        self.grace = min(1.0, (lease.window.total_seconds() - lease.bound) / 3)
        self.hard_stop = hard_stop
        self.cpu_share = cpu_share() if hard_stop else 1.0
        """The share of a core this process may use at most (see :func:`cpu_share`)."""
        """Whether the thread keeps the CPU-time timer armed behind itself (see the module):
        only where the process may end itself (``end`` is ``os._exit``)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._told = False
        self._seen_at: float | None = None
        self._timer = False
        """Whether the timer is ours to arm (SIGPROF unhandled at the start, faulthandler on it)."""
        self._stderr: int | None = None
        """A copy of the standard error descriptor faulthandler writes to (a handler may close 2)."""

    def check(self) -> bool:
        """Whether the loop is blocked past the lapse with a handler running (then the
        process is ended, or the error logged once)."""
        lease, clock, renewed_at = self.lease, self.lease.clock, self.lease.renewed_at
        if not lease.enforced or clock is None or renewed_at is None or lease.lapsed:
            self._told, self._seen_at = False, None
            return False
        now = clock()
        overdue = now - renewed_at - lease.bound
        if overdue <= self.grace or not self.busy():
            self._seen_at = None
            return False
        # Seen twice, a grace apart: a process just resumed (a suspended VM) gives its loop
        # that long to lapse the lease and stop its handlers itself.
        if self._seen_at is None:
            self._seen_at = now
        if now - self._seen_at < self.grace:
            return False
        what = (
            f"the event loop has been blocked for {overdue + lease.bound:.1f}s, past the lease's renewal bound "
            f"({lease.bound:g}s), while a handler runs (an async handler that blocks the loop: a time.sleep, a "
            "blocking call, a CPU-bound loop)"
        )
        if self.end is None:
            if not self._told:
                self._told = True
                log.error("%s: it may run on beside its retry elsewhere (exit_when_lease_lapses=False)", what)
            return True
        log.critical(
            "ENDING THE PROCESS: %s, so this process ends (exit code %d) before another instance takes its work "
            "over in %gs; give such a handler isolation=\"process\", or make it a plain def (it then runs on a "
            "thread)",
            what, EXIT_LEASE_LAPSED, lease.window.total_seconds(),
        )  # fmt: skip
        sys.stderr.flush()
        self.end(EXIT_LEASE_LAPSED)
        return True

    def deadline(self) -> float | None:
        """When, on the lease clock, :meth:`check` has ended the process at the latest if the
        loop stayed blocked since the last renewal, and half a grace more; ``None`` when it
        would not (the lease lapsed or is not held, not enforced)."""
        lease, renewed_at = self.lease, self.lease.renewed_at
        if not lease.enforced or lease.clock is None or renewed_at is None or lease.lapsed:
            return None
        return renewed_at + lease.bound + 2.5 * self.grace

    def arm(self) -> None:
        """Set the CPU-time timer to what is left until :meth:`deadline` (see the module),
        or disarm it: no deadline, or one passed (the loop is blocked while this thread
        runs: :meth:`check` ends the process)."""
        if not self._timer:
            return
        deadline, clock = self.deadline(), self.lease.clock
        left = 0.0 if deadline is None or clock is None else deadline - clock()
        # (a second of CPU time takes 1/share seconds where the process may use a share of a
        # core: a quota of 0.5 CPU doubled the time to the deadline, past the window)
        signal.setitimer(signal.ITIMER_PROF, max(left, 0.0) * self.cpu_share)

    def _take_timer(self) -> None:
        if not self.hard_stop or signal.getsignal(signal.SIGPROF) is not signal.SIG_DFL:
            return
        self._stderr = os.dup(2)
        # (chained: once the tracebacks are written, SIGPROF's default action ends the process)
        faulthandler.register(signal.SIGPROF, file=self._stderr, all_threads=True, chain=True)
        self._timer = True

    def _give_timer_back(self) -> None:
        if self._timer:
            signal.setitimer(signal.ITIMER_PROF, 0)
            faulthandler.unregister(signal.SIGPROF)
            self._timer = False
        if self._stderr is not None:
            os.close(self._stderr)
            self._stderr = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._take_timer()
        self.arm()  # (before any handler runs: one holding the GIL from its start gives no round)
        self._stop.clear()
        every = max(0.05, self.grace / 4)
        self._thread = threading.Thread(target=self._run, args=(every,), name="schedtui-loop-watch", daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.check()
                self.arm()
            except Exception:  # noqa: BLE001 - the watch must outlive a bad reading
                log.exception("the event loop's watch failed a round")

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        self._give_timer_back()


def cpu_share(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float:
    """The share of a core the process's cgroups let it use, at most 1.0: the smallest
    quota over period of its cgroup and its ancestors (v2's ``cpu.max``, v1's
    ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``); 1.0 without a quota, or where none can
    be read (not Linux, another mount)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return 1.0
    share = 1.0
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, where = rest.partition(":")
        if controllers == "":  # v2: one hierarchy
            mounts, read = [root, root / "unified"], _v2_quota
        elif "cpu" in controllers.split(","):
            mounts, read = [root / controllers, root / "cpu", root / "cpu,cpuacct"], _v1_quota
        else:
            continue
        parts = [part for part in where.split("/") if part not in ("", ".", "..")]
        for mount in mounts:
            for depth in range(len(parts), -1, -1):  # the cgroup, then each ancestor
                quota = read(mount.joinpath(*parts[:depth]))
                if quota is not None:
                    share = min(share, quota)
    return share


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return int(quota) / int(period) if quota != "max" and int(period) > 0 and int(quota) > 0 else None
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None
