"""The scheduler engine: timers, overlap, watchdog, catch-up and operator actions.

One :class:`Engine` drives a set of schedules against one store. Its moving parts:

* **Timers.** Every ``self``-triggered schedule has exactly one armed slot at a time; when
  that slot is due the schedule fires and re-arms for its next slot, whatever the handler
  does. All armed slots sit in one heap watched by one loop, so a thousand schedules due
  at the same second wake the loop once, start their handlers back to back, and only
  then spend time computing their next slots.
* **Overlap.** A firing that finds a run of its schedule still in flight is skipped
  (recorded ``skipped``), queued behind it, or started alongside, per ``on_overlap``.
* **Watchdog.** Every run has a deadline (``max_runtime``). Past it the run is recorded
  ``failed``/``timeout``; an async handler is cancelled, a sync one (a thread, which
  cannot be killed) is abandoned to finish on its own, unobserved.
* **Catch-up.** At start, and whenever the engine finds itself more than one slot behind
  (a suspended VM, a blocked loop), the slots it missed are handled per ``backfill``:
  recorded ``missed``, the newest fired once, or all fired in order. At most
  ``catch_up_limit`` (1,000) slots are considered.
* **The ledger.** Every run is written through the store's group commit; the engine
  never waits on the disk before starting a handler.

Time comes only from the injected :class:`~backend.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import inspect
import itertools
import logging
import os
import socket
import threading
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Any, Literal

from .clock import Clock, SystemClock
from .coordination import ClaimCoordinator, Coordinator, SingleCoordinator
from .errors import BadInput, NotFound, Refused, Unavailable
from .ids import IdFactory
from .model import (
    BACKFILL_CONFIRM_ABOVE,
    BACKFILL_DEFAULT_LIMIT,
    BACKFILL_MAX_LIMIT,
    TAG_ABANDONED,
    TAG_INTERRUPTED,
    TAG_TIMEOUT,
    BackfillPlan,
    BackfillProgress,
    Claim,
    ClaimResult,
    CoordinationMode,
    Outcome,
    Run,
    RunContext,
    RunStatus,
    ScheduleState,
    ScheduleView,
    Trigger,
    slot_key,
    utc,
)
from .schedules import Schedule
from .store import Store, open_store

__all__ = ["Engine", "ExternalFiring", "RunListener"]

log = logging.getLogger("schedtui.engine")

RunListener = Callable[[Run], None]
"""Called on the engine's loop with every run version the engine records."""

_MAX_ERROR_MESSAGE = 2000
# Handlers due at one instant are started in slices of this size, yielding to the loop in
# between, so the first ones start before the last ones are even created.
_START_SLICE = 32
_NOBODY: Any = None  # what _launch(notify=False) returns


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(eq=False, slots=True)
class _Active:
    """A run this engine started and has not closed yet."""

    run: Run
    schedule: Schedule
    deadline: datetime
    done: asyncio.Future[Run]
    task: asyncio.Task[None] | None = None
    closed: bool = False


@dataclass
class _Loop:
    """Where one of the engine's own loops is parked (for :meth:`Engine.quiesce`)."""

    parked: bool = False
    until: datetime | None = None
    wake: asyncio.Event | None = None
    """Set by whoever has new work for the loop; a set event means it is not idle."""


@dataclass(frozen=True)
class ExternalFiring:
    """What an external fire did: the run of the due slot, and whether this call made it."""

    run_id: str
    run: Run | None
    """``None`` only while the firing waits behind a run in flight (``on_overlap="queue"``)."""
    created: bool
    """False when the slot had already been fired (a retry): ``run`` is that firing."""
    queued: bool = False


@dataclass
class _BackfillJob:
    progress: BackfillProgress
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)


