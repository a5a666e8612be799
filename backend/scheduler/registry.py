"""The instance registry: who is alive, what the dead left running, and what has expired.

Every process that opens a store registers itself (name, host, pid, and what it is to the
fleet: a firing member or an observer, and its coordination mode); a member refreshes its
heartbeat every few seconds, which renews its lease (:mod:`backend.runtime.liveness`).
:meth:`InstanceRegistry.close_abandoned` closes what an instance that is gone left
``running`` (runs as ``failed``/``abandoned``, backfills as ``abandoned``). Gone means:

* its heartbeat is older than ``abandon_after`` (the take-over window), counted from when
  this process could last write the store: a heartbeat that nobody could write during an
  outage is no evidence of death;
* or, sooner, its pid no longer runs (a zombie counts as ended), but only where a pid means
  the same process: the same machine, boot and PID namespace (containers sharing a
  hostname, or ``unshare --pid``, each have their own pids).

The job queue and durable executions ask it the same question. It also runs the
retention sweeps (old runs, old claims) at most once an hour.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from backend.clock import Clock, follows_real_time
from backend.errors import InUse, NameTaken, Unavailable
from backend.model import TAG_ABANDONED, BackfillProgress, CoordinationMode, Role, Run
from backend.runtime.liveness import WorkLease
from backend.runtime.skew import ClockCheck, ClockReading
from backend.safetext import in_line, printable
from backend.scheduler.ledger import RunLedger
from backend.store import Beat, KnowsFirer, Membership, ReadsServerClock, Store, Unfinished

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Most runs the retention sweep deletes in one maintenance round.
PRUNE_ROUND = 20_000
#: An instance silent this long is forgotten (its row removed; a frozen one that beats
#: again is registered again).
FORGET_SILENT = timedelta(days=1)

__all__ = ["InstanceRegistry", "host_identity"]

log = logging.getLogger("schedtui.engine")


def host_identity() -> str:
    """Where this process's pid means something, as recorded with each heartbeat: the
    hostname, the kernel's boot id and the PID namespace, where there are such. A dead pid
    proves a run abandoned only to a process that sees the same pids: two machines that
    share a hostname (cloned VMs, containers named alike) or two containers on one host
    (host networking, ``unshare --pid``) must not judge each other's pids."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip()[:8])
    except OSError:
        return parts[0]
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        namespace = ""
    if namespace:
        parts.append(namespace.removeprefix("pid:[").removesuffix("]"))
    return "#".join(parts)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process here. A zombie (ended, not yet reaped by its
    parent) is not: its work stopped when it did."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # no procfs: the signal check is all there is
    # "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


