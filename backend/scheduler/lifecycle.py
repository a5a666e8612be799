"""The engine's lifecycle: the order in which its parts open, start, keep house and stop.

:class:`~backend.scheduler.engine.Engine` keeps the guards (opened, started, stopping) and calls
these; each takes the engine and touches only its public parts. The contract: ``open_engine``
(once the engine opened the store) registers this instance and closes what dead processes
left running before any part opens; ``start_engine`` catches up, then arms, then starts the systems beside the
schedules; ``stop_engine`` always closes the store, whatever a part raised while stopping
(a store left open keeps its connection tasks alive, and the process would never exit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from backend.errors import Refused, Unavailable
from backend.model import ScheduleState
from backend.runtime.liveness import boot_clock, linger_grace
from backend.runtime.loopwatch import EXIT_LEASE_LAPSED, LoopWatch
from backend.scheduler.coordination.slots import warn_cluster_fallback
from backend.scheduler.timings import same_timing
from backend.schedules import Schedule

if TYPE_CHECKING:
    from backend.scheduler.engine import Engine

__all__ = [
    "hold_observer_lease",
    "housekeeping",
    "is_armed",
    "is_settled",
    "join_fleet",
    "maintain",
    "open_engine",
    "role_changed",
    "start_engine",
    "state_changed",
    "stop_engine",
    "watch_lease",
]

log = logging.getLogger("schedtui.engine")

#: While the other instances' changes are heard as they are made, the stored schedules and
#: the enabled states are read every this many state-poll rounds (a lost signal's backstop).
STATE_BACKSTOP = 10


async def open_engine(engine: Engine) -> None:
    """Once the store is open: register this instance, close what dead processes left
    running, open the parts."""
    await engine.registry.take_name()
    now = engine.clock.now()
    await engine.catalog.load()
    await engine.states.load()
    await engine.registry.close_abandoned(at_open=True)
    await engine.registry.prune(now)
    engine.runner.open()
    for subsystem in engine.subsystems:
        await subsystem.open()


async def join_fleet(engine: Engine) -> None:
    """Become a member of the store's fleet: the heartbeat that records this instance as
    firing (or waiting, while another coordination mode fires) renews its lease, before
    anything is claimed or armed."""
    engine.registry.member = True
    engine.lease.enforced = True
    await engine.registry.beat(engine.clock.now(), force=True)


async def record_code_timings(engine: Engine) -> None:
    """Record the cron and zone each schedule defined in code runs by: one whose timing
    changed since an instance last recorded it (a deploy) changed now, and the catch-up
    starts from there, as it does from a stored schedule's change."""
    code = engine.code_timings()
    recorded = await engine.catalog.store.code_timings() if code else {}
    timings = []
    for name, (cron, zone, digest) in code.items():
        fleet = recorded.get(name)
        if fleet is not None and same_timing(fleet, (cron, zone, digest)):
            cron, zone = fleet.cron, fleet.timezone  # written another way: the same timing, kept as recorded
        timings.append((name, cron, zone))
    rules = {name: digest for name, (_, _, digest) in code.items()}
    now = engine.clock.now()
    changed = await engine.catalog.store.record_code_timings(timings, now, instance=engine.instance, rules=rules)
    engine.catch_up.code_timing_changed = changed
    if now in changed.values():
        engine.events.publish("schedules")  # a deploy: the other instances look at the fleet's timings again


def role_changed(engine: Engine, was: str, now: str) -> None:
    """A heartbeat recorded another role: a member that waits (another coordination mode
    fires) holds no timer; one that fires again catches up from where the ledger left off,
    as at boot (``cluster``'s shards follow the role on their own)."""
    if engine.cluster is not None or not engine.registry.member:
        return
    if now == "waiting":
        for name in [n for n in engine.schedules if n in engine.timers.wheel]:
            engine.timers.disarm(name)
    elif now == "firing" and was == "waiting":
        at = engine.clock.now()
        for schedule in engine.schedules.values():
            name = schedule.name
            if engine.trigger_of(schedule) == "self" and engine.is_enabled(name) and name not in engine.timers.wheel:
                engine.catch_up.at_boot(schedule, at, reason="while instances of another coordination mode fired")


