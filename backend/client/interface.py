"""The shared backend interface: all the console and the CLI know about an engine.

:class:`Backend` is implemented twice: :class:`EmbeddedBackend` drives an
:class:`~backend.scheduler.engine.Engine` in this process, and :class:`backend.client.remote.RemoteBackend`
drives a remote engine through its HTTP inspect API. The same contract tests run against
both. Nothing here imports Textual; the caller owns concurrency (the console calls these
methods from its workers).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict

from backend.client.actions import ACTIONS, Action, action_of
from backend.client.operations import (
    AlertOperations,
    AuditOperations,
    DurableOperations,
    FleetOperations,
    HealthOperations,
    JobOperations,
    LockOperations,
    ScheduleOperations,
)
from backend.events.bus import Signal
from backend.jobs.model import QueueView
from backend.model import BackfillProgress, CoordinationMode, Health, Run, RunsPage, SchedulesSnapshot, ScheduleView

__all__ = [
    "ACTIONS",
    "SYSTEMS",
    "Action",
    "Backend",
    "ConnectionInfo",
    "ConnectionInfoJson",
    "RunsPage",
    "SchedulesSnapshot",
    "action_of",
]

SYSTEMS = ("schedules", "jobs", "durable", "locks", "audit", "alerts", "health")
"""The systems an engine of this version offers (an older server offers only
``schedules``; ``alerts`` and ``health``, the activity read, came after ``audit``); a
console shows a view only for a system its backend offers."""


class ConnectionInfoJson(TypedDict):
    """What a console or CLI is connected to: an engine in this process (``embedded``) or a
    server (``remote``), the systems it offers, and who its actions are recorded as."""

    kind: Literal["embedded", "remote"]
    where: str
    coordination: CoordinationMode
    instance: str
    read_only: bool
    store_kind: str
    fires: bool
    systems: list[str]
    actor: str


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What a backend is connected to, for the console's header."""

    kind: Literal["embedded", "remote"]
    where: str
    """The store's path or redacted URL (embedded), or the server's URL (remote)."""
    coordination: CoordinationMode
    instance: str
    read_only: bool
    store_kind: str = ""
    fires: bool = True
    """Whether this engine fires schedules on its timers (a remote ``serve`` does; an
    embedded console only when asked to, otherwise it observes and acts)."""
    systems: tuple[str, ...] = SYSTEMS
    """What the backend offers (``schedules``; later ``jobs``, ``durable``, ``locks``, ``audit``,
    ``health``)."""
    actor: str = ""
    """Who the actions are recorded as: the OS user or ``--as`` (embedded), the token's
    name (remote)."""

    def to_json(self) -> ConnectionInfoJson:
        return {
            "kind": self.kind,
            "where": self.where,
            "coordination": self.coordination,
            "instance": self.instance,
            "read_only": self.read_only,
            "store_kind": self.store_kind,
            "fires": self.fires,
            "systems": list(self.systems),
            "actor": self.actor,
        }


class Backend(
    ScheduleOperations,
    FleetOperations,
    LockOperations,
    DurableOperations,
    AuditOperations,
    AlertOperations,
    HealthOperations,
    JobOperations,
    abc.ABC,
):
    """One engine, local or remote, as the console and the CLI see it.

    Its operator actions are the methods it inherits from each system's class in
    :mod:`backend.client.operations` (``operations/jobs.py`` declares the job queue's,
    and so on), marked :func:`~backend.client.actions.action`: each one's signature and
    docstring are its declaration (see :mod:`backend.client.actions`), and every call of
    one goes to :meth:`_act`, which each implementation defines once. The members here
    are the plain abstract methods and two conveniences.

    Contract:

    * Every method may raise a :class:`backend.errors.SchedtuiError` subclass and nothing
      else on purpose: ``NotFound`` (unknown schedule/run/backfill), ``Refused`` (with
      ``count`` and ``reason``), ``BadInput``, ``Unauthorized``, ``Forbidden`` (a
      read-only backend asked to act), ``Unavailable`` (store or server unreachable).
    * Reads have no side effects. ``plan_backfill`` in particular fires nothing.
    * ``run_now`` always starts exactly one run (trigger and outcome ``manual``) and
      returns it once it is recorded; it is not retried on a connection error.
    * Datetimes are aware UTC.
    """

    read_only: bool
    """True when the ``operate`` actions raise ``Forbidden``."""

    @abc.abstractmethod
    async def _act(self, action: Action, arguments: dict[str, Any]) -> Any:
        """Carry out ``action`` with ``arguments`` (by name, defaults applied)."""

    @abc.abstractmethod
    async def connect(self) -> ConnectionInfo:
        """Open the store or reach the server; returns what it is connected to."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def info(self) -> ConnectionInfo:
        """What :meth:`connect` found (call it after connecting)."""

    @abc.abstractmethod
    async def health(self) -> Health:
        """Whether the engine is serving; needs no token."""

    @abc.abstractmethod
    async def now(self) -> datetime:
        """The engine's clock: what relative times such as ``-2d`` are read against."""

    @abc.abstractmethod
    async def schedule_zone(self, name: str) -> str:
        """The IANA zone of schedule ``name``, in which operator-typed times without an
        offset are read; ``NotFound`` for an unknown name (a cheap existence check)."""

    @abc.abstractmethod
    async def wait_run(self, run_id: str) -> Run:
        """Return the run once it is no longer ``running``."""

    @abc.abstractmethod
    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        """Return the backfill's progress once it is no longer ``running``."""

    @abc.abstractmethod
    def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        """Change signals as they happen (see :mod:`backend.events.bus`): first a batch holding
        a ``ready`` signal (its name says how other instances' changes arrive: ``notify``,
        ``file`` or ``none``; a ``stream down`` beside it says they do not, for now), then
        each batch as it comes, and ``[]`` when the stream has been quiet for a while
        (``idle`` seconds embedded; at the server's ping remotely). ``since`` resumes after
        the last id seen: what was missed comes first, or a ``resync``. Raises
        ``Unavailable`` when the stream cannot be had or breaks."""

    # -- conveniences over two actions -------------------------------------------------
    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None) -> ScheduleView:
        """:meth:`enable_schedule` or :meth:`disable_schedule`."""
        if enabled:
            return await self.enable_schedule(name, note=note)
        return await self.disable_schedule(name, note=note)

    async def set_queue_paused(self, queue: str, paused: bool) -> QueueView:
        """:meth:`pause_queue` or :meth:`resume_queue`."""
        return await (self.pause_queue(queue) if paused else self.resume_queue(queue))
