"""The audit log: who did what to which thing, and when.

Every operator action (Run now, enable, disable, a backfill, and the actions of the queue,
durable executions, locks and stored schedules) is appended to one log in the store, by
one call from wherever the action is carried out::

    await shared.audit.record("job.retry", job.id, {"queue": job.queue})

The actor is a person, not a process: the name of the API token a request came with, or
the OS user of a CLI or an embedded console (``--as NAME`` overrides it). The HTTP API
names the actor of each request with :func:`acting_as`; code that acts directly gets the
engine's default actor. Entries are kept :data:`RETENTION` and read newest first, paged by
keyset (ids sort by time, as run ids do).

An entry is written after its action took effect. If the store cannot take it then, it
is kept in memory and retried every housekeeping round (the action is not undone, and the
entry is not lost); an engine that stops with entries still unwritten logs each one, and so
does the log for an entry it cannot write once it has stopped (nothing would retry it).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict, runtime_checkable

from backend.clock import Clock
from backend.errors import BadInput, Unavailable
from backend.events.bus import EventBus
from backend.inputs import check_before, check_count
from backend.model import Timestamp, iso, parse_iso
from backend.safetext import load_json, printable

__all__ = [
    "ACTIONS",
    "RETENTION",
    "AuditEntry",
    "AuditEntryJson",
    "AuditLog",
    "AuditPage",
    "AuditPageJson",
    "AuditStore",
    "acting_as",
    "check_actor",
    "current_actor",
    "os_user",
]

log = logging.getLogger("schedtui.audit")

#: Every action the log knows, in one place. A system that adds an operator action adds
#: its name here (``system.verb``) and calls :meth:`AuditLog.record` where it acts.
ACTIONS: frozenset[str] = frozenset(
    {
        # schedules
        "schedule.fire",
        "schedule.enable",
        "schedule.disable",
        "schedule.backfill",
        "schedule.backfill_cancel",
        "schedule.backfill_end",
        "schedule.create",
        "schedule.update",
        "schedule.delete",
        # the job queue
        "job.send",
        "job.retry",
        "job.cancel",
        "job.delete",
        "queue.pause",
        "queue.resume",
        # durable executions
        "durable.start",
        "durable.signal",
        "durable.cancel",
        "durable.retry",
        # locks
        "lock.release",
        # the fleet
        "instance.forget",
        # alerts: a notification delivered to a sink, or given up on (the system's, not an operator's)
        "alert.notified",
        "alert.notify_failed",
    }
)

#: How long entries are kept.
RETENTION = timedelta(days=90)

#: The longest actor name; the characters it may hold.
ACTOR_MAX = 64
_ACTOR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]*")

_actor: ContextVar[str | None] = ContextVar("schedtui_actor", default=None)


def check_actor(name: object, field: str = "actor") -> str:
    """An actor name (a token's name, ``--as``): 1-64 letters, digits and ``_.@+-``."""
    if not isinstance(name, str) or not name:
        raise BadInput(f"{field} must be a name (letters, digits, _.@+-)", field=field)
    if len(name) > ACTOR_MAX or not _ACTOR.fullmatch(name):
        raise BadInput(
            f'{field} "{printable(name, 70)}" is not a name: up to {ACTOR_MAX} letters, digits and _.@+- '
            "(starting with a letter, digit or _)",
            field=field,
        )
    return name


def os_user() -> str:
    """The OS user running this process (what the CLI and an embedded console record)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return f"uid-{os.getuid()}"
    return name if _ACTOR.fullmatch(name) and len(name) <= ACTOR_MAX else f"uid-{os.getuid()}"


@contextlib.contextmanager
def acting_as(actor: str) -> Iterator[None]:
    """Record the actions taken inside the block (in this task and the tasks it starts) as
    ``actor``'s: how the HTTP API names the token of each request."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> str | None:
    """The actor named by an enclosing :func:`acting_as`, if any."""
    return _actor.get()


class AuditEntryJson(TypedDict):
    """One operator action of the audit log: who (``actor``) did what (``action``, as
    ``system.verb``) to which thing (``target``), and when; ``detail`` is the action's own data."""

    id: str
    at: Timestamp
    actor: str
    action: str
    target: str
    detail: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action: ``id`` sorts by time; ``target`` is what was acted on (a
    schedule, a queue, a job or execution id, a lock); ``detail`` is the action's own data
    (a backfill's range and count, an edit's before and after)."""

    id: str
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, Any] | None = None

    def to_json(self) -> AuditEntryJson:
        return {
            "id": self.id,
            "at": iso(self.at),
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditEntry:
        return cls(
            id=data["id"],
            at=parse_iso(data["at"]),
            actor=data["actor"],
            action=data["action"],
            target=data["target"],
            detail=data.get("detail"),
        )


class AuditPageJson(TypedDict):
    """A page of audit entries, newest first; ``next_before`` pages further back (``null``: the last page)."""

    entries: list[AuditEntryJson]
    next_before: str | None


@dataclass(frozen=True, slots=True)
class AuditPage:
    """A page of entries, newest first; ``next_before`` pages further back (``None``: the last)."""

    entries: list[AuditEntry]
    next_before: str | None = None

    def to_json(self) -> AuditPageJson:
        return {"entries": [e.to_json() for e in self.entries], "next_before": self.next_before}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditPage:
        return cls([AuditEntry.from_json(e) for e in data["entries"]], data.get("next_before"))


@runtime_checkable
class AuditStore(Protocol):
    """What the audit log needs from a store (both stores implement it, in a mixin beside
    each: :mod:`backend.store.sqlite.audit`, :mod:`backend.store.postgres.audit`).

    Contract: :meth:`append_audit` commits the entry before it returns (an id already
    there is left as it is: a retry after a lost reply writes nothing twice);
    :meth:`list_audit` returns at most ``limit`` entries with ``id < before``, newest
    first; :meth:`prune_audit` deletes entries older than ``before``. Connection trouble
    raises :class:`~backend.errors.Unavailable`."""

    async def append_audit(self, entry: AuditEntry) -> None: ...

    async def list_audit(self, *, limit: int, before: str | None = None) -> list[AuditEntry]: ...

    async def prune_audit(self, before: datetime) -> int: ...


def encode_detail(detail: Mapping[str, Any] | None) -> str | None:
    """The detail as the stores keep it: JSON text, escaped to ASCII (a lone surrogate or
    a NUL in a note must not make an entry unwritable)."""
    if detail is None:
        return None
    return json.dumps(detail, separators=(",", ":"), default=str)


def decode_detail(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    value = load_json(text)  # a NUL or a lone surrogate an older version wrote is escaped
    return value if isinstance(value, dict) else {"value": value}


class AuditLog:
    """Appends entries for the engine and its subsystems, and keeps the log to its
    retention. A subsystem of the engine (see :mod:`backend.runtime.subsystems`): its housekeeping
    retries entries the store could not take, and prunes hourly."""

    def __init__(
        self,
        *,
        store: object,
        clock: Clock,
        new_id: Callable[[], str],
        events: EventBus,
        actor: str | None = None,
        retention: timedelta | None = RETENTION,
    ) -> None:
        self.store = store
        self.clock = clock
        self.new_id = new_id
        self.events = events
        self.default_actor = check_actor(actor, "--as") if actor is not None else os_user()
        """Who acts when no :func:`acting_as` names someone (the CLI's ``--as``, the OS user)."""
        self.retention = retention
        self.pending: list[AuditEntry] = []
        """Entries the store could not take yet, oldest first."""
        self.stopped = False
        """Closed (:meth:`close`): nothing retries a pending entry any more (see :meth:`record`)."""
        self._last_prune: datetime | None = None

    def actor(self) -> str:
        """Who is acting now: the enclosing :func:`acting_as`, else the default actor."""
        return current_actor() or self.default_actor

    def _store(self) -> AuditStore:
        if not isinstance(self.store, AuditStore):
            raise Unavailable(f"this store ({type(self.store).__name__}) keeps no audit log")
        return self.store

    async def record(
        self, action: str, target: str, detail: Mapping[str, Any] | None = None, *, actor: str | None = None
    ) -> AuditEntry:
        """Append an entry for an action that has taken effect; returns it. Never raises for
        a store that cannot take it now (it is retried; see the module docstring)."""
        entry = self.entry(action, target, detail, actor=actor)
        if self.pending:
            self.pending.append(entry)  # behind the older ones: the log stays in order
            await self.retry()
        else:
            try:
                await self._store().append_audit(entry)
            except Unavailable as exc:
                if self.stopped:  # (nothing retries it: the log is the only place left, as at the stop)
                    log.error("audit entry not written (the audit log has stopped: %s): %s", exc,
                              json.dumps(entry.to_json(), ensure_ascii=False))  # fmt: skip
                else:
                    log.warning("audit entry %s (%s %s by %s) not written yet, will retry: %s",
                                entry.id, action, target, entry.actor, exc)  # fmt: skip
                    self.pending.append(entry)
        self.events.publish("audit", target)
        return entry

    def entry(
        self, action: str, target: str, detail: Mapping[str, Any] | None = None, *, actor: str | None = None
    ) -> AuditEntry:
        """A new entry, not written: :meth:`record` writes it, or an action's own write
        carries it (one transaction for both: see ``durable_insert``), and then calls
        :meth:`carried`."""
        if action not in ACTIONS:
            raise ValueError(f"unknown audit action {action!r}: add it to backend.events.audit.ACTIONS")
        return AuditEntry(
            id=self.new_id(),
            at=self.clock.now(),
            actor=actor or self.actor(),
            action=action,
            target=target,
            detail=dict(detail) if detail is not None else None,
        )

    def carried(self, entry: AuditEntry) -> None:
        """An action's write committed ``entry`` with it (see :meth:`entry`)."""
        self.events.publish("audit", entry.target)

    async def retry(self) -> None:
        """Write the entries still pending, oldest first, while the store takes them."""
        while self.pending:
            try:
                await self._store().append_audit(self.pending[0])
            except Unavailable:
                return
            self.pending.pop(0)

    async def list(self, *, limit: int = 50, before: str | None = None) -> AuditPage:
        """A page of entries, newest first."""
        check_count(limit, "limit", 1, 1000)
        before = check_before(before, "entry")
        entries = await self._store().list_audit(limit=limit + 1, before=before)
        if len(entries) > limit:
            return AuditPage(entries[:limit], entries[limit - 1].id)
        return AuditPage(entries, None)

    # -- the subsystem ------------------------------------------------------------------------
    async def open(self) -> None:
        pass

    def start(self) -> None:
        pass

    async def maintain(self, now: datetime) -> None:
        await self.retry()
        if self.retention is None:
            return
        if self._last_prune is not None and now - self._last_prune < timedelta(hours=1):
            return
        self._last_prune = now
        removed = await self._store().prune_audit(now - self.retention)
        if removed:
            log.info("audit retention: removed %d entr%s older than %s", removed, "y" if removed == 1 else "ies",
                     self.retention)  # fmt: skip

    async def stop(self, grace: float) -> None:
        with contextlib.suppress(Unavailable):
            await self.retry()
        for entry in self.pending:
            # The last resort: the log is the only place left that can keep it.
            log.error("audit entry not written: %s", json.dumps(entry.to_json(), ensure_ascii=False))
        self.pending.clear()

    async def close(self) -> None:
        """The engine's last word to the log before it closes the store: write what came
        since :meth:`stop` (a backfill's end), and from now on log an entry the store cannot
        take instead of keeping it for a retry that never comes."""
        try:
            await self.stop(0)
        finally:
            self.stopped = True

    @property
    def idle(self) -> bool:
        return True

    def is_ours(self, id_: str) -> bool:
        return False