class InstanceRegistry:
    """This instance's heartbeat, the abandoned-work sweep, and retention.

    Contract: :meth:`gone` says why an instance is dead, or ``None`` while it may be
    alive (this process's own name counts as dead: an earlier process that used it has
    stopped). Work is closed as abandoned only when :meth:`gone` says so and
    ``is_ours(id)`` is false, and only if it is still ``running`` in the store (a
    conditional write), so two live instances never close the same run twice. Each
    heartbeat that commits renews :attr:`lease`; :attr:`role` is what the last one recorded.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        ledger: RunLedger,
        instance: str,
        heartbeat_interval: timedelta,
        abandon_after: timedelta,
        retention: timedelta | None,
        claims_ttl: timedelta | None,
        is_ours: Callable[[str], bool],
        due_at: Callable[[datetime], list[str]] = lambda slot: [],
        new_id: Callable[[], str] = lambda: "",
        lease: WorkLease | None = None,
        coordination: CoordinationMode | None = None,
        defined: Callable[[], Collection[str]] = lambda: (),
    ) -> None:
        self.clock = clock
        self.defined = defined
        """The schedules this process defines: the retention keeps each one's newest timed run."""
        self.store = store
        self.ledger = ledger
        self.instance = instance
        self.host = host_identity()
        self.pid = os.getpid()
        self.abandon_after = abandon_after
        self.lease = lease if lease is not None else WorkLease(abandon_after, None)
        # Three renewals fit in the renewal bound, whatever the window.
        self.heartbeat_interval = min(heartbeat_interval, timedelta(seconds=self.lease.bound / 3))
        self.retention = retention
        self.claims_ttl = claims_ttl
        """Claims older than this are swept (hourly); ``None`` keeps them."""
        self.is_ours = is_ours
        self.due_at = due_at
        """The self-triggered schedules due at a slot (for bursts a dead instance left)."""
        self.new_id = new_id
        self.coordination = coordination
        self.member = False
        """Whether this process arms timers or runs workers (set by the engine's start)."""
        self.role: Role = "observer"
        """What the last heartbeat recorded: ``firing``, ``waiting`` or ``observer``."""
        self.on_role: Callable[[Role, Role], None] | None = None
        """Told (was, now) when a heartbeat records another role for this instance."""
        self.on_abandoned_backfill: Callable[[BackfillProgress, datetime], Awaitable[None]] | None = None
        """Closes a backfill a gone instance left ``running`` (the backfills' own, which
        count its runs and record its end); without it, it is only marked abandoned."""
        self.back_at: datetime | None = None
        """When this process could write the store again after it could not: heartbeat
        ages are counted from then at the earliest (nobody could beat meanwhile)."""
        self.clock_check: ClockCheck | None = (
            ClockCheck(abandon_after) if follows_real_time(clock) and isinstance(store, ReadsServerClock) else None
        )
        """This instance's clock against the store server's, read with each heartbeat (see
        :mod:`backend.runtime.skew`); ``None``: not compared (SQLite, an injected clock)."""
        self._cut_off = False
        self._beating = asyncio.Lock()
        self._last_beat: datetime | None = None
        self._last_prune: datetime | None = None
        self._pruned = 0  # runs removed by the retention sweep under way

    @property
    def fires(self) -> bool:
        """Whether this instance may claim and fire: a member that is not waiting."""
        return self.role == "firing"

    def _membership(self, now: datetime) -> Membership:
        # The clock as the newest reading (the one after the previous heartbeat) judged it:
        # the row tells the fleet which instance stands down for its clock, and by how much.
        check = self.clock_check
        offset, off = (check.offset, check.off) if check is not None else (None, False)
        # A row of this name another process wrote within the take-over window is that
        # process's, alive: the beat leaves it (NameTaken) rather than share the name. Its
        # silence is measured on this clock: while that is off or jumped unconfirmed, no
        # silence is long enough (8 s ahead, it took a name silent 22 s, from a process
        # whose work was not yet anyone's to take, and closed nothing after: its clock off).
        doubtful = off or self.lease.wall_in_doubt
        taken_before = _EPOCH if doubtful else now - self.abandon_after
        window = self.abandon_after.total_seconds()
        if not self.member:
            return Membership("observer", clock_offset=offset, clock_off=off, taken_before=taken_before, window=window)
        return Membership("firing", self.coordination, self._live_after(now), offset, off, taken_before, window)

    def _due(self, now: datetime) -> bool:
        """Whether a heartbeat is due at ``now`` (a clock stepped back since the last one:
        due now, not once it has caught up)."""
        last = self._last_beat
        return last is None or not timedelta(0) <= now - last < self.heartbeat_interval

    def next_beat_at(self, now: datetime, *, failed: bool = False) -> datetime:
        """When the lease loop beats next, at ``now`` after a round: an interval after the
        last heartbeat, so a round the clock moved past while it ran (an injected clock,
        a step ahead) is followed at once by one stamped with the new time, not an interval
        later; never later than an interval from ``now`` (a clock stepped back), and after a
        round that could not write the store, an interval from ``now`` (no tight retry)."""
        later = now + self.heartbeat_interval
        last = self._last_beat
        if failed or last is None:
            return later
        return min(last + self.heartbeat_interval, later)

    async def _beating_round(self, now: datetime, beat: Callable[[datetime], Awaitable[T]], force: bool) -> T | None:
        """One heartbeat (unless one is not due; one under way is waited for, then judged by
        its stamp): renews the lease when it commits, notes when the store comes back after
        it could not be written. ``beat(at)`` writes it, stamped ``at``."""
        if not force and not self._due(now):
            return None
        async with self._beating:
            # ``now`` was read by a caller that may have waited since (a housekeeping round
            # reads it first): stamped with it, a beat would put the row back before the
            # one written meanwhile, and an older `now` would pass for a clock stepped back.
            now = max(now, self.clock.now())
            # A beat under way meanwhile was stamped with its own time: one the clock has
            # moved past by an interval (an injected clock, a clock step) is not fresh now.
            if not force and not self._due(now):
                return None
            self.lease.check_jump()  # (a stamp of a clock that jumped would mislead the others)
            sent = self.lease.sending()
            try:
                result = await beat(now)
            except NameTaken:
                # (the store answered: no outage) Its clock is judged all the same: one
                # that agrees again may take the name once its holder is silent.
                if await self._clock_agrees():
                    self.lease.confirmed(sent)
                raise
            except Unavailable:
                self._cut_off = True
                raise
            if self._cut_off:
                self._cut_off = False
                self.back_at = now
            self._last_beat = now
            if await self._clock_agrees():
                self.lease.renewed(sent)
            return result

    async def _clock_agrees(self) -> bool:
        """Read the store server's clock beside this instance's; whether they agree (a
        reading that cannot be taken keeps the last verdict). A member whose clock is off
        lets its lease lapse at once and renews it only once they agree again."""
        check = self.clock_check
        if check is None:
            return True
        assert isinstance(self.store, ReadsServerClock)
        before = self.clock.now()
        try:
            server = await self.store.server_clock()
        except Unavailable:
            return not check.off
        if check.judge(ClockReading.between(before, server, self.clock.now())):
            if check.off and not self.member:  # (a client: it sends, it runs nothing)
                log.error("CLOCK: %s; what it sends is stamped by the database server's clock until they agree: "
                          "fix its time sync (NTP)", check.describe())  # fmt: skip
            elif check.off:
                log.error(
                    "CLOCK: %s; it stops its work and takes none (nor closes other instances' work; it judges and "
                    "sends alerts by the database server's time) until they agree: fix its time sync (NTP)",
                    check.describe(),
                )
            else:
                log.warning("CLOCK: %s; it renews its lease and takes work again", check.describe())
        if check.off and self.member and not self.lease.lapsed:
            self.lease.lapse(check.describe())
        return not check.off

    @property
    def clock_off(self) -> bool:
        """Whether this instance's clock is off the store server's (see :meth:`_clock_agrees`)."""
        return self.clock_check is not None and self.clock_check.off

    def store_time(self, now: datetime) -> datetime:
        """``now`` as the store server's clock reads it, where this process's clock is off
        that one (by the newest reading); otherwise ``now`` itself. What this process
        stamps for the others to act on (a job's due time) is stamped so: a web process
        five minutes ahead held every job it sent five minutes, one behind ran delayed
        jobs early."""
        check = self.clock_check
        if check is None or not check.off or check.offset is None:
            return now
        return now - timedelta(seconds=check.offset)

    async def beat(self, now: datetime, *, force: bool = False) -> bool:
        """Refresh the heartbeat if it is due (or ``force``); True if it was written."""

        async def beat(at: datetime) -> Role:
            role = await self.store.heartbeat(self.instance, self.host, self.pid, at, self._membership(at))
            self._recorded(role)
            return role

        return await self._beating_round(now, beat, force) is not None

    async def beat_when_due(self, now: datetime) -> bool:
        """See that the heartbeat is no older than its interval at ``now``: write it if
        due, or wait for the one under way. True if one was written meanwhile."""
        before = self._last_beat
        if self._beating.locked():
            async with self._beating:
                pass
        else:
            await self.beat(now)
        return self._last_beat != before

    async def beat_and_sweep(self, now: datetime, *, force: bool = False) -> list[Run]:
        """The periodic round: if the heartbeat is due, refresh it and, reading in the same
        transaction what is left running, close what the dead left (one commit every
        ``heartbeat_interval``, not two)."""

        async def beat(at: datetime) -> Unfinished:
            work = await self.store.heartbeat_and_unfinished(
                self.instance, self.host, self.pid, at, self._membership(at), stuck_after=self.abandon_after
            )
            self._recorded(work.role)
            if work.ended_sessions:
                log.warning(
                    "ended %d database session(s) of this fleet stuck mid-transaction on a silent client for over %s "
                    "(a partition or a frozen process: their locks held the fleet's work)",
                    work.ended_sessions, self.abandon_after,
                )  # fmt: skip
            return work

        work = await self._beating_round(now, beat, force)
        if work is None:
            return []
        return await self._close(work.runs, work.backfills, work.marks, work.instances, at_open=False)

    def _recorded(self, role: Role) -> None:
        if role != self.role and self.member:
            if role == "waiting":
                log.error(
                    "COORDINATION: another instance of this store fires in another coordination mode; this "
                    "instance (%s) fires nothing until no such instance is left (one fleet, one coordination: "
                    "change the mode of every instance, or of none)",
                    self.coordination,
                )
            elif self.role == "waiting":
                log.warning("COORDINATION: no instance fires in another mode any more; this instance fires (%s)", self.coordination)
        was, self.role = self.role, role
        if was != role and self.on_role is not None:
            self.on_role(was, role)

    async def fleet_mode(self, now: datetime) -> CoordinationMode | None:
        """The coordination the live firing members record (the newest heartbeat's; ``None``
        while none fires): what an observer reports, rather than its own default."""
        live_after = self._live_after(now)
        firing = [i for i in await self.store.fleet() if i.fires and i.coordination is not None and i.heartbeat_at > live_after]
        newest = max(firing, key=lambda i: i.heartbeat_at, default=None)
        return newest.coordination if newest is not None else None

    def _live_after(self, now: datetime) -> datetime:
        """Instances whose heartbeat is newer than this may be alive. Just after this process
        could write the store again, any of them may be: nobody could beat meanwhile."""
        if self.back_at is not None and now - self.back_at <= self.abandon_after:
            return _EPOCH
        return now - self.abandon_after

    async def take_name(self) -> None:
        """The first heartbeat, at open, which takes this instance's name in the store.

        A name is held by one process at a time: two under one name each took the other's
        work for its own (each closes, at its start, what "an earlier process with this
        name" left running). So while another process's heartbeat under this name is
        younger than the take-over window, this one does not start: at once when that
        process runs on this host (:class:`InUse`); one whose pid is gone here was this
        name's predecessor, and its row is let go of. Elsewhere (another host, or another
        container: its pid means nothing here) it is waited for: :class:`InUse` if it
        beats again, the name taken once it has been silent for the window (a process that
        crashed, started again in a new container)."""
        waited_for: datetime | None = None
        while True:
            try:
                await self.beat(self.clock.now(), force=True)
                return
            except NameTaken as taken:
                if taken.host == self.host:
                    if taken.pid != self.pid and not pid_alive(taken.pid):
                        await self.store.forget_instance(self.instance, taken.host, taken.pid)
                        continue
                    raise InUse(taken.message) from None
                if waited_for is not None and taken.heartbeat_at > waited_for:
                    raise InUse(taken.message) from None
                # Its silence is judged by its own window when that is longer (a rolling change
                # of --abandon-after), as the heartbeat that takes the name judges it.
                window = max(self.abandon_after, timedelta(seconds=taken.window or 0))
                if waited_for is None:
                    log.warning(
                        'the instance name "%s" was last heard from pid %d on host "%s" at %s: waiting until it '
                        "has been silent for %ss (then this process takes the name) or is heard again (then "
                        "this one stops: give each instance its own name)",
                        printable(self.instance), taken.pid, printable(taken.host.split("#")[0]),
                        taken.heartbeat_at.isoformat(), f"{window.total_seconds():g}",
                    )  # fmt: skip
                waited_for = taken.heartbeat_at
                now = self.clock.now()
                await self.clock.sleep_until(min(now + self.heartbeat_interval, taken.heartbeat_at + window))

    async def forget(self) -> None:
        """Delete this instance's row, unless another process holds the name now."""
        await self.store.forget_instance(self.instance, self.host, self.pid)

    def log_claims_retention(self) -> None:
        """Say at start how old claims are swept."""
        if self.claims_ttl is not None:
            log.info(
                "claims retention: claims older than %gh are swept hourly (renamed and deleted schedules' too)",
                self.claims_ttl.total_seconds() / 3600,
            )
        else:
            log.info("claims retention: off (claims are only pruned by the schedules that win new ones)")

    def holds_name(self) -> bool:
        """Whether this process may take what runs under its own name and is not its own
        for an earlier process's: only while its lease holds. One whose lease lapsed may
        have lost the name meanwhile (cut off or frozen past the window, and replaced by a
        process that took the name; its heartbeats are refused since): what runs under the
        name is then the other process's, and closing it would run that work twice."""
        self.lease.check()
        self.lease.check_jump()
        return not self.lease.lapsed and not self.clock_off

    def gone(self, beats: dict[str, Beat], instance: str, now: datetime) -> str | None:
        if instance == self.instance:
            return "an earlier process with this instance name stopped" if self.holds_name() else None
        beat = beats.get(instance)
        if beat is None:
            return f"instance {instance} is no longer registered"
        host, pid, at, window = beat
        if host == self.host and not pid_alive(pid):
            return f"instance {instance} (pid {pid}) is no longer running"
        silent_since = at if self.back_at is None else max(at, self.back_at)
        # By its own window (its lease lapses at two thirds of it), or ours if longer: an
        # instance started with a longer --abandon-after is not taken over by a shorter one.
        after = self.abandon_after if window is None else max(self.abandon_after, timedelta(seconds=window))
        if now - silent_since > after and not self._holds_firing_lock(instance):
            self.lease.check_jump()
            if self.clock_off or self.lease.lapsed:
                return None  # its clock may be what is off (or jumped): judge nobody dead by it
            if silent_since == at:
                return f"instance {instance} has not sent a heartbeat since {at.isoformat()}"
            return (
                f"instance {instance} has not sent a heartbeat since {at.isoformat()}, nor in the "
                f"{after.total_seconds():g}s since the store was back at {silent_since.isoformat()}"
            )
        return None

    def _holds_firing_lock(self, instance: str) -> bool:
        """On a store with a firing lock (SQLite): its holder is alive, however old its
        heartbeat (a full disk silences it; the kernel's lock does not lie)."""
        store = self.store
        return isinstance(store, KnowsFirer) and store.live_firer() == instance

    async def close_abandoned(self, *, at_open: bool = False) -> list[Run]:
        """Close runs (and backfills) left ``running`` by instances that are gone, and
        record the runs of a burst a dead instance was starting when it died.

        ``at_open``: this process has fired nothing yet, so a mark left under its own
        instance name is a dead predecessor's (later, it is this process's own)."""
        runs, backfills, marks = await self.store.unfinished_work()
        return await self._close(runs, backfills, marks, None, at_open=at_open)

    async def _close(
        self,
        runs: list[Run],
        backfills: list[BackfillProgress],
        marks: dict[str, datetime],
        beats: dict[str, Beat] | None,
        *,
        at_open: bool,
    ) -> list[Run]:
        now = self.clock.now()
        if not at_open:
            marks.pop(self.instance, None)
        if not runs and not backfills and not marks:
            return []
        if self.clock_off:
            return []  # the others' heartbeat ages would be judged by a clock that is off
        if beats is None:
            beats = await self.store.instances()
        closed = await self._close_bursts(marks, beats, now)
        closing: list[Run] = []
        for run in runs:
            if self.is_ours(run.id):
                continue
            why = self.gone(beats, run.instance, now)
            if why is None:
                continue
            if run.held and run.done:  # closed already; its handler stopped with its instance
                log.info("run %s of %s (%s) lets go of its overlap place: %s", run.id, run.name, run.error_tag, why)
                self.ledger.keep(dataclasses.replace(run, held=False))
            else:
                closing.append(run.finish("failed", now, error_tag=TAG_ABANDONED, error_message=why))
        if closing:
            # Hand in our own finished versions first: a run of ours that finished while we
            # looked then lands before this close, which finds it closed. All in one
            # statement: a dead instance's burst, or a burst of ours read just as it
            # finished, is one transaction, not one per run.
            self.ledger.handoff()
            written = await self.store.close_runs(closing)
            for finished in closing:
                if finished.id in written:
                    log.warning("run %s of %s abandoned: %s", finished.id, finished.name, in_line(finished.error_message or ""))
                    closed.append(finished)
                    self.ledger.stats["abandoned"] += 1
                    self.ledger.closed(finished)
        for progress in backfills:
            if self.is_ours(progress.id):
                continue
            if self.gone(beats, progress.instance, now) is not None:
                if self.on_abandoned_backfill is not None:
                    await self.on_abandoned_backfill(progress, now)
                else:
                    await self.store.update_backfill(dataclasses.replace(progress, state="abandoned", finished_at=now))
        return closed

    async def _close_bursts(
        self, marks: dict[str, datetime], beats: dict[str, Beat], now: datetime
    ) -> list[Run]:
        """A dead instance's last burst: the runs due then that never reached the ledger
        (the process died before its group commit) are recorded failed/abandoned."""
        closed: list[Run] = []
        for instance, slot in marks.items():
            why = self.gone(beats, instance, now)
            if why is None:
                continue
            message = (
                f"{why}, while the runs due at {slot.isoformat()} were starting: "
                "neither this run's start nor its result was recorded"
            )
            rows = [
                Run(self.new_id(), name, slot, "failed", "self", "single", instance, None, now, TAG_ABANDONED, message)
                for name in self.due_at(slot)
            ]
            written = await self.store.close_unrecorded(instance, slot, rows)
            for run in written:
                log.warning("run %s of %s abandoned: %s", run.id, run.name, message)
                self.ledger.stats["abandoned"] += 1
                self.ledger.closed(run)
            closed += written
        return closed

    async def _forget_silent(self, now: datetime) -> None:
        """Forget the instances silent for over :data:`FORGET_SILENT` (killed, crashed: only
        a clean stop removes its own row), once the sweep has closed their last burst."""
        silent = [
            (name, beat.host, beat.pid) for name, beat in (await self.store.instances()).items()
            if name != self.instance and now - beat.at > max(FORGET_SILENT, timedelta(seconds=beat.window or 0))
        ]  # fmt: skip
        if not silent:
            return
        marks = await self.store.starting_marks()
        gone = [name for name, _, _ in silent if name not in marks]
        for name, host, pid in silent:
            if name in gone:  # (and by host and pid: a new process under the name is kept)
                await self.store.forget_instance(name, host, pid)
        if gone:
            log.info("forgot %d instance(s) silent for over %s: %s", len(gone), FORGET_SILENT, ", ".join(gone))

    async def prune(self, now: datetime) -> None:
        """The retention sweeps, at most once an hour. The runs' takes :data:`PRUNE_ROUND`
        of them a round, and goes on in the next rounds until none is left: a backlog (the
        first start after a long downtime, a lower ``--retention-days``) is never one long
        delete at start, before anything fires, holding every other write meanwhile."""
        if self._last_prune is not None and now - self._last_prune < timedelta(hours=1):
            return
        if self.retention is not None:
            removed = await self.store.prune_runs(now - self.retention, limit=PRUNE_ROUND, keep=self.defined())
            self._pruned += removed
            if removed >= PRUNE_ROUND:
                return  # more in the next round
            if self._pruned:
                log.info("retention: removed %d run(s) older than %s", self._pruned, self.retention)
            self._pruned = 0
        self._last_prune = now
        if self.member:
            await self._forget_silent(now)
        if self.claims_ttl is not None:
            swept = await self.store.prune_claims(None, now - self.claims_ttl)
            if swept:
                log.info("claims retention: swept %d claim(s) older than %s", swept, self.claims_ttl)