class Engine:
    """Fires schedules, records every run, and carries out operator actions.

    Use ``await engine.start()`` to arm timers (what ``schedtui serve`` does), or only
    ``await engine.open()`` to act on the store without firing anything on the clock (what
    the other CLI verbs do). ``await engine.stop()`` shuts down cleanly.
    """

    def __init__(
        self,
        schedules: Iterable[Schedule],
        store: Store | str | None = None,
        *,
        clock: Clock | None = None,
        instance: str | None = None,
        coordination: CoordinationMode | Coordinator | None = None,
        default_trigger: Literal["self", "external"] = "self",
        retention: timedelta | None = timedelta(days=30),
        claims_ttl: timedelta | None = timedelta(hours=24),
        catch_up_limit: int = 1000,
        state_poll_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        abandon_after: float = 30.0,
        shutdown_grace: float = 30.0,
        external_tolerance: timedelta = timedelta(minutes=10),
        external_early: timedelta = timedelta(seconds=5),
        ids: Callable[[], str] | None = None,
    ) -> None:
        self.schedules: dict[str, Schedule] = {}
        for schedule in schedules:
            if schedule.name in self.schedules:
                raise BadInput(f'schedule name "{schedule.name}" is given twice')
            self.schedules[schedule.name] = schedule
        self.store: Store = store if store is not None and not isinstance(store, str) else open_store(store)
        self.clock: Clock = clock or SystemClock()
        self.instance = instance or default_instance_name()
        self.host = host_identity()
        self.coordinator = self._make_coordinator(coordination)
        self.default_trigger = default_trigger
        self.retention = retention
        self.claims_ttl = claims_ttl
        """Claims older than this are swept (hourly); ``None`` keeps them."""
        self.catch_up_limit = catch_up_limit
        self.state_poll_interval = timedelta(seconds=state_poll_interval)
        self.heartbeat_interval = timedelta(seconds=heartbeat_interval)
        self.abandon_after = timedelta(seconds=abandon_after)
        self.shutdown_grace = shutdown_grace
        self.external_tolerance = external_tolerance
        self.external_early = external_early
        self._external_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.new_id = ids or IdFactory(self.clock.now)
        # Per-schedule constants the firing path would otherwise recompute for every run.
        self._max_runtime = {n: timedelta(seconds=s.max_runtime) for n, s in self.schedules.items()}
        self._is_async = {n: s.is_async for n, s in self.schedules.items()}

        self._states: dict[str, ScheduleState] = {}
        self._opened = False
        self._started = False
        self._stopping = False
        # timers
        # One heap entry per distinct armed slot, with the schedules armed for it: a
        # thousand schedules due at one second cost one heap operation, not a thousand.
        self._heap: list[datetime] = []
        self._due_at: dict[datetime, list[str]] = {}
        self._armed: dict[str, tuple[datetime, datetime]] = {}  # name -> (slot, the slot after)
        self._seq = itertools.count()
        self._timer_wake: asyncio.Event | None = None
        # runs in flight
        self._inflight: dict[str, int] = defaultdict(int)
        self._active: dict[str, _Active] = {}
        self._waiting: dict[str, deque[tuple[datetime, Trigger, Outcome, str]]] = defaultdict(deque)
        self._watch: list[tuple[datetime, int, str]] = []
        self._watch_wake: asyncio.Event | None = None
        # ledger hand-off
        self._buffer: list[Run] = []
        self._handoff_pending = False
        self._hold_handoff = False  # set while a burst of due slots is being started
        self._listeners: list[RunListener] = []
        # bookkeeping
        self._loops: dict[str, _Loop] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._catching_up: set[str] = set()
        self._backfills: dict[str, _BackfillJob] = {}
        self._poke: asyncio.Event | None = None
        self._last_beat: datetime | None = None
        self._last_prune: datetime | None = None
        self.stats: dict[str, int] = defaultdict(int)
        # coordination across instances
        self._claimed: set[str] = set()
        """Run ids this engine won a claim for whose run is not recorded finished yet."""
        self._lost: dict[str, dict[datetime, str]] = defaultdict(dict)
        """Slots that could not be claimed (store unreachable), with the run id proposed;
        claimed and recorded once the store is back (see :meth:`_recover_lost`)."""
        self._remote: dict[str, str] = {}
        """Schedules whose queued slots wait for a run in flight on another instance."""
        self._store_down_at: datetime | None = None
        self._store_warned: dict[str, int] = {}

    def _make_coordinator(self, coordination: CoordinationMode | Coordinator | None) -> Coordinator:
        if coordination is not None and not isinstance(coordination, str):
            return coordination
        mode = coordination or self.store.default_coordination
        if mode == "single":
            return SingleCoordinator()
        if mode == "advisoryLock":
            return ClaimCoordinator(self.store)
        raise BadInput(f'coordination "{mode}" is not one of single, advisoryLock')

    @property
    def coordination(self) -> CoordinationMode:
        return self.coordinator.mode

    # ------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the store, register this instance, close what dead processes left running."""
        if self._opened:
            return
        self._poke = asyncio.Event()
        self._timer_wake = asyncio.Event()
        self._watch_wake = asyncio.Event()
        await self.store.open()
        self._opened = True
        now = self.clock.now()
        await self.store.heartbeat(self.instance, self.host, os.getpid(), now)
        self._last_beat = now
        self._states = await self.store.get_states()
        await self.close_abandoned()
        await self._prune(now)
        self._loops["watchdog"] = _Loop()  # busy until it first parks
        self._spawn(self._loop_watchdog(), "watchdog")

    async def start(self) -> None:
        """Open, catch up on missed slots, arm every enabled self-triggered schedule."""
        await self.open()
        if self._started:
            return
        self._started = True
        log.info(
            "starting %d schedule(s) (self=%d external=%d) coordination=%s instance=%s store=%s",
            len(self.schedules),
            sum(1 for s in self.schedules.values() if self._trigger_of(s) == "self"),
            sum(1 for s in self.schedules.values() if self._trigger_of(s) == "external"),
            self.coordination,
            self.instance,
            self.store.where,
        )
        if self.claims_ttl is not None:
            log.info(
                "claims retention: claims older than %gh are swept hourly (renamed and deleted schedules' too)",
                self.claims_ttl.total_seconds() / 3600,
            )
        else:
            log.info("claims retention: off (claims are only pruned by the schedules that win new ones)")
        now = self.clock.now()
        for schedule in self.schedules.values():
            if self._trigger_of(schedule) == "self" and self.is_enabled(schedule.name):
                self._catching_up.add(schedule.name)
                self._spawn(self._boot_catch_up(schedule, now), f"catch-up {schedule.name}")
        self._loops["timers"], self._loops["maintenance"] = _Loop(), _Loop()
        self._spawn(self._loop_timers(), "timers")
        self._spawn(self._loop_maintenance(), "maintenance")

    async def stop(self, grace: float | None = None) -> None:
        """Stop firing, let runs in flight finish (up to ``grace`` seconds), record the rest."""
        if not self._opened or self._stopping:
            return
        self._stopping = True
        grace = self.shutdown_grace if grace is None else grace
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        running = [a.task for a in self._active.values() if a.task is not None]
        if running:
            log.info("waiting up to %.0fs for %d run(s) in flight", grace, len(running))
            if grace > 0:
                await asyncio.wait(running, timeout=grace)
        now = self.clock.now()
        for active in list(self._active.values()):
            self._close(active, "failed", now, TAG_INTERRUPTED, "the engine stopped while this run was in flight")
            if active.task is not None:
                active.task.cancel()
        for name, waiting in self._waiting.items():
            schedule = self.schedules[name]
            while waiting:
                slot, trigger, outcome, run_id = waiting.popleft()
                self._record_missed(
                    schedule, slot, trigger, outcome, "the engine stopped before this queued firing started", run_id
                )
        self._handoff()
        try:
            await self.store.flush()
            await self.store.forget_instance(self.instance)
        except Unavailable as exc:
            log.warning("could not write the last runs: %s", exc)
        await self.store.close()
        self._opened = False

    def interrupt(self) -> None:
        """Stop waiting for the runs in flight: record them ``failed``/``interrupted`` and
        cancel them (a sync handler's thread cannot be cancelled and is abandoned)."""
        now = self.clock.now()
        for active in list(self._active.values()):
            self._close(active, "failed", now, TAG_INTERRUPTED, "interrupted while the engine was stopping")
            if active.task is not None:
                active.task.cancel()

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"schedtui {name}")
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s crashed", name, exc_info=t.exception())
            self._poke_waiters()

        task.add_done_callback(done)
        return task

    # ------------------------------------------------------------------------------------
    # listeners and the ledger hand-off
    # ------------------------------------------------------------------------------------
    def add_listener(self, listener: RunListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: RunListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def _record(self, run: Run) -> None:
        if run.status != "running":
            self._claimed.discard(run.id)
        self._buffer.append(run)
        if not self._handoff_pending and not self._hold_handoff:
            self._handoff_pending = True
            # After the tasks already scheduled (handlers starting), not before them.
            asyncio.get_running_loop().call_soon(self._scheduled_handoff)
        self.stats[run.status] += 1
        for listener in self._listeners:
            try:
                listener(run)
            except Exception:
                log.exception("a run listener failed")

    def _scheduled_handoff(self) -> None:
        self._handoff_pending = False
        if not self._hold_handoff:
            self._handoff()

    def _handoff(self) -> None:
        self._handoff_pending = False
        if self._buffer:
            batch, self._buffer = self._buffer, []
            self.store.save_runs(batch)

    async def flush(self) -> None:
        """Return once every run recorded so far is committed to the store."""
        self._handoff()
        await self.store.flush()

    # ------------------------------------------------------------------------------------
    # quiescence (for tests and demos driven by a ManualClock)
    # ------------------------------------------------------------------------------------
    def _poke_waiters(self) -> None:
        if self._poke is not None:
            self._poke.set()

    def _settled(self, runs: bool = True) -> bool:
        now = self.clock.now()
        for loop in self._loops.values():
            if not loop.parked or (loop.until is not None and loop.until <= now):
                return False
            if loop.wake is not None and loop.wake.is_set():
                return False
        if not runs:
            return True
        return (
            not any(self._inflight.values())
            and not self._catching_up
            and not any(job.task is not None and not job.task.done() for job in self._backfills.values())
        )

    async def quiesce(self, *, runs: bool = True) -> None:
        """Wait until every due slot has fired and every run in flight has finished and is
        committed. Meant for a :class:`~backend.clock.ManualClock`: after moving it, this
        returns once the engine has done everything the new time calls for. With
        ``runs=False`` it waits only for the engine's own loops (timers, watchdog,
        housekeeping) to have handled the new time, not for handlers to finish."""
        assert self._poke is not None, "open() the engine first"
        while True:
            self._poke.clear()
            if self._settled(runs):
                await self.flush()
                if self._settled(runs):
                    return
                continue
            await self._poke.wait()

    async def _park(self, name: str, until: datetime | None, wake: asyncio.Event | None = None) -> None:
        """Sleep on the clock until ``until`` (or forever), or until ``wake`` is set."""
        state = self._loops.setdefault(name, _Loop())
        state.parked, state.until, state.wake = True, until, wake
        self._poke_waiters()
        try:
            waiters: list[asyncio.Future[Any]] = []
            if until is not None:
                waiters.append(asyncio.ensure_future(self.clock.sleep_until(until)))
            if wake is not None:
                waiters.append(asyncio.ensure_future(wake.wait()))
            if not waiters:
                await asyncio.Future()  # until cancelled
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if wake is not None:
                wake.clear()
        finally:
            state.parked = False

    # ------------------------------------------------------------------------------------
    # state
    # ------------------------------------------------------------------------------------
    def schedule(self, name: str) -> Schedule:
        try:
            return self.schedules[name]
        except KeyError:
            raise NotFound(f'no schedule named "{name}"') from None

    def _trigger_of(self, schedule: Schedule) -> Literal["self", "external"]:
        return schedule.effective_trigger(self.default_trigger)

    def is_enabled(self, name: str) -> bool:
        state = self._states.get(name)
        return state.enabled if state is not None else self.schedule(name).enabled

    def next_fire_at(self, name: str) -> datetime | None:
        schedule = self.schedule(name)
        return self._next_fire(schedule, self.is_enabled(name))

    def _next_fire(self, schedule: Schedule, enabled: bool) -> datetime | None:
        if not enabled or self._trigger_of(schedule) == "external":
            return None
        armed = self._armed.get(schedule.name)
        if armed is not None:
            return armed[0]
        return schedule.cron.next(self.clock.now())

    def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        """The next ``count`` slots of a schedule, whatever its state (for previews)."""
        schedule = self.schedule(name)
        slots, at = [], self.clock.now()
        for _ in range(count):
            at = schedule.cron.next(at)
            slots.append(at)
        return slots

    async def refresh_states(self) -> None:
        """Re-read enabled/disabled from the store and arm or disarm what changed."""
        states = await self.store.get_states()
        for name, state in states.items():
            if name in self.schedules and self._states.get(name) != state:
                self._apply_state(state)

    def _apply_state(self, state: ScheduleState) -> None:
        was = self.is_enabled(state.name)
        self._states[state.name] = state
        if not self._started or state.enabled == was:
            return
        schedule = self.schedules[state.name]
        if self._trigger_of(schedule) != "self":
            return
        if state.enabled:
            log.info("schedule %s enabled by %s", state.name, state.changed_by)
            self._arm(schedule, self.clock.now())
        else:
            log.info("schedule %s disabled by %s", state.name, state.changed_by)
            self._armed.pop(state.name, None)

    async def list_schedules(self) -> list[ScheduleView]:
        """Every schedule with its state, next slot, newest self/external run and newest
        manual run (when that is its newest run)."""
        self._handoff()
        await self.refresh_states()
        return await self._views(list(self.schedules))

    async def get_schedule(self, name: str) -> ScheduleView:
        self.schedule(name)
        return (await self._views([name]))[0]

    async def _views(self, names: list[str]) -> list[ScheduleView]:
        last = await self.store.last_runs(names)
        latest = await self.store.last_runs(names, manual=True)
        views = []
        for name in names:
            newest = latest.get(name)
            manual = newest if newest is not None and newest.trigger == "manual" else None
            views.append(self._view(self.schedules[name], last.get(name), manual))
        return views

    def _view(self, schedule: Schedule, last_run: Run | None, latest_manual: Run | None = None) -> ScheduleView:
        state = self._states.get(schedule.name)
        enabled = state.enabled if state is not None else schedule.enabled
        return ScheduleView(
            name=schedule.name,
            cron=schedule.cron.expr,
            timezone=schedule.timezone,
            trigger=self._trigger_of(schedule),
            on_overlap=schedule.on_overlap,
            backfill=schedule.backfill,
            max_runtime_s=schedule.max_runtime,
            description=schedule.description,
            payload=schedule.payload,
            enabled=enabled,
            state_note=state.state_note if state is not None else None,
            next_fire_at=self._next_fire(schedule, enabled),
            last_run=last_run,
            latest_manual=latest_manual,
        )

    async def list_runs(
        self, name: str, *, limit: int = 50, before: str | None = None
    ) -> tuple[list[Run], str | None]:
        """A page of a schedule's runs, newest first, and the ``before`` of the next page
        (``None`` on the last). ``before`` is the last id of the previous page."""
        self.schedule(name)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise BadInput(f"limit {limit!r} is out of range (1-1000)", field="limit")
        self._handoff()
        runs = await self.store.list_runs(name, limit=limit + 1, before=before)
        if len(runs) > limit:  # one more than asked for: there is an older page
            return runs[:limit], runs[limit - 1].id
        return runs, None

    async def get_run(self, run_id: str) -> Run:
        active = self._active.get(run_id)
        if active is not None:
            return active.run
        await self.flush()  # a run that just finished may still be on its way to the store
        run = await self.store.get_run(run_id)
        if run is None:
            raise NotFound(f'no run with id "{run_id}"')
        return run

    # ------------------------------------------------------------------------------------
    # timers
    # ------------------------------------------------------------------------------------
    def _arm(self, schedule: Schedule, after: datetime) -> None:
        slot = schedule.cron.next(after)
        self._arm_at(schedule, slot, schedule.cron.next(slot))

    def _arm_at(self, schedule: Schedule, slot: datetime, following: datetime) -> None:
        self._armed[schedule.name] = (slot, following)
        names = self._due_at.get(slot)
        if names is None:
            self._due_at[slot] = [schedule.name]
            heapq.heappush(self._heap, slot)
        else:
            names.append(schedule.name)
        timers = self._loops.get("timers")
        if timers is None or not timers.parked or timers.until is None or slot < timers.until:
            if self._timer_wake is not None:
                self._timer_wake.set()

    async def _loop_timers(self) -> None:
        assert self._timer_wake is not None
        while True:
            now = self.clock.now()
            if not self._heap or self._heap[0] > now:
                await self._park("timers", self._heap[0] if self._heap else None, self._timer_wake)
                continue
            due: list[tuple[Schedule, datetime, datetime]] = []
            behind: list[tuple[Schedule, datetime]] = []
            while self._heap and self._heap[0] <= now:
                slot = heapq.heappop(self._heap)
                for name in self._due_at.pop(slot):
                    armed = self._armed.get(name)
                    if armed is None or armed[0] != slot:
                        continue  # disarmed or re-armed since: a stale entry
                    schedule = self.schedules[name]
                    if armed[1] <= now:
                        behind.append((schedule, slot))
                    else:
                        due.append((schedule, slot, armed[1]))
            if due:
                await self._fire_due(due, now)
            for schedule, slot in behind:
                del self._armed[schedule.name]
                missed = [slot, *islice(schedule.cron.occurrences(slot, now), self.catch_up_limit)]
                self._catching_up.add(schedule.name)
                self._spawn(
                    self._catch_up(schedule, missed[-self.catch_up_limit :], live=True), f"catch-up {schedule.name}"
                )

    async def _fire_due(self, due: list[tuple[Schedule, datetime, datetime]], now: datetime) -> None:
        outcome = self.coordinator.outcome
        busy: dict[str, str] = {}
        owned: Iterable[tuple[Schedule, datetime, str]]
        if self.coordinator.needs_claims:
            # One claim for the whole batch: one round trip, one transaction.
            owned, busy = await self._claim([(schedule, slot) for schedule, slot, _ in due], now)
        else:
            # Lazily: making every id before the first start delays the whole burst.
            owned = ((schedule, slot, self.new_id()) for schedule, slot, _ in due)
        # The runs started here reach the writer thread only once the whole burst has
        # started: its work holds the GIL, and handing it batches between slices makes
        # every later handler of the burst wait for it.
        self._hold_handoff = True
        try:
            await self._fire_owned(owned, outcome, busy)
            # Schedules that share an expression share their next slot: compute it once.
            after: dict[tuple[Any, datetime], datetime] = {}
            for schedule, _, following in due:
                if schedule.name in self._armed and self.is_enabled(schedule.name):
                    key = (schedule.cron, following)
                    nxt = after.get(key)
                    if nxt is None:
                        nxt = after[key] = schedule.cron.next(following)
                    self._arm_at(schedule, following, nxt)
        finally:
            self._hold_handoff = False
            self._handoff()

    async def _fire_owned(
        self, owned: Iterable[tuple[Schedule, datetime, str]], outcome: Outcome, busy: dict[str, str]
    ) -> None:
        index = -1
        for index, (schedule, slot, run_id) in enumerate(owned):
            self._fire(schedule, slot, "self", outcome, run_id, remote=busy.get(schedule.name))
            if index % _START_SLICE == _START_SLICE - 1:
                await asyncio.sleep(0)  # let the handlers created so far start
        if index >= 0:
            await asyncio.sleep(0)  # the last slice too, before the re-arming that follows

    def _claim_horizon(self, schedule: Schedule, now: datetime) -> datetime:
        """How far back a winner keeps its schedule's claims: long enough that a replica
        running late still finds its slot taken (an hour; a minute for sub-minute crons)."""
        return now - (timedelta(minutes=1) if schedule.cron.has_seconds else timedelta(hours=1))

    async def _claim(
        self, slots: list[tuple[Schedule, datetime]], now: datetime, *, in_store: bool = False
    ) -> tuple[list[tuple[Schedule, datetime, str]], dict[str, str]]:
        """The slots this instance wins, each with the run id its claim recorded, and the
        schedules of the batch with a run in flight on another instance (name -> run id).

        Fails closed: if the claims cannot be written, nothing is won, and the slots are
        remembered as lost, to be claimed and recorded once the store is back (see
        :meth:`_recover_lost`); external fires are not remembered, their caller gets the
        error and retries. ``in_store`` claims in the store whatever the coordination mode
        (external fires dedupe retries so)."""
        claims = self._make_claims(slots, now, in_store=in_store)
        try:
            result = await self._send_claims(claims, now, in_store=in_store)
        except Unavailable as exc:
            self.stats["unclaimed"] += len(slots)
            self._store_trouble("claim", f"not firing {len(slots)} slot(s): cannot claim them", exc)
            if not in_store:
                for (schedule, slot), claim in zip(slots, claims):
                    self._remember_lost(schedule, slot, claim.run_id)
            return [], {}
        self._store_back()
        owned = [(schedule, slot, claim.run_id) for (schedule, slot), claim in zip(slots, claims) if claim.key in result.won]
        return owned, result.busy

    def _make_claims(
        self,
        slots: list[tuple[Schedule, datetime]],
        now: datetime,
        *,
        in_store: bool = False,
        run_ids: dict[tuple[str, datetime], str] | None = None,
    ) -> list[Claim]:
        """One claim per slot; ``run_ids`` reuses the ids of an earlier attempt, whose
        reply may have been lost after it committed."""
        trigger: Trigger = "external" if in_store else "self"
        outcome: Outcome = "external" if in_store else self.coordinator.outcome
        stamps: dict[datetime, str] = {}  # a batch shares a few slots: format each once

        def key(name: str, slot: datetime) -> str:
            stamp = stamps.get(slot)
            if stamp is None:
                stamp = stamps[slot] = slot_key("", slot)[1:]
            return f"{name}@{stamp}"

        return [
            Claim(
                key(schedule.name, slot),
                schedule.name,
                (run_ids or {}).get((schedule.name, slot)) or self.new_id(),
                self._claim_horizon(schedule, now),
                scheduled_at=slot,
                trigger=trigger,
                outcome=outcome,
            )
            for schedule, slot in slots
        ]

    async def _send_claims(self, claims: list[Claim], now: datetime, *, in_store: bool = False) -> ClaimResult:
        """Claim (raising :class:`Unavailable`); remember the run ids won as pending."""
        if in_store:
            result = await self.store.claim(claims, self.instance, now)
        else:
            result = await self.coordinator.claim(claims, self.instance, now)
        self._claimed.update(claim.run_id for claim in claims if claim.key in result.won)
        return result

    def _remember_lost(self, schedule: Schedule, slot: datetime, run_id: str) -> None:
        lost = self._lost[schedule.name]
        run_id = lost.setdefault(slot, run_id)
        # The claim may have committed with its reply lost: then its placeholder row is ours.
        self._claimed.add(run_id)
        if len(lost) > self.catch_up_limit:  # slots come in order: the first is the oldest
            self._claimed.discard(lost.pop(next(iter(lost))))

    async def _recover_lost(self) -> None:
        """Claim and record the slots that could not be claimed while the store was down.

        Every instance that lost a slot tries to claim it now; one wins it (or nobody, if
        another instance fired it in time), and the winner applies the schedule's backfill
        policy to the lost slots it won: ``skip`` records them ``missed``, ``latest`` fires
        the newest lost slot and records the others, ``all`` fires them in order. A slot lost
        to an outage thus shows up in the ledger afterwards, and still never fires twice."""
        lost, self._lost = self._lost, defaultdict(dict)
        wanted: list[tuple[Schedule, datetime]] = []
        ids: dict[tuple[str, datetime], str] = {}
        for name, entries in lost.items():
            schedule = self.schedules.get(name)
            if schedule is None:
                self._claimed.difference_update(entries.values())
                continue
            for slot, run_id in sorted(entries.items()):
                wanted.append((schedule, slot))
                ids[(name, slot)] = run_id
        if not wanted:
            return
        now = self.clock.now()
        claims = self._make_claims(wanted, now, run_ids=ids)
        try:
            result = await self._send_claims(claims, now)
        except Unavailable as exc:
            for schedule, slot in wanted:
                self._remember_lost(schedule, slot, ids[(schedule.name, slot)])
            self._store_trouble("claim", f"not firing {len(wanted)} slot(s): cannot claim them", exc)
            return
        self._store_back()
        won: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
        for (schedule, slot), claim in zip(wanted, claims):
            if claim.key in result.won:
                won[schedule.name].append((slot, claim.run_id))
            else:
                self._claimed.discard(claim.run_id)
        outcome = self.coordinator.outcome
        for name, mine in won.items():
            schedule = self.schedules[name]
            enabled = self.is_enabled(name)
            policy = schedule.backfill if enabled else "skip"
            newest = max(lost[name])
            if policy == "all":
                to_fire = mine
            elif policy == "latest":
                to_fire = [(slot, run_id) for slot, run_id in mine if slot == newest]
            else:
                to_fire = []
            firing = {slot for slot, _ in to_fire}
            why = f"not fired: the store was unreachable when it was due (backfill={policy})"
            for slot, run_id in mine:
                if slot not in firing:
                    self._record_missed(schedule, slot, "self", outcome, why, run_id)
            if to_fire:
                self._catching_up.add(name)
                self._spawn(self._fire_in_order(schedule, to_fire, result.busy.get(name)), f"recover {name}")
            log.info(
                "%s: %d slot(s) lost while the store was unreachable: %d recorded missed, %d fired (backfill=%s)",
                name,
                len(mine),
                len(mine) - len(to_fire),
                len(to_fire),
                policy,
            )

    async def _fire_in_order(self, schedule: Schedule, slots: list[tuple[datetime, str]], remote: str | None) -> None:
        """Fire owned slots one after the other (each waits for the previous run to end)."""
        try:
            outcome = self.coordinator.outcome
            for slot, run_id in slots:
                if remote is not None or self._inflight[schedule.name]:
                    self._fire(schedule, slot, "self", outcome, run_id, remote=remote)
                    remote = None
                    continue
                active = await self._launch(schedule, slot, "self", outcome, run_id)
                await active.done
        finally:
            self._catching_up.discard(schedule.name)
            self._poke_waiters()

    def _store_trouble(self, kind: str, what: str, exc: Exception) -> None:
        """Log a store outage: a warning at its first failure of each kind, then one every
        60 failures (once a minute for every-second schedules); the rest at debug level."""
        if self._store_down_at is None:
            self._store_down_at = self.clock.now()
        count = self._store_warned.get(kind, 0)
        self._store_warned[kind] = count + 1
        if count % 60 == 0:
            log.warning("%s (%s)", what, exc)
        else:
            log.debug("%s (%s)", what, exc)

    def _store_back(self) -> None:
        if self._store_down_at is None:
            return
        lost = sum(len(entries) for entries in self._lost.values())
        log.info(
            "store reachable again after %.1fs; %d slot(s) that could not be claimed meanwhile will be recorded",
            (self.clock.now() - self._store_down_at).total_seconds(),
            lost,
        )
        self._store_down_at = None
        self._store_warned.clear()

    def _fire(
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
        queued = schedule.on_overlap == "queue" and (self._waiting[name] or name in self._remote)
        if (self._inflight[name] or remote or queued) and trigger != "manual":
            if schedule.on_overlap == "skip":
                now = self.clock.now()
                busy = next((a.run.id for a in self._active.values() if a.schedule is schedule), "")
                if not busy and remote:
                    busy = f"{remote} (on another instance)"
                skipped = Run(
                    id=run_id,
                    name=name,
                    scheduled_at=slot,
                    status="skipped",
                    trigger=trigger,
                    coordination_outcome=outcome,
                    instance=self.instance,
                    fired_at=now,
                    finished_at=now,
                    error_tag="overlap",
                    error_message=f"run {busy} was still in flight" if busy else "a run was still in flight",
                )
                self._record(skipped)
                return skipped
            if schedule.on_overlap == "queue":
                self._waiting[name].append((slot, trigger, outcome, run_id))
                if remote:
                    self._remote[name] = remote  # released by the housekeeping loop
                return None
        self._launch(schedule, slot, trigger, outcome, run_id, notify=False)
        return None

    def _launch(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        run_id: str | None = None,
        *,
        notify: bool = True,
    ) -> asyncio.Future[_Active]:
        """Start a run now, whatever the overlap policy; resolves once its row exists
        (without ``notify``, nobody waits for that: the returned future is a dummy)."""
        self._inflight[schedule.name] += 1
        started = asyncio.get_running_loop().create_future() if notify else None
        asyncio.ensure_future(self._execute(schedule, slot, trigger, outcome, run_id or self.new_id(), started))
        return started if started is not None else _NOBODY

    async def _execute(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        run_id: str,
        started: asyncio.Future[_Active] | None,
    ) -> None:
        fired_at = self.clock.now()
        deadline = fired_at + self._max_runtime[schedule.name]
        run = Run(
            id=run_id,
            name=schedule.name,
            scheduled_at=slot,
            status="running",
            trigger=trigger,
            coordination_outcome=outcome,
            instance=self.instance,
            fired_at=fired_at,
        )
        active = _Active(run, schedule, deadline, asyncio.get_running_loop().create_future())
        active.task = asyncio.current_task()
        self._active[run_id] = active
        ctx = RunContext(
            name=schedule.name,
            run_id=run_id,
            scheduled_at=slot,
            fired_at=fired_at,
            trigger=trigger,
            payload=schedule.payload,
            deadline=deadline,
        )
        self._after_start(active, started)
        try:
            if self._is_async[schedule.name]:
                await schedule.handler(ctx)
            else:
                result = await self._in_thread(schedule.handler, ctx)
                if inspect.isawaitable(result):  # e.g. lambda ctx: send(ctx): the work is the awaitable
                    await result
        except asyncio.CancelledError:
            if not active.closed:
                self._close(active, "failed", self.clock.now(), TAG_INTERRUPTED, "the run was cancelled")
        except Exception as exc:
            message = str(exc) or repr(exc)
            self._close(active, "failed", self.clock.now(), type(exc).__name__, message[:_MAX_ERROR_MESSAGE])
        else:
            self._close(active, "succeeded", self.clock.now())

    def _after_start(self, active: _Active, started: asyncio.Future[_Active] | None) -> None:
        self._record(active.run)
        heapq.heappush(self._watch, (active.deadline, next(self._seq), active.run.id))
        watchdog = self._loops.get("watchdog")
        if watchdog is not None and (watchdog.until is None or active.deadline < watchdog.until):
            assert self._watch_wake is not None
            self._watch_wake.set()
        if started is not None and not started.done():
            started.set_result(active)

    @staticmethod
    def _in_thread(fn: Callable[[RunContext], Any], ctx: RunContext) -> asyncio.Future[Any]:
        """Run a sync handler on its own thread: a thread the watchdog gives up on must not
        hold a pool worker that later runs need."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def target() -> None:
            try:
                result, error = fn(ctx), None
            except BaseException as exc:  # handed to the loop, raised there
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=target, name=f"schedtui-run-{ctx.name}", daemon=True).start()
        return fut

    def _close(
        self,
        active: _Active,
        status: RunStatus,
        at: datetime,
        error_tag: str | None = None,
        error_message: str | None = None,
    ) -> None:
        """Record the end of a run exactly once and free its overlap slot."""
        if active.closed:
            return
        active.closed = True
        active.run = active.run.finish(status, at, error_tag=error_tag, error_message=error_message)
        self._record(active.run)
        self._active.pop(active.run.id, None)
        name = active.schedule.name
        self._inflight[name] -= 1
        if not active.done.done():
            active.done.set_result(active.run)
        if not self._inflight[name] and self._waiting[name] and not self._stopping and name not in self._remote:
            slot, trigger, outcome, run_id = self._waiting[name].popleft()
            self._launch(active.schedule, slot, trigger, outcome, run_id)
        self._poke_waiters()

    def _record_missed(
        self,
        schedule: Schedule,
        slot: datetime,
        trigger: Trigger,
        outcome: Outcome,
        why: str,
        run_id: str | None = None,
    ) -> None:
        self._record(
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

    # ------------------------------------------------------------------------------------
    # watchdog
    # ------------------------------------------------------------------------------------
    async def _loop_watchdog(self) -> None:
        assert self._watch_wake is not None
        while True:
            now = self.clock.now()
            while self._watch and self._watch[0][0] <= now:
                _, _, run_id = heapq.heappop(self._watch)
                active = self._active.get(run_id)
                if active is None or active.closed:
                    continue
                kind = "async handler was cancelled" if active.schedule.is_async else "sync handler was abandoned"
                log.warning("run %s of %s timed out; its %s", run_id, active.schedule.name, kind)
                self._close(
                    active,
                    "failed",
                    now,
                    TAG_TIMEOUT,
                    f"exceeded max_runtime of {active.schedule.max_runtime:g}s; the {kind}",
                )
                if active.task is not None:
                    active.task.cancel()
            while self._watch and self._watch[0][2] not in self._active:
                heapq.heappop(self._watch)  # finished in time: drop lazily
            await self._park("watchdog", self._watch[0][0] if self._watch else None, self._watch_wake)

    # ------------------------------------------------------------------------------------
    # catch-up
    # ------------------------------------------------------------------------------------
    async def _boot_catch_up(self, schedule: Schedule, now: datetime) -> None:
        try:
            since = await self._where_it_left_off(schedule)
            state = self._states.get(schedule.name)
            if since is not None and state is not None and state.enabled and state.changed_at > since:
                since = state.changed_at  # slots missed while disabled are not caught up
            missed: list[datetime] = []
            if since is not None:
                for slot in schedule.cron.occurrences_back(now):
                    if slot <= since or len(missed) == self.catch_up_limit:
                        break
                    missed.append(slot)
                missed.reverse()
        except BaseException:
            self._catching_up.discard(schedule.name)
            raise
        if not missed:
            self._catching_up.discard(schedule.name)
            self._arm(schedule, now)
            return
        await self._catch_up(schedule, missed)

    async def _where_it_left_off(self, schedule: Schedule) -> datetime | None:
        """The schedule's newest recorded slot; while the store is unreachable, wait for it
        (nothing could be claimed meanwhile anyway), parked so that quiesce() sees it idle."""
        name = schedule.name
        while True:
            try:
                return await self.store.last_slot(name)
            except Unavailable as exc:
                self._store_trouble("catch-up", f"{name}: catch-up waits for the store", exc)
            loop = f"catch-up {name}"
            self._catching_up.discard(name)
            try:
                await self._park(loop, self.clock.now() + self.state_poll_interval)
            finally:
                self._loops.pop(loop, None)
                self._catching_up.add(name)

    async def _catch_up(self, schedule: Schedule, slots: list[datetime], *, live: bool = False) -> None:
        """Apply the schedule's backfill policy to ``slots`` (ascending, all due), then arm.

        At boot every slot is in the past: ``skip`` records them all ``missed``, ``latest``
        fires the newest, ``all`` fires each in order. When a live engine finds itself
        behind (``live``), the newest slot is simply the current one and always fires; the
        policy decides about the older ones."""
        try:
            if len(slots) >= self.catch_up_limit:
                log.warning(
                    "%s missed more slots than the catch-up walk considers; only the newest %d are handled",
                    schedule.name,
                    len(slots),
                )
            outcome = self.coordinator.outcome
            policy = schedule.backfill
            if policy == "all":
                to_fire, to_record = slots, []
            elif policy == "latest" or live:
                to_fire, to_record = slots[-1:], slots[:-1]
            else:
                to_fire, to_record = [], slots
            ids: dict[datetime, str] = {}
            remote: str | None = None
            if self.coordinator.needs_claims:
                # Missed slots are claimed like live ones, so N instances booting together
                # catch each slot up (or record it missed) once.
                owned, busy = await self._claim([(schedule, slot) for slot in slots], self.clock.now())
                ids = {slot: run_id for _, slot, run_id in owned}
                remote = busy.get(schedule.name)
                to_fire = [s for s in to_fire if s in ids]
                to_record = [s for s in to_record if s in ids]
            why = (
                f"missed while the engine was behind (backfill={policy})"
                if live
                else f"missed while the engine was not running (backfill={policy})"
            )
            for slot in to_record:
                self._record_missed(schedule, slot, "self", outcome, why, ids.get(slot))
            for slot in to_fire:
                if remote is not None:  # in flight on another instance: the overlap policy decides
                    self._fire(schedule, slot, "self", outcome, ids[slot], remote=remote)
                    continue
                active = await self._launch(schedule, slot, "self", outcome, ids.get(slot))
                await active.done
            log.info(
                "%s caught up: %d slot(s) recorded missed, %d fired (backfill=%s)",
                schedule.name,
                len(to_record),
                len(to_fire),
                policy,
            )
        finally:
            self._catching_up.discard(schedule.name)
            if not self._stopping and self.is_enabled(schedule.name) and schedule.name not in self._armed:
                # From the last slot handled: slots that passed during a long catch-up are
                # then late (one) or behind (several), and handled by the same rules.
                self._arm(schedule, slots[-1] if slots else self.clock.now())
            self._poke_waiters()

    # ------------------------------------------------------------------------------------
    # maintenance: state changes from other processes, heartbeats, abandoned runs, retention
    # ------------------------------------------------------------------------------------
    async def _loop_maintenance(self) -> None:
        while True:
            try:
                await self.maintain()
            except Unavailable as exc:
                self._store_trouble("maintain", "store unavailable for housekeeping", exc)
            await self._park("maintenance", self.clock.now() + self.state_poll_interval)

    async def maintain(self) -> None:
        """One round of housekeeping (normally every ``state_poll_interval``)."""
        now = self.clock.now()
        await self.refresh_states()
        if self._last_beat is None or now - self._last_beat >= self.heartbeat_interval:
            await self.store.heartbeat(self.instance, self.host, os.getpid(), now)
            self._last_beat = now
            await self.close_abandoned()
        await self._prune(now)
        if self._lost:
            await self._recover_lost()
        if self._remote:
            await self._release_remote_waits()
        self._store_back()

    async def _release_remote_waits(self) -> None:
        """Start the queued slots that waited for a run on another instance, once no other
        instance has a run of that schedule started, or placed for an earlier slot (so
        queues spread over instances still run one at a time, in slot order)."""
        running = await self.store.running_runs()
        for name in list(self._remote):
            waiting = self._waiting.get(name)
            if not waiting:
                del self._remote[name]
                continue
            head = waiting[0][0]
            blocker = next(
                (
                    r.id
                    for r in running
                    if r.name == name
                    and r.instance != self.instance
                    and (r.fired_at is not None or r.scheduled_at < head)
                ),
                None,
            )
            if blocker is not None:
                self._remote[name] = blocker
                continue
            del self._remote[name]
            if not self._inflight[name] and not self._stopping:
                slot, trigger, outcome, run_id = waiting.popleft()
                self._launch(self.schedules[name], slot, trigger, outcome, run_id)

    async def _prune(self, now: datetime) -> None:
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

    async def close_abandoned(self) -> list[Run]:
        """Close runs (and backfills) left ``running`` by instances that are gone."""
        now = self.clock.now()
        runs = await self.store.running_runs()
        backfills = await self.store.running_backfills()
        if not runs and not backfills:
            return []
        beats = await self.store.instances()

        def gone(instance: str) -> str | None:
            if instance == self.instance:
                return "an earlier process with this instance name stopped"
            beat = beats.get(instance)
            if beat is None:
                return f"instance {instance} is no longer registered"
            host, pid, at = beat
            if host == self.host and not _pid_alive(pid):
                return f"instance {instance} (pid {pid}) is no longer running"
            if now - at > self.abandon_after:
                return f"instance {instance} has not sent a heartbeat since {at.isoformat()}"
            return None

        closed = []
        for run in runs:
            if run.id in self._active or run.id in self._claimed:
                continue
            why = gone(run.instance)
            if why is None:
                continue
            finished = run.finish("failed", now, error_tag=TAG_ABANDONED, error_message=why)
            if await self.store.close_run(finished):
                log.warning("run %s of %s abandoned: %s", run.id, run.name, why)
                closed.append(finished)
                self.stats["abandoned"] += 1
                for listener in self._listeners:
                    listener(finished)
        for progress in backfills:
            if progress.id in self._backfills:
                continue
            if gone(progress.instance) is not None:
                await self.store.update_backfill(dataclasses.replace(progress, state="abandoned", finished_at=now))
        return closed

    # ------------------------------------------------------------------------------------
    # operator actions
    # ------------------------------------------------------------------------------------
    async def run_now(self, name: str, *, wait: bool = False) -> Run:
        """Fire a schedule at once (trigger and outcome ``manual``), whatever its overlap
        policy and enabled state. Returns the run once its row is committed, or, with
        ``wait``, once it has finished."""
        schedule = self.schedule(name)
        active = await self._launch(schedule, self.clock.now(), "manual", "manual")
        if wait:
            run = await active.done
        else:
            run = active.run
        await self.flush()
        return run

    async def wait_run(self, run_id: str) -> Run:
        """Wait for a run this engine started to finish."""
        active = self._active.get(run_id)
        if active is None:
            return await self.get_run(run_id)
        return await asyncio.shield(active.done)

    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None, by: str | None = None) -> ScheduleView:
        """Enable or disable a schedule, persistently. A disabled schedule keeps its
        definition, has no next slot and does not fire; enabling it arms its next future slot
        (slots that passed while it was disabled are not caught up)."""
        self.schedule(name)
        if note is not None and len(note) > 1000:
            raise BadInput("note is longer than 1000 characters", field="note")
        state = ScheduleState(
            name=name,
            enabled=enabled,
            changed_by=by or self.instance,
            changed_at=self.clock.now(),
            note=note or None,
        )
        await self.store.set_state(state)
        self._apply_state(state)
        return await self.get_schedule(name)

    async def fire_external(self, name: str, *, allow_self: bool = False) -> ExternalFiring:
        """Fire the slot that is due now because an external scheduler says so.

        The slot is the newest cron slot at or before now; it must be at most
        ``external_tolerance`` (10 minutes) old. A call up to ``external_early`` (5 s)
        before a slot is for that slot: it waits for the slot's instant, then fires. The slot is claimed in the store, so a
        platform that retries the call gets the same run back (``created`` False) instead
        of a second firing, whichever instance it reaches. Schedules not marked
        ``trigger="external"`` are refused unless ``allow_self``. The overlap policy
        applies as for timer firings."""
        schedule = self.schedule(name)
        if self._trigger_of(schedule) != "external" and not allow_self:
            raise Refused(
                f'"{name}" is fired by its own timer (trigger=self); an external fire would run it twice. '
                "Mark it trigger=\"external\", or allow it explicitly.",
                reason="not an external schedule",
            )
        async with self._external_locks[name]:
            now = self.clock.now()
            upcoming = schedule.cron.next(now)
            if upcoming - now <= self.external_early:
                # A platform whose clock runs a little fast calls just before the slot:
                # that call is for the coming slot, which still never fires early.
                await self.clock.sleep_until(upcoming)
                now = self.clock.now()
            slot = schedule.cron.latest(now)
            key = slot_key(name, slot)
            existing = await self.store.claimed_run(key)
            if existing is not None:
                return await self._external_result(existing, created=False)
            late = now - slot
            if late > self.external_tolerance:
                raise Refused(
                    f'no slot of "{name}" is due: the newest, {slot.isoformat()}, is {late} old '
                    f"(tolerance {self.external_tolerance})",
                    reason="no slot due",
                )
            owned, busy = await self._claim([(schedule, slot)], now, in_store=True)
            if not owned:
                winner = await self.store.claimed_run(key)
                if winner is None:
                    raise Unavailable(f"could not claim slot {key}; try again")
                return await self._external_result(winner, created=False)
            _, _, run_id = owned[0]
            self._fire(schedule, slot, "external", "external", run_id, remote=busy.get(name))
            await self.flush()
            return await self._external_result(run_id, created=True)

    async def _external_result(self, run_id: str, *, created: bool) -> ExternalFiring:
        """The run a claim points at; its row may still be on its way from another instance."""
        for _ in range(40):
            if any(entry[3] == run_id for queue in self._waiting.values() for entry in queue):
                return ExternalFiring(run_id, None, created, queued=True)
            active = self._active.get(run_id)
            if active is None:
                await self.flush()  # our own latest version first, not the claim's placeholder
            run = active.run if active is not None else await self.store.get_run(run_id)
            if run is not None:
                return ExternalFiring(run_id, run, created)
            await asyncio.sleep(0.05)  # the winner commits its run within one group commit
        raise Unavailable(f"run {run_id} was claimed but is not recorded yet; try again")

    # -- range backfill ------------------------------------------------------------------
    def plan_backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        confirm: bool = False,
        limit: int | None = None,
    ) -> BackfillPlan:
        """What a backfill of the slots in ``(start, end]`` would do; fires nothing."""
        schedule = self.schedule(name)
        limit = BACKFILL_DEFAULT_LIMIT if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BACKFILL_MAX_LIMIT:
            raise BadInput(f"limit {limit!r} is out of range (1-{BACKFILL_MAX_LIMIT:,})", field="limit")
        try:
            start, end = utc(start), utc(end)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        now = self.clock.now()
        slots = list(islice(schedule.cron.occurrences(start, end), BACKFILL_MAX_LIMIT + 1)) if start < end else []
        exceeds = len(slots) > BACKFILL_MAX_LIMIT
        count = len(slots)
        shown = f"more than {BACKFILL_MAX_LIMIT:,}" if exceeds else f"{count:,}"
        reason, refusal = None, None
        if start > end:
            reason, refusal = "reversed range", "reversed range: from is after to"
        elif start == end:
            reason, refusal = "empty range", "empty range: from equals to"
        elif end > now:
            reason = "reaches into the future"
            refusal = f"the range reaches into the future (to is after now, {now.isoformat()})"
        elif count == 0:
            reason, refusal = "no slots in range", "no slots in the range"
        elif count > limit:
            reason = "over the limit"
            refusal = f"{shown} slots exceed the limit of {limit:,}; backfill in smaller slices"
        elif count > BACKFILL_CONFIRM_ABOVE and not confirm:
            reason = "needs confirmation"
            refusal = f"{shown} slots need confirmation (more than {BACKFILL_CONFIRM_ABOVE})"
        return BackfillPlan(
            name=name,
            start=start,
            end=end,
            count=count,
            count_exceeds=exceeds,
            first=slots[0] if slots else None,
            last=slots[-1] if slots and not exceeds else None,
            limit=limit,
            confirm=confirm,
            refusal=refusal,
            reason=reason,
        )

    async def start_backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        confirm: bool = False,
        limit: int | None = None,
        skip_succeeded: bool = False,
    ) -> BackfillProgress:
        """Start firing the slots in ``(start, end]`` in order, in the background; with
        ``skip_succeeded``, only those without a succeeded run.

        Raises :class:`Refused` (with the count and reason) when the plan is refused or a
        backfill of this schedule is already running anywhere."""
        plan = self.plan_backfill(name, start, end, confirm=confirm, limit=limit)
        if plan.refusal is not None:
            raise Refused(
                f'backfill of "{name}" refused: {plan.refusal}', count=plan.count, reason=plan.reason or plan.refusal
            )
        schedule = self.schedules[name]
        slots = list(schedule.cron.occurrences(plan.start, plan.end))
        if skip_succeeded:
            done = await self.succeeded_slots(name, slots)
            slots = [slot for slot in slots if slot not in done]
            if not slots:
                raise Refused(f'backfill of "{name}": every slot in the range already succeeded', count=0,
                              reason="nothing to run")
        progress = BackfillProgress(
            id=self.new_id(),
            name=name,
            start=plan.start,
            end=plan.end,
            total=len(slots),
            fired=0,
            failed=0,
            state="running",
            instance=self.instance,
            started_at=self.clock.now(),
        )
        await self.store.start_backfill(progress)
        job = _BackfillJob(progress)
        self._backfills[progress.id] = job
        job.task = self._spawn(self._run_backfill(schedule, job, slots), f"backfill {name}")
        return progress

    async def _run_backfill(self, schedule: Schedule, job: _BackfillJob, slots: list[datetime]) -> None:
        try:
            for slot in slots:
                job.progress = dataclasses.replace(job.progress, current=slot)
                active = await self._launch(schedule, slot, "manual", "manual")
                run = await asyncio.shield(active.done)
                job.progress = dataclasses.replace(
                    job.progress,
                    fired=job.progress.fired + 1,
                    failed=job.progress.failed + (run.status == "failed"),
                )
                await self.store.update_backfill(job.progress)
            job.progress = dataclasses.replace(job.progress, state="done", finished_at=self.clock.now(), current=None)
        except asyncio.CancelledError:
            state: Literal["cancelled", "abandoned"] = "cancelled" if job.cancelled else "abandoned"
            job.progress = dataclasses.replace(job.progress, state=state, finished_at=self.clock.now())
            if not job.cancelled:
                raise
        finally:
            with contextlib.suppress(Unavailable):
                await self.store.update_backfill(job.progress)
            job.finished.set()
            log.info(
                "backfill %s of %s %s: %d fired, %d failed, %d remaining",
                job.progress.id,
                schedule.name,
                job.progress.state,
                job.progress.fired,
                job.progress.failed,
                job.progress.remaining,
            )

    async def succeeded_slots(self, name: str, slots: list[datetime]) -> set[datetime]:
        """Which of ``slots`` (ascending) already have a succeeded run, of any trigger."""
        if not slots:
            return set()
        found = await self.store.runs_between(
            [name], slots[0], slots[-1] + timedelta(seconds=1), limit_per_name=4 * len(slots) + 100
        )
        wanted = set(slots)
        return {r.scheduled_at for r in found.get(name, []) if r.status == "succeeded" and r.scheduled_at in wanted}

    async def cancel_backfill(self, backfill_id: str) -> BackfillProgress:
        """Stop a running backfill of this engine before its next slot (the run in flight
        finishes on its own); recorded ``cancelled`` with what it fired."""
        job = self._backfills.get(backfill_id)
        if job is None:
            progress = await self.backfill_progress(backfill_id)
            if progress.state != "running":
                return progress
            raise Refused(f"backfill {backfill_id} runs on instance {progress.instance}; cancel it there",
                          reason="runs elsewhere")
        if job.task is not None and not job.task.done():
            job.cancelled = True
            job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)
        if job.progress.state == "running":  # cancelled before its first step
            job.progress = dataclasses.replace(job.progress, state="cancelled", finished_at=self.clock.now())
            await self.store.update_backfill(job.progress)
            job.finished.set()
        return job.progress

    async def backfill_progress(self, backfill_id: str) -> BackfillProgress:
        job = self._backfills.get(backfill_id)
        if job is not None:
            return job.progress
        progress = await self.store.get_backfill(backfill_id)
        if progress is None:
            raise NotFound(f'no backfill with id "{backfill_id}"')
        return progress

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        job = self._backfills.get(backfill_id)
        if job is None:
            return await self.backfill_progress(backfill_id)
        await job.finished.wait()
        return job.progress
