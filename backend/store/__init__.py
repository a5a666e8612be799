"""The run ledger and schedule state, behind one protocol.

:class:`Store` is the seam between the engine and a database. Two implementations:
:mod:`backend.store.sqlite.store` (embedded default) and :mod:`backend.store.postgres.store` (fleets).
:func:`open_store` picks one from a URL. Every method is safe to call from the engine's
event loop; none blocks it.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from backend import safetext
from backend.errors import BadInput, Unavailable
from backend.model import (
    DEFAULT_STORE_URL,
    BackfillProgress,
    Claim,
    ClaimResult,
    CoordinationMode,
    InstanceInfo,
    Role,
    Run,
    ScheduleState,
    StoreHealth,
    Turn,
)

__all__ = [
    "DEFAULT_STORE_URL", "FIRING", "Beat", "InstanceBeat", "KnowsFirer", "MarksNow", "Membership", "Store", "Unfinished", "open_store",
    "redact_url", "store_lost", "store_unavailable", "until_lost",
]  # fmt: skip


class Unfinished(NamedTuple):
    """What the abandoned-work sweep looks at (see :meth:`Store.heartbeat_and_unfinished`)."""

    runs: list[Run]
    """Runs in flight (see :meth:`Store.running_runs`)."""
    backfills: list[BackfillProgress]
    """Backfills still ``running``."""
    marks: dict[str, datetime]
    """Each instance's burst mark not cleared yet (:meth:`Store.starting_marks`)."""
    instances: dict[str, Beat]
    """Every registered instance (:meth:`Store.instances`)."""
    role: Role = "firing"
    """The role the heartbeat recorded for the caller (see :meth:`Store.heartbeat`)."""
    ended_sessions: int = 0
    """The fleet's database sessions stuck on a silent client that this round ended."""


class Membership(NamedTuple):
    """What a heartbeat says of its instance besides its name, host and pid (see
    :meth:`Store.heartbeat`)."""

    role: Role = "firing"
    coordination: CoordinationMode | None = None
    live_after: datetime | None = None
    clock_offset: float | None = None
    """Its clock minus the store server's, in seconds (``None``: not measured)."""
    clock_off: bool = False
    """Whether it stands down for its clock (see :mod:`backend.runtime.skew`)."""
    taken_before: datetime | None = None
    """The name's row, written by another process (another host or pid) after this, is that
    process's, alive: the heartbeat leaves it as it is and raises
    :class:`~backend.errors.NameTaken` (``None``: no such check, a bare heartbeat)."""
    window: float | None = None
    """Its take-over window (``--abandon-after``, seconds): the others wait that long at
    least before they take its work over (``None``: not said, a bare heartbeat)."""


class Beat(NamedTuple):
    """An instance's last heartbeat, as the others judge it (see :meth:`Store.instances`)."""

    host: str
    pid: int
    at: datetime
    window: float | None = None
    """Its take-over window in seconds (``None``: an older version's row, or a bare heartbeat)."""


#: A bare heartbeat: a firing instance whose mode is not said (not gated, does not gate).
FIRING = Membership()


class InstanceBeat(Protocol):
    instance: str
    host: str
    pid: int
    heartbeat_at: datetime


@runtime_checkable
class ReadsServerClock(Protocol):
    """A store shared by machines (PostgreSQL): its server's clock is the one every instance
    can be compared with (see :mod:`backend.runtime.skew`)."""

    async def server_clock(self) -> datetime:
        """The database server's clock now (aware UTC)."""


@runtime_checkable
class KnowsFirer(Protocol):
    """A store whose one firing process holds an OS lock (SQLite): that lock, not a
    heartbeat, says whether it is alive."""

    def live_firer(self) -> str | None:
        """The instance holding the firing lock now, or ``None``."""


@runtime_checkable
class MarksNow(Protocol):
    """A store that can sometimes commit :meth:`Store.mark_starting` at once, on the
    caller's thread and without waiting (SQLite, while its writer has nothing in hand)."""

    def mark_starting_now(self, instance: str, slot: datetime) -> bool:
        """:meth:`Store.mark_starting`, committed if this returns True; False: nothing was
        written (it could not be done at once): call :meth:`Store.mark_starting`."""


