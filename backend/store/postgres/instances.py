"""The fleet's membership on PostgreSQL (a mixin of :class:`~backend.store.postgres.store.PostgresStore`):
heartbeats and the roles they record, the instances, their burst marks, and the work a
stopped instance left unfinished.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import AsyncConnection

from backend.errors import NameTaken
from backend.model import BackfillProgress, InstanceInfo, Role, Run
from backend.store import FIRING, Beat, Membership, Unfinished
from backend.store.postgres.sql import (
    CLEAR_STARTING,
    END_STUCK_SESSIONS,
    FLEET_LOCK,
    FORGET_HOLDER,
    FORGET_INSTANCE,
    FORGET_LOST,
    HEARTBEAT,
    INSTANCE_LIST,
    INSTANCES,
    MARK_STARTING,
    NAME_HOLDER,
    RECORDED_IDS,
    RUNNING_BACKFILLS,
    RUNNING_RUNS,
    SERVER_CLOCK,
    SLOT_RECORDED,
    STARTING_MARKS,
    UPSERT_RUNS,
    _backfill,
    _in_flight,
    _runs_json,
    _utc,
)

__all__ = ["PostgresInstances"]

T = TypeVar("T")


class PostgresInstances:
    """The instances' rows: heartbeats, burst marks, and what a stopped one left."""

    if TYPE_CHECKING:  # provided by PostgresStore
        commits: int

        async def _with_conn(self, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], *, wait: float = ...) -> T: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

        async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

        async def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int: ...

        async def _again(self, first: Callable[[Any], Awaitable[T]], again: Callable[[Any], Awaitable[T]]) -> T: ...

    # -- instances ------------------------------------------------------------------------
    async def heartbeat(
        self,
        instance: str,
        host: str,
        pid: int,
        at: datetime,
        membership: Membership = FIRING,
    ) -> Role:
        async def beat(conn: AsyncConnection[Any]) -> Role:
            async with conn.transaction():
                return await _beat(conn, instance, host, pid, at, membership)

        role = await self._with_conn(beat)
        self.commits += 1
        return role

    async def server_clock(self) -> datetime:
        row = await self._fetchone(SERVER_CLOCK)
        assert row is not None
        return _utc(row[0])  # type: ignore[return-value]

    async def instances(self) -> dict[str, Beat]:
        return _beats(await self._fetchall(INSTANCES))

    async def fleet(self) -> list[InstanceInfo]:
        rows = await self._fetchall(INSTANCE_LIST)
        return [
            InstanceInfo(row[0], row[1], row[2], _utc(row[3]), _utc(row[4]), row[5], row[6], row[7], bool(row[8]))  # type: ignore[arg-type]
            for row in rows
        ]  # (an older version's row: no clock, NULL)

    async def forget_instance(self, instance: str, host: str | None = None, pid: int | None = None) -> None:
        if host is None or pid is None:
            await self._execute(FORGET_INSTANCE, (instance,))
        else:
            await self._execute(FORGET_HOLDER, (instance, host, pid))

    async def forget_lost_instance(self, instance: str, host: str, pid: int, heartbeat_at: datetime) -> bool:
        params = (instance, host, pid, heartbeat_at)

        async def first(conn: AsyncConnection[Any]) -> bool:
            return bool((await conn.execute(FORGET_LOST, params)).rowcount > 0)

        async def again(conn: AsyncConnection[Any]) -> bool:
            # Sent again after its answer was lost, it may have deleted the row already: it
            # found none and told the operator the instance had beaten again, nothing
            # forgotten. A name no row holds is forgotten (by this delete, or a sweep's).
            if await first(conn):
                return True
            return await (await conn.execute(NAME_HOLDER, (instance,))).fetchone() is None

        return bool(await self._again(first, again))

    async def mark_starting(self, instance: str, slot: datetime) -> None:
        await self._execute(MARK_STARTING, (slot, instance))

    async def starting_marks(self) -> dict[str, datetime]:
        return {row[0]: _utc(row[1]) for row in await self._fetchall(STARTING_MARKS)}  # type: ignore[misc]

    async def unfinished_work(self) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        async def read(conn: AsyncConnection[Any]) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
            async with conn.transaction():  # one commit for the three, not three
                return await self._read_unfinished(conn)

        return await self._with_conn(read)

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
        async def beat(conn: AsyncConnection[Any]) -> Unfinished:
            ended = 0
            if stuck_after is not None:
                ended = await self._end_stuck_sessions(conn, stuck_after)
            async with conn.transaction():  # a member's round: one commit, not two
                recorded = await _beat(conn, instance, host, pid, at, membership)
                # The runs before the instances: a run committed after its instance renewed
                # is then never read beside that instance's older heartbeat.
                runs, backfills, marks = await self._read_unfinished(conn)
                beats = await (await conn.execute(INSTANCES)).fetchall()
            return Unfinished(runs, backfills, marks, _beats(beats), recorded, ended)

        return await self._with_conn(beat)

    @staticmethod
    async def _end_stuck_sessions(conn: AsyncConnection[Any], after: timedelta) -> int:
        row = await (await conn.execute(END_STUCK_SESSIONS, (after.total_seconds(),))).fetchone()
        return int(row[0]) if row is not None else 0

    @staticmethod
    async def _read_unfinished(conn: AsyncConnection[Any]) -> tuple[list[Run], list[BackfillProgress], dict[str, datetime]]:
        runs = await (await conn.execute(RUNNING_RUNS)).fetchall()
        backfills = await (await conn.execute(RUNNING_BACKFILLS)).fetchall()
        marks = await (await conn.execute(STARTING_MARKS)).fetchall()
        return [_in_flight(r) for r in runs], [_backfill(r) for r in backfills], {r[0]: r[1].astimezone(UTC) for r in marks}

    async def close_unrecorded(self, instance: str, slot: datetime, runs: Sequence[Run]) -> list[Run]:
        async def close(conn: AsyncConnection[Any]) -> list[Run]:
            async with conn.transaction():
                if (await conn.execute(CLEAR_STARTING, (instance, slot))).rowcount != 1:
                    return []  # cleared by someone else meanwhile
                missing = [
                    run for run in runs if await (await conn.execute(SLOT_RECORDED, (run.name, slot))).fetchone() is None
                ]
                if missing:
                    await conn.execute(UPSERT_RUNS, (_runs_json(missing),))
            return missing

        async def again(conn: AsyncConnection[Any]) -> list[Run]:
            # Sent again after its answer was lost, it found the mark cleared (by itself) and
            # answered none: the runs it wrote were never logged, counted or told as
            # abandoned. Their ids are this call's own: those the ledger holds it wrote.
            closed = await close(conn)
            if closed:
                return closed
            rows = await (await conn.execute(RECORDED_IDS, ([run.id for run in runs],))).fetchall()
            written = {row[0] for row in rows}
            return [run for run in runs if run.id in written]

        return await self._again(close, again)