def state_changed(engine: Engine, schedule: Schedule, state: ScheduleState) -> None:
    """A schedule was enabled or disabled (here or by another process): a self-triggered
    one is armed from the enable, or disarmed."""
    if engine.trigger_of(schedule) != "self":
        return
    if state.enabled:
        log.info("schedule %s enabled by %s", state.name, state.changed_by)
        # Armed from the enable, not from when it was heard: an enable made elsewhere is
        # heard at the next state poll (later still after a stall), and a slot due in
        # between was due while enabled. The timer then finds it late (fired) or several
        # behind (caught up, as any timer behind); in a fleet, a slot another instance
        # fired is claimed already. (Never from later than now: the enabler's clock may
        # run ahead of this one.)
        engine.timers.arm(schedule, min(state.changed_at, engine.clock.now()))
    else:
        log.info("schedule %s disabled by %s", state.name, state.changed_by)
        engine.timers.disabled(state.name)


def start_engine(engine: Engine) -> None:
    """Catch up on missed slots, arm every enabled self-triggered schedule, start the rest."""
    engine.states.on_change = lambda schedule, state: state_changed(engine, schedule, state)
    log.info(
        "starting %d schedule(s) (self=%d external=%d) coordination=%s instance=%s store=%s",
        len(engine.schedules),
        sum(1 for s in engine.schedules.values() if engine.trigger_of(s) == "self"),
        sum(1 for s in engine.schedules.values() if engine.trigger_of(s) == "external"),
        engine.coordination,
        engine.instance,
        engine.store.where,
    )
    engine.registry.log_claims_retention()
    engine.catalog.say_invalid()
    if engine.cluster_fallback:
        warn_cluster_fallback(engine.store)  # said loudly at start
    now = engine.clock.now()
    for schedule in engine.schedules.values():
        if engine.cluster is not None:
            break  # each schedule is caught up when its shard is taken
        if engine.trigger_of(schedule) == "self" and engine.is_enabled(schedule.name):
            engine.catch_up.at_boot(schedule, now)
        elif engine.trigger_of(schedule) == "self":
            engine.catch_up.resting_at_boot(schedule, now)
    engine.timers.start()
    for subsystem in engine.subsystems:
        subsystem.start()
    watch_lease(engine)
    engine.loops.expect("lease")
    engine.loops.keep(lambda: renew_lease(engine), "lease")
    engine.loops.expect("maintenance")
    engine.loops.keep(lambda: housekeeping(engine), "maintenance")
    if engine.relay.postgres is not None:
        # Another instance's change to a stored schedule is heard at once by NOTIFY
        # (the state poll would find it within its interval anyway).
        def heard(topic: str, name: str | None) -> None:
            engine.catalog.heard(topic, name)
            engine.fleet_timings.heard(topic, name)

        engine.relay.postgres.on_remote = heard
        engine.relay.listen()
        engine.loops.keep(engine.catalog.follow_signals, "catalog signals")


def watch_lease(engine: Engine) -> None:
    """Enforce this instance's lease from now on (a member's at its start, an observer's
    once it runs a handler: see :func:`hold_observer_lease`): a lapse stops its handlers,
    and ends the process if a sync handler still runs (:func:`end_if_threads_run`); a task
    lapses it as soon as its bound passes, and a thread ends the process if a handler
    blocks the event loop past it (:class:`~backend.runtime.loopwatch.LoopWatch`)."""
    engine.lease.enforced = True
    engine.lease.after_lapse = lambda why: end_if_threads_run(engine, why)
    if engine.lease.clock is boot_clock:  # (real time: a thread cannot follow an injected clock)
        engine.loop_watch = LoopWatch(
            engine.lease,
            busy=lambda: bool(engine.runner.in_flight),
            end=(lambda code: engine.end_process(code)) if engine.exit_when_lease_lapses else None,
            hard_stop=engine.exit_when_lease_lapses and engine.end_process is os._exit,
        )
        engine.loop_watch.start()
    engine.loops.keep(engine.lease.watch, "lease watch")


