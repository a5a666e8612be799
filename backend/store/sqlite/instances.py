"""The fleet's membership on SQLite (a mixin of :class:`~backend.store.sqlite.store.SQLiteStore`):
heartbeats and the roles they record, the instances, their burst marks, and the work a
stopped instance left unfinished.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from backend.errors import NameTaken
from backend.model import BackfillProgress, InstanceInfo, Role, Run
from backend.store import FIRING, Beat, Membership, Unfinished
from backend.store.sqlite.sql import (
    _EPOCH,
    _MICROSECOND,
    CLEAR_STARTING,
    FORGET_HOLDER,
    FORGET_INSTANCE,
    FORGET_LOST,
    HEARTBEAT,
    INSTANCE_LIST,
    INSTANCES,
    MARK_STARTING,
    NAME_HOLDER,
    OTHER_MODE_FIRING,
    RUNNING_BACKFILLS,
    RUNNING_RUNS,
    SLOT_RECORDED,
    STARTING_MARKS,
    UPSERT_RUN,
    _backfill,
    _dt,
    _in_flight,
    _run_params,
    _us,
)

if TYPE_CHECKING:
    from backend.store.sqlite.writer import _Writer

__all__ = ["SQLiteInstances"]

T = TypeVar("T")


class SQLiteInstances:
    """The instances' rows: heartbeats, burst marks, and what a stopped one left."""

    if TYPE_CHECKING:  # provided by SQLiteStore
        _writer: _Writer | None
        _marks: dict[str, int]

        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    # -- instances ------------------------------------------------------------------------
    async def heartbeat(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
    ) -> Role:
        role, coordination, live_after, clock_offset, clock_off, taken_before, window = membership
        since = _us(live_after if live_after is not None else at)
        taken = None if taken_before is None else _us(taken_before)

        def beat(c: sqlite3.Connection) -> Role:
            recorded = role
            if role == "firing" and coordination is not None:
                # The writer's transaction is the only one: the check and the write are atomic.
                if c.execute(OTHER_MODE_FIRING, (instance, coordination, since, _us(at))).fetchone() is not None:
                    recorded = "waiting"
            params = (instance, host, pid, _us(at), recorded, coordination, clock_offset, int(clock_off), taken, window)
            if c.execute(HEARTBEAT, params).rowcount == 0:
                holder = c.execute(NAME_HOLDER, (instance,)).fetchone()
                raise NameTaken(instance, holder[0], holder[1], _dt(holder[2]), holder[3])  # type: ignore[arg-type]
            return recorded

        return await self._write(beat)

    async def instances(self) -> dict[str, Beat]:
        rows = await self._read(lambda c: c.execute(INSTANCES).fetchall())
        return {row[0]: Beat(row[1], row[2], _dt(row[3]), row[4]) for row in rows}  # type: ignore[arg-type]

    async def fleet(self) -> list[InstanceInfo]:
        rows = await self._read(lambda c: c.execute(INSTANCE_LIST).fetchall())
        return [
            InstanceInfo(row[0], row[1], row[2], _dt(row[3]), _dt(row[4]), row[5], row[6], row[7], bool(row[8]))  # type: ignore[arg-type]
            for row in rows
        ]  # (an older version's row: no clock, NULL)

    async def forget_instance(self, instance: str, host: str | None = None, pid: int | None = None) -> None:
        if host is None or pid is None:
            await self._write(lambda c: c.execute(FORGET_INSTANCE, (instance,)))
        else:
            await self._write(lambda c: c.execute(FORGET_HOLDER, (instance, host, pid)))

    async def forget_lost_instance(self, instance: str, host: str, pid: int, heartbeat_at: datetime) -> bool:
        params = (instance, host, pid, _us(heartbeat_at))
        return await self._write(lambda c: c.execute(FORGET_LOST, params).rowcount) > 0

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        us = (slot - _EPOCH) // _MICROSECOND
        await self._write(lambda c: c.execute(MARK_STARTING, (us, instance)))
        self._marks[instance] = us

    def mark_starting_now(self, instance: str, slot: datetime) -> bool:
        writer, us = self._writer, (slot - _EPOCH) // _MICROSECOND
        if writer is None or not writer.mark_now((us, instance)):
            return False
        self._marks[instance] = us
        return True

    async def starting_marks(self) -> dict[str, datetime]:
        rows = await self._read(lambda c: c.execute(STARTING_MARKS).fetchall())
        return {row[0]: _dt(row[1]) for row in rows}  # type: ignore[misc]

    async def unfinished_work(self) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        def read(c: sqlite3.Connection) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
            runs = [_in_flight(row) for row in c.execute(RUNNING_RUNS).fetchall()]
            backfills = [_backfill(row) for row in c.execute(RUNNING_BACKFILLS).fetchall()]
            marks = {row[0]: _EPOCH + _MICROSECOND * row[1] for row in c.execute(STARTING_MARKS).fetchall()}
            return runs, backfills, marks

        return await self._read(read)

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
        # One process's file: no commit to save by folding the reads into the write.
        recorded = await self.heartbeat(instance, host, pid, at, membership)
        runs, backfills, marks = await self.unfinished_work()
        return Unfinished(runs, backfills, marks, await self.instances(), recorded)

    async def close_unrecorded(self, instance: str, slot: datetime, runs: Sequence[Run]) -> list[Run]:
        us = _us(slot)

        def close(c: sqlite3.Connection) -> list[Run]:
            if c.execute(CLEAR_STARTING, (instance, us)).rowcount != 1:
                return []  # cleared by someone else meanwhile
            missing = [run for run in runs if not c.execute(SLOT_RECORDED, (run.name, us)).fetchone()]
            c.executemany(UPSERT_RUN, [_run_params(run) for run in missing])
            return missing

        return await self._write(close)
