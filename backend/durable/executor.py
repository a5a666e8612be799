"""The executor: claims runnable executions, keeps their leases, runs them, and lets go.

Each instance that runs durable functions (``schedtui serve``) claims on its own: there is
no coordinator. Every ``poll_interval`` (and at once when this process starts, signals or
wakes one) it claims what is runnable among the functions it defines, up to its
``concurrency``: new executions, waits that are due, and executions whose owner's lease
has expired. It renews the leases it holds every third of ``lease_ttl`` (on SQLite each
checkpoint renews its own too). An instance that runs a function and has room claims the
executions it starts itself as it inserts them (:meth:`DurableExecutor.reserve`). An
instance that dies stops renewing: within ``lease_ttl`` any other live instance takes its
executions over; sooner when the instance registry already knows it is gone (its pid is
dead on this machine, or its heartbeat is too old).

An execution of a function no live instance defines is never claimed, and never dropped:
the executor warns, every few minutes, about runnable executions nobody has claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from backend.durable.definition import DurableFunction
from backend.durable.run import ExecutionRun
from backend.durable.store import Claimed, DurableStore, ExecutionRow, NewExecution
from backend.errors import Unavailable
from backend.runtime.liveness import CLOCK_LIMIT_SHARE
from backend.runtime.subsystems import Shared, answers_of, keep_for_the_stop

__all__ = ["DurableExecutor"]

log = logging.getLogger("schedtui.durable")

#: Most executions one claim takes.
CLAIM_BATCH = 32
#: Runnable executions unclaimed for this long are reported (and how often, at most).
STALE_AFTER = timedelta(seconds=60)
STALE_REPORT_EVERY = timedelta(minutes=5)


class DurableExecutor:
    """Runs the durable functions of one instance (see the module docstring).

    Contract: an execution runs in this process only while this process holds its lease;
    every write for it carries the lease number of its claim; :attr:`idle` is false while
    any runs here; :meth:`stop` lets the code reach its next step boundary (for up to
    ``grace``), then releases what is left to the queue.
    """

    def __init__(
        self,
        shared: Shared,
        functions: Mapping[str, DurableFunction],
        *,
        lease_ttl: timedelta,
        poll_interval: timedelta,
        concurrency: int,
        check_owners_every: timedelta,
        retention: timedelta | None,
    ) -> None:
        self.shared = shared
        self.clock = shared.clock
        self.store = cast(DurableStore, shared.store)
        self.loops = shared.loops
        self.runner = shared.runner
        self.instance = shared.instance
        self.functions = functions
        self.lease_ttl = lease_ttl
        self.lease_margin = lease_ttl * 2 * CLOCK_LIMIT_SHARE
        """How long before an execution's lease ends, by this process's clock, its run stops:
        this clock may be behind the database's by the limit, and another's ahead of it by
        as much (a clock further off lapses the lease)."""
        self.poll_interval = poll_interval
        self.concurrency = concurrency
        self.check_owners_every = check_owners_every
        self.retention = retention
        self.running: dict[str, ExecutionRun] = {}
        self.started = False
        """Whether this instance runs its durable functions (started, not stopped)."""
        self.stopping = False
        self._reserved = 0
        """Places held for executions this process starts and claims at once, their insert
        in flight (see :meth:`reserve`)."""
        self._unreserved = asyncio.Event()
        self._unreserved.set()
        self._drives: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._short = False
        """Whether the last round left runnable work unclaimed for want of room: a run that
        ends then claims again at once (otherwise the next poll, or a poke, does)."""
        self._renew_at: datetime | None = None
        self._owners_checked: datetime | None = None
        self._pruned: datetime | None = None
        self._stale_reported: datetime | None = None
        self._started_at = self.clock.now()
        self._unanswered: dict[str, datetime] = {}
        """Claims whose executions nobody runs here, by claim, with the end of the lease
        they took: their answer was lost (the claim may have committed all the same), or
        it came under a lapsed lease (:meth:`_not_run`). Given back by the next round
        (:meth:`_give_back`), so another claim, here or elsewhere, takes them at once and
        not when their lease runs out."""
        self._claims_cut: list[asyncio.Future[Any]] = []
        """Claims on their way when a stop cancelled the loop: the stop waits for their
        answers before it gives back what they took (sent first, a give-back could find
        nothing, and the claim commit after it)."""

    @property
    def idle(self) -> bool:
        return not self._drives

    def poke(self) -> None:
        """Claim now rather than at the next poll (new work, a signal, a due wait)."""
        self._wake.set()
        self.loops.poke()

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._started_at = self.clock.now()
        if not self.functions:
            return  # nothing this instance could run
        # (as the queues' workers say theirs: what this instance runs, in its start-up log)
        log.info("running %d durable function(s), %d execution(s) at once here: %s",
                 len(self.functions), self.concurrency, ", ".join(sorted(self.functions)))  # fmt: skip
        lease = self.shared.registry.lease
        lease.on_lapse.append(self.lease_lapsed)
        lease.on_renewed.append(self.poke)
        self.loops.expect("durable")
        self.loops.keep(self._loop, "durable")
        self.started = True

    async def _loop(self) -> None:
        while True:
            # The next round is due a poll after this one looked (not after it ended): time
            # that passed during its claim may already have made a wait due.
            looked = self.clock.now()
            try:
                more = await self.round(looked)
            except Unavailable as exc:
                self.shared.outages.trouble("durable", "store unavailable for durable executions", exc)
                more = False
            if more:
                self._wake.set()
            until = looked + self.poll_interval
            if self._renew_at is not None and self.running:
                until = min(until, self._renew_at, *(run.held_until for run in self.running.values()))
            await self.loops.park("durable", until, self._wake)

    async def round(self, now: datetime) -> bool:
        """Renew leases when due, then claim what is runnable at ``now``; True when there
        may be more to claim at once."""
        if self.running and (self._renew_at is None or now >= self._renew_at) and self.shared.registry.lease.fresh():
            try:
                await self.renew(now)  # (not stamped by a clock that jumped: the lapse lets them go)
            finally:
                self._lose_expired(now)
        elif self.running:
            self._lose_expired(now)
        if self._claims_cut:  # (answered since: only the stop waits for them)
            self._claims_cut = [claiming for claiming in self._claims_cut if not claiming.done()]
        if self._unanswered:
            await self._give_back(now)
        free = self.concurrency - len(self.running) - self._reserved
        if free <= 0:
            self._short = True
            return False
        if self.stopping or not self.shared.registry.lease.fresh():
            return False  # (woken when the lease is renewed)
        limit = min(free, CLAIM_BATCH)
        lease = self.shared.registry.lease
        epoch = lease.epoch
        until = now + self.lease_ttl
        claim = uuid.uuid4().hex  # (not an id of the engine's: those are what operators see, in order)
        claiming = asyncio.ensure_future(
            self.store.durable_claim(self.instance, list(self.functions), now, until, limit, claim)
        )
        try:
            claimed = await asyncio.shield(claiming)
        except (Unavailable, asyncio.CancelledError) as exc:
            self.not_run_here(claim, until)  # it may have committed, and only its answer been lost
            if isinstance(exc, asyncio.CancelledError):
                keep_for_the_stop(claiming, self._claims_cut)
            raise
        # (Only a claim ends the trouble: a round that sends nothing says nothing of the
        # store, and renewals, updates in place, go through on a full disk.)
        self.shared.outages.back("durable")
        if claimed and not lease.holds(epoch):
            self._not_run(len(claimed))
            self.not_run_here(claim, until)
            self._wake.set()  # (given back, and claimed again, by the next round)
            return False
        for one in claimed:
            self._launch(one, until)
        self._short = len(claimed) == free
        return len(claimed) == limit

    # -- executions started here ------------------------------------------------------
    def _not_run(self, count: int) -> None:
        """Executions claimed under an epoch of this instance's lease that lapsed while the
        answer was on its way (a partition that healed, a process frozen meanwhile): another
        instance may have claimed them since, so none runs here; the next round gives back
        those still under this claim, and they are claimed again, here or elsewhere."""
        log.warning(
            "%d durable execution(s) claimed while this instance's lease lapsed are not run here: "
            "they are given back, to be claimed again", count,
        )  # fmt: skip

    def not_run_here(self, claim: str, lease_until: datetime) -> None:
        """What ``claim`` took (until ``lease_until``) does not run here: the next round
        gives it back (see :attr:`_unanswered`)."""
        self._unanswered[claim] = lease_until

    async def _give_back(self, now: datetime) -> None:
        """End the leases of what claims nobody runs here took (see :attr:`_unanswered`);
        a claim is forgotten once answered, or once the lease it took has run out."""
        for claim, until in list(self._unanswered.items()):  # (an outage fails a claim a second)
            if now >= until:
                del self._unanswered[claim]
        for claim, until in list(self._unanswered.items()):
            try:
                given_back = await self.store.durable_give_back(self.instance, claim, until, now)
            except Unavailable as exc:
                # Through the outage log: a full disk failed this every round (each round's
                # failed claim adds one), a line a second for the whole outage.
                self.shared.outages.trouble(
                    "durable give-back", "could not give back what a claim nobody runs here took; it is retried", exc
                )
                return
            self.shared.outages.back("durable give-back")
            del self._unanswered[claim]
            if given_back:
                log.warning("%d durable execution(s) taken by a claim whose answer was lost, or came too late, "
                            "are given back", given_back)  # fmt: skip

    async def renew_one(self, run: ExecutionRun) -> bool:
        """Renew one run's lease now (a step is about to start past :attr:`ExecutionRun.held_until`);
        whether it is still held."""
        if not self.shared.registry.lease.fresh():
            return False
        now = self.clock.now()
        until = now + self.lease_ttl
        try:
            renewal = await self.store.durable_renew(self.instance, [(run.id, run.lease)], until)
        except Unavailable:
            return False
        if run.id in renewal.lost:
            return False
        run.held_until = max(run.held_until, until - self.lease_margin)
        if run.id in renewal.cancel:
            run.cancel_requested = True  # (its code is at a step boundary: it stops there)
        return True

    def _lose_expired(self, now: datetime) -> None:
        """Let go of the runs whose execution lease may have run out by now, by this
        process's reckoning (their renewals failed, or were too slow): another instance
        may claim them at its end."""
        for run in list(self.running.values()):
            if now >= run.held_until:
                run.lose("its lease ran out before it could be renewed")

    def reserve(self, function: str, now: datetime) -> datetime | None:
        """An execution of ``function`` is being started in this process: if this instance
        runs that function and has room, hold a place for it and return the end of the
        lease to insert it claimed with (one statement for the start and the claim, and no
        round of the loop before it runs); ``None`` otherwise (it is queued, and claimed as
        usual). Then :meth:`launch_new` it once inserted, or :meth:`unreserve`."""
        if (
            not self.started
            or self.stopping
            or function not in self.functions
            or len(self.running) + self._reserved >= self.concurrency
            or not self.shared.registry.lease.fresh()
        ):
            return None
        self._reserved += 1
        self._unreserved.clear()
        return now + self.lease_ttl

    def unreserve(self) -> None:
        self._reserved -= 1
        if not self._reserved:
            self._unreserved.set()

    def launch_new(self, new: NewExecution, epoch: int, lease_until: datetime) -> None:
        """Run an execution inserted claimed by this instance (see :meth:`reserve`), as a
        claim of it would have: lease 1, no steps, no signals; the insert wrote the first
        line of its log (:func:`~.run.started_on`). ``epoch``: that of this instance's lease
        when it was reserved (the insert claims under it); ``lease_until``: the end of the
        lease it was inserted with."""
        self.unreserve()
        if not self.shared.registry.lease.holds(epoch):
            self._not_run(1)
            self.not_run_here(new.id, lease_until)
            self._wake.set()
            return
        row = ExecutionRow(new.id, new.function, new.input, new.created_at, 1, False, new.schedule, new.scheduled_at,
                           "queued", None)  # fmt: skip
        run = self._launch(Claimed(row, [], {}), lease_until, start_logged=True)
        if self.stopping:  # (stop() began while it was inserted): it goes back to the queue at its first step
            run.stopping = True

    def _launch(self, claimed: Claimed, lease_until: datetime, *, start_logged: bool = False) -> ExecutionRun:
        execution = claimed.execution
        held_until = lease_until - self.lease_margin
        run = ExecutionRun(self, claimed, self.functions[execution.function], held_until, start_logged=start_logged)
        if execution.was == "running" and execution.was_instance == self.instance:
            log.warning(
                "execution %s of %s claimed again under this instance's name (its lease had expired: "
                "the process of this name that held it stopped renewing it)",
                execution.id, execution.function,
            )  # fmt: skip
        elif execution.was == "running":
            log.warning(
                "execution %s of %s taken over from %s (its lease had expired)",
                execution.id, execution.function, execution.was_instance,
            )  # fmt: skip
        earlier = self.running.get(run.id)
        if earlier is not None:  # cannot happen while leases hold; never let two runs go on
            earlier.lose("the execution was claimed again")
        self.running[run.id] = run
        if self._renew_at is None:
            self._renew_at = self.clock.now() + self.lease_ttl / 3
        self.shared.events.publish("durable", run.id)
        task = asyncio.ensure_future(self._drive(run))
        task.set_name(f"schedtui durable {run.id}")
        self._drives.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._drives.discard(t)
            self.loops.poke()

        task.add_done_callback(done)
        return run

    async def _drive(self, run: ExecutionRun) -> None:
        try:
            await run.drive()
        except Exception:
            log.exception("execution %s of %s: the executor failed", run.id, run.function.name)
        finally:
            if self.running.get(run.id) is run:
                del self.running[run.id]
            if not self.running:
                self._renew_at = None
            if self._short and not self.stopping:
                self._wake.set()  # a place is free for work left unclaimed: claim again

    async def renew(self, now: datetime) -> None:
        """Extend every lease held here; stop the runs whose lease is gone, and tell the
        ones an operator cancelled elsewhere."""
        self._renew_at = now + self.lease_ttl / 3
        runs = list(self.running.values())
        leases = [(run.id, run.lease) for run in runs]
        if not leases:
            return
        until = now + self.lease_ttl
        renewal = await self.store.durable_renew(self.instance, leases, until)
        for kept in runs:
            if kept.id not in renewal.lost:
                kept.held_until = max(kept.held_until, until - self.lease_margin)
        for id_ in renewal.lost:
            run = self.running.get(id_)
            if run is not None:
                run.lose("its lease could not be renewed (another instance took the execution over)")
        for id_ in renewal.cancel:
            run = self.running.get(id_)
            if run is not None:
                run.request_cancel()

    # -- housekeeping ------------------------------------------------------------------
    async def prune(self, now: datetime) -> None:
        """Delete the executions finished longer ago than the retention (hourly)."""
        if self.retention is not None and (self._pruned is None or now - self._pruned >= timedelta(hours=1)):
            self._pruned = now
            removed = await self.store.durable_prune(now - self.retention)
            if removed:
                log.info("retention: removed %d durable execution(s) finished more than %s ago", removed, self.retention)

    async def maintain(self, now: datetime) -> None:
        """Take the executions of instances known to be gone, and report runnable
        executions nobody claims (the retention is :meth:`prune`'s)."""
        if self._owners_checked is None or now - self._owners_checked >= self.check_owners_every:
            self._owners_checked = now
            await self._expire_gone(now)
        if self._stale_reported is None or now - self._stale_reported >= STALE_REPORT_EVERY:
            self._stale_reported = now
            await self._report_stale(now)

    async def _expire_gone(self, now: datetime) -> None:
        owners = await self.store.durable_owners(now)
        if not owners:
            return
        registry = self.shared.registry
        beats = await self.shared.store.instances()
        for owner in owners:
            why = registry.gone(beats, owner, now)
            if why is None:
                continue
            # Our own name: only what an earlier process of that name claimed (the registry
            # calls it gone); a claim of ours in flight right now must keep its lease.
            before = self._started_at if owner == self.instance else None
            expired = await self.store.durable_expire(owner, now, before)
            if expired:
                log.warning("%d durable execution(s) of %s are free to claim: %s", expired, owner, why)
                self.poke()

    async def _report_stale(self, now: datetime) -> None:
        stale = await self.store.durable_stale(now - STALE_AFTER, now)
        for function, count in stale.items():
            if function in self.functions:
                continue  # ours: claimed as soon as there is room
            log.warning(
                '%d runnable execution(s) of durable function "%s" have waited over %ds for an instance that '
                "defines it; this instance does not (it defines: %s)",
                count, function, STALE_AFTER.total_seconds(), ", ".join(sorted(self.functions)) or "none",
            )  # fmt: skip

    def lease_lapsed(self, why: str) -> None:
        """This instance's lease lapsed: let go of every execution at once, writing nothing
        (its own execution lease lets another instance claim it, and replay its steps)."""
        for run in list(self.running.values()):
            run.lose(f"this instance's lease on its work lapsed ({why})")

    # -- stopping ------------------------------------------------------------------------
    async def stop(self, grace: float) -> None:
        self.stopping = True
        self.started = False
        lease = self.shared.registry.lease
        with contextlib.suppress(ValueError):
            lease.on_lapse.remove(self.lease_lapsed)
            lease.on_renewed.remove(self.poke)
        cut, self._claims_cut = self._claims_cut, []
        await answers_of(cut)
        if self._unanswered:
            await self._give_back(self.clock.now())
        if self._reserved:  # starts claimed here, being inserted: their runs are let go of below too
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._unreserved.wait(), timeout=max(grace, 0.5))
        if not self._drives:
            return
        for run in self.running.values():
            run.stopping = True
        try:
            await self.renew(self.clock.now())  # a full lease for the grace period
        except Unavailable:
            pass
        # The last runs may have ended during the renewal: asyncio.wait refuses an empty set.
        if self._drives:
            await self.shared.loops.within_grace(set(self._drives), grace)
        for run in list(self.running.values()):
            run.interrupt()
        if self._drives:
            await asyncio.wait(set(self._drives), timeout=10)
