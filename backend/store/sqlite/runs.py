"""The run ledger's reads, the schedule states, the claims and the backfills on SQLite
(a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`).

Runs are written by the writer thread (:mod:`backend.store.sqlite.writer`), reads go to the
store's reader; every statement used here is in :mod:`backend.store.sqlite.sql`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from backend.errors import Refused
from backend.ids import id_floor
from backend.model import BackfillProgress, Claim, ClaimResult, Run, ScheduleState, Turn, unique_claims
from backend.safetext import store_text
from backend.store.rows import backfill_progress_params
from backend.store.sqlite.batches import delete_in_batches
from backend.store.sqlite.logs import DROP_RUN_LOG, PRUNE_RUN_LOGS
from backend.store.sqlite.sql import (
    _EPOCH,
    _MICROSECOND,
    BUSY_ELSEWHERE,
    CLAIM,
    CLAIMED_RUN,
    CLOSE_RUN,
    COUNT_CLAIMS,
    END_BACKFILL,
    GET_BACKFILL,
    GET_RUN,
    GET_STATES,
    IN_FLIGHT_ELSEWHERE,
    INSERT_BACKFILL,
    INSERT_PLACEHOLDER,
    LAST_RUNS,
    LAST_SLOT,
    LATEST_RUNS,
    LIST_RUNS,
    LIST_RUNS_BEFORE,
    PRUNE_BACKFILLS,
    PRUNE_OWN_CLAIMS,
    PRUNE_RUNS,
    RELEASE_CLAIM,
    RELEASE_PLACEHOLDER,
    RUNNING_BACKFILLS,
    RUNNING_RUNS,
    RUNS_BETWEEN,
    SET_STATE,
    SLOT_TAKEN,
    SWEEP_CLAIMS,
    TAKE_TURN,
    UPDATE_BACKFILL,
    _backfill,
    _dt,
    _in_flight,
    _run,
    _us,
)
from backend.store.sqlite.writer import _Peek, _Writer

__all__ = ["SQLiteRuns"]

T = TypeVar("T")

#: Above every microsecond a slot may be at (SQLite's largest integer).
_NO_BOUND = 2**63 - 1


class SQLiteRuns:
    """The run ledger's reads and the rest of its data access (the writing is :mod:`backend.store.sqlite.writer`'s)."""

    if TYPE_CHECKING:  # provided by SQLiteStore
        _writer: _Writer | None

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    # -- runs -----------------------------------------------------------------------------
    async def get_run(self, run_id: str) -> Run | None:
        row = await self._read(lambda c: c.execute(GET_RUN, (run_id,)).fetchone())
        return _run(row) if row else None

    async def list_runs(self, name: str, *, limit: int, before: str | None = None) -> list[Run]:
        if before:
            rows = await self._read(lambda c: c.execute(LIST_RUNS_BEFORE, (name, before, limit)).fetchall())
        else:
            rows = await self._read(lambda c: c.execute(LIST_RUNS, (name, limit)).fetchall())
        return [_run(row) for row in rows]

    async def last_runs(self, names: Iterable[str], *, manual: bool = False) -> dict[str, Run]:
        payload, sql = json.dumps(list(names)), LATEST_RUNS if manual else LAST_RUNS
        rows = await self._read(lambda c: c.execute(sql, (payload,)).fetchall())
        return {row[1]: _run(row) for row in rows}

    async def runs_between(
        self, names: Iterable[str], start: datetime, end: datetime, *, limit_per_name: int
    ) -> dict[str, list[Run]]:
        wanted, low, high = list(names), _us(start), _us(end)

        def read(c: sqlite3.Connection) -> dict[str, list[Run]]:
            found = {}
            for name in wanted:  # one index range per name, on the reader's thread
                rows = c.execute(RUNS_BETWEEN, (name, low, high, limit_per_name)).fetchall()
                if rows:
                    found[name] = [_run(row) for row in rows]
            return found

        return await self._read(read)

    async def last_slots(self, names: Iterable[str], *, until: datetime | None = None) -> dict[str, datetime]:
        """Counting the runs that wait in the writer (a full disk), and those kept in the
        reserve by an earlier process: their slots ran."""
        wanted = sorted(set(names))
        waiting = await self._newest_waiting(wanted, until) if wanted else {}
        bound = _NO_BOUND if until is None else _us(until)

        def read(c: sqlite3.Connection) -> dict[str, datetime]:
            found: dict[str, datetime] = {}
            for name in wanted:  # one index probe per name, on the reader's thread
                row = c.execute(LAST_SLOT, (name, bound)).fetchone()
                if row and row[0] is not None:
                    found[name] = _EPOCH + _MICROSECOND * row[0]
            return found

        found = await self._read(read) if wanted else {}
        for name, slot in waiting.items():
            if name not in found or slot > found[name]:
                found[name] = slot
        return found

    async def _newest_waiting(self, names: list[str], until: datetime | None) -> dict[str, datetime]:
        """Per name, the newest slot (at or before ``until``) of its timed runs handed in
        and not committed yet. Looked at before the ledger is read: a run committed in
        between is then in one or the other."""
        writer = self._writer
        if writer is None or writer.crashed or writer.closing or not writer.waiting():
            return {}
        wanted = set(names)
        peek = _Peek(lambda _: writer.newest_waiting(wanted, until))  # on the writer's thread: it owns them
        writer.jobs.put(peek)
        newest: dict[str, datetime] = await asyncio.wrap_future(peek.future)
        return newest

    async def running_runs(self) -> list[Run]:
        rows = await self._read(lambda c: c.execute(RUNNING_RUNS).fetchall())
        return [_in_flight(row) for row in rows]

    async def close_runs(self, runs: Sequence[Run]) -> set[str]:
        if not runs:
            return set()

        rows = [(r.status, _us(r.finished_at), store_text(r.error_tag), store_text(r.error_message), r.id) for r in runs]

        def close(c: sqlite3.Connection) -> set[str]:
            return {row[-1] for row in rows if c.execute(CLOSE_RUN, row).rowcount == 1}

        return await self._write(close)

    async def prune_runs(self, created_before: datetime, limit: int | None = None, keep: Collection[str] = ()) -> int:
        # Many short transactions, not one: the writer takes the runs (and any other write)
        # handed in meanwhile between two, and the write-ahead log stays small (one delete
        # of 1.6 million runs held every write for 25 s and grew the log to the store's size).
        floor, us, kept = id_floor(created_before), _us(created_before), json.dumps(sorted(keep))
        await self._write(lambda c: c.execute(PRUNE_BACKFILLS, (us,)))

        def prune(c: sqlite3.Connection, batch: int) -> int:
            gone = c.execute(PRUNE_RUNS, (floor, kept, batch)).fetchall()
            c.executemany(DROP_RUN_LOG, gone)  # their logs
            if len(gone) < batch:
                c.execute(PRUNE_RUN_LOGS, (floor,))  # the sweep's end: any other log left
            return len(gone)

        return await delete_in_batches(self._write, prune, limit)

    # -- schedule state -------------------------------------------------------------------
    async def get_states(self) -> dict[str, ScheduleState]:
        rows = await self._read(lambda c: c.execute(GET_STATES).fetchall())
        return {
            row[0]: ScheduleState(
                name=row[0], enabled=bool(row[1]), changed_by=row[2], changed_at=_dt(row[3]), note=row[4]  # type: ignore[arg-type]
            )
            for row in rows
        }

    async def set_state(self, state: ScheduleState) -> None:
        params = (state.name, int(state.enabled), store_text(state.changed_by), _us(state.changed_at), store_text(state.note))
        await self._write(lambda c: c.execute(SET_STATE, params))

    # -- claims ---------------------------------------------------------------------------
    async def claim(self, claims: Sequence[Claim], instance: str, at: datetime) -> ClaimResult:
        us = _us(at)
        claims = unique_claims(claims)

        def insert(c: sqlite3.Connection) -> ClaimResult:
            won = set()
            first: dict[str, int | None] = {}
            for claim in sorted(claims, key=lambda cl: cl.key):
                slot = _us(claim.scheduled_at)
                owner = c.execute(CLAIMED_RUN, (claim.key,)).fetchone()
                if owner is not None:
                    if owner[0] != claim.run_id:
                        continue
                    won.add(claim.key)  # our own earlier attempt: its reply was lost
                elif slot is not None and c.execute(SLOT_TAKEN, (claim.name, slot, claim.trigger == "external")).fetchone():
                    continue  # fired already; its claim has been pruned since
                else:
                    c.execute(CLAIM, (claim.key, claim.name, instance, us, claim.run_id))
                    won.add(claim.key)
                    if slot is not None:
                        c.execute(INSERT_PLACEHOLDER, (claim.run_id, claim.name, slot, claim.trigger, claim.outcome, instance))
                    if claim.prune_before is not None:
                        c.execute(PRUNE_OWN_CLAIMS, (claim.name, _us(claim.prune_before)))
                earliest = first.get(claim.name)
                first[claim.name] = slot if earliest is None or (slot is not None and slot < earliest) else earliest
            busy = {}
            for name, slot in first.items():
                row = c.execute(BUSY_ELSEWHERE, (name, instance, slot)).fetchone()
                if row is not None:
                    busy[name] = row[0]
            result = ClaimResult(frozenset(won), busy)
            c.executemany(TAKE_TURN, [(run_id,) for run_id in result.turns(claims)])
            return result

        return await self._write(insert)

    async def take_turn(self, run_id: str, name: str, slot: datetime, instance: str) -> Turn:
        def take(c: sqlite3.Connection) -> Turn:  # (the writer's transaction serializes every call)
            row = c.execute(BUSY_ELSEWHERE, (name, instance, _us(slot))).fetchone()
            if row is not None:
                return Turn(False, row[0])
            return Turn(c.execute(TAKE_TURN, (run_id,)).rowcount == 1)

        return await self._write(take)

    async def busy_elsewhere(self, firsts: Mapping[str, datetime], instance: str) -> dict[str, str]:
        rows = await self._read(lambda c: c.execute(IN_FLIGHT_ELSEWHERE, (instance, instance)).fetchall())
        busy: dict[str, str] = {}
        for name, run_id, scheduled_at, fired_at, held in sorted(rows, key=lambda row: row[1]):
            first = firsts.get(name)
            if first is not None and name not in busy and (fired_at is not None or held or scheduled_at < _us(first)):
                busy[name] = run_id  # (the lowest id, as a claim names it)
        return busy

    async def claimed_run(self, key: str) -> str | None:
        row = await self._read(lambda c: c.execute(CLAIMED_RUN, (key,)).fetchone())
        return row[0] if row else None

    async def release_claim(self, key: str, run_id: str) -> bool:
        def release(c: sqlite3.Connection) -> bool:
            if c.execute(RELEASE_PLACEHOLDER, (run_id, key, run_id)).rowcount != 1:
                return False
            c.execute(RELEASE_CLAIM, (key, run_id))
            return True

        return await self._write(release)

    async def prune_claims(self, name: str | None, before: datetime) -> int:
        us = _us(before)
        if name is None:
            return await self._write(lambda c: int(c.execute(SWEEP_CLAIMS, (us,)).rowcount))
        return await self._write(lambda c: int(c.execute(PRUNE_OWN_CLAIMS, (name, us)).rowcount))

    async def count_claims(self) -> int:
        row = await self._read(lambda c: c.execute(COUNT_CLAIMS).fetchone())
        return int(row[0])

    # -- backfills ------------------------------------------------------------------------
    async def start_backfill(self, progress: BackfillProgress) -> None:
        params = (
            progress.id,
            progress.name,
            _us(progress.start),
            _us(progress.end),
            progress.total,
            progress.fired,
            progress.failed,
            progress.state,
            progress.instance,
            _us(progress.started_at),
            _us(progress.finished_at),
            _us(progress.current),
        )

        def insert(c: sqlite3.Connection) -> None:
            try:
                c.execute(INSERT_BACKFILL, params)
            except sqlite3.IntegrityError:
                raise Refused(
                    f'a backfill of "{progress.name}" is already running; wait for it to finish',
                    count=progress.total,
                    reason="a backfill is already running",
                ) from None

        await self._write(insert)

    async def update_backfill(self, progress: BackfillProgress) -> None:
        params = backfill_progress_params(progress, _us)
        await self._write(lambda c: c.execute(UPDATE_BACKFILL, params))

    async def end_backfill(self, progress: BackfillProgress) -> bool:
        params = backfill_progress_params(progress, _us)
        return bool(await self._write(lambda c: c.execute(END_BACKFILL, params).rowcount))

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None:
        row = await self._read(lambda c: c.execute(GET_BACKFILL, (backfill_id,)).fetchone())
        return _backfill(row) if row else None

    async def running_backfills(self) -> list[BackfillProgress]:
        rows = await self._read(lambda c: c.execute(RUNNING_BACKFILLS).fetchall())
        return [_backfill(row) for row in rows]
