"""Alerts as a subsystem of the engine (:class:`~backend.runtime.subsystems.Subsystem`).

Every engine reads alerts (:meth:`Alerts.page`: what ``schedtui alerts``, ``GET
/inspect/alerts`` and the console's header show). An engine given :class:`AlertSettings`
(``schedtui serve``) also evaluates the conditions on its clock every ``interval`` seconds
and delivers the notifications of the fleet's transitions to its sinks: see
:mod:`backend.alerts.evaluator` and :mod:`backend.alerts.notifier`. Its housekeeping drops
resolved alerts and finished deliveries after :data:`KEEP`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

import httpx

from backend.alerts.evaluator import Evaluator, Round
from backend.alerts.model import AlertsPage, ordered
from backend.alerts.notifier import AlertSettings, Notifier, parse_sinks
from backend.alerts.store import AlertStore
from backend.clock import Clock
from backend.durable.definition import DurableFunction
from backend.errors import Unavailable
from backend.events.audit import AuditLog
from backend.events.bus import EventBus
from backend.jobs.definition import Queue
from backend.model import ScheduleState
from backend.runtime.loops import Loops
from backend.schedules import Schedule

__all__ = ["KEEP", "RESOLVED_SHOWN", "AlertSettings", "Alerts"]

log = logging.getLogger("schedtui.alerts")

#: How long a resolved alert is listed with ``resolved=True``.
RESOLVED_SHOWN: Final = timedelta(hours=24)
#: How long resolved alerts and finished deliveries are kept.
KEEP: Final = timedelta(days=7)


class Alerts:
    """The alerts of one engine's store; with ``settings``, their evaluation and delivery."""

    def __init__(
        self,
        *,
        store: object,
        clock: Clock,
        loops: Loops,
        events: EventBus,
        audit: AuditLog,
        instance: str,
        new_id: Callable[[], str],
        settings: AlertSettings | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.loops = loops
        self.events = events
        self.audit = audit
        self.instance = instance
        self.new_id = new_id
        self.settings = settings
        self.transport = transport
        self.evaluator: Evaluator | None = None
        self.notifier: Notifier | None = None
        self.last_round: Round | None = None
        self._last_prune: datetime | None = None
        self._again = asyncio.Event()
        """Set: the evaluation loop runs a round now, not at its next interval."""

    def _store(self) -> AlertStore:
        if not isinstance(self.store, AlertStore):
            raise Unavailable(f"this store ({type(self.store).__name__}) keeps no alerts")
        return self.store

    async def page(self, *, resolved: bool = False) -> AlertsPage:
        """The firing alerts (and, with ``resolved``, those resolved in the last
        :data:`RESOLVED_SHOWN`), firing ones first, newest first."""
        after = self.now() - RESOLVED_SHOWN if resolved else None
        return ordered(await self._store().list_alerts(resolved_after=after))

    # -- evaluation and delivery (serve) ------------------------------------------------------
    def watch(
        self,
        *,
        schedules: Mapping[str, Schedule],
        queues: Mapping[str, Queue],
        functions: Mapping[str, DurableFunction],
        state_of: Callable[[str], ScheduleState | None],
        is_enabled: Callable[[str], bool],
        fleet: Callable[[], Any],
        fresh: timedelta,
        beat: Callable[[datetime], Awaitable[bool]] | None = None,
        unrunnable: Collection[str] = (),
        code_owners: Callable[[], Awaitable[Mapping[str, str | None]]] | None = None,
        store_time: Callable[[datetime], datetime] = lambda now: now,
    ) -> None:
        """Hand the evaluator what it reads of the engine (before :meth:`start`); ``beat``
        writes this instance's heartbeat when it is due, ``unrunnable`` names the stored
        schedules not valid here, ``code_owners`` reads who defines each code schedule
        (see :class:`Evaluator`). ``store_time``: this clock's time as the store server's
        (see :meth:`now`)."""
        self.store_time = store_time
        if self.settings is None:
            return
        store = self._store()
        self.evaluator = Evaluator(
            store=store, instance=self.instance, new_id=self.new_id, schedules=schedules, queues=queues,
            functions=functions, state_of=state_of, is_enabled=is_enabled, fleet=fleet, fresh=fresh, beat=beat,
            unrunnable=unrunnable, code_owners=code_owners,
        )  # fmt: skip
        self.notifier = Notifier(
            store=store, clock=self.clock, loops=self.loops, instance=self.instance,
            sinks=parse_sinks(self.settings.sinks), settings=self.settings, audit=self.audit, transport=self.transport,
            now=self.now,
        )  # fmt: skip

    def now(self) -> datetime:
        """The time alerting judges and stamps by: this clock's, or the store server's where
        this clock is off it (by the newest reading). On a clock a minute ahead the others'
        heartbeats looked a minute old (it paged "no instance fires" beside a healthy one,
        stamped in the future, which the others could not resolve); one behind took
        delivery leases that had run out by the others' clocks (a page sent twice). Judged
        so, an instance that stands down for its clock still pages, and a fleet that all
        stands down (the database server's clock off) is paged."""
        return self.store_time(self.clock.now())

    async def evaluate(self) -> Round:
        """One evaluation round now (see :meth:`now`): the transitions it wrote wake the delivery."""
        assert self.evaluator is not None and self.settings is not None, "evaluation needs settings"
        now = self.now()
        done = await self.evaluator.evaluate(now, sinks_after=now - timedelta(seconds=self.settings.sink_ttl))
        self.last_round = done
        for alert in done.won:
            self.events.publish("alerts", alert.key)
        if done.summaries and not done.won:
            self.events.publish("alerts", None)
        if done.won and self.notifier is not None:
            self.notifier.wake_up()
        return done

    def evaluate_soon(self) -> None:
        """Have the evaluation loop run a round now: an operator's action changed what it
        judges (an instance forgotten: its ``instance_lost`` resolves in seconds, not at the
        next interval). Nothing without evaluation (no settings, or not started)."""
        self._again.set()

    async def _evaluating(self) -> None:
        assert self.settings is not None
        every = timedelta(seconds=self.settings.interval)
        failing: str | None = None  # the unexpected failure of the rounds since the last good one
        while True:
            try:
                await self.evaluate()
            except Unavailable as exc:
                log.warning("alerts: evaluation skipped: %s", exc)
            except Exception as exc:  # a bug or a bad rule: it must not end all alerting for good
                seen = f"{type(exc).__name__}: {exc}"
                if seen != failing:  # with the traceback once, not every round
                    log.exception("alerts: an evaluation round failed; trying again every %gs", every.total_seconds())
                failing = seen
            else:
                if failing is not None:
                    log.info("alerts: evaluation works again (the rounds before failed with %s)", failing)
                failing = None
            await self.loops.park("alert evaluation", self.clock.now() + every, wake=self._again)

    # -- the subsystem ---------------------------------------------------------------------------
    async def open(self) -> None:
        pass

    def start(self) -> None:
        if self.evaluator is None or self.notifier is None:
            return
        self.loops.expect("alert evaluation")
        self.loops.spawn(self._evaluating(), "alert evaluation")
        for sink_id, name in self.notifier.loop_names.items():  # (one loop a sink)
            self.loops.expect(name)
            self.loops.spawn(self.notifier.run(sink_id), name)

    async def maintain(self, now: datetime) -> None:
        if self.evaluator is None:
            return
        if self._last_prune is not None and now - self._last_prune < timedelta(hours=1):
            return
        self._last_prune = now
        with contextlib.suppress(Unavailable):
            removed = await self._store().prune_alerts(now - KEEP)
            if removed:
                log.info("alerts retention: removed %d row(s) older than %s", removed, KEEP)

    async def stop(self, grace: float) -> None:
        if self.notifier is not None:
            await self.notifier.stop(grace)

    @property
    def idle(self) -> bool:
        return True

    def is_ours(self, id_: str) -> bool:
        return False