def _beats(rows: Sequence[tuple[Any, ...]]) -> dict[str, Beat]:
    return {row[0]: Beat(row[1], row[2], _utc(row[3]), row[4]) for row in rows}  # type: ignore[arg-type]


async def _beat(
    conn: AsyncConnection[Any],
    instance: str,
    host: str,
    pid: int,
    at: datetime,
    membership: Membership,
) -> Role:
    """The heartbeat, inside the caller's transaction (see :meth:`PostgresStore.heartbeat`)."""
    role, coordination, live_after, clock_offset, clock_off, taken_before, window = membership
    gated = role == "firing" and coordination is not None
    if gated:
        await conn.execute(FLEET_LOCK)
    row = await (
        await conn.execute(
            HEARTBEAT,
            {
                "instance": instance, "host": host, "pid": pid, "at": at, "role": role,
                "mode": coordination, "live_after": live_after if live_after is not None else at,
                "clock_offset": clock_offset, "clock_off": clock_off, "taken_before": taken_before,
                "window": window,
            },
        )
    ).fetchone()  # fmt: skip
    if row is None:  # another process holds the name (see Membership.taken_before)
        holder = await (await conn.execute(NAME_HOLDER, (instance,))).fetchone()
        assert holder is not None
        raise NameTaken(instance, holder[0], holder[1], _utc(holder[2]), holder[3])  # type: ignore[arg-type]
    return row[0]  # type: ignore[no-any-return]
