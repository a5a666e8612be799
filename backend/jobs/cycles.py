"""The dispatcher's claim cycles (a part of :class:`~backend.jobs.workers.Workers`): which
queues a cycle claims for and how many jobs, with a seat and ahead; when the dispatcher
parks; and each cycle's round trip to the store and what comes back (finishes and
handovers handed in, jobs claimed started or left waiting for a seat). The cycles, their
streams and claiming ahead are described in :mod:`backend.jobs.workers`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from backend.clock import Clock
from backend.errors import Unavailable
from backend.jobs.definition import Queue
from backend.jobs.seats import JobRun
from backend.jobs.store import Claimed, Finish, Handover, QueueSpec
from backend.model import TAG_LEASE_LOST
from backend.runtime.runner import Outcome
from backend.runtime.subsystems import keep_for_the_stop

if TYPE_CHECKING:
    from backend.jobs.store import JobStore
    from backend.jobs.system import Jobs
    from backend.runtime.liveness import WorkLease
    from backend.runtime.loops import Loops
    from backend.runtime.outages import OutageLog
    from backend.runtime.runner import HandlerRunner

__all__ = ["AHEAD_MAX", "AHEAD_ROUNDS", "RETRY_AFTER_TROUBLE", "Cycles", "Stream"]

log = logging.getLogger("schedtui.jobs")

#: How long the dispatcher waits after the store failed a cycle before trying again (seconds).
RETRY_AFTER_TROUBLE = 1.0
#: Per queue, jobs claimed ahead at most, in multiples of its concurrency (see the module)...
AHEAD_ROUNDS = 16
#: ... and in all. A cycle's own costs (its statements, commit and round trip, and this
#: process's part) are large beside a short job's: with tests/bench/queue.py's no-op jobs,
#: 4 rounds drained at 0.7 times the rate of 16.
AHEAD_MAX = 256


class Stream:
    """Some of the queues, with their own cycles (see the module): at most one of its
    cycles claims at a time; when none does, at most one more, that only hands in."""

    __slots__ = ("claiming", "names", "tokens")

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.claiming: str | None = None
        """The token of its cycle on its way that claims, if one does. Two that claim the
        same queues would race each other for the same seats and rows: measured with
        tests/bench/queue.py, that drains at half the rate of one."""
        self.tokens: set[str] = set()
        """Its cycles on their way."""


class Cycles:
    """The claim cycles (see the module): a part of :class:`~backend.jobs.workers.Workers`,
    which sets up the state declared here."""

    jobs: Jobs
    clock: Clock
    loops: Loops
    runner: HandlerRunner
    outages: OutageLog
    instance: str
    new_id: Callable[[], str]
    store: JobStore
    lease: WorkLease
    queues: dict[str, Queue]
    async_queues: set[str]
    poll_interval: timedelta
    active: Counter[str]
    asked: Counter[str]
    finishes: list[tuple[Finish, JobRun]]
    inflight: dict[str, list[tuple[Finish, JobRun]]]
    streams: list[Stream]
    stream_of: dict[str, Stream]
    waiting: dict[str, deque[Claimed]]
    ahead_ids: set[str]
    handovers: list[tuple[Handover, JobRun]]
    inflight_handovers: dict[str, list[tuple[Handover, JobRun]]]
    resent: set[tuple[str, int]]
    ahead_asked: Counter[str]
    held: Counter[str]
    revokes: int
    cycled: asyncio.Event
    ended_since: Counter[str]
    fast: set[str]
    due: set[str]
    backlog: set[str]
    next_at: dict[str, datetime | None]
    polled_at: dict[str, datetime]
    trouble_until: datetime | None
    stopping: bool
    wake: asyncio.Event
    defined: bool
    cycles_cut: list[asyncio.Future[Any]]

    if TYPE_CHECKING:  # the other parts'

        def _run(self, claimed: Claimed) -> JobRun: ...

        def _release_stale(self, claimed: list[Claimed]) -> None: ...

        def _release_waiting(self, name: str) -> None: ...

        def _hand_spare_seats(self, name: str) -> None: ...

        def _handed_in(self, run: JobRun, finish: Finish, applied: bool) -> None: ...

        def _unanswered(self, token: str) -> None: ...

    def room(self, queue: Queue) -> int:
        free = queue.concurrency - self.active[queue.name] - self.asked[queue.name]
        if queue.name not in self.async_queues:
            free = min(free, self.runner.pool.max_threads - self.runner.pool.busy - sum(self.asked.values()))
        return free

    def ahead(self, queue: Queue) -> int:
        """How many more jobs of ``queue`` to claim ahead (see the module)."""
        name = queue.name
        if (
            name not in self.async_queues or name not in self.fast or name not in self.backlog
            or not self.store.job_reservations or self.held[name]
        ):  # fmt: skip
            return 0
        return min(AHEAD_ROUNDS * queue.concurrency, AHEAD_MAX) - len(self.waiting[name]) - self.ahead_asked[name]

    def _wanted(self, now: datetime, stream: Stream) -> tuple[dict[str, int], dict[str, int]]:
        if self.stopping or not self.lease.fresh():
            return {}, {}  # (woken when the lease is renewed)
        wanted: dict[str, int] = {}
        ahead: dict[str, int] = {}
        for name in stream.names:
            queue = self.queues[name]
            room = self.room(queue)
            more = self.ahead(queue)
            if room <= 0 and more <= 0:
                continue
            polled = self.polled_at.get(name)
            upcoming = self.next_at.get(name)
            if (
                name in self.due
                or name in self.backlog
                or polled is None
                or polled + self.poll_interval <= now
                or (upcoming is not None and upcoming <= now)
            ):
                if room > 0:
                    wanted[name] = room
                if more > 0:
                    ahead[name] = more
        return wanted, ahead

    def _park_until(self, now: datetime) -> datetime | None:
        if self.trouble_until is not None:
            return self.trouble_until
        if not self.lease.fresh():
            return None  # woken when the lease is renewed
        times = []
        for name, queue in self.queues.items():
            if self.room(queue) <= 0 or self.stream_of[name].claiming is not None:
                continue  # woken by its attempts ending, or by the claim on its way coming back
            polled = self.polled_at.get(name)
            times.append(polled + self.poll_interval if polled is not None else now)
            upcoming = self.next_at.get(name)
            if upcoming is not None:
                times.append(upcoming)
        return min(times) if times else None

    async def _define(self) -> None:
        """Record this process's queue settings (serve is their authority)."""
        specs = [QueueSpec(q.name, q.concurrency, q.attempts, q.max_runtime) for q in self.queues.values()]
        while not self.defined:
            try:
                await self.store.define_queues(specs, self.clock.now(), update=True)
                self.defined = True
                self.outages.back("jobs")
            except Unavailable as exc:
                self.outages.trouble("jobs", "store unavailable to the job workers", exc)
                await self.loops.park("jobs", self.clock.now() + timedelta(seconds=RETRY_AFTER_TROUBLE))

    async def _dispatch(self) -> None:
        await self._define()
        while True:
            now = self.clock.now()
            if self.trouble_until is not None and now >= self.trouble_until:
                self.trouble_until = None
            sent = False
            if self.trouble_until is None:
                for stream in self.streams:
                    sent = self._maybe_send(stream, now) or sent
            if not sent:
                await self.loops.park("jobs", self._park_until(now), self.wake)

    def _maybe_send(self, stream: Stream, now: datetime) -> bool:
        """Send a cycle for ``stream`` if it has reason to: claims to make, or ended
        attempts to hand in with no cycle of its that only hands in on its way."""
        names = stream.names
        mine = len(self.streams) == 1
        # One cycle at a time while handovers are pending or on their way: a later cycle
        # must not overtake the finish that frees a handed-over seat.
        serial = any(mine or run.queue.name in names for _, run in self.handovers) or any(
            self.inflight_handovers.get(token) for token in stream.tokens
        )
        if serial and stream.tokens:
            return False
        if stream.claiming is not None and not self.stopping:
            # Attempts that end while a claim is on its way go with the next cycle: one
            # transaction, not two (the seats they free were not the claim's to take).
            return False
        wanted, ahead = self._wanted(now, stream)
        if not (wanted or ahead) and stream.tokens:
            return False
        if mine:
            batch, self.finishes = self.finishes, []
            handing, self.handovers = self.handovers, []
        else:
            batch = [item for item in self.finishes if item[0].queue in names]
            handing = [item for item in self.handovers if item[1].queue.name in names]
            if batch:
                self.finishes = [item for item in self.finishes if item[0].queue not in names]
            if handing:
                self.handovers = [item for item in self.handovers if item[1].queue.name not in names]
        if not (wanted or ahead or batch or handing):
            return False
        # A job that ended before its handover was written needs none: its finish goes in
        # the same cycle, after the one that freed its seat.
        if handing and batch:
            ending = {f.id for f, _ in batch}
            handing = [item for item in handing if item[0].id not in ending]
        self._send_cycle(stream, batch, handing, wanted, ahead, now)
        return True

    def _send_cycle(
        self,
        stream: Stream,
        batch: list[tuple[Finish, JobRun]],
        handovers: list[tuple[Handover, JobRun]],
        wanted: dict[str, int],
        ahead: dict[str, int],
        now: datetime,
    ) -> None:
        token = self.new_id()
        self.inflight[token] = batch
        self.inflight_handovers[token] = handovers
        stream.tokens.add(token)
        if wanted or ahead:
            stream.claiming = token
        self.asked.update(wanted)
        self.ahead_asked.update(ahead)
        for name in {**wanted, **ahead}:
            self.polled_at[name] = now
            queue = self.queues[name]
            if self.ended_since[name] >= queue.concurrency:
                self.fast.add(name)
            else:
                self.fast.discard(name)
            self.ended_since[name] = 0
            if self.room(queue) <= 0:
                self.due.discard(name)  # all its room is asked for; a later reason sets it again
        epoch = self.lease.epoch  # (what it claims is claimed under this epoch of the lease)
        revokes = self.revokes
        self.loops.spawn(self._cycle(stream, token, batch, handovers, wanted, ahead, now, epoch, revokes), "jobs cycle")

    async def _cycle(
        self,
        stream: Stream,
        token: str,
        batch: list[tuple[Finish, JobRun]],
        handovers: list[tuple[Handover, JobRun]],
        wanted: dict[str, int],
        ahead: dict[str, int],
        now: datetime,
        epoch: int,
        revokes: int,
    ) -> None:
        sending = asyncio.ensure_future(self.store.cycle_jobs(
            [f for f, _ in batch], wanted, self.instance, token, now,
            ahead=ahead or None, handovers=[h for h, _ in handovers],
        ))  # fmt: skip
        try:
            cycle = await asyncio.shield(sending)
        except asyncio.CancelledError:
            # A stop cut it short: the stop waits for its answer before it looks for what
            # it claimed (read first, a claim that commits after would be missed).
            keep_for_the_stop(sending, self.cycles_cut)
            raise
        except Exception as exc:
            if not isinstance(exc, Unavailable):
                log.exception("a job cycle failed")
            self.outages.trouble("jobs", "store unavailable to the job workers", exc)
            for _, run in batch:
                run.spare_seat = None  # (its finish may have been applied: the seat may be free)
            self.finishes[:0] = batch  # handed in again with the next cycle
            self.resent.update((finish.id, finish.tries) for finish, _ in batch)
            self.handovers[:0] = handovers
            self.asked.subtract(wanted)
            self.ahead_asked.subtract(ahead)
            self.inflight.pop(token, None)
            self.inflight_handovers.pop(token, None)
            if wanted or ahead:
                self._unanswered(token)
            stream.tokens.discard(token)
            if stream.claiming == token:
                stream.claiming = None
            self.due.update(wanted)
            self.due.update(ahead)
            self.trouble_until = self.clock.now() + timedelta(seconds=RETRY_AFTER_TROUBLE)
            self.cycled.set()
            self.wake.set()
            return
        self.outages.back("jobs")
        if cycle.in_doubt:
            # A first sending of it lost its answer and the store ran it again: an end not
            # applied now was most likely applied by it, and what its claim took under this
            # token (`running` here, in no hand) goes back untouched at the next sweep. The
            # token is kept before it leaves `inflight` below: the sweep always sees one or
            # the other.
            self.resent.update((finish.id, finish.tries) for finish, _ in batch)
            if wanted or ahead:
                self._unanswered(token)
        for (finish, run), applied in zip(batch, cycle.applied, strict=False):
            self._handed_in(run, finish, applied)
        for (handover, run), moved in zip(handovers, cycle.handed, strict=False):
            if not moved and not run.done:
                # The attempt whose seat it took was closed elsewhere: the seat is not ours.
                message = f"stopped: seat {handover.seat} it started on was taken over (this instance's lease lapsed)"
                self.runner.stop_call(run, Outcome("failed", self.clock.now(), TAG_LEASE_LOST, message))
        claimed_jobs = cycle.claimed
        if claimed_jobs and not self.lease.holds(epoch):
            self._release_stale(claimed_jobs)
            claimed_jobs = []
        got: Counter[str] = Counter()
        for claimed in claimed_jobs:
            got[claimed.queue] += 1
            if claimed.seat is None:
                self.waiting[claimed.queue].append(claimed)
                self.ahead_ids.add(claimed.id)
            else:
                self._run(claimed)
        for name in sorted({f.queue for f, _ in batch} | set(got)):
            self.jobs.shared.events.publish("jobs", name)  # a job started or ended there
        self.asked.subtract(wanted)
        self.ahead_asked.subtract(ahead)
        for name in {**wanted, **ahead}:
            self.next_at[name] = cycle.next_at.get(name)
            if got[name] >= wanted.get(name, 0) + ahead.get(name, 0):
                self.backlog.add(name)
            else:
                self.backlog.discard(name)
            if self.waiting[name] and (self.held[name] or revokes != self.revokes):
                # Claimed before an action on the queue that came meanwhile, or while one
                # is on its way: they go back, the next claim decides anew.
                self._release_waiting(name)
            if self.waiting[name] and not self.active[name]:
                self._hand_spare_seats(name)
                if self.waiting[name] and not self.active[name]:
                    self._release_waiting(name)  # nothing of its queue runs here to hand it a seat
        self.inflight.pop(token, None)  # after its jobs are in `running`: the sweep sees one or the other
        self.inflight_handovers.pop(token, None)
        stream.tokens.discard(token)
        if stream.claiming == token:
            stream.claiming = None
        self.cycled.set()
        self.wake.set()
        self.loops.poke()