async def hold_observer_lease(engine: Engine, action: str, *, first: bool) -> None:
    """An engine opened, not started (``schedtui fire``, a console without ``--fire``),
    is about to run a handler: from now on it holds a lease as a member does. Its
    heartbeat is written now (the lease is fresh before the handler starts) and kept
    (``first``: the loop starts), and its lease is enforced (:func:`watch_lease`).

    Before, such a process only beat: frozen (SIGSTOP, a suspended VM) or cut off past
    the take-over window while its Run now ran, it was judged gone, its run closed
    ``abandoned``, and the schedule's next run started beside its handler, which ran on
    once it woke. Now the lapse stops that handler first, as a member's. Raises
    :class:`Unavailable` (the heartbeat could not be written) or :class:`Refused` (it was
    written, but this process's clock is off the database server's: the others would judge
    its heartbeat by it)."""
    lease, registry = engine.lease, engine.registry
    sent = lease.clock() if lease.clock is not None else None
    try:
        await registry.beat(engine.clock.now(), force=True)
    except Unavailable as exc:
        raise Unavailable(f"cannot {action} here: this process's heartbeat could not be written ({exc})") from None
    if sent is not None and (lease.renewed_at is None or lease.renewed_at < sent):
        why = (
            registry.clock_check.describe()
            if registry.clock_check is not None and registry.clock_off
            else "this instance's wall clock jumped"
        )
        raise Refused(
            f"cannot {action} here: its heartbeat does not renew this process's lease ({why}); the instances "
            "that fire would judge it silent and start the next run beside its handler: fix its time sync "
            "(NTP), or do it through one of those",
            reason="its clock is off",
        )
    if first:  # (only once it holds the lease: a refused process is asked again at its next Run now)
        engine.loops.expect("heartbeat")
        engine.loops.keep(lambda: renew_lease(engine, member=False), "heartbeat")
    if sent is not None and not lease.enforced:  # (not on SQLite, whose firer holds the file's lock; an injected clock)
        watch_lease(engine)


async def renew_lease(engine: Engine, *, member: bool = True) -> None:
    """The lease loop: a heartbeat every ``heartbeat_interval`` (a slow housekeeping round
    must not delay it), with the abandoned-work sweep that reads in the same transaction.

    With ``member=False``, the heartbeat alone, of an engine opened, not started, once it
    runs a handler (a Run now, a backfill's runs: ``schedtui fire``, a console without
    ``--fire``; see :func:`hold_observer_lease`): the instances that fire judge a silent
    instance gone after their take-over window, close its runs as abandoned, and would
    start the schedule's next run beside its handler."""
    registry, name = engine.registry, "lease" if member else "heartbeat"
    while True:
        try:
            await (registry.beat_and_sweep if member else registry.beat)(engine.clock.now())
            failed = False
            engine.outages.back(name)
        except Unavailable as exc:
            engine.outages.trouble(name, "cannot renew this instance's lease (its heartbeat)", exc)
            failed = True
        engine.lease.check()  # (the watcher does too, on real time)
        await engine.loops.park(name, registry.next_beat_at(engine.clock.now(), failed=failed), engine.lease.jumped)


def end_if_threads_run(engine: Engine, why: str) -> None:
    """After every system let go of its work: a handler still running that cannot be
    stopped (a sync handler's thread) is stopped by ending the process, which the
    instance taking the work over relies on. Async handlers were cancelled: those that
    have not returned within :func:`~backend.runtime.liveness.linger_grace` (they ignore their cancellation) end
    the process too."""
    running = engine.runner.threads_running
    if running:
        _end_process(engine, f"{running} sync handler(s) still run and a thread cannot be stopped", why)
        return
    tasks = [i.task for i in engine.runner.lingering if i.is_async and i.task is not None and not i.task.done()]
    if tasks:
        engine.loops.expect("lapse")  # quiesce() waits for the verdict
        engine.loops.spawn(_end_if_still_running(engine, tasks, why), "lapse")


async def _end_if_still_running(engine: Engine, tasks: list[asyncio.Task[None]], why: str) -> None:
    try:
        await asyncio.wait(tasks, timeout=linger_grace(engine.lease.window))
        stubborn = [task for task in tasks if not task.done()]
        if stubborn:
            _end_process(engine, f"{len(stubborn)} handler(s) ignored their cancellation and still run", why)
    finally:
        engine.loops.forget("lapse")
        engine.loops.poke()


