"""What every system the engine runs beside the schedules looks like to the engine.

The job queue, durable executions and locks live in the same store and process as the
schedules and share the engine's parts: the clock, the store, the background loops, the
handler runner, the instance registry, the audit log and the change signals (:class:`Shared`). Each is a :class:`Subsystem`:
the engine opens it with the store, starts it with the timers, calls its housekeeping
every poll interval, waits for it in :meth:`~backend.scheduler.engine.Engine.quiesce`, and stops it
before the store closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from backend.clock import Clock
from backend.events.audit import AuditLog
from backend.events.bus import EventBus
from backend.runtime.loops import Loops
from backend.runtime.outages import OutageLog
from backend.runtime.runner import HandlerRunner
from backend.store import Store

if TYPE_CHECKING:  # a type only: the scheduler builds this, not the other way round
    from backend.scheduler.registry import InstanceRegistry

__all__ = ["CUT_CLAIMS_WAIT", "Shared", "Subsystem", "answers_of", "keep_for_the_stop"]

#: How long a stop waits for the answers of the claims it cut short (a job cycle, a
#: durable claim, an acquire, an alerts claim), to give back what they took: a healthy
#: store answers in milliseconds; a partition is not waited out (what such a claim took
#: then waits for its lease, or the take-over, as after a lost answer).
CUT_CLAIMS_WAIT = 2.0


def keep_for_the_stop(claim: asyncio.Future[Any], cut: list[asyncio.Future[Any]]) -> None:
    """A claim whose caller a stop cancelled (the claim itself shielded, on its way): kept
    in ``cut`` for the stop to wait for (:func:`answers_of`); its outcome is read whenever
    it comes, so a failure is never reported as not retrieved."""
    claim.add_done_callback(_read_outcome)
    cut.append(claim)


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def answers_of(claims: Collection[asyncio.Future[Any]]) -> None:
    """Wait for the answers of claims a stop cut short, :data:`CUT_CLAIMS_WAIT` at most."""
    if claims:
        await asyncio.wait(claims, timeout=CUT_CLAIMS_WAIT)


@dataclass(frozen=True)
class Shared:
    """The engine's parts a subsystem may use."""

    clock: Clock
    store: Store
    loops: Loops
    runner: HandlerRunner
    registry: InstanceRegistry
    outages: OutageLog
    instance: str
    new_id: Callable[[], str]
    audit: AuditLog
    """``await audit.record(action, target, detail)`` for every operator action."""
    events: EventBus
    """``events.publish(topic, name)`` whenever something an operator may watch changed."""


class Subsystem(Protocol):
    """Contract: ``open`` runs once the store is open (``serve`` and the one-shot verbs
    alike); ``start`` only where work is done (``serve``, ``console --fire``): it starts
    workers through ``Shared.loops`` so that ``quiesce`` sees them; ``maintain`` is the
    housekeeping round (abandoned work of dead instances, retention) and must tolerate
    :class:`~backend.errors.Unavailable`; ``stop`` lets work in flight finish for up to
    ``grace`` seconds and records the rest; ``idle`` is false while work this process
    started is in flight; ``is_ours`` names work this process is responsible for, which
    the abandoned-work sweeps must leave alone."""

    async def open(self) -> None: ...

    def start(self) -> None: ...

    async def maintain(self, now: datetime) -> None: ...

    async def stop(self, grace: float) -> None: ...

    @property
    def idle(self) -> bool: ...

    def is_ours(self, id_: str) -> bool: ...
