"""The instance registry: who is alive, what the dead left running, and what has expired.

Every process that opens a store registers itself (name, host, pid) and refreshes its
heartbeat every few seconds. :meth:`InstanceRegistry.close_abandoned` closes what an
instance that is gone left ``running`` (runs as ``failed``/``abandoned``, backfills as
``abandoned``): gone means, on the same machine, that its pid no longer exists, and
anywhere, that its heartbeat is older than ``abandon_after``. Schedules use it today; the
job queue and durable executions ask it the same question. It also runs the retention
sweeps (old runs, old claims) at most once an hour.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta

from .clock import Clock
from .ledger import RunLedger
from .model import TAG_ABANDONED, BackfillProgress, Run
from .store import Store

__all__ = ["InstanceRegistry", "default_instance_name", "host_identity"]

log = logging.getLogger("schedtui.engine")


def default_instance_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def host_identity() -> str:
    """This machine, as recorded with each instance's heartbeat: the hostname, plus the
    kernel's boot id where there is one. A dead pid proves a run abandoned only to a
    process on the same machine; two machines that share a hostname (cloned VMs, two
    containers named alike) must not judge each other's pids."""
    host = socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{host}#{f.read().strip()[:8]}"
    except OSError:
        return host


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class InstanceRegistry:
    """This instance's heartbeat, the abandoned-work sweep, and retention.

    Contract: :meth:`gone` says why an instance is dead, or ``None`` while it may be
    alive (this process's own name counts as dead: an earlier process that used it has
    stopped). Work is closed as abandoned only when :meth:`gone` says so and
    ``is_ours(id)`` is false, and only if it is still ``running`` in the store (a
    conditional write), so two live instances never close the same run twice.
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
    ) -> None:
        self.clock = clock
        self.store = store
        self.ledger = ledger
        self.instance = instance
        self.host = host_identity()
        self.heartbeat_interval = heartbeat_interval
        self.abandon_after = abandon_after
        self.retention = retention
        self.claims_ttl = claims_ttl
        """Claims older than this are swept (hourly); ``None`` keeps them."""
        self.is_ours = is_ours
        self.due_at = due_at
        """The self-triggered schedules due at a slot (for bursts a dead instance left)."""
        self.new_id = new_id
        self._last_beat: datetime | None = None
        self._last_prune: datetime | None = None

    async def beat(self, now: datetime, *, force: bool = False) -> bool:
        """Refresh the heartbeat if it is due (or ``force``); True if it was written."""
        if not force and self._last_beat is not None and now - self._last_beat < self.heartbeat_interval:
            return False
        await self.store.heartbeat(self.instance, self.host, os.getpid(), now)
        self._last_beat = now
        return True

    async def beat_and_sweep(self, now: datetime) -> list[Run]:
        """The periodic round: if the heartbeat is due, refresh it and, reading in the same
        transaction what is left running, close what the dead left (one commit every
        ``heartbeat_interval``, not two)."""
        if self._last_beat is not None and now - self._last_beat < self.heartbeat_interval:
            return []
        work = await self.store.heartbeat_and_unfinished(self.instance, self.host, os.getpid(), now)
        self._last_beat = now
        return await self._close(work.runs, work.backfills, work.marks, work.instances, at_open=False)

    async def forget(self) -> None:
        await self.store.forget_instance(self.instance)

    def log_claims_retention(self) -> None:
        """Say at start how old claims are swept."""
        if self.claims_ttl is not None:
            log.info(
                "claims retention: claims older than %gh are swept hourly (renamed and deleted schedules' too)",
                self.claims_ttl.total_seconds() / 3600,
            )
        else:
            log.info("claims retention: off (claims are only pruned by the schedules that win new ones)")

    def gone(self, beats: dict[str, tuple[str, int, datetime]], instance: str, now: datetime) -> str | None:
        if instance == self.instance:
            return "an earlier process with this instance name stopped"
        beat = beats.get(instance)
        if beat is None:
            return f"instance {instance} is no longer registered"
        host, pid, at = beat
        if host == self.host and not pid_alive(pid):
            return f"instance {instance} (pid {pid}) is no longer running"
        if now - at > self.abandon_after:
            return f"instance {instance} has not sent a heartbeat since {at.isoformat()}"
        return None

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
        beats: dict[str, tuple[str, int, datetime]] | None,
        *,
        at_open: bool,
    ) -> list[Run]:
        now = self.clock.now()
        if not at_open:
            marks.pop(self.instance, None)
        if not runs and not backfills and not marks:
            return []
        if beats is None:
            beats = await self.store.instances()
        closed = await self._close_bursts(marks, beats, now)
        closing: list[Run] = []
        for run in runs:
            if self.is_ours(run.id):
                continue
            why = self.gone(beats, run.instance, now)
            if why is not None:
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
                    log.warning("run %s of %s abandoned: %s", finished.id, finished.name, finished.error_message)
                    closed.append(finished)
                    self.ledger.stats["abandoned"] += 1
                    self.ledger.tell(finished)
        for progress in backfills:
            if self.is_ours(progress.id):
                continue
            if self.gone(beats, progress.instance, now) is not None:
                await self.store.update_backfill(dataclasses.replace(progress, state="abandoned", finished_at=now))
        return closed

    async def _close_bursts(
        self, marks: dict[str, datetime], beats: dict[str, tuple[str, int, datetime]], now: datetime
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
                self.ledger.tell(run)
            closed += written
        return closed

    async def prune(self, now: datetime) -> None:
        """The retention sweeps, at most once an hour."""
        if self._last_prune is not None and now - self._last_prune < timedelta(hours=1):
            return
        self._last_prune = now
        if self.retention is not None:
            removed = await self.store.prune_runs(now - self.retention)
            if removed:
                log.info("retention: removed %d run(s) older than %s", removed, self.retention)
        if self.claims_ttl is not None:
            swept = await self.store.prune_claims(None, now - self.claims_ttl)
            if swept:
                log.info("claims retention: swept %d claim(s) older than %s", swept, self.claims_ttl)