class Store(Protocol):
    """A durable ledger of runs plus the operator-controlled state of schedules.

    Contract:

    * Writes of runs are *upserts by id* and are applied in the order they were handed in.
      :meth:`save_runs` returns at once; the rows become durable at the next group commit,
      and :meth:`flush` waits until everything handed in so far is committed. Several
      processes may write the same store at once.
    * Runs are read per schedule, newest first by scheduled time (ties, such as a slot
      fired and then backfilled, by id: by creation), paged by keyset on
      ``(scheduled_at, id)``: ``before`` is the id of the last run of the previous page.
    * Times go in and come out as aware UTC datetimes.
    * A connection problem raises :class:`backend.errors.Unavailable`.
    * Runs handed in are never dropped because the store cannot take them now (a full
      disk, a database that is down): they wait in memory, are retried until written, and
      :meth:`health` says so. :meth:`flush` does not wait for that: it raises
      :class:`Unavailable` naming the cause once an attempt to write them has failed.
    * A run's row is replaced while it is ``running``. Once closed it stays closed: a
      later version with another outcome (an instance frozen past the abandon window, whose
      run was closed ``abandoned`` meanwhile) leaves status, times and tag as they are and
      appends "late result from instance I at T: STATUS [TAG] MESSAGE" to its
      ``error_message`` (once); a late ``running`` version changes nothing.
    """

    kind: str
    """``sqlite`` or ``postgresql``."""
    where: str
    """Where it lives, fit to show (a path, or a URL without its password)."""
    default_coordination: CoordinationMode
    migrated: list[tuple[str, str]]
    """What :meth:`open` migrated, in order: ``("core", "version 9")``, ``("jobs",
    "addition 1")`` (:func:`backend.store.migrations.summary` tells it); empty when every
    table was at this release's version already."""

    async def open(self) -> None:
        """Connect, create or migrate the schema (safe when several processes start at
        once). Tables already at this release's version are only read: a role that may use
        them but not change the schema opens the store."""

    async def close(self) -> None:
        """Commit what is pending and disconnect (giving up, loudly, after a few seconds)."""

    def health(self) -> StoreHealth:
        """Whether runs can be written now, from what the store already knows (no I/O)."""

    async def take_firing_lock(self, instance: str, *, claims: bool = False) -> None:
        """Become the one process firing this store's schedules on their timers, until
        :meth:`close` or the process ends; :class:`~backend.errors.InUse` (naming the
        holder) when another has that role. ``claims``: the engine coordinates by claims,
        so engines of this one process may share the role (an embedded store has no lease
        to fence another process with). A no-op where instances coordinate through the
        store (PostgreSQL)."""

    # -- runs ---------------------------------------------------------------------------
    def save_runs(self, runs: Sequence[Run]) -> None:
        """Hand runs to the writer (thread-safe, non-blocking); see the class contract."""

    async def flush(self) -> None:
        """Return once every run handed in before this call is committed."""

    async def get_run(self, run_id: str) -> Run | None: ...

    async def list_runs(self, name: str, *, limit: int, before: str | None = None) -> list[Run]:
        """At most ``limit`` runs of ``name`` older than the run ``before`` in the order
        ``(scheduled_at, id)``, newest first (none when ``before`` names no stored run)."""

    async def last_runs(self, names: Iterable[str], *, manual: bool = False) -> dict[str, Run]:
        """Per named schedule that has one, the run of its newest self/external slot; with
        ``manual``, its newest run of any trigger (by scheduled time, then id)."""

    async def runs_between(
        self, names: Iterable[str], start: datetime, end: datetime, *, limit_per_name: int
    ) -> dict[str, list[Run]]:
        """Per named schedule, its runs scheduled in ``[start, end)``, newest first, at most
        ``limit_per_name`` of them (the newest); names without runs there are left out."""

    async def last_slots(self, names: Iterable[str], *, until: datetime | None = None) -> dict[str, datetime]:
        """Per named schedule that has one, the newest ``scheduled_at`` among its non-manual
        runs (where its catch-up starts), at or before ``until`` when given (a clock
        stepped back: where it left off before the slots recorded ahead of it). One read
        for every name: an instance starting, or taking over a shard, asks for a thousand
        schedules at once."""

    async def running_runs(self) -> list[Run]:
        """Every run in flight, from any instance: still ``running``, or closed while its
        handler runs on (:attr:`Run.held`; a fleet's store, PostgreSQL, keeps those)."""

    async def close_runs(self, runs: Sequence[Run]) -> set[str]:
        """Write each of ``runs`` (finished versions) whose stored version is still
        ``running``, in one transaction; the ids written. Runs handed to :meth:`save_runs`
        before the call land first."""

    async def prune_runs(self, created_before: datetime, limit: int | None = None, keep: Collection[str] = ()) -> int:
        """Delete runs created before the given time, the oldest ``limit`` of them at most
        (``None``: all); returns how many. Never one in flight, nor the newest timed run of
        a schedule that is (stored, in some instance's code as the fleet's timings record,
        or named in ``keep``): the catch-up counts from it."""

    # -- schedule state -----------------------------------------------------------------
    async def get_states(self) -> dict[str, ScheduleState]: ...

    async def set_state(self, state: ScheduleState) -> None: ...

    # -- instances ----------------------------------------------------------------------
    async def heartbeat(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
    ) -> Role:
        """Register or refresh an instance, and return the role recorded for it.

        One fleet, one coordination: a member asking for ``firing`` with a
        ``coordination`` is recorded ``waiting`` instead while another instance recorded
        ``firing`` in a different mode has a heartbeat newer than ``live_after`` (all three
        in ``membership``). The check and the write are atomic across every process sharing
        the store (two members of different modes starting at once: one of them waits).
        ``None`` as the mode is not gated and does not gate (an older version, a bare
        heartbeat)."""

    async def instances(self) -> dict[str, Beat]:
        """Every registered instance: ``{name: Beat(host, pid, heartbeat_at, window)}``."""

    async def fleet(self) -> list[InstanceInfo]:
        """Every registered instance, by name, with when it last started a run."""

    async def forget_instance(self, instance: str, host: str | None = None, pid: int | None = None) -> None:
        """Delete the instance's row; given ``host`` and ``pid``, only while it is theirs."""

    async def forget_lost_instance(self, instance: str, host: str, pid: int, heartbeat_at: datetime) -> bool:
        """Delete the row of an instance an operator judged lost, only while it is still the
        row judged: that ``host`` and ``pid``, its heartbeat still ``heartbeat_at`` (as
        :meth:`instances` read it: it has not beaten since), and no :meth:`mark_starting`
        mark on it (a burst of the dead process's that a sweep has yet to record). Whether
        it was deleted; atomic across every process sharing the store."""

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        """Record, committed when this returns, that ``instance`` is about to start the
        runs due at ``slot`` whose rows are not written yet (a burst of ``single``-mode
        firings: their rows follow in the group commit). If the process dies before they
        land, :meth:`close_unrecorded` lets a survivor record them."""

    async def starting_marks(self) -> dict[str, datetime]:
        """Every instance's last :meth:`mark_starting` slot not cleared yet."""

    async def unfinished_work(self) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        """:meth:`running_runs`, ``running_backfills`` and :meth:`starting_marks` in one
        read transaction: what the abandoned-work sweep of every instance looks at."""

    async def heartbeat_and_unfinished(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
        *,
        stuck_after: timedelta | None = None,
    ) -> Unfinished:
        """:meth:`heartbeat`, then what :meth:`unfinished_work` and :meth:`instances` read:
        a member's periodic round. PostgreSQL does it in one transaction (one commit every
        few seconds per member, not two); SQLite writes the heartbeat, then reads.
        ``stuck_after``: PostgreSQL also ends the fleet's sessions that have waited longer
        than this on a silent client inside a transaction (their locks would hold the
        fleet's work for as long as TCP takes to give up); SQLite has no such sessions."""

    async def close_unrecorded(self, instance: str, slot: datetime, runs: Sequence[Run]) -> list[Run]:
        """In one transaction: if ``instance``'s mark is still ``slot``, clear it and write
        those of ``runs`` (closed rows, one per schedule, all of that slot) whose schedule
        has no non-manual run of that slot yet; return the ones written. Concurrent
        callers never both write (the mark is cleared conditionally)."""

    # -- claims (coordination) -------------------------------------------------------------
    async def claim(self, claims: Sequence[Claim], instance: str, at: datetime) -> ClaimResult:
        """Insert each claim unless its key exists; return the keys this call won, all in
        one transaction (and, for a server, one round trip).

        The key's uniqueness is what makes a slot fire once across every process sharing
        the store. A claim that carries its ``scheduled_at`` is also refused when the
        ledger already holds a claimed run of that slot (outcome ``wonLock`` or
        ``external``: its claim may have been pruned since), and its winner's run row is
        written as a ``running`` placeholder in the same transaction (see :class:`Claim`).
        A key whose stored claim carries this call's ``run_id`` counts as won: that is a
        retry of a call whose reply was lost. A key given twice in one batch is claimed
        once, by its first claim (see :func:`backend.model.unique_claims`). Each won
        claim's ``prune_before`` deletes that schedule's claims older than it. ``busy``
        names the schedules won here that another instance has a run of in flight (see
        :class:`ClaimResult`). A claim's turns (:attr:`Claim.turn`) are decided one
        schedule at a time across the store, with :meth:`take_turn` and other claims' turns:
        two instances never both take one. A claim never waits for that: a turn it cannot
        decide at once it leaves to its run (:attr:`ClaimResult.untried`).

        Concurrent callers never deadlock (keys are taken in one global order). Raises
        :class:`Unavailable` when the claims cannot be written: the caller must not fire."""

    async def take_turn(self, run_id: str, name: str, slot: datetime, instance: str) -> Turn:
        """Take the overlap place of schedule ``name`` for ``instance``'s run ``run_id`` (of
        ``slot``, its ``running`` row written by its claim) before its handler starts: in
        one transaction, serialized with every other call for that schedule, find a run
        of it in flight on another instance (as :attr:`ClaimResult.busy` counts them: started,
        holding its turn, or claimed for an earlier slot), and, if there is none, mark the
        row :attr:`~backend.model.Run.held`. Two instances' calls for different slots of
        one schedule never both take it. See :class:`~backend.model.Turn`."""

    async def busy_elsewhere(self, firsts: Mapping[str, datetime], instance: str) -> dict[str, str]:
        """For each schedule of ``firsts``, a run of it in flight on an instance other than
        ``instance`` that a run of its slot ``firsts[name]`` must not start beside (as
        :attr:`ClaimResult.busy` counts them: started, holding its turn, or placed for an
        earlier slot); schedules with none are left out. A read: under ``single`` the
        firing instance asks it before its timed runs start, for the Run nows of processes
        that fire nothing (``schedtui fire`` in another shell, a console without
        ``--fire``)."""

    async def claimed_run(self, key: str) -> str | None:
        """The run id recorded with a claim, if the key is claimed."""

    async def release_claim(self, key: str, run_id: str) -> bool:
        """Give back a claim whose run never started: the claim (if it still names
        ``run_id``) and its ``running`` placeholder go together, in one transaction, and
        only while that placeholder is unstarted (no ``fired_at``: nobody closed or ran it).
        True if they went; the slot can then be claimed again."""

    async def prune_claims(self, name: str | None, before: datetime) -> int:
        """Delete claims older than ``before``: one schedule's, or (``None``) everyone's."""

    async def count_claims(self) -> int: ...

    # -- backfills ----------------------------------------------------------------------
    async def start_backfill(self, progress: BackfillProgress) -> None:
        """Record a new running backfill; :class:`Refused` if one runs for that schedule."""

    async def update_backfill(self, progress: BackfillProgress) -> None: ...

    async def end_backfill(self, progress: BackfillProgress) -> bool:
        """:meth:`update_backfill`, only if it is still ``running``; whether it was (of the
        instances that close a dead instance's backfill at once, exactly one gets true)."""

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None: ...

    async def running_backfills(self) -> list[BackfillProgress]: ...