def _end_process(engine: Engine, what: str, why: str) -> None:
    if not engine.exit_when_lease_lapses:
        log.error("%s after the lease lapsed (exit_when_lease_lapses=False: the process goes on)", what)
        return
    log.critical(
        "ENDING THE PROCESS: %s, so this process ends (exit code %d) before another instance "
        "takes their work over (the lease lapsed: %s)",
        what, EXIT_LEASE_LAPSED, why,
    )  # fmt: skip
    for handler in logging.getLogger().handlers + log.handlers:
        try:
            handler.flush()
        except Exception:  # noqa: S112 - ending anyway
            continue
    sys.stderr.flush()
    engine.end_process(EXIT_LEASE_LAPSED)


async def stop_engine(engine: Engine, grace: float) -> None:
    """Stop firing, let runs in flight finish (up to ``grace`` seconds), record the rest."""
    # The watchdog and the lease go on while runs finish: a run past its deadline during
    # the grace is a timeout (and a child process is killed), and the others must not take
    # this instance's work over while it is still running it.
    keep = {task for task in engine.loops.tasks if task.get_name() in _KEPT_WHILE_STOPPING}
    await engine.loops.cancel_all(keep=keep)
    if grace > 0:
        grace = await _fire_current_lost_slots(engine, grace)
    parts = [engine.launcher.stop(grace), *(subsystem.stop(grace) for subsystem in engine.subsystems)]
    # A part that fails to stop must not keep the store open: its connections' tasks would
    # then outlive the loop, and the process would never exit.
    for failed in await asyncio.gather(*parts, return_exceptions=True):
        if isinstance(failed, BaseException):
            log.error("stopping: %s", failed, exc_info=failed)
    try:
        # Its runs in flight are closed now (interrupted): each backfill's end, as it was.
        await engine.backfills.stop()
        await engine.audit.close()  # (the audit log stopped beside the others: write what came since)
    except Exception as exc:  # the store is closed below whatever happens here
        log.error("stopping: could not record the backfills' ends: %s", exc, exc_info=exc)
    try:
        await engine.external.recover(stopping=True)  # a platform's claims whose answer was lost
        await engine.claims.recover_lost()  # lost slots not claimed yet: recorded, a next start would not look
    except Exception as exc:  # the store is closed below whatever happens here
        log.error("stopping: could not record the lost slots: %s", exc, exc_info=exc)
    await engine.loops.cancel_all()
    await engine.run_logs.close()
    engine.ledger.handoff()
    lingering = len(engine.runner.lingering)
    try:
        await engine.store.flush()
        if lingering:
            # Registered still: its work is taken over once this process is gone (its pid on
            # this host, its heartbeat's age elsewhere), not while its handlers run on.
            log.warning("%d handler(s) still running: this instance stays registered until its process ends", lingering)
        else:
            await engine.registry.forget()
    except Unavailable as exc:
        log.warning("could not write the last runs: %s", exc)
    await engine.store.close()
    if engine.loop_watch is not None:
        engine.loop_watch.stop()
        engine.loop_watch = None
    if engine.runner.in_code and engine.lease.remaining is not None:
        engine.after_stop = threading.Thread(
            target=_end_if_threads_outlive_the_lease, args=(engine,), name="schedtui-after-stop", daemon=True
        )
        engine.after_stop.start()


def _end_if_threads_outlive_the_lease(engine: Engine) -> None:
    """After the stop, on a thread of its own (the loop may be gone): sync handlers that
    still run end the process when the lease would have lapsed, as a running engine's do.
    The stopped instance renews its lease no more and stays registered, so the others take
    its work over once its heartbeat is older than the take-over window: a process that
    went on after an engine's stop (an embedded engine, stopped and started again, or a web
    app shutting down one part) ran such a handler beside its retry."""
    lease, runner, wake = engine.lease, engine.runner, threading.Event()
    while True:
        running, remaining = len(runner.in_code), lease.remaining
        if not running or remaining is None:
            return
        if remaining <= 0:
            _end_process(
                engine, f"{running} sync handler(s) still run after this engine stopped and a thread cannot be stopped",
                "the stopped engine renews it no more",
            )  # fmt: skip
            return
        wake.wait(min(remaining, AFTER_STOP_EVERY))


#: How often (seconds) the watch after a stop looks at the handlers left running.
AFTER_STOP_EVERY = 0.25


