"""The locks subsystem: taking, renewing and releasing leases; locked schedule runs.

One :class:`Locks` per engine (``engine.locks``, and ``st.locks`` from
:func:`~backend.client.connection.connect`). A lease is taken with one conditional statement
(:meth:`Locks.acquire`: another holder means ``None`` at once, never a wait), renewed in
the background every ``ttl/3`` by a task parked on the engine's clock (so
:meth:`~backend.scheduler.engine.Engine.quiesce` sees it), and released with one statement. When a
renewal fails for good (the token is no longer current) or the lease's deadline passes
without one, the lease is *lost*: its callbacks run (``with_lock`` and ``hold`` cancel
async work, a locked schedule's run is recorded ``failed``/``lease_lost``). The release
is the last check: when it finds the token no longer current (released by force since
the last renewal), the lease is lost too, and ``with_lock`` and ``hold`` report it.

An acquire whose answer is lost (the connection breaks after the statement committed)
raises :class:`~backend.errors.Unavailable` as any failed acquire does, but the lock may be
taken all the same, by a holder that does not know it: every acquire carries a claim of
its own, and the next housekeeping round (or this process's next acquire of that name)
gives back what a failed one took (:meth:`Locks.maintain`), so the lock is free again
within a second or so, not at the end of its ttl (a locked schedule would otherwise skip
its own next slots as "held").

Times: leases expire on the *lock clock*, the database's own unless the engine runs on an
injected :class:`~backend.clock.ManualClock` (tests), so that instances whose clocks
differ agree on expiry. This process measures a lease's ttl, and when to renew it, on the
*lease clock*, one that never jumps (``CLOCK_BOOTTIME``; an
injected clock's own time in tests): a step of the wall clock (NTP, a restored VM) neither
holds a renewal back nor keeps a lease believed held past its ttl.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from backend.errors import BadInput, NotFound, Refused, Unavailable
from backend.inputs import check_text, is_async_callable, shown_number
from backend.locks.lease import Lease, LockResult
from backend.locks.model import (
    DEFAULT_TTL,
    HOLDER_MAX_CHARS,
    TAG_LEASE_LOST,
    TAG_LOCKED,
    LeaseLost,
    Lock,
    LockNotAcquired,
    LockRelease,
    LocksSnapshot,
    check_lock_name,
    check_lock_to_take,
    check_ttl,
)
from backend.locks.store import LockStore
from backend.locks.sync import SyncLocks
from backend.model import TAG_UNAVAILABLE, iso
from backend.runtime.leaseclock import LeaseClock
from backend.runtime.loops import call_from_thread
from backend.runtime.runner import Outcome
from backend.runtime.subsystems import answers_of
from backend.safetext import in_line

if TYPE_CHECKING:
    from backend.clock import Clock
    from backend.locks.sync import SyncLocks
    from backend.runtime.subsystems import Shared
    from backend.schedules import Schedule

__all__ = ["GuardedRun", "Locks"]

log = logging.getLogger("schedtui.locks")


class _Unanswered(NamedTuple):
    """An acquire that failed: what it may have taken, and until when that would hold."""

    name: str
    until: datetime


class GuardedRun(Protocol):
    """A run of a schedule defined with ``lock=``, as the launcher hands it in."""

    schedule: Schedule
    lease: Lease | None

    @property
    def done(self) -> bool: ...

    def settle(self, outcome: Outcome) -> bool: ...

    def cancel(self) -> None: ...


class Locks:
    """Leases on named locks in the engine's store. See the module docstring.

    Contract: a lease returned by :meth:`acquire` is the lock's only current lease until
    it is released or lost; its renewals, releases and fences act only while its token is
    the lock's current one; the lock clock is the database's unless ``lock_clock`` is given
    (an injected clock, for tests)."""

    def __init__(self, shared: Shared, *, lock_clock: Clock | None = None) -> None:
        self.clock = shared.clock
        self.store = cast(LockStore, shared.store)
        self.loops = shared.loops
        self.instance = shared.instance
        self.audit = shared.audit
        self.events = shared.events
        self.lock_clock = lock_clock
        self.lease_clock = LeaseClock(self.clock, self.loops)
        self._unanswered: dict[str, _Unanswered] = {}
        """By claim: acquires that failed, whose statement may have taken the lock all the
        same; given back by :meth:`maintain` (and at a stop) until their ttl has run out."""
        self._leases: set[Lease] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._run_leases: set[Lease] = set()
        """Leases held by locked schedule runs (what :meth:`stop` gives its grace to)."""
        self._runs_done = asyncio.Event()
        self._releasing: set[asyncio.Task[Any]] = set()
        """Releases on their way in the background (a locked run's, after it ended)."""
        self._guarding: set[asyncio.Task[Any]] = set()
        """Locked runs taking their lock (what :meth:`stop` waits for, within its grace)."""
        self._acquiring: dict[asyncio.Future[Lock | None], tuple[str, _Unanswered]] = {}
        """Acquires on their way, by their store call: their claim and what they would take."""
        self._stopped = False
        """Set by :meth:`stop` before it waits for the acquires on their way: none takes a lock now."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The engine's event loop (bound at :meth:`open`): where :attr:`sync` carries calls out."""

    def lease_now(self) -> int:
        """The lease clock's time (nanoseconds; see :class:`~backend.runtime.leaseclock.LeaseClock`)."""
        return self.lease_clock.now()

    def lock_now(self) -> datetime | None:
        """The time to hand the store: ``None`` for the database's own clock."""
        return None if self.lock_clock is None else self.lock_clock.now()

    # -- the subsystem's hooks ------------------------------------------------------------
    async def open(self) -> None:
        """The store migrated the lock tables when it opened; bind to this event loop."""
        self._runs_done = asyncio.Event()
        self._runs_done.set()
        self._stopped = False
        self.loop = asyncio.get_running_loop()

    def start(self) -> None:
        """No workers: leases renew themselves."""

    @property
    def sync(self) -> SyncLocks:
        """These locks for code on another thread (a plain ``def`` handler, as
        ``ctx.locks.sync``): each call blocks until the engine's loop has carried it out, and
        the lease renews on that loop while the work runs in the caller's thread."""
        return SyncLocks(self, self._blocking)

    def _blocking(self, call: Coroutine[Any, Any, Any]) -> Any:
        return call_from_thread(self.loop, call, "await ctx.locks.… instead of ctx.locks.sync.…")

    async def maintain(self, now: datetime) -> None:
        """Give back what acquires whose answer was lost took. Nothing else to sweep: lock
        rows and fence counters are kept for good (a name's row carries its last token;
        deleting it could let a token run backwards)."""
        await self.give_back_unanswered(now)

    async def give_back_unanswered(self, now: datetime, only: str | None = None) -> None:
        """Free each lock (``only`` that one) still held under the claim of an acquire that
        failed. A claim is forgotten once answered, or once its ttl has run out (the lock is
        free by then; and an acquire by an older schedtui, which does not write claims,
        could have taken the row since and left the claim on it)."""
        for claim, unanswered in list(self._unanswered.items()):
            if now >= unanswered.until:
                del self._unanswered[claim]
        for claim, (name, _) in list(self._unanswered.items()):
            if only is not None and name != only:
                continue
            try:
                given_back = await self.store.give_back_lock(name, claim, self.lock_now())
            except Unavailable as exc:  # (the rest at the next round: the store is away)
                log.info('lock "%s": could not give back what an unanswered acquire took (%s); retrying', name, exc)
                return
            self._unanswered.pop(claim, None)
            if given_back:
                log.warning('lock "%s": an acquire whose answer was lost had taken it; given back', name)
                self.events.publish("locks", name)

    @property
    def idle(self) -> bool:
        # Renewal loops park on the clock (quiesce sees them through Loops); a release in
        # the background is the end of a run's work: quiesce waits for it too.
        return not self._releasing

    def is_ours(self, id_: str) -> bool:
        return False

    async def stop(self, grace: float) -> None:
        """Give locked runs up to ``grace`` seconds to finish (a run's lease is released when
        the run is recorded), those still taking their lock included (a slot fired just
        before the stop); then release every lease still held (any other is lost first:
        its holder's ``with_lock`` or ``hold`` is cancelled and raises or returns
        :class:`LeaseLost`), and give back what acquires cut short took."""
        if grace > 0:
            loop = asyncio.get_running_loop()
            until = loop.time() + grace
            await self.loops.within_grace(set(self._guarding), grace)
            if self._run_leases:
                done = asyncio.ensure_future(self._runs_done.wait())
                await self.loops.within_grace({done}, until - loop.time())
                done.cancel()
        # Releases on their way land first: cut short, one could leave its lock held until
        # its ttl. Guards still taking a lock are cut short before the give-back (their
        # acquire is then remembered unanswered): one cancelled after it would keep what it
        # took, by nobody who knows it, for the whole ttl.
        await asyncio.gather(*self._releasing, return_exceptions=True)
        await _cancel(self._guarding)
        await asyncio.gather(*self._releasing, return_exceptions=True)  # (a guard's own, cut short)
        # Acquires on their way (the caller's code, not the engine's): their answers first,
        # then what they took is lost below, or, not taken yet, given back by its claim.
        self._stopped = True  # (their callers raise once answered)
        acquiring = dict(self._acquiring)
        await answers_of(acquiring)
        self._unanswered.update(acquiring.values())
        for lease in list(self._leases):
            if lease in self._run_leases:  # (its run is recorded by the launcher's stop)
                await self.release_lease(lease)
            else:
                # Its renewals stop with the engine: the work holding it (``with_lock``,
                # ``hold``) is told and cancelled, not left to run on unprotected, reporting
                # success.
                self._lose(lease, "the engine stopped while it was held")
        await asyncio.gather(*self._releasing, return_exceptions=True)
        await self.give_back_unanswered(self.clock.now())
        await _cancel(self._tasks)

    # -- leases ----------------------------------------------------------------------------
    async def acquire(self, name: str, ttl: float | Any = DEFAULT_TTL, *, holder: str | None = None) -> Lease | None:
        """Take the lock if nobody holds it (one statement); ``None`` at once otherwise."""
        name, span = check_lock_to_take(name), check_ttl(ttl)
        if holder is not None:
            check_text(holder, "holder", max_chars=HOLDER_MAX_CHARS, one_line=True)
            if not holder.strip():  # (shown as nobody's: a lock held by no one anyone can name)
                raise BadInput(f"holder {holder!r} is empty: give a name an operator can tell apart", field="holder")
        if self._stopped:
            raise Unavailable(f'lock "{name}" not taken: the engine has stopped')
        asked_at, asked = self.clock.now(), self.lease_now()
        if self._unanswered:  # this process may hold it unknowingly: give that back first
            await self.give_back_unanswered(asked_at, name)
        claim = uuid.uuid4().hex  # (not an id of the engine's: those are what operators see, in order)
        sending = asyncio.ensure_future(
            self.store.acquire_lock(name, holder or self.instance, span, self.lock_now(), claim)
        )
        self._acquiring[sending] = (claim, _Unanswered(name, asked_at + span))
        try:
            lock = await sending
        except (Unavailable, asyncio.CancelledError):
            # The statement may have committed and only its answer been lost: the lock
            # would be held, by nobody who knows it, until its ttl ran out.
            self._unanswered[claim] = _Unanswered(name, asked_at + span)
            raise
        finally:
            self._acquiring.pop(sending, None)
        if self._stopped:  # the stop waited for this answer: it gives back what it took
            raise Unavailable(f'lock "{name}" not taken: the engine stopped while it was being taken')
        if lock is None:
            return None
        lease = Lease(self, lock, span, asked)
        if self.lease_now() >= lease.deadline:
            # Its answer came back after the lease it gives would have run out (a partition
            # that healed, a process frozen meanwhile): another holder may have it since.
            log.warning('lock "%s" (token %d): the answer came after its ttl had run out; not taken',
                        name, lease.token)  # fmt: skip
            await self.release_lease(lease)
            return None
        self._leases.add(lease)
        self.events.publish("locks", name)
        self._spawn(self._keep(lease), f"lease {name}#{lease.token}")
        return lease

    async def release_lease(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        lease._stop.set()
        self._leases.discard(lease)
        if lease in self._run_leases:
            self._run_leases.discard(lease)
            if not self._run_leases:
                self._runs_done.set()
        asked_at = self.lease_now()
        sending = asyncio.ensure_future(self.store.release_lock(lease.name, lease.token, self.lock_now()))
        try:
            still_held = await asyncio.shield(sending)
        except asyncio.CancelledError:
            # Its caller cut short (a guard cancelled by a stop): the release goes on, or the
            # lock would stay held, by nobody, until its ttl. A stop waits for it.
            self._releasing.add(sending)
            sending.add_done_callback(self._released)
            sending.add_done_callback(_retrieve)
            raise
        except Unavailable as exc:
            log.warning('lock "%s" (token %d) not released (%s); it expires by itself at %s',
                        lease.name, lease.token, exc, iso(lease.expires_at))
        else:
            # The release is the check on exit: the work that just ended must not be
            # reported done under a lock it had lost before its next renewal would say so.
            if not still_held:
                self._mark_lost(lease, f"token {lease.token} was no longer current when it was released "
                                       "(released by force, or taken over)")
            elif asked_at >= lease.deadline:
                self._mark_lost(lease, "it was not renewed before it expired")
        self.events.publish("locks", lease.name)

    def release_soon(self, lease: Lease) -> None:
        """Release in the background (from code that cannot wait)."""
        if not lease.released:
            self.release_then(lease, None)

    def release_then(self, lease: Lease, then: Callable[[], None] | None) -> None:
        """Release in the background, then call ``then`` (on the loop, whatever happened):
        by then ``lease.lost`` says whether the release found the lease no longer current.
        A stop, and :meth:`~backend.scheduler.engine.Engine.quiesce`, wait for both."""

        async def release() -> None:
            try:
                await self.release_lease(lease)
            finally:
                if then is not None:
                    then()

        task = self._spawn(release(), f"release {lease.name}#{lease.token}")
        self._releasing.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[Any]) -> None:
        self._releasing.discard(task)
        self.loops.poke()  # (a quiesce waiting for it looks again)

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        # Not Loops.spawn: the engine cancels those first when it stops, and a lease must
        # keep being renewed while the runs it protects are given their grace.
        task = asyncio.ensure_future(coro)
        task.set_name(f"schedtui {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _mark_lost(self, lease: Lease, reason: str) -> None:
        """Set :attr:`Lease.lost` (once) and say why."""
        if lease.lost.is_set():
            return
        lease.lost_reason = reason
        lease.lost.set()
        lease._lost_flag.set()
        log.warning('lease of lock "%s" (token %d) lost: %s', lease.name, lease.token, reason)

    def _lose(self, lease: Lease, reason: str) -> None:
        """The lease is lost while held: mark it, tell whoever runs the protected work."""
        if lease.lost.is_set() or lease.released:
            return
        self._mark_lost(lease, reason)
        for callback in lease._on_lost:
            try:
                callback(reason)
            except Exception:
                log.exception('a callback of lock "%s" failed', lease.name)
        # In case a renewal went through after all: a stale lease must not block the next holder.
        self.release_soon(lease)

    async def _keep(self, lease: Lease) -> None:
        """Renew every ttl/3 until released; lose the lease when that fails for good."""
        loop = f"lease {lease.name}#{lease.token}"
        every = LeaseClock.span(lease.ttl) // 3
        due = lease.renewed_at + every
        try:
            while True:
                await self.lease_clock.park(loop, min(due, lease.deadline), lease._stop)
                if lease.released or lease.lost.is_set():
                    return
                asked_at = self.lease_now()
                if asked_at >= lease.deadline:
                    self._lose(lease, "it was not renewed before it expired")
                    return
                if asked_at < due:
                    continue
                renewal = asyncio.ensure_future(self.store.renew_lock(lease.name, lease.token, lease.ttl, self.lock_now()))
                expired = asyncio.ensure_future(self.lease_clock.sleep_until(lease.deadline))
                try:
                    await asyncio.wait({renewal, expired}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    expired.cancel()
                if lease.released:
                    renewal.add_done_callback(_retrieve)
                    return
                if not renewal.done():
                    renewal.add_done_callback(_retrieve)
                    self._lose(lease, "the store did not answer the renewal before the lease expired")
                    return
                try:
                    expires = renewal.result()
                except Unavailable as exc:
                    # Try again soon; the deadline decides when it is too late.
                    log.info('lock "%s": renewal failed (%s); retrying', lease.name, exc)
                    due = min(self.lease_now() + every // 3, lease.deadline)
                    continue
                if expires is None:
                    self._lose(lease, f"token {lease.token} is no longer current (taken over, or released by force)")
                    return
                lease.expires_at = expires
                lease.renewed_at = asked_at
                lease.deadline = asked_at + LeaseClock.span(lease.ttl)
                due = asked_at + every
        finally:
            self.loops.forget(loop)
            self.loops.poke()

    # -- what callers use ------------------------------------------------------------------
    async def with_lock(self, name: str, work: Callable[[Lease], Any], ttl: float | Any = DEFAULT_TTL) -> LockResult:
        """Run ``work(lease)`` while holding the lock, or return ``acquired=False`` at once.

        Async work is cancelled if the lease is lost (``error`` is then :class:`LeaseLost`);
        sync work runs on a thread and is told through ``lease.lost``. What ``work``
        returns is ``value``; what it raises is ``error`` (returned, not raised). A lease
        found released by force when the work ends (before a renewal noticed) is lost:
        ``error`` is :class:`LeaseLost`, never a success."""
        lease = await self.acquire(name, ttl)
        if lease is None:
            return LockResult(False)
        value: Any = None
        error: BaseException | None = None
        try:
            if is_async_callable(work):
                value, error = await self._run_async(lease, work)
            else:
                value, error = await asyncio.to_thread(_call, work, lease)
                if inspect.isawaitable(value):  # lambda lease: coro(lease)
                    value, error = await self._run_async(lease, lambda _: value)
        finally:
            await lease.release()
        if lease.lost.is_set() and error is None:
            error = LeaseLost(f'the lease of lock "{lease.name}" was lost while the work ran: {lease.lost_reason}')
        return LockResult(True, value, error, lease.token)

    async def _run_async(self, lease: Lease, work: Callable[[Lease], Any]) -> tuple[Any, BaseException | None]:
        task = asyncio.ensure_future(_await(work, lease))

        def cancel(why: str) -> None:
            task.cancel()

        lease.on_lost(cancel)
        try:
            return await task
        except asyncio.CancelledError:
            if lease.lost.is_set() and task.cancelled() and not _cancelling():
                return None, LeaseLost(f'the lease of lock "{lease.name}" was lost; the work was cancelled: {lease.lost_reason}')
            raise

    @contextlib.asynccontextmanager
    async def hold(self, name: str, ttl: float | Any = DEFAULT_TTL) -> AsyncIterator[Lease]:
        """``async with locks.hold(name, ttl) as lease:`` runs the block holding the lock.

        Raises :class:`LockNotAcquired` (naming the holder) when another holder has it. If
        the lease is lost, the block is cancelled and :class:`LeaseLost` raised instead."""
        lease = await self.acquire(name, ttl)
        if lease is None:
            raise LockNotAcquired(await self.describe_holder(name))
        task = asyncio.current_task()
        assert task is not None
        cancelled = False

        def cancel(why: str) -> None:
            nonlocal cancelled
            cancelled = True
            task.cancel()

        lease.on_lost(cancel)
        try:
            yield lease
        except asyncio.CancelledError:
            if not cancelled:
                raise
            cancelled = False
            if task.uncancel() > 0:  # cancelled by someone else as well: theirs wins
                raise
            raise LeaseLost(f'the lease of lock "{name}" was lost; the block was cancelled: {lease.lost_reason}') from None
        finally:
            lease._on_lost.clear()
            if cancelled:  # lost after the block's last await: the cancel is still pending
                task.uncancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
            await lease.release()
        if lease.lost.is_set():
            raise LeaseLost(f'the lease of lock "{name}" was lost while the block ran: {lease.lost_reason}')

    async def describe_holder(self, name: str) -> str:
        """A sentence naming who holds ``name`` (for refusals)."""
        try:
            lock = await self.store.get_lock(name)
        except Unavailable:
            lock = None
        if lock is None or lock.holder is None:
            return f'lock "{name}" is held by another holder'
        return f'lock "{name}" is held by {lock.holder} (token {lock.token}) until {iso(lock.expires_at)}'

    async def list(self) -> LocksSnapshot:
        """Every lock (held, expired or free) and the lock clock's now."""
        return await self.store.list_locks(self.lock_now())

    async def release(self, name: str, if_token: int | None = None) -> LockRelease:
        """Release ``name`` by force, whoever holds it (an operator's action): its holder's
        renewals and fences fail from now on, and the next holder gets a greater token.
        Given ``if_token`` (the lease the operator saw and confirmed), only while that is still
        the lock's: one taken since is never cut by a confirmation of another (``Refused``,
        nothing released). Returns the lock as it was; :class:`~backend.errors.NotFound`
        for an unknown name."""
        if if_token is not None and (isinstance(if_token, bool) or not isinstance(if_token, int)):
            raise BadInput(f"if_token {shown_number(if_token)} is not a whole number (a lock's token)", field="if_token")
        done = await self.store.force_release_lock(check_lock_name(name), self.lock_now(), if_token)
        if done is None:
            raise NotFound(f'no lock named "{name}"')
        if if_token is not None and done.lock.token != if_token:
            now = done.lock
            holder = f"held by {now.holder} (token {now.token})" if now.holder is not None else f"free (token {now.token})"
            raise Refused(
                f'lock "{name}" is {holder} now, no longer token {if_token}: nothing was released; look again',
                reason="lock changed",
            )
        if done.released:
            log.warning('lock "%s" released by force (holder %s, token %d)', name, in_line(done.lock.holder or "-"),
                        done.lock.token)  # fmt: skip
        await self.audit.record(
            "lock.release", name, {"released": done.released, "holder": done.lock.holder, "token": done.lock.token}
        )
        self.events.publish("locks", name)
        return done

    # -- locked schedule runs ------------------------------------------------------------------
    def guard(self, run: GuardedRun, start: Callable[[], None]) -> None:
        """Take the schedule's lock, then ``start()`` the run holding it; if another holder
        has it, record the run ``skipped`` (error tag ``locked``). The lease is released
        when the run's handler has returned (:meth:`release_soon` from the launcher; a
        success is recorded only once that release has found the lease still current, see
        :meth:`release_then`); if it is lost first, the run is recorded ``failed``
        (``lease_lost``) and cancelled."""
        task = self._spawn(self._guard(run, start), f"lock for {run.schedule.name}")
        self._guarding.add(task)
        task.add_done_callback(self._guarding.discard)

    async def _guard(self, run: GuardedRun, start: Callable[[], None]) -> None:
        schedule = run.schedule
        name = schedule.lock
        assert name is not None
        try:
            lease = await self.acquire(name, schedule.lock_ttl, holder=f"{self.instance} ({schedule.name})")
        except Unavailable as exc:
            run.settle(Outcome("failed", self.clock.now(), TAG_UNAVAILABLE, f'not started: cannot take lock "{name}": {exc}'))
            return
        if lease is None:
            why = await self.describe_holder(name)
            run.settle(Outcome("skipped", self.clock.now(), TAG_LOCKED, f"not started: {why}"))
            return
        if run.done:  # stopped while the lock was being taken
            await lease.release()
            return
        run.lease = lease
        self._run_leases.add(lease)
        self._runs_done.clear()

        def lost(why: str) -> None:
            message = f'the lease of lock "{name}" (token {lease.token}) was lost: {why}'
            if run.settle(Outcome("failed", self.clock.now(), TAG_LEASE_LOST, message)):
                run.cancel()

        lease.on_lost(lost)
        start()


# What the work raises is its result's error, whatever it is: raised into a task, SystemExit
# or KeyboardInterrupt would end the process (asyncio re-raises them out of the loop), and
# a future refuses StopIteration (to_thread would then never return).
def _call(work: Callable[[Lease], Any], lease: Lease) -> tuple[Any, BaseException | None]:
    try:
        return work(lease), None
    except BaseException as exc:  # noqa: B036 - the work's error, returned
        return None, exc


async def _await(work: Callable[[Lease], Any], lease: Lease) -> tuple[Any, BaseException | None]:
    try:
        return await work(lease), None
    except asyncio.CancelledError:
        raise  # (the lease was lost, or the caller cancelled: see _run_async)
    except BaseException as exc:  # noqa: B036 - the work's error, returned
        return None, exc


async def _cancel(tasks: set[asyncio.Task[Any]]) -> None:
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _cancelling() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