async def until_lost(store: Store, every: float = 1.0) -> StoreHealth:
    """Return the store's health once it is ``lost`` (looked at every ``every`` seconds):
    a process that keeps writing then writes into nothing."""
    while True:
        health = store.health()
        if health.state == "lost":
            return health
        await asyncio.sleep(every)


def store_lost(where: str, then: str) -> Unavailable:
    """How a process stops once its store is ``lost`` (see :func:`until_lost`): ``then``
    says what to do about it."""
    return Unavailable(
        f'stopped: the store "{where}" was deleted or replaced while in use, so nothing written since would '
        f"survive (the runs not written are in the log); {then}"
    )


def store_unavailable(where: str, problem: str, reason: str = "", public_reason: str | None = None) -> Unavailable:
    """The error of a store that cannot be used now, told twice: ``problem`` is a sentence
    in which ``{store}`` stands for the store. The message (the operator's log and command
    line) reads it ``the store "WHERE"`` and adds ``: reason``; :attr:`Unavailable.public`
    (what a client of the HTTP API is answered) reads it ``the store`` and adds
    ``public_reason``, the reason in words that name no path, host, port, user or database
    (by default ``reason``, when it names none: SQLite's own)."""
    shown = reason if public_reason is None else public_reason
    return Unavailable(
        problem.format(store=f'the store "{where}"') + (f": {reason}" if reason else ""),
        public=problem.format(store="the store") + (f": {shown}" if shown else ""),
    )


