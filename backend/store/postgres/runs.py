"""The run ledger's reads, the schedule states, the claims and the backfills on PostgreSQL
(a mixin of :class:`~backend.store.postgres.store.PostgresStore`).

Runs are written by the group-commit writer (:mod:`backend.store.postgres.ledger`); what is
here is one statement (or one transaction) per call on a pooled connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from backend.errors import Refused
from backend.ids import id_floor
from backend.model import BackfillProgress, Claim, ClaimResult, Run, ScheduleState, Turn, unique_claims
from backend.safetext import store_text
from backend.store.postgres.logs import PRUNE_RUN_LOGS
from backend.store.postgres.sql import (
    BACKFILL_PKEY,
    BUSY_OF,
    CLAIM,
    CLAIM_OR_RUN_LEFT,
    CLAIMED_RUN,
    CLOSE_RUNS,
    CLOSED_AS,
    COUNT_CLAIMS,
    END_BACKFILL,
    ENDED_AS,
    GET_BACKFILL,
    GET_RUN,
    GET_STATES,
    INSERT_BACKFILL,
    KEEP_TURNS,
    LAST_RUNS,
    LAST_SLOTS,
    LATEST_RUNS,
    LIST_RUNS,
    LIST_RUNS_BEFORE,
    PRUNE_BACKFILLS,
    PRUNE_OWN_CLAIMS,
    PRUNE_RUNS,
    RELEASE_CLAIM,
    RUNNING_BACKFILLS,
    RUNNING_RUNS,
    RUNS_BETWEEN,
    SET_STATE,
    SWEEP_CLAIMS,
    TAKE_TURN,
    TRY_TURN_LOCKS,
    TURN_LOCK,
    UPDATE_BACKFILL,
    _backfill,
    _claims_json,
    _in_flight,
    _run,
    _runs_json,
    _utc,
)
from backend.store.rows import backfill_progress_params

__all__ = ["PostgresRuns"]

T = TypeVar("T")

#: How long a claim waits for a pooled connection before giving up (seconds): shorter than
#: the other calls' wait, since a slot that cannot be claimed promptly is not fired (fail closed).
_CLAIM_WAIT = 2.0


class PostgresRuns:
    """The run ledger's reads and the rest of its data access (its writer is
    :class:`~backend.store.postgres.ledger.PostgresLedgerWriter`)."""

    if TYPE_CHECKING:  # provided by PostgresStore
        commits: int

        async def flush(self) -> None: ...

        async def _with_conn(self, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], *, wait: float = ...) -> T: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]: ...

        async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

        async def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int: ...

        async def _again(self, first: Callable[[Any], Awaitable[T]], again: Callable[[Any], Awaitable[T]]) -> T: ...

    # -- runs: reads and the rest -----------------------------------------------------------
    async def get_run(self, run_id: str) -> Run | None:
        row = await self._fetchone(GET_RUN, (run_id,))
        return _run(row) if row else None

    async def list_runs(self, name: str, *, limit: int, before: str | None = None) -> list[Run]:
        if before:
            rows = await self._fetchall(LIST_RUNS_BEFORE, {"name": name, "before": before, "limit": limit})
        else:
            rows = await self._fetchall(LIST_RUNS, (name, limit))
        return [_run(row) for row in rows]

    async def last_runs(self, names: Iterable[str], *, manual: bool = False) -> dict[str, Run]:
        wanted = list(names)
        if not wanted:
            return {}
        rows = await self._fetchall(LATEST_RUNS if manual else LAST_RUNS, (wanted,))
        return {row[1]: _run(row) for row in rows}

    async def runs_between(
        self, names: Iterable[str], start: datetime, end: datetime, *, limit_per_name: int
    ) -> dict[str, list[Run]]:
        wanted = list(names)
        if not wanted:
            return {}
        params = {"names": wanted, "start": start, "end": end, "limit": limit_per_name}
        found: dict[str, list[Run]] = {}
        for row in await self._fetchall(RUNS_BETWEEN, params):
            found.setdefault(row[1], []).append(_run(row))
        return found

    async def last_slots(self, names: Iterable[str], *, until: datetime | None = None) -> dict[str, datetime]:
        wanted = sorted(set(names))
        if not wanted:
            return {}
        rows = await self._fetchall(LAST_SLOTS, ("infinity" if until is None else until, wanted))
        return {name: slot.astimezone(UTC) for name, slot in rows if slot is not None}

    async def running_runs(self) -> list[Run]:
        return [_in_flight(row) for row in await self._fetchall(RUNNING_RUNS)]

    async def close_runs(self, runs: Sequence[Run]) -> set[str]:
        if not runs:
            return set()
        await self.flush()  # the order of hand-in: a version handed in earlier lands first
        batch = (_runs_json(runs),)

        async def first(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = await (await conn.execute(CLOSE_RUNS, batch)).fetchall()
            return rows

        async def again(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            # Sent again after its answer was lost, the close found the runs it had closed
            # closed, and answered none: they were never logged, counted or told as
            # abandoned. Those closed as this batch closes them are its own.
            return [*await (await conn.execute(CLOSED_AS, batch)).fetchall(), *await first(conn)]

        rows = await self._again(first, again)
        return {str(row[0]) for row in rows}

    async def prune_runs(self, created_before: datetime, limit: int | None = None, keep: Collection[str] = ()) -> int:
        await self.flush()
        floor = id_floor(created_before)

        async def prune(conn: AsyncConnection[Any]) -> int:
            async with conn.transaction():
                await conn.execute(PRUNE_BACKFILLS, (created_before,))
                removed = (await conn.execute(PRUNE_RUNS, (floor, sorted(keep), limit))).rowcount  # (LIMIT NULL: no limit)
                await conn.execute(PRUNE_RUN_LOGS, (floor,))  # their logs
                return removed

        removed = await self._with_conn(prune)
        self.commits += 1
        return removed

    # -- schedule state -------------------------------------------------------------------
    async def get_states(self) -> dict[str, ScheduleState]:
        rows = await self._fetchall(GET_STATES)
        return {
            row[0]: ScheduleState(
                name=row[0], enabled=bool(row[1]), changed_by=row[2], changed_at=_utc(row[3]), note=row[4]  # type: ignore[arg-type]
            )
            for row in rows
        }

    async def set_state(self, state: ScheduleState) -> None:
        params = (state.name, state.enabled, store_text(state.changed_by), state.changed_at, store_text(state.note))
        await self._execute(SET_STATE, params)

    # -- claims ---------------------------------------------------------------------------
    async def claim(self, claims: Sequence[Claim], instance: str, at: datetime) -> ClaimResult:
        if not claims:
            return ClaimResult(frozenset())
        # A key twice in the batch would get one claim row but two placeholder runs.
        params = {"claims": _claims_json(unique_claims(claims)), "instance": instance, "at": at}
        turning = any(c.turn for c in claims)

        async def go(conn: AsyncConnection[Any]) -> ClaimResult:
            if not turning:
                return _claim_result(await (await conn.execute(CLAIM, params)).fetchall())
            async with conn.transaction():  # (see TRY_TURN_LOCKS)
                result = _claim_result(await (await conn.execute(CLAIM, params)).fetchall())
                taken = _turns_taken(claims, result)
                if not taken:
                    return result
                cur = await conn.execute(TRY_TURN_LOCKS, {"names": sorted({name for name, _, _ in taken})})
                untried = frozenset(row[0] for row in await cur.fetchall())
                kept = [turn for turn in taken if turn[0] not in untried]
                keep = {
                    "names": [name for name, _, _ in kept],
                    "firsts": [first.isoformat() for _, first, _ in kept],  # (a str list adapts fast)
                    "run_ids": [run_id for _, _, run_id in kept],
                    "undecided": [run_id for name, _, run_id in taken if name in untried],
                    "instance": instance,
                }
                rows = await (await conn.execute(KEEP_TURNS, keep)).fetchall()
                return ClaimResult(result.won, {**result.busy, **_claim_result(rows).busy}, untried)

        result = await self._with_conn(go, wait=_CLAIM_WAIT)
        self.commits += 1
        return result

    async def take_turn(self, run_id: str, name: str, slot: datetime, instance: str) -> Turn:
        params = {"run_id": run_id, "name": name, "slot": slot, "instance": instance}

        async def go(conn: AsyncConnection[Any]) -> tuple[Any, ...] | None:
            async with conn.transaction():
                await conn.execute(TURN_LOCK, params)
                return await (await conn.execute(TAKE_TURN, params)).fetchone()

        row = await self._with_conn(go)
        self.commits += 1
        blocker, taken = row if row is not None else (None, False)
        return Turn(bool(taken), blocker)

    async def busy_elsewhere(self, firsts: Mapping[str, datetime], instance: str) -> dict[str, str]:
        params = {"names": list(firsts), "firsts": [first.isoformat() for first in firsts.values()], "instance": instance}
        return {str(name): str(run_id) for name, run_id in await self._fetchall(BUSY_OF, params)}

    async def claimed_run(self, key: str) -> str | None:
        row = await self._fetchone(CLAIMED_RUN, (key,))
        return row[0] if row else None

    async def release_claim(self, key: str, run_id: str) -> bool:
        params = {"key": key, "run_id": run_id}

        async def first(conn: AsyncConnection[Any]) -> bool:
            return (await conn.execute(RELEASE_CLAIM, params)).rowcount == 1

        async def again(conn: AsyncConnection[Any]) -> bool:
            # Sent again after its answer was lost, the release found the claim and its run
            # gone (by itself) and answered False: the slot was recorded missed under the
            # run id it had just freed, while the platform's retry fired it elsewhere. Both
            # gone is its own release.
            if await first(conn):
                return True
            row = await (await conn.execute(CLAIM_OR_RUN_LEFT, params)).fetchone()
            return row is not None and not row[0]

        return bool(await self._again(first, again))

    async def prune_claims(self, name: str | None, before: datetime) -> int:
        if name is None:
            return await self._execute(SWEEP_CLAIMS, (before,))
        return await self._execute(PRUNE_OWN_CLAIMS, (name, before))

    async def count_claims(self) -> int:
        row = await self._fetchone(COUNT_CLAIMS)
        return int(row[0]) if row else 0

    # -- backfills ------------------------------------------------------------------------
    async def start_backfill(self, progress: BackfillProgress) -> None:
        params = (
            progress.id,
            progress.name,
            progress.start,
            progress.end,
            progress.total,
            progress.fired,
            progress.failed,
            progress.state,
            progress.instance,
            progress.started_at,
            progress.finished_at,
            progress.current,
        )
        try:
            await self._execute(INSERT_BACKFILL, params)
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name == BACKFILL_PKEY:
                return  # a retry of our own insert whose reply was lost
            raise Refused(
                f'a backfill of "{progress.name}" is already running; wait for it to finish',
                count=progress.total,
                reason="a backfill is already running",
            ) from None

    async def update_backfill(self, progress: BackfillProgress) -> None:
        params = backfill_progress_params(progress)
        await self._execute(UPDATE_BACKFILL, params)

    async def end_backfill(self, progress: BackfillProgress) -> bool:
        params = backfill_progress_params(progress)

        async def first(conn: AsyncConnection[Any]) -> bool:
            return (await conn.execute(END_BACKFILL, params)).rowcount > 0

        async def again(conn: AsyncConnection[Any]) -> bool:
            # Sent again after its answer was lost, the end found the backfill no longer
            # running (by itself) and answered False: nobody wrote its schedule.backfill_end
            # entry. A backfill at what this end sets, to its instant, is its own end.
            if await first(conn):
                return True
            return await (await conn.execute(ENDED_AS, params)).fetchone() is not None

        return bool(await self._again(first, again))

    async def get_backfill(self, backfill_id: str) -> BackfillProgress | None:
        row = await self._fetchone(GET_BACKFILL, (backfill_id,))
        return _backfill(row) if row else None

    async def running_backfills(self) -> list[BackfillProgress]:
        return [_backfill(row) for row in await self._fetchall(RUNNING_BACKFILLS)]


def _claim_result(rows: Sequence[tuple[Any, ...]]) -> ClaimResult:
    won = frozenset(value for kind, value in rows if kind == "won")
    busy = {kind[len("busy:") :]: value for kind, value in rows if kind.startswith("busy:")}
    return ClaimResult(won, busy)


def _turns_taken(claims: Sequence[Claim], result: ClaimResult) -> list[tuple[str, datetime, str]]:
    """``(name, earliest slot won, run id)`` of each turn the claim took (see KEEP_TURNS)."""
    taken = set(result.turns(claims))
    first: dict[str, datetime] = {}
    for c in claims:
        if c.key in result.won and c.scheduled_at is not None:
            first[c.name] = min(first.get(c.name, c.scheduled_at), c.scheduled_at)
    return [(c.name, first[c.name], c.run_id) for c in claims if c.run_id in taken and c.name in first]

