"""Starting schedule runs: the overlap policy, runs in flight, and the ledger rows they make.

A slot this instance owns is handed to :meth:`Launcher.fire`, which applies the schedule's
``on_overlap`` policy against the runs in flight (here, and on other instances as the claim
reported them): ``skip`` records a ``skipped`` run, ``queue`` parks the slot until the run
in flight ends (slot order kept), ``parallel`` starts at once. :meth:`Launcher.launch`
starts a run whatever the policy (Run now, backfills, catch-up). Each run is a
:class:`ScheduleRun`, an invocation of the :class:`~backend.runtime.runner.HandlerRunner`, whose
outcome closes the run exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import textwrap
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from backend.clock import Clock
from backend.errors import Unavailable
from backend.ids import id_batches
from backend.model import TAG_INTERRUPTED, TAG_LEASE_LOST, TAG_UNAVAILABLE, Outcome, Run, RunStatus, Trigger, Turn, iso
from backend.observability.logs import LogTarget
from backend.runtime.runner import TAG_THREADS_EXHAUSTED, HandlerRunner, Invocation, RunnerSaturated
from backend.runtime.runner import Outcome as CallOutcome
from backend.safetext import in_line
from backend.scheduler.ledger import RunLedger
from backend.scheduler.placement import RowPlacement
from backend.schedules import RunContext, Schedule
from backend.store import Store

if TYPE_CHECKING:
    from backend.locks import Lease, Locks

__all__ = ["Launcher", "ScheduleRun"]

log = logging.getLogger("schedtui.engine")

# slot, trigger, outcome, run id (None: a new run, its row written before it starts)
_Queued = tuple[datetime, Trigger, Outcome, str | None]

class ScheduleRun(Invocation):
    """A run of a schedule: its ledger row, and futures for whoever waits on it.

    Made once per firing, so it is lean: its ``running`` row (:attr:`run`) is built when
    first asked for (a run placed before it starts) or when the handler begins, and its
    label only when something logs it."""

    __slots__ = (
        "_finished", "_gone", "_run", "_started", "coordination", "launcher", "lease", "run_id", "schedule", "slot", "trigger",
    )  # fmt: skip

    def __init__(
        self, launcher: Launcher, schedule: Schedule, run_id: str, slot: datetime, trigger: Trigger, outcome: Outcome
    ) -> None:
        name = schedule.name
        # A run in a child process takes no thread here: it is awaited like async work.
        super().__init__("", launcher.max_runtime[name], launcher.runs_async[name])
        self.launcher = launcher
        self.schedule = schedule
        self.run_id = run_id
        self.slot = slot
        self.trigger = trigger
        self.coordination = outcome
        self._run: Run | None = None
        self.lease: Lease | None = None
        """The lease of the schedule's lock, while the run holds it."""
        self._started: asyncio.Future[ScheduleRun] | None = None
        self._finished: asyncio.Future[Run] | None = None
        self._gone: asyncio.Future[None] | None = None

    captured = True

    def log_target(self) -> LogTarget:
        return LogTarget("run", self.run_id)

    @property
    def run(self) -> Run:
        """The run's latest row: ``running`` (``fired_at`` set once its handler began),
        then the finished one."""
        run = self._run
        if run is None:
            # A Run now (or a backfill's run) holds its schedule's place from the commit of
            # its row, before its handler starts: the other instances' overlap checks count
            # it in flight whatever its slot (see Launcher.place), in every mode (under
            # single, the firing process's for a Run now of one that fires nothing).
            held = self.trigger == "manual" and self.schedule.on_overlap != "parallel"
            run = self._run = Run(
                self.run_id, self.schedule.name, self.slot, "running", self.trigger, self.coordination,
                self.launcher.instance, held=held,
            )  # fmt: skip
        return run

    @run.setter
    def run(self, run: Run) -> None:
        self._run = run

    @property
    def label(self) -> str:
        return f"run {self.run_id} of {self.schedule.name}"

    @property
    def thread_name(self) -> str:
        return f"schedtui-run-{self.schedule.name}"

    @property
    def stopped_how(self) -> str:
        return "handler's process was killed" if self.schedule.isolation == "process" else super().stopped_how

    def process_spec(self, arg: RunContext) -> dict[str, Any] | None:
        if self.schedule.isolation != "process":
            return None
        return {
            "file": self.schedule.source_file,
            "schedule": self.schedule.name,
            "context": {
                "name": arg.name,
                "run_id": arg.run_id,
                "scheduled_at": iso(arg.scheduled_at),
                "fired_at": iso(arg.fired_at),
                "trigger": arg.trigger,
                "payload": arg.payload,
                "deadline": iso(arg.deadline),
            },
        }

    def begin(self, now: datetime) -> RunContext:
        """The handler is about to be called: record the run as started."""
        deadline = self.deadline = now + self.max_runtime
        launcher, schedule = self.launcher, self.schedule
        run = self._run = Run(
            self.run_id, schedule.name, self.slot, "running", self.trigger, self.coordination, launcher.instance, now
        )
        launcher.ledger.record(run)
        started = self._started
        if started is not None and not started.done():
            started.set_result(self)
        lease = self.lease
        fence = lease.token if lease is not None else None
        if fence is None and self.coordination == "cluster" and launcher.shard_fence is not None:
            fence = launcher.shard_fence(schedule.name)
        # Positional, in field order: name, run_id, scheduled_at, fired_at, trigger,
        # payload, deadline, jobs, lease, locks, fence.
        return RunContext(
            run.name, run.id, run.scheduled_at, now, run.trigger, schedule.payload, deadline,
            launcher.jobs, lease, launcher.locks, fence,
        )  # fmt: skip

    def settled(self, outcome: CallOutcome) -> None:
        lease, locks = self.lease, self.launcher.locks
        if lease is not None and locks is not None and outcome.status == "succeeded":
            # The release is the last check, as with_lock's: a lock released by force
            # (or taken over) since the last renewal fails the run, never a success.
            self.lease = None  # (released here, not once the handler has returned)
            locks.release_then(lease, lambda: self._confirmed(lease, outcome))
            return
        self.launcher.close(self, outcome.status, outcome.at, outcome.error_tag, outcome.error_message, outcome.traceback)

    def _confirmed(self, lease: Lease, outcome: CallOutcome) -> None:
        """The release of a succeeded run's lease has answered: record the run."""
        if lease.lost.is_set():
            message = f'the lease of lock "{lease.name}" (token {lease.token}) was lost: {lease.lost_reason}'
            self.launcher.close(self, "failed", outcome.at, TAG_LEASE_LOST, message)
        else:
            self.launcher.close(self, outcome.status, outcome.at)

    def ended(self) -> None:
        self.launcher.released(self)
        gone = self._gone
        if gone is not None and not gone.done():
            gone.set_result(None)

    def gone(self) -> asyncio.Future[None]:
        """Resolves once its handler has returned and its place under the overlap policy is
        free (:meth:`Launcher.released`): a run recorded ``timeout`` whose handler runs on
        is finished, not gone."""
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
            if self.has_ended:
                self._gone.set_result(None)
        return self._gone

    def lingers(self) -> None:
        run = self.run
        if run.done:  # its row tells the fleet the place is still held (see Launcher.released)
            self.run = run = dataclasses.replace(run, held=True)
            self.launcher.ledger.keep(run)

    def started(self) -> asyncio.Future[ScheduleRun]:
        """Resolves once the run's ``running`` row is recorded (its handler starting)."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            if self.run.fired_at is not None or self.done:
                self._started.set_result(self)
        return self._started

    def finished(self) -> asyncio.Future[Run]:
        """Resolves with the closed run."""
        if self._finished is None:
            self._finished = asyncio.get_running_loop().create_future()
            if self.run.finished_at is not None:  # (settled, its lock's release may be on its way)
                self._finished.set_result(self.run)
        return self._finished


class Launcher:
    """Applies overlap policies and starts, tracks and closes schedule runs.

    Contract: every run started here is closed exactly once (``succeeded``, ``failed``);
    under ``skip`` and ``queue`` no two runs of one schedule that this instance fired from
    its timers overlap, and queued slots start in slot order; manual runs ignore the policy
    (they start at once) but count as in flight for the timers' slots, which wait for them.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: Store,
        ledger: RunLedger,
        runner: HandlerRunner,
        schedules: dict[str, Schedule],
        instance: str,
        new_id: Callable[[], str],
        poke: Callable[[], None],
    ) -> None:
        self.clock = clock
        self.store = store
        self.ledger = ledger
        self.runner = runner
        self.schedules = schedules
        self.instance = instance
        self.new_id = new_id
        self.new_ids = id_batches(new_id)
        self.poke = poke
        # Per-schedule constants the firing path would otherwise recompute for every run.
        self.max_runtime: dict[str, timedelta] = {}
        self.runs_async: dict[str, bool] = {}
        for schedule in schedules.values():
            self.defined(schedule)
        self.inflight: dict[str, int] = defaultdict(int)
        self.active: dict[str, ScheduleRun] = {}
        self.waiting: dict[str, deque[_Queued]] = defaultdict(deque)
        self.remote: dict[str, str] = {}
        """Schedules whose queued slots wait for a run in flight on another instance."""
        self.takes_turns = False
        """``advisoryLock``: a ``skip`` or ``queue`` run that did not win its turn with its
        claim takes it in the store before it starts (see :meth:`launch`)."""
        self.turns: set[str] = set()
        """Run ids whose claim took their schedule's turn (:attr:`backend.model.Claim.turn`),
        not started or recorded finished yet."""
        self.rechecks_waits = False
        self.blocker_elsewhere: Callable[[str, datetime, str], Awaitable[str | None]] | None = None
        """Under ``single``: the run in flight in another process (a Run now of one that
        fires nothing) that a run of a schedule's slot must not start beside, read from the
        store; what a run that waited asks as it starts, in place of taking a turn."""
        """Where the coordination claims slots (``advisoryLock``, ``cluster``): a run that
        waited after its claim takes its turn in the store as it starts (see :meth:`waits`)."""
        self.waited: set[str] = set()
        """Run ids that waited after their claim, not launched since."""
        self.stopping = False
        self.stop_grace = 0.0
        """The grace of the stop under way (see :meth:`stop`)."""
        self.placement = RowPlacement(store=store, instance=instance)
        """Writes the rows of runs launched without one before they start (see :meth:`launch`)."""
        self.jobs: Any = None
        """What handlers get as ``ctx.jobs`` (the engine's job queue actions)."""
        self.locks: Locks | None = None
        """Takes the lock of a schedule defined with ``lock=`` before its runs start."""
        self.shard_fence: Callable[[str], int | None] | None = None
        """In ``cluster`` coordination: the token of the shard holding a schedule."""
        self._turning: set[asyncio.Future[None]] = set()

    def defined(self, schedule: Schedule) -> None:
        """Take in a schedule's definition (new, or replacing its namesake's)."""
        self.max_runtime[schedule.name] = timedelta(seconds=schedule.max_runtime)
        self.runs_async[schedule.name] = schedule.is_async or schedule.isolation == "process"

    @property
    def idle(self) -> bool:
        return not any(self.inflight.values())

    # -- the overlap policy -------------------------------------------------------------
    def fire(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        run_id: str,
        *,
        remote: str | None = None,
    ) -> Run | None:
        """A slot is due and this instance owns it: apply the overlap policy. ``remote`` is
        a run of the schedule in flight on another instance (from the claim): it counts
        like one of ours. Returns the ``skipped`` run, or ``None`` when the run was started
        or queued (under ``run_id``)."""
        name = schedule.name
        queued = schedule.on_overlap == "queue" and (self.waiting[name] or name in self.remote)
        if (self.inflight[name] or remote or queued) and trigger != "manual":
            if schedule.on_overlap == "skip":
                mine = next((a for a in self.active.values() if a.schedule.name == name), None)  # (any definition of it)
                busy = "" if mine is None else mine.run.id
                if mine is not None and mine.done:
                    busy += f" (recorded {mine.run.error_tag or mine.run.status}; its handler had not returned yet)"
                if not busy and remote:
                    busy = f"{remote} (on another instance)"
                message = f"run {busy} was still in flight" if busy else "a run was still in flight"
                return self.record_closed(schedule, slot, trigger, outcome, run_id, "skipped", "overlap", message)
            if schedule.on_overlap == "queue":
                self.waiting[name].append((slot, trigger, outcome, run_id))
                self.waits(run_id)
                if remote:
                    self.remote[name] = remote  # released by release_remote_waits
                return None
        self.launch(schedule, slot, trigger, outcome, run_id)
        return None

    def enqueue(self, schedule: Schedule, entries: list[_Queued], remote: str | None = None) -> None:
        """Queue slots of a ``queue`` schedule (a catch-up's, lost ones) among those waiting,
        in slot order, and start the first if nothing holds the queue. ``remote``: a run in
        flight on another instance (from the claim) holds it, as in :meth:`fire`."""
        name = schedule.name
        waiting = self.waiting[name]
        merged = sorted([*waiting, *entries], key=lambda entry: entry[0])
        waiting.clear()
        waiting.extend(merged)
        if remote is not None:
            self.remote[name] = remote  # released by release_remote_waits
        elif waiting and not self.inflight[name] and name not in self.remote and not self.stopping:
            slot, trigger, outcome, run_id = waiting.popleft()
            self.launch(schedule, slot, trigger, outcome, run_id)
        for entry in waiting:
            self.waits(entry[3])

    def waits(self, run_id: str | None) -> None:
        """A claimed run waits before it starts (queued, or behind a catch-up's earlier
        slot): by the time it starts, what its claim saw is old (a Run now may have started
        on another instance meanwhile, which counts in flight for what starts after it), and
        a turn it took is stale. It takes its turn in the store as it starts (see
        :meth:`needs_turn`): under ``cluster`` too, whose owner otherwise takes none, and
        under ``single``, which reads instead what other processes run
        (:attr:`blocker_elsewhere`)."""
        if run_id is not None:
            self.turns.discard(run_id)
            if self.rechecks_waits:
                self.waited.add(run_id)

    def launch(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        run_id: str | None = None,
    ) -> ScheduleRun:
        """Start a run now, whatever the overlap policy. When every handler thread is busy
        the run is recorded ``skipped`` (error tag ``threads_exhausted``) instead.

        ``run_id`` is the id of a run whose ``running`` row is in the store already (a
        claim's, or one written by :meth:`place`). Without it the run is new: its row is
        written first (see :mod:`~backend.scheduler.placement`), and its handler starts
        once that row is committed, so a handler that kills its
        process still leaves its run in the ledger, to be closed as abandoned."""
        if run_id is None:
            scheduled = ScheduleRun(self, schedule, self.new_id(), slot, trigger, outcome)
            placed = self.placement.soon(scheduled.run)
            scheduled.gate = asyncio.ensure_future(self._shown(scheduled, placed)) if scheduled.run.held else placed
            # Under single, a timed run launched without an id is a catch-up's, whose slots
            # wait for each other (or in the queue): each reads what other processes run.
            recheck = self.blocker_elsewhere is not None and trigger != "manual" and schedule.on_overlap != "parallel"
        else:
            scheduled = ScheduleRun(self, schedule, run_id, slot, trigger, outcome)
            recheck = self.needs_turn(schedule, trigger, run_id)
        self.inflight[schedule.name] += 1
        self.active[scheduled.run_id] = scheduled
        if recheck:
            self.waited.discard(scheduled.run_id)
            task = asyncio.ensure_future(self._take_turn(scheduled))
            self._turning.add(task)
            task.add_done_callback(self._turned)
        else:
            self.turns.discard(scheduled.run_id)
            self._guarded_start(scheduled)
        return scheduled

    @property
    def turning(self) -> int:
        """Runs waiting for the store's answer to their turn (not started, nor queued)."""
        return len(self._turning)

    def _turned(self, task: asyncio.Future[None]) -> None:
        self._turning.discard(task)
        self.poke()  # (quiesce(runs=False) waits for the answer)

    def _guarded_start(self, scheduled: ScheduleRun) -> None:
        if scheduled.schedule.lock is not None and self.locks is not None:
            self.locks.guard(scheduled, lambda: self._start(scheduled))
        else:
            self._start(scheduled)

    def needs_turn(self, schedule: Schedule, trigger: Trigger, run_id: str) -> bool:
        """Whether this run must take its schedule's turn in the store before it starts:
        in ``advisoryLock``, a timed run of a ``skip`` or ``queue`` schedule whose claim did
        not take it (a queued slot released, a lost or caught-up slot fired later). Its
        claim's overlap check is old by then: another instance may have started a run of
        the schedule since, or be about to (it claimed a later slot before this one). In
        ``cluster``, a run that waited after its claim (:meth:`waits`); in ``single``, one
        that waited, which reads what other processes run instead (:attr:`blocker_elsewhere`)."""
        if trigger == "manual" or schedule.on_overlap == "parallel" or run_id in self.turns:
            return False
        return self.takes_turns or run_id in self.waited

    async def _take_turn(self, scheduled: ScheduleRun) -> None:
        """Take ``scheduled``'s turn (see :meth:`Store.take_turn`), then start it; or, when
        another instance's run holds the place, put it back at the head of its queue to
        wait for that run (``queue``) or record it ``skipped`` (``skip``)."""
        schedule, now = scheduled.schedule, self.clock.now
        turn: Turn | None = None
        try:
            if self.blocker_elsewhere is not None:  # single: no turn to take, only a read
                blocker = await self.blocker_elsewhere(schedule.name, scheduled.slot, self.instance)
                turn = Turn(blocker is None, blocker)
            else:
                turn = await self.store.take_turn(scheduled.run_id, schedule.name, scheduled.slot, self.instance)
        except Unavailable as exc:
            trouble: Exception | None = exc
        else:
            trouble = None
        if scheduled.done:
            return  # stopped meanwhile (recorded so); a turn taken goes with its closed row
        if turn is not None and turn.taken:
            self._guarded_start(scheduled)
            return
        if turn is not None and turn.blocker is None:
            # Its row was closed by another instance meanwhile (it judged this one gone):
            # that is the run's record now, and its handler must not start.
            log.warning("%s not started: its row was closed by another instance meanwhile", scheduled.label)
            self._unlaunch(scheduled)
            self._next_queued(schedule)
            return
        blocker = turn.blocker if turn is not None else None
        if schedule.on_overlap == "queue":
            self._unlaunch(scheduled)
            entry = (scheduled.slot, scheduled.trigger, scheduled.coordination, scheduled.run_id)
            if self.stopping:  # (as stop() records the queued slots)
                self.record_missed(schedule, *entry[:3], "the engine stopped before this queued firing started", entry[3])
                return
            self.waiting[schedule.name].appendleft(entry)
            self.waits(scheduled.run_id)
            self.remote[schedule.name] = blocker or "(unknown: the store was unreachable)"  # see release_remote_waits
            return
        if blocker is not None:
            outcome = CallOutcome("skipped", now(), "overlap", f"run {blocker} was still in flight (on another instance)")
        else:
            outcome = CallOutcome("failed", now(), TAG_UNAVAILABLE, f"not started: cannot take its turn: {trouble}")
        scheduled.settle(outcome)

    def _unlaunch(self, scheduled: ScheduleRun) -> None:
        """Take back a run :meth:`launch` made that never started, as if it had not been."""
        self.active.pop(scheduled.run_id, None)
        self.inflight[scheduled.schedule.name] -= 1
        finished = scheduled._finished
        if finished is not None and not finished.done():  # (a stop waiting for it)
            finished.set_result(scheduled.run)
        self.poke()

    def _start(self, scheduled: ScheduleRun) -> None:
        try:
            self.runner.start(scheduled, scheduled.schedule.handler)
        except RunnerSaturated as exc:
            log.warning("%s not started: %s", scheduled.label, exc)
            scheduled.settle(CallOutcome("skipped", self.clock.now(), TAG_THREADS_EXHAUSTED, f"not started: {exc}"))

    async def _shown(self, scheduled: ScheduleRun, placed: asyncio.Future[bool | None]) -> None:
        """A run that holds its schedule's place (a Run now) starts once its row is
        committed, not when the store refused it: the other processes count it in flight
        by that row alone (the firing one under ``single``, for a Run now of one that fires
        nothing). Only a slow store (no answer yet) lets it start before."""
        if await asyncio.shield(placed) is False and not scheduled.done:
            why = "its row could not be committed, so no other process could count it in flight"
            scheduled.settle(CallOutcome("failed", self.clock.now(), TAG_UNAVAILABLE, f"not started: {why}"))

    def close(
        self,
        scheduled: ScheduleRun,
        status: RunStatus,
        at: datetime,
        error_tag: str | None = None,
        error_message: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """Record the end of a run (called once per run). Its place under the overlap
        policy is freed by :meth:`released`, once its handler has really returned."""
        run = scheduled.run = scheduled.run.finish(
            status, at, error_tag=error_tag, error_message=error_message, traceback=traceback
        )
        if traceback is not None:
            # The handler raised: say so where serve's operator looks (its log), whole. INFO:
            # a handler failing is the ledger's news, not the engine's trouble. Its message
            # on the line itself, escaped, and its traceback indented under it: no text of
            # the handler's makes a line that looks like the engine's own.
            log.info(
                "%s failed: %s: %s\n%s", scheduled.label, error_tag, in_line(error_message or ""),
                textwrap.indent(traceback.rstrip(), "  "),
            )  # fmt: skip
        self.ledger.record(run)
        if scheduled.has_ended:  # recorded after its handler returned: a locked success, confirmed
            self.active.pop(scheduled.run_id, None)
        started, finished = scheduled._started, scheduled._finished
        if started is not None and not started.done():
            started.set_result(scheduled)
        if finished is not None and not finished.done():
            finished.set_result(run)

    def released(self, scheduled: ScheduleRun) -> None:
        """A run's handler has really returned (a sync handler past its deadline returns
        after its run was recorded ``timeout``): only now may the next run of its schedule
        start under ``skip``/``queue``, and its lock go (called once per run)."""
        if scheduled.run.finished_at is not None:  # (else its lock's release records it: see close)
            self.active.pop(scheduled.run_id, None)
        if scheduled.run.held:  # the other instances' overlap checks counted it in flight
            scheduled.run = run = dataclasses.replace(scheduled.run, held=False)
            self.ledger.keep(run)
        if scheduled.lease is not None and self.locks is not None:
            self.locks.release_soon(scheduled.lease)
        self.inflight[scheduled.schedule.name] -= 1
        self._next_queued(scheduled.schedule)
        self.poke()

    def _next_queued(self, schedule: Schedule) -> None:
        """Start the slot at the head of ``schedule``'s queue, if nothing holds it, by the
        schedule's definition now: ``schedule`` is the run's that ended, and a stored
        schedule changed (or deleted and created again) while it ran queued its later slots
        by the new one."""
        name = schedule.name
        if not self.inflight[name] and self.waiting.get(name) and not self.stopping and name not in self.remote:
            slot, trigger, outcome, run_id = self.waiting[name].popleft()
            self.launch(self.schedules.get(name, schedule), slot, trigger, outcome, run_id)

    def record_closed(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        run_id: str | None,
        status: RunStatus,
        error_tag: str | None,
        message: str,
    ) -> Run:
        """Record a slot that did not start (``skipped``) as one closed row."""
        now = self.clock.now()
        run = Run(
            run_id or self.new_id(), schedule.name, slot, status, trigger, outcome, self.instance, now, now, error_tag, message
        )
        self.ledger.record(run)
        return run

    def record_missed(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        why: str,
        run_id: str | None = None,
    ) -> None:
        self.ledger.record(
            Run(
                id=run_id or self.new_id(),
                name=schedule.name,
                scheduled_at=slot,
                status="missed",
                trigger=trigger,
                coordination_outcome=outcome,
                instance=self.instance,
                error_message=why,
            )
        )

    @contextlib.contextmanager
    def missed_on_stop(
        self, schedule: Schedule, slots: Sequence[tuple[datetime, str | None]], outcome: Outcome
    ) -> Iterator[None]:
        """Slots a task fires in order (a catch-up, lost slots), not started yet: if stop()
        cancels the task, record them ``missed`` as it does the queued ones, so none is
        left without a row, nor with its claim's placeholder row ``running``."""
        try:
            yield
        except asyncio.CancelledError:
            for slot, run_id in slots:
                why = "the engine stopped before this catch-up firing started"
                self.record_missed(schedule, slot, "self", outcome, why, run_id)
            raise

    # -- queues waiting on another instance ----------------------------------------------------
    async def release_remote_waits(self) -> None:
        """Start the queued slots that waited for a run on another instance, once no other
        instance has a run of that schedule started, or placed for an earlier slot (so
        queues spread over instances still run one at a time, in slot order)."""
        if not self.remote:
            return
        running = await self.store.running_runs()
        for name in list(self.remote):
            waiting = self.waiting.get(name)
            if not waiting:
                del self.remote[name]
                continue
            head = waiting[0][0]
            blocker = next(
                (
                    r.id
                    for r in running
                    if r.name == name
                    and r.instance != self.instance
                    and (r.fired_at is not None or r.held or r.scheduled_at < head)
                ),
                None,
            )
            if blocker is not None:
                self.remote[name] = blocker
                continue
            del self.remote[name]
            if not self.inflight[name] and not self.stopping:
                slot, trigger, outcome, run_id = waiting.popleft()
                self.launch(self.schedules[name], slot, trigger, outcome, run_id)

    def queued_run(self, run_id: str) -> bool:
        return any(entry[3] == run_id for queue in self.waiting.values() for entry in queue)

    # -- stopping -----------------------------------------------------------------------
    async def stop(self, grace: float) -> None:
        """Let runs in flight finish for up to ``grace`` seconds; record the rest
        ``interrupted`` and the queued slots ``missed``."""
        self.stopping = True
        self.stop_grace = grace
        running: list[asyncio.Future[Any]] = [*self.runner.running_tasks()]
        # Runs still taking their lock (fired just before the stop) get the grace too.
        running += [s.finished() for s in self.active.values() if s.task is None and not s.done]
        if running:
            log.info("waiting up to %.0fs for %d run(s) in flight", grace, len(running))
            await self.runner.loops.within_grace(running, grace)
        self.interrupt("the engine stopped while this run was in flight")
        for name, waiting in self.waiting.items():
            schedule = self.schedules.get(name)
            if schedule is None:  # deleted at run time: its queued slots were recorded then
                waiting.clear()
                continue
            while waiting:
                slot, trigger, outcome, run_id = waiting.popleft()
                self.record_missed(
                    schedule, slot, trigger, outcome, "the engine stopped before this queued firing started", run_id
                )

    def lease_lapsed(self, why: str) -> None:
        """This instance's lease lapsed: stop every run in flight (``failed``/``lease_lost``);
        runs not started yet never start (see :class:`~backend.runtime.runner.HandlerRunner`),
        nor do the slots queued behind them (``queue``): claimed under the lease that lapsed,
        they may be another instance's by now, and are recorded ``missed`` (a run another
        instance closed meanwhile stays as it closed it)."""
        self.interrupt(f"stopped: this instance's lease on its work lapsed ({why})", TAG_LEASE_LOST)
        for name, waiting in self.waiting.items():
            schedule = self.schedules.get(name)
            while waiting:
                slot, trigger, outcome, run_id = waiting.popleft()
                if schedule is not None:
                    self.record_missed(schedule, slot, trigger, outcome,
                                       "not started: this instance's lease lapsed while this slot was queued", run_id)  # fmt: skip

    def interrupt(self, message: str, tag: str = TAG_INTERRUPTED) -> None:
        """Close every run in flight as ``failed``/``interrupted`` (or ``tag``) and cancel
        it (a sync handler's thread runs on until it returns, holding its place)."""
        now = self.clock.now()
        for scheduled in list(self.active.values()):
            self.runner.stop_call(scheduled, CallOutcome("failed", now, tag, message))