async def _fire_current_lost_slots(engine: Engine, grace: float) -> float:
    """Start the current slots this instance lost (a claim's answer lost, a blip of the
    store) before the runs in flight are waited for; returns what is left of the grace. A
    claim that outlasts the grace is cut short: what it won is recorded ``missed``. Each
    round sends its claim twice; a second round follows one that left slots lost (answers
    lost again), and what is left after it is recorded once the runs are done."""

    async def rounds() -> None:
        for _ in range(2):
            await engine.claims.recover_lost(fire_current=True)
            if not engine.claims.lost_count:
                return

    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        await asyncio.wait_for(rounds(), grace)
    except Exception as exc:  # (TimeoutError too) what is left is recorded after the runs
        log.warning("stopping: could not claim the slots lost before the stop: %s", exc)
    return max(0.0, grace - (loop.time() - began))


# (The run logs' loop writes the logs of the runs finishing meanwhile, for their followers.)
_KEPT_WHILE_STOPPING = frozenset(
    {"schedtui watchdog", "schedtui lease", "schedtui lease watch", "schedtui run logs", "schedtui heartbeat"}
)


def is_armed(engine: Engine) -> bool:
    """Every enabled self-triggered schedule (this instance's, in ``cluster``) is armed and
    none is catching up."""
    wanted = sum(
        1
        for s in engine.schedules.values()
        if engine.trigger_of(s) == "self"
        and engine.is_enabled(s.name)
        and (engine.cluster is None or engine.cluster.owns(s.name))
    )
    return len(engine.timers.wheel) >= wanted and not engine.catch_up.busy


def has_started(engine: Engine) -> bool:
    """Every catch-up has handed its slots on, every run taking its turn has its answer,
    every backfill has launched its next run (or ended), and every handler started has
    begun (what ``quiesce(runs=False)`` waits for besides the loops)."""
    return (
        engine.catch_up.unhanded == 0
        and engine.launcher.turning == 0
        and not engine.backfills.stepping
        and engine.runner.unbegun == 0
    )


def is_settled(engine: Engine) -> bool:
    """No run in flight, nothing catching up, recovering or backfilling, every system idle."""
    return not unsettled(engine)


def unsettled(engine: Engine) -> list[str]:
    """What keeps :func:`is_settled` false, by name (for a quiesce that never ends)."""
    parts = {
        "runs in flight": not engine.launcher.idle,
        "catching up": engine.catch_up.busy,
        "recovering claims": engine.claims.recovering,
        "backfilling": not engine.backfills.idle,
    }
    busy = [what for what, now in parts.items() if now]
    return busy + [type(subsystem).__name__ for subsystem in engine.subsystems if not subsystem.idle]


async def housekeeping(engine: Engine) -> None:
    """The housekeeping loop: :func:`maintain` every ``state_poll_interval``."""
    while True:
        began = engine.clock.now()
        try:
            await maintain(engine)
        except Unavailable as exc:
            engine.outages.trouble("maintain", "store unavailable for housekeeping", exc)
        else:
            # (Its own kind only: a full disk takes this round's reads and updates while
            # the claims' inserts fail.)
            engine.outages.back("maintain")
        # Counted from the round's start: a slow round does not push the next one out, so a
        # change made while it read (after its read) is seen a poll interval later at most.
        await engine.loops.park("maintenance", began + engine.state_poll_interval)


async def maintain(engine: Engine) -> None:
    """One round: stored schedules and states from other processes, heartbeats and the
    abandoned-work sweep, retention, lost slots, backfills, remote waits, each system."""
    now = engine.clock.now()
    last = engine.catalog.polled_at
    if not engine.relay.hears_others or last is None or now - last >= STATE_BACKSTOP * engine.state_poll_interval:
        # Every round, unless the other instances' changes are heard as they are made
        # (PostgreSQL's NOTIFY): then a read every few rounds only covers a lost signal,
        # and an idle fleet member costs the database almost nothing.
        await engine.catalog.refresh()
        await engine.refresh_states()
        engine.catalog.polled_at = now
    await engine.registry.beat_and_sweep(now)
    await engine.fleet_timings.review(now)
    await engine.registry.prune(now)
    await engine.claims.recover_lost()
    await engine.external.recover()
    await engine.backfills.maintain()
    await engine.launcher.release_remote_waits()
    for subsystem in engine.subsystems:
        await subsystem.maintain(now)