def redact_url(url: str) -> str:
    """A store URL fit to show or log: its passwords (user part, ``password``/``sslpassword``
    query parameters) replaced by ``***`` (see :func:`backend.safetext.redact_url`)."""
    return safetext.redact_url(url)


#: What a SQLite store's file name may not hold: a control character (tab and line breaks
#: too), or a lone surrogate (a byte that is not UTF-8, as Python keeps it).
_NOT_IN_FILE_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    """Build the store a URL names (not yet opened): ``sqlite:///path`` or ``postgresql://…``.

    ``create=False`` is for callers that only read or act: a SQLite file that does not
    exist is refused (:class:`~backend.errors.NotFound`, naming the path) rather than
    created empty, and one that is not a schedtui store is refused before anything is
    written to it. (A PostgreSQL database is never created; its tables are, by whoever
    connects first.)"""
    url = url or DEFAULT_STORE_URL
    # Error texts may quote the URL (libpq echoes what it cannot parse): keep its secrets out.
    safetext.remember_url_secrets(url)
    if url.startswith("sqlite://"):
        from backend.store.sqlite.store import SQLiteStore

        path = url[len("sqlite://") :]
        if path.startswith("/"):
            path = path[1:]  # sqlite:///relative.db and sqlite:////abs/path.db, as SQLAlchemy
        if not path:
            raise BadInput(f'store URL "{url}" names no file (try sqlite:///.schedtui/state.db)')
        odd = _NOT_IN_FILE_NAME.search(path)
        if odd:
            char = odd.group()
            if "\ud800" <= char <= "\udfff":  # (a byte of argv or a file that is not UTF-8, as Python keeps it)
                what = "a byte that is not UTF-8"
            else:
                what = "a line break: a --store-file of two lines?" if char in "\r\n" else "a control character"
            raise BadInput(
                f'store URL "{safetext.printable(safetext.redact_url(url))}" holds {safetext.printable(char)} at position '
                f"{len(url) - len(path) + odd.start() + 1} ({what}): a store's file name is UTF-8 text without control "
                "characters",
                field="store",
            )
        if "?" in path:
            # Options would otherwise become part of a new file's name, silently.
            raise BadInput(
                f'store URL "{redact_url(url)}" has a query ("?{path.partition("?")[2]}"): a SQLite store URL '
                "names a file and takes no options"
            )
        return SQLiteStore(Path(path) if path != ":memory:" else path, create=create)
    if url.startswith(("postgresql://", "postgres://")):
        from backend.store.postgres.store import PostgresStore

        safetext.remember_secret(os.environ.get("PGPASSWORD"))  # libpq's own: kept out of texts too

        return PostgresStore(url)
    raise BadInput(f'unsupported store URL "{redact_url(url)}" (use sqlite:///PATH or postgresql://…)')
