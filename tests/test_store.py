"""The Store contract, written once and run against every store kind.

Every test goes through the :class:`backend.store.Store` protocol only. To run the suite
against another implementation, add a factory to :data:`STORE_FACTORIES`: it gets the
test's ``tmp_path`` and returns a new, unopened store over one fresh, empty location
for that test; calling it again with the same ``tmp_path`` must give another store over
the *same* location (the re-open and multi-store tests rely on that).

SQLite-only checks (WAL, a second process on the same file, the schema version row) are
in their own section at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import os
import re
import socket
import sqlite3
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend import BackfillProgress, Engine, InUse, ManualClock, NotFound, Refused, Run, ScheduleState, Unavailable
from backend.durable import DurableContext, define_durable
from backend.errors import NameTaken
from backend.events.audit import AuditEntry, AuditStore
from backend.ids import IdFactory, id_floor
from backend.jobs import JobContext, define_queue
from backend.model import Claim, StoreHealth, Turn, slot_key
from backend.observability.logs import LogTarget, StoredLog
from backend.runtime.ownthread import in_own_thread
from backend.store import Beat, Membership, Store, open_store
from backend.store.postgres.store import PostgresStore
from backend.store.sqlite.reserve import Reserve
from backend.store.sqlite.sql import _run_params
from backend.store.sqlite.store import SQLiteStore
from tests import pg

UTC = UTC
REPO = Path(__file__).resolve().parents[1]

StoreFactory = Callable[[Path], Store]

STORE_FACTORIES: dict[str, StoreFactory] = {
    "sqlite": lambda tmp_path: open_store(f"sqlite:///{tmp_path / 'ledger' / 'state.db'}"),
    # One fresh database per test on the session's server (see tests/pg.py).
    "postgres": lambda tmp_path: open_store(pg.database_for(tmp_path)),
}
#: Kinds that need a server: their tests carry the ``postgres`` mark and its fixture.
SERVER_KINDS = {"postgres"}


@pytest.fixture(
    params=[pytest.param(kind, marks=pytest.mark.postgres) if kind in SERVER_KINDS else kind for kind in sorted(STORE_FACTORIES)]
)
def store_kind(request: pytest.FixtureRequest) -> str:
    if request.param in SERVER_KINDS:
        request.getfixturevalue("pg_server")
    return str(request.param)


@pytest.fixture
async def new_store(store_kind: str, tmp_path: Path) -> AsyncIterator[Callable[[], Store]]:
    """Make more (unopened) stores over the same location; each opened one is closed at the end."""
    made: list[Store] = []

    def make() -> Store:
        store = STORE_FACTORIES[store_kind](tmp_path)
        made.append(store)
        return store

    yield make
    for store in made:
        try:
            await store.close()
        except Exception:  # already closed by the test
            pass


@pytest.fixture
async def store(new_store: Callable[[], Store]) -> Store:
    s = new_store()
    await s.open()
    return s


T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


class _AnyRun:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run)


ANY_RUN = _AnyRun()


class Ids:
    """Real run ids from a clock the test controls."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start
        self.make = IdFactory(lambda: self.now)

    def __call__(self) -> str:
        return self.make()


def run(
    run_id: str,
    name: str = "job",
    scheduled_at: datetime = T0,
    status: str = "succeeded",
    trigger: str = "self",
    **kwargs: object,
) -> Run:
    done = status != "running"
    fields: dict[str, object] = {
        "coordination_outcome": "manual" if trigger == "manual" else ("external" if trigger == "external" else "single"),
        "instance": "host-a:101",
        "fired_at": scheduled_at + timedelta(milliseconds=3),
        "finished_at": scheduled_at + timedelta(seconds=1, microseconds=250) if done else None,
    }
    fields.update(kwargs)
    return Run(id=run_id, name=name, scheduled_at=scheduled_at, status=status, trigger=trigger, **fields)  # type: ignore[arg-type]  # as the test gives them: Run checks them


def assert_utc(dt: datetime | None) -> None:
    assert dt is not None and dt.tzinfo is not None and dt.utcoffset() == timedelta(0)


# ---------------------------------------------------------------------------------------
# opening and the schema
# ---------------------------------------------------------------------------------------
async def test_a_fresh_store_is_empty_and_usable(store: Store) -> None:
    assert store.kind in ("sqlite", "postgresql")
    assert store.default_coordination in ("single", "advisoryLock")
    assert isinstance(store.where, str) and store.where
    assert await store.list_runs("job", limit=10) == []
    assert await store.get_run("01J00000000000000000000000") is None
    assert await store.last_runs(["job"]) == {}
    assert await store.last_slots(["job"]) == {}
    assert await store.running_runs() == []
    assert await store.get_states() == {}
    assert await store.instances() == {}
    assert await store.running_backfills() == []
    await store.flush()  # nothing handed in: returns at once


async def test_reopening_an_existing_store_keeps_its_data(new_store: Callable[[], Store]) -> None:
    ids = Ids()
    first = new_store()
    await first.open()
    saved = run(ids())
    first.save_runs([saved])
    await first.set_state(ScheduleState("job", False, "alice", T0, "paused"))
    await first.close()

    second = new_store()
    await second.open()  # the schema exists at the current version: nothing to do
    third = new_store()
    await third.open()  # a second open while another store has it open
    for s in (second, third):
        assert await s.get_run(saved.id) == saved
        assert await s.get_states() == {"job": ScheduleState("job", False, "alice", T0, "paused")}
    more = run(ids(), scheduled_at=T0 + timedelta(minutes=1))
    third.save_runs([more])
    await third.flush()
    assert [r.id for r in await second.list_runs("job", limit=10)] == [more.id, saved.id]


async def test_close_commits_what_was_handed_in(new_store: Callable[[], Store]) -> None:
    ids = Ids()
    first = new_store()
    await first.open()
    runs = [run(ids(), scheduled_at=T0 + timedelta(minutes=i)) for i in range(5)]
    first.save_runs(runs)
    await first.close()  # no flush: close commits what is pending
    second = new_store()
    await second.open()
    assert await second.list_runs("job", limit=10) == runs[::-1]


async def test_what_a_closing_store_is_handed_is_answered_and_kept_or_refused(
    new_store: Callable[[], Store], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Run now's audit entry written while a stop closed the store (a loaded machine: the
    write came late) waited for ever on the SQLite writer, which had already been told to
    stop (seen as ``run_now(wait=True)`` hanging), and runs handed in then were neither
    written nor kept nor logged. Whatever is handed in at any point of a close (a run, an
    audit entry, a flush) is answered: taken and then in the store once it is reopened (or,
    the last resort, logged as not written), or refused (:class:`Unavailable`)."""
    caplog.set_level(logging.ERROR, "schedtui.store")
    ids = Ids()
    store = new_store()
    await store.open()
    assert isinstance(store, AuditStore)
    taken: list[Run] = []
    written: list[AuditEntry] = []
    calls: list[asyncio.Future[Any]] = []

    async def audit(entry: AuditEntry) -> None:
        await store.append_audit(entry)
        written.append(entry)

    def hand_in() -> None:
        """A run, an audit entry and a flush, handed in now."""
        handed = run(ids(), scheduled_at=T0 + timedelta(seconds=len(calls)))
        try:
            store.save_runs([handed])
        except Unavailable:
            pass
        else:
            taken.append(handed)
        calls.append(asyncio.ensure_future(audit(AuditEntry(ids(), T0, "me", "schedule.fire", "job", None))))
        calls.append(asyncio.ensure_future(store.flush()))

    if isinstance(store, SQLiteStore):
        # And once each of the close's threads (the writer's end) is done, before the close
        # goes on: on a loaded machine, calls come then too.
        async def then_hand_in(fn: Callable[..., Any], *args: Any, name: str = "schedtui call") -> Any:
            result = await in_own_thread(fn, *args, name=name)
            hand_in()
            await asyncio.sleep(0)  # (begun before the close goes on)
            return result

        monkeypatch.setattr("backend.store.sqlite.store.in_own_thread", then_hand_in)
    closing = asyncio.ensure_future(store.close())
    for _ in range(200):  # at every step of the close (a bound: the calls slow it down)
        if closing.done():
            break
        hand_in()
        await asyncio.sleep(0)
    await closing
    done, waiting = await asyncio.wait(calls, timeout=10)
    for call in waiting:
        call.cancel()
    assert not waiting, f"{len(waiting)} of {len(calls)} calls made while the store closed were never answered"
    assert all(call.exception() is None or isinstance(call.exception(), Unavailable) for call in done)
    again = new_store()
    await again.open()
    assert isinstance(again, AuditStore)
    logged = [json.loads(r.getMessage().split(": ", 1)[1])["id"] for r in caplog.records if "not written to the ledger: " in r.getMessage()]
    assert {r.id for r in taken} <= {r.id for r in await again.list_runs("job", limit=10_000)} | set(logged)
    assert {e.id for e in written} <= {e.id for e in await again.list_audit(limit=1000)}


async def test_several_stores_open_at_once_on_a_fresh_location(new_store: Callable[[], Store]) -> None:
    stores = [new_store() for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    ids = Ids()
    for i, s in enumerate(stores):
        s.save_runs([run(ids(), name=f"job{i}")])
        await s.flush()
    for i in range(4):
        assert len(await stores[0].list_runs(f"job{i}", limit=5)) == 1


# ---------------------------------------------------------------------------------------
# saving runs
# ---------------------------------------------------------------------------------------
async def test_save_and_get_round_trip_every_field(store: Store) -> None:
    ids = Ids()
    full = Run(
        id=ids(),
        name="export.v2",
        scheduled_at=T0,
        status="failed",
        trigger="external",
        coordination_outcome="external",
        instance="host-b:4242",
        fired_at=T0 + timedelta(microseconds=123_457),
        finished_at=T0 + timedelta(seconds=61, microseconds=999_999),
        error_tag="ConnectionRefusedError",
        error_message="smtp refused: ünïcode ✓ and 'quotes' \"too\"",
    )
    sparse = Run(
        id=ids(),
        name="export.v2",
        scheduled_at=T0 + timedelta(hours=1),
        status="missed",
        trigger="self",
        coordination_outcome="single",
        instance="host-b:4242",
        error_message="missed while the engine was not running (backfill=skip)",
    )
    store.save_runs([full, sparse])
    await store.flush()
    got_full, got_sparse = await store.get_run(full.id), await store.get_run(sparse.id)
    assert got_full == full
    assert got_sparse == sparse
    assert got_full is not None and got_sparse is not None
    assert (got_sparse.fired_at, got_sparse.finished_at, got_sparse.error_tag) == (None, None, None)
    assert got_full.duration_ms == 61_877


async def test_datetimes_come_back_aware_utc_and_equal(store: Store) -> None:
    berlin = timezone(timedelta(hours=1))
    tokyo = timezone(timedelta(hours=9))
    ids = Ids()
    sent = Run(
        id=ids(),
        name="job",
        scheduled_at=datetime(2026, 3, 2, 9, 0, tzinfo=berlin),
        status="succeeded",
        trigger="self",
        coordination_outcome="single",
        instance="i",
        fired_at=datetime(2026, 3, 2, 17, 0, 0, 1, tzinfo=tokyo),
        finished_at=datetime(2026, 3, 2, 8, 0, 59, 999_999, tzinfo=UTC),
    )
    store.save_runs([sent])
    await store.flush()
    got = await store.get_run(sent.id)
    assert got is not None
    for field in ("scheduled_at", "fired_at", "finished_at"):
        value = getattr(got, field)
        assert_utc(value)
        assert value == getattr(sent, field)
    assert got.scheduled_at == datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    assert got.fired_at == datetime(2026, 3, 2, 8, 0, 0, 1, tzinfo=UTC)
    assert got.finished_at is not None and got.fired_at is not None
    assert (got.finished_at.microsecond, got.fired_at.microsecond) == (999_999, 1)


async def test_dates_far_from_now_round_trip(store: Store) -> None:
    ids = Ids()
    old = run(ids(), scheduled_at=datetime(1970, 1, 1, tzinfo=UTC), fired_at=datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC))
    future = run(ids(), name="later", scheduled_at=datetime(2199, 12, 31, 23, 59, 59, tzinfo=UTC))
    store.save_runs([old, future])
    await store.flush()
    assert await store.get_run(old.id) == old
    assert await store.get_run(future.id) == future


async def test_a_later_version_replaces_the_earlier(store: Store) -> None:
    ids = Ids()
    started = run(ids(), status="running")
    store.save_runs([started])
    await store.flush()
    assert await store.get_run(started.id) == started
    finished = started.finish("failed", T0 + timedelta(seconds=5), error_tag="timeout", error_message="too slow")
    store.save_runs([finished])
    await store.flush()
    assert await store.get_run(started.id) == finished
    assert await store.list_runs("job", limit=10) == [finished]  # replaced, not added


async def test_an_upsert_replaces_every_field(store: Store) -> None:
    ids = Ids()
    first = run(ids(), status="running", instance="host-a:1", trigger="self")
    store.save_runs([first])
    await store.flush()
    other = dataclasses.replace(
        first,
        scheduled_at=T0 + timedelta(minutes=1),
        status="skipped",
        trigger="external",
        coordination_outcome="external",
        instance="host-b:2",
        fired_at=T0 + timedelta(minutes=1, microseconds=5),
        finished_at=T0 + timedelta(minutes=1, microseconds=6),
        error_tag="overlap",
        error_message="run X was still in flight",
    )
    store.save_runs([other])
    await store.flush()
    assert await store.get_run(first.id) == other


async def test_hand_in_order_wins_within_one_batch(store: Store) -> None:
    ids = Ids()
    running = run(ids(), status="running")
    done = running.finish("succeeded", T0 + timedelta(seconds=2))
    other = run(ids(), name="other")
    # The same id twice in one batch: the later one wins, even though "running" looks newer.
    store.save_runs([done, other, running])
    await store.flush()
    assert await store.get_run(running.id) == running
    store.save_runs([running, done])
    await store.flush()
    assert await store.get_run(running.id) == done
    assert await store.get_run(other.id) == other


async def test_hand_in_order_wins_across_batches_without_flushing(store: Store) -> None:
    ids = Ids()
    base = run(ids(), status="running")
    versions = [base] + [
        dataclasses.replace(base, fired_at=T0 + timedelta(seconds=i), error_message=f"version {i}") for i in range(1, 29)
    ]
    versions.append(versions[-1].finish("failed", T0 + timedelta(seconds=30), error_tag="timeout", error_message="last"))
    for version in versions:
        store.save_runs([version])
    await store.flush()
    assert await store.get_run(base.id) == versions[-1]


async def test_save_runs_from_other_threads(store: Store) -> None:
    ids = Ids()
    batches = [[run(ids(), name=f"t{t}", scheduled_at=T0 + timedelta(minutes=i)) for i in range(50)] for t in range(4)]

    def hand_in(batch: list[Run]) -> None:
        for r in batch:
            store.save_runs([r])

    await asyncio.gather(*(asyncio.to_thread(hand_in, b) for b in batches))
    await store.flush()
    for t, batch in enumerate(batches):
        assert await store.list_runs(f"t{t}", limit=100) == batch[::-1]


async def test_flush_waits_for_everything_handed_in_before_it(store: Store, new_store: Callable[[], Store]) -> None:
    ids = Ids()
    runs = [run(ids(), scheduled_at=T0 + timedelta(seconds=i)) for i in range(500)]
    store.save_runs(runs[:250])
    store.save_runs(runs[250:])
    await store.flush()
    # Another store over the same location sees it all: it is committed, not just buffered.
    other = new_store()
    await other.open()
    assert len(await other.list_runs("job", limit=1000)) == 500


async def test_get_run_of_an_unknown_id(store: Store) -> None:
    assert await store.get_run("nope") is None


# ---------------------------------------------------------------------------------------
# reading runs
# ---------------------------------------------------------------------------------------
async def test_list_runs_pages_by_keyset_newest_first(store: Store) -> None:
    ids = Ids()
    mine, noise = [], []
    for i in range(250):
        ids.now = T0 + timedelta(seconds=i // 3)  # several ids per millisecond too
        mine.append(run(ids(), scheduled_at=T0 + timedelta(minutes=i)))
        if i % 5 == 0:
            noise.append(run(ids(), name="job-other", scheduled_at=T0 + timedelta(minutes=i)))
    store.save_runs(mine + noise)
    await store.flush()

    pages: list[list[Run]] = []
    before: str | None = None
    while True:
        page = await store.list_runs("job", limit=50, before=before)
        if not page:
            break
        pages.append(page)
        before = page[-1].id
    assert [len(p) for p in pages] == [50, 50, 50, 50, 50]
    seen = [r.id for p in pages for r in p]
    assert seen == sorted((r.id for r in mine), reverse=True)
    assert len(set(seen)) == 250
    assert all(a > b for a, b in zip(seen, seen[1:], strict=False))
    assert pages[0][0] == mine[-1] and pages[-1][-1] == mine[0]

    # A limit that does not divide the count: the last page is shorter.
    sizes, before = [], None
    while True:
        page = await store.list_runs("job", limit=60, before=before)
        if not page:
            break
        sizes.append(len(page))
        before = page[-1].id
    assert sizes == [60, 60, 60, 60, 10]
    assert [r.name for r in await store.list_runs("job-other", limit=100)] == ["job-other"] * 50


async def test_list_runs_before_a_run_that_is_not_stored_is_empty(store: Store) -> None:
    ids = Ids()
    runs = []
    for i in range(10):
        ids.now = T0 + timedelta(seconds=i)
        runs.append(run(ids(), scheduled_at=T0 + timedelta(minutes=i)))
    store.save_runs(runs)
    await store.flush()
    assert await store.list_runs("job", limit=3, before=runs[6].id) == [runs[5], runs[4], runs[3]]
    # The cursor is a run: one that is not stored (pruned meanwhile) ends the paging.
    assert await store.list_runs("job", limit=3, before=id_floor(T0 + timedelta(seconds=5, milliseconds=500))) == []
    assert await store.list_runs("job", limit=3, before=runs[0].id) == []
    assert await store.list_runs("nobody", limit=3) == []


async def test_runs_are_read_in_scheduled_order_and_paged_by_slot_then_id(store: Store) -> None:
    """A backfill writes old slots after new ones: reads put them among their peers, and a
    slot with two runs (fired, then backfilled) lists them newest-created first."""
    ids = Ids()
    fired = []
    for i in range(6):
        ids.now = T0 + timedelta(hours=i)
        fired.append(run(ids(), scheduled_at=T0 + timedelta(hours=i)))
    ids.now = T0 + timedelta(hours=7)
    backfilled = [run(ids(), scheduled_at=T0 + timedelta(hours=i), trigger="manual") for i in (1, 2, 3)]
    ids.now = T0 + timedelta(hours=8)
    now = run(ids(), scheduled_at=T0 + timedelta(hours=8), trigger="manual")
    store.save_runs([*fired, *backfilled, now])
    await store.flush()
    expected = [now, fired[5], fired[4], backfilled[2], fired[3], backfilled[1], fired[2], backfilled[0], fired[1], fired[0]]
    assert await store.list_runs("job", limit=20) == expected
    pages, before = [], None
    while page := await store.list_runs("job", limit=3, before=before):
        pages.append(page)
        before = page[-1].id
    assert [r for p in pages for r in p] == expected and [len(p) for p in pages] == [3, 3, 3, 1]
    # LAST RUN is the newest self/external slot; with manual=True, the newest of any trigger.
    assert await store.last_runs(["job"]) == {"job": fired[5]}
    assert await store.last_runs(["job"], manual=True) == {"job": now}


async def test_last_runs_of_several_names(store: Store) -> None:
    ids = Ids()
    a1, b1 = run(ids(), name="a"), run(ids(), name="b", status="failed", error_tag="E")
    a2 = run(ids(), name="a", scheduled_at=T0 + timedelta(minutes=1), status="running")
    b2 = run(ids(), name="b", scheduled_at=T0 + timedelta(minutes=2), trigger="manual")
    a0 = run(ids(), name="a", scheduled_at=T0 - timedelta(days=1), trigger="external")  # an old slot, recorded last
    store.save_runs([a1, b1, a2, b2, run(ids(), name="c"), a0, run(ids(), name="m", trigger="manual")])
    await store.flush()
    assert await store.last_runs(["a", "b", "never-ran", "m"]) == {"a": a2, "b": b1}
    assert await store.last_runs(["a", "b", "never-ran", "m"], manual=True) == {"a": a2, "b": b2, "m": ANY_RUN}
    assert await store.last_runs(iter(["b"])) == {"b": b1}
    assert await store.last_runs([]) == {}
    assert await store.last_runs(["never-ran"]) == {}


async def test_runs_between_reads_a_window_per_name_newest_first(store: Store) -> None:
    ids = Ids()
    runs = {name: [run(ids(), name=name, scheduled_at=T0 + timedelta(minutes=i)) for i in range(10)]
            for name in ("a", "b", "c")}
    store.save_runs([r for rs in runs.values() for r in rs])
    await store.flush()
    start, end = T0 + timedelta(minutes=2), T0 + timedelta(minutes=6)  # [start, end)
    found = await store.runs_between(["a", "b", "none"], start, end, limit_per_name=100)
    assert found == {"a": runs["a"][5:1:-1], "b": runs["b"][5:1:-1]}
    assert all(r.scheduled_at.utcoffset() == timedelta(0) for r in found["a"])
    assert await store.runs_between(["a"], start, end, limit_per_name=2) == {"a": runs["a"][5:3:-1]}  # the newest
    assert await store.runs_between(["a"], T0 + timedelta(hours=1), T0 + timedelta(hours=2), limit_per_name=5) == {}
    assert await store.runs_between([], start, end, limit_per_name=5) == {}


async def test_last_slots_ignore_manual_runs(store: Store) -> None:
    ids = Ids()
    store.save_runs(
        [
            run(ids(), scheduled_at=T0, trigger="self"),
            run(ids(), scheduled_at=T0 + timedelta(hours=1), trigger="external"),
            run(ids(), scheduled_at=T0 + timedelta(hours=2), status="missed", fired_at=None, finished_at=None),
            run(ids(), scheduled_at=T0 + timedelta(hours=5), trigger="manual"),
            run(ids(), name="other", scheduled_at=T0 + timedelta(hours=9)),
            # An older slot recorded later (e.g. a backfill): the newest *slot* counts, not the newest id.
            run(ids(), scheduled_at=T0 - timedelta(days=1), trigger="self"),
        ]
    )
    store.save_runs([run(ids(), name="manual-only", trigger="manual")])
    await store.flush()
    slots = await store.last_slots(["job", "other", "manual-only", "never-ran", "job"])
    assert slots == {"job": T0 + timedelta(hours=2), "other": T0 + timedelta(hours=9)}
    assert_utc(slots["job"])
    assert await store.last_slots([]) == {}
    # At or before a time (a clock stepped back: where a schedule left off before it).
    until = await store.last_slots(["job", "other"], until=T0 + timedelta(hours=1, minutes=30))
    assert until == {"job": T0 + timedelta(hours=1)}
    assert await store.last_slots(["job"], until=T0 + timedelta(hours=2)) == {"job": T0 + timedelta(hours=2)}
    assert await store.last_slots(["job"], until=T0 - timedelta(days=2)) == {}


async def test_running_runs_from_every_instance(store: Store) -> None:
    ids = Ids()
    r1 = run(ids(), status="running", instance="host-a:1")
    r2 = run(ids(), name="other", status="running", instance="host-b:2")
    done = run(ids(), status="succeeded")
    store.save_runs([r1, r2, done])
    await store.flush()
    assert sorted(await store.running_runs(), key=lambda r: r.id) == [r1, r2]
    store.save_runs([r1.finish("succeeded", T0 + timedelta(seconds=9))])
    await store.flush()
    assert await store.running_runs() == [r2]


# ---------------------------------------------------------------------------------------
# close_runs
# ---------------------------------------------------------------------------------------
async def test_a_closed_run_stays_closed_and_a_late_result_is_noted_once(store: Store) -> None:
    ids = Ids()
    started = run(ids(), status="running", instance="host-a:1")
    store.save_runs([started])
    await store.flush()
    # Another instance closes it while host-a:1 is frozen past the abandon window...
    abandoned = started.finish("failed", T0 + timedelta(seconds=40), error_tag="abandoned", error_message="no heartbeat")
    assert await store.close_runs([abandoned]) == {started.id}
    # ...then host-a:1 wakes up and hands in its result (twice: a retried write).
    late = started.finish("succeeded", T0 + timedelta(seconds=61, microseconds=5))
    store.save_runs([late])
    await store.flush()
    store.save_runs([late])
    await store.flush()
    stored = await store.get_run(started.id)
    assert stored == dataclasses.replace(
        abandoned, error_message="no heartbeat; late result from instance host-a:1 at 2026-03-02T08:01:01Z: succeeded"
    )
    assert stored is not None and stored.error_message is not None
    # A late failure is noted with its tag and message; a late "running" version and the
    # same closed version again change nothing.
    for version in (
        abandoned,
        started.finish("failed", T0 + timedelta(seconds=62), error_tag="ValueError", error_message="boom"),
        started,
    ):
        store.save_runs([version])
        await store.flush()  # each its own commit (a batch keeps only the latest version of a run)
    assert (await store.get_run(started.id)) == dataclasses.replace(
        stored,
        error_message=stored.error_message + "; late result from instance host-a:1 at 2026-03-02T08:01:02Z: failed [ValueError] boom",
    )
    assert [r.status for r in await store.running_runs()] == []


async def test_a_finished_run_written_first_is_not_reopened(store: Store) -> None:
    ids = Ids()
    skipped = run(ids(), status="skipped", error_tag="overlap", error_message="run X was in flight")
    missed = run(ids(), status="missed", finished_at=None, error_message="the engine was down")
    store.save_runs([skipped, missed])
    await store.flush()
    # A "running" version handed in later (out of order) does not reopen either, and a
    # version without a finish time is noted without one.
    store.save_runs(
        [
            dataclasses.replace(skipped, status="running", finished_at=None, error_tag=None),
            dataclasses.replace(missed, status="skipped", error_message=None),
        ]
    )
    await store.flush()
    assert await store.get_run(skipped.id) == skipped
    assert await store.get_run(missed.id) == dataclasses.replace(
        missed, error_message="the engine was down; late result from instance host-a:101: skipped"
    )


async def test_close_runs_closes_only_running_runs(store: Store) -> None:
    ids = Ids()
    running = run(ids(), status="running")
    store.save_runs([running])
    await store.flush()
    abandoned = running.finish("failed", T0 + timedelta(minutes=1), error_tag="abandoned", error_message="gone")
    assert await store.close_runs([abandoned]) == {running.id}
    assert await store.get_run(running.id) == abandoned
    assert await store.running_runs() == []
    # Already closed: a second closer (another instance) loses and changes nothing.
    late = running.finish("succeeded", T0 + timedelta(minutes=2))
    assert await store.close_runs([late]) == set()
    assert await store.get_run(running.id) == abandoned
    assert await store.close_runs([]) == set()


async def test_a_run_closed_while_its_handler_runs_on_is_in_flight_until_it_lets_go(store: Store) -> None:
    """A run recorded ``timeout`` whose handler has not returned keeps its schedule's place:
    the other instances' overlap checks read it with the runs in flight."""
    ids = Ids()
    running = run(ids(), status="running")
    store.save_runs([running])
    await store.flush()
    closed = running.finish("failed", T0 + timedelta(seconds=30), error_tag="timeout", error_message="exceeded")
    store.save_runs([dataclasses.replace(closed, held=True)])
    await store.flush()
    assert [(r.id, r.status, r.held) for r in await store.running_runs()] == [(running.id, "failed", True)]
    assert await store.get_run(running.id) == closed
    store.save_runs([closed])  # its handler returned: the place is let go, nothing else changes
    await store.flush()
    assert await store.running_runs() == []
    assert await store.get_run(running.id) == closed
    store.save_runs([dataclasses.replace(closed, held=True)])  # (once let go, never held again)
    await store.flush()
    assert await store.running_runs() == []


async def test_close_runs_of_a_burst_closes_the_running_ones_and_leaves_the_rest(store: Store) -> None:
    ids = Ids()
    burst = [run(ids(), name=f"tick{i}", status="running") for i in range(40)]
    done = run(ids(), status="succeeded")
    store.save_runs([*burst, done])
    store.save_runs([burst[0].finish("succeeded", T0 + timedelta(seconds=1))])  # finished meanwhile
    await store.flush()
    ghost = run(ids(), status="failed", error_tag="abandoned")
    at = T0 + timedelta(minutes=1)
    closing = [r.finish("failed", at, error_tag="abandoned", error_message="gone") for r in [*burst, done]] + [ghost]
    commits = getattr(store, "commits", 0)
    assert await store.close_runs(closing) == {r.id for r in burst[1:]}
    if hasattr(store, "commits"):
        assert store.commits == commits + 1  # one transaction for the whole burst
    first = await store.get_run(burst[0].id)
    assert first is not None and first.status == "succeeded"
    assert await store.get_run(burst[1].id) == closing[1]
    assert await store.get_run(done.id) == done
    assert await store.get_run(ghost.id) is None
    assert await store.running_runs() == []


async def test_close_runs_sees_runs_handed_in_before_it(store: Store) -> None:
    ids = Ids()
    running = run(ids(), status="running")
    store.save_runs([running])  # no flush: the order of hand-in still holds
    closed = running.finish("failed", T0 + timedelta(seconds=1), error_tag="abandoned", error_message="x")
    assert await store.close_runs([closed]) == {running.id}
    assert await store.get_run(running.id) == closed


# ---------------------------------------------------------------------------------------
# retention
# ---------------------------------------------------------------------------------------
async def defined(store: Any, *names: str) -> None:
    """``names`` are schedules some instance defines (its start records their timings):
    the retention keeps each one's newest timed run."""
    await store.record_code_timings([(name, "* * * * *", "UTC") for name in names], T0, instance="i")


async def test_prune_runs_by_creation_time(store: Store) -> None:
    await defined(store, "job")
    ids = Ids()
    made: dict[str, Run] = {}
    for hours in (0, 1, 2, 3):
        ids.now = T0 + timedelta(hours=hours)
        # scheduled_at deliberately disagrees with creation time: pruning goes by creation.
        r = run(ids(), scheduled_at=T0 + timedelta(days=10 - hours))
        made[f"h{hours}"] = r
    ids.now = T0 + timedelta(minutes=30)
    old_running = run(ids(), name="stuck", status="running")
    store.save_runs([*made.values(), old_running])
    await store.flush()

    # h0, the oldest, holds the newest slot: kept, whatever its age (the catch-up counts from it)
    assert await store.prune_runs(T0 + timedelta(hours=2)) == 1
    remaining = await store.list_runs("job", limit=10)
    assert remaining == [made["h0"], made["h2"], made["h3"]]  # created at the cutoff exactly: kept (listed by slot)
    assert await store.running_runs() == [old_running]  # a run in flight is never pruned
    assert await store.prune_runs(T0 + timedelta(hours=2)) == 0
    assert await store.prune_runs(T0 - timedelta(days=1)) == 0
    assert await store.prune_runs(datetime(1926, 3, 2, tzinfo=UTC)) == 0  # before 1970: nothing is older
    assert await store.prune_runs(T0 + timedelta(days=1)) == 2
    assert await store.list_runs("job", limit=10) == [made["h0"]]
    assert await store.last_slots(["job"]) == {"job": made["h0"].scheduled_at}
    assert await store.get_run(old_running.id) == old_running


async def test_prune_runs_takes_the_oldest_first_at_most_its_limit(store: Store) -> None:
    await defined(store, "job")
    ids = Ids()
    made = [run(ids(), scheduled_at=T0 + timedelta(minutes=i)) for i in range(7)]
    store.save_runs(made)
    await store.flush()
    cut = T0 + timedelta(days=1)
    assert await store.prune_runs(cut, limit=4) == 4
    assert [r.id for r in await store.list_runs("job", limit=10)] == [r.id for r in reversed(made[4:])]
    assert await store.prune_runs(cut, limit=4) == 2  # the newest slot stays
    assert await store.prune_runs(cut, limit=4) == 0


async def test_a_sqlite_retention_sweep_is_many_short_transactions_taking_the_logs_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One delete of 1.6 million runs held every other write (a firing's) for 25 s and grew
    # the write-ahead log to the store's size.
    monkeypatch.setattr("backend.store.sqlite.batches.PRUNE_BATCH", 3)
    store = SQLiteStore(tmp_path / "state.db")
    await store.open()
    try:
        await defined(store, "job")
        ids = Ids()
        made = [run(ids(), scheduled_at=T0 + timedelta(minutes=i)) for i in range(11)]
        store.save_runs(made)
        await store.save_logs([StoredLog(LogTarget("run", r.id), "hello\n", "", 6, 0, 0, True, T0) for r in made[:-1]])
        await store.flush()
        before = store.commits
        assert await store.prune_runs(T0 + timedelta(days=1)) == 10
        assert store.commits - before == 1 + 4  # the backfills', then 3 + 3 + 3 + 1 runs
        assert [r.id for r in await store.list_runs("job", limit=20)] == [made[-1].id]
        assert [await store.get_run_log(r.id) for r in made[:-1]] == [None] * 10
    finally:
        await store.close()


async def test_a_sqlite_sweep_of_jobs_executions_logs_and_audit_is_many_short_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs were swept a batch at a time, but the durable executions, the job attempts
    and their logs, the dead jobs and the audit were each deleted in one transaction: a
    backlog of 200,000 executions and 2,000,000 attempts held every other write 2-4 s, fired
    an every-second schedule 2 s late, and grew the write-ahead log to 465 MB (outside
    attack: the store's data over its life)."""
    monkeypatch.setattr("backend.store.sqlite.batches.PRUNE_BATCH", 2)

    async def fails(job: JobContext) -> None:
        print("a line of its log")
        raise RuntimeError("no")

    async def body(ctx: DurableContext, input: Any) -> int:
        await ctx.step("one", lambda: 1)
        return 1

    clock = ManualClock(T0)
    engine = Engine([define_queue(name="mail", handler=fails, attempts=1), define_durable(name="f", handler=body)],
                    f"sqlite:///{tmp_path / 'state.db'}", clock=clock, retention=None, shutdown_grace=0)  # fmt: skip
    await engine.start()
    try:
        for n in range(5):
            await engine.jobs.send("mail", n)
            await engine.durable.start_execution("f")
        await engine.quiesce()
        store: Any = engine.store
        ids = IdFactory(clock.now)
        for n in range(5):
            await store.append_audit(AuditEntry(ids(), T0, "me", "schedule.fire", f"job{n}", None))
        transactions: list[int] = []
        write = store._write

        async def counted(fn: Callable[[sqlite3.Connection], Any]) -> Any:
            result = await write(fn)
            transactions.append(result)
            return result

        monkeypatch.setattr(store, "_write", counted)
        later = T0 + timedelta(days=400)
        assert await store.durable_prune(later) == 5
        assert transactions == [2, 2, 1]
        transactions.clear()
        assert await store.prune_jobs(later, later, later) == 10  # 5 dead jobs, 5 attempts
        assert transactions == [2, 2, 1, 2, 2, 1, 2, 2, 1]  # the jobs, their logs, their attempts
        transactions.clear()
        removed = await store.prune_audit(later)  # the 5 entries here, and the engine's own (its starts)
        assert removed >= 5 and max(transactions) == 2 and sum(transactions) == removed
        assert await store.list_audit(limit=10) == [] and (await engine.jobs.list_jobs("mail")).jobs == []
        assert (await engine.durable.list())[0] == []
        # and a checkpoint gives the log's space back (it stayed at its high-water mark)
        assert await store._peek(lambda c: c.execute("PRAGMA journal_size_limit").fetchone()[0]) == 64 * 1024 * 1024
    finally:
        await engine.stop()


async def test_no_commit_of_the_sqlite_store_checkpoints_its_checkpointer_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit that took the write-ahead log past a thousand pages checkpointed inside
    it (three fsyncs): on a slow disk the ledger's commit took seconds, the timers waited
    for it, and every-second schedules lost slots at each checkpoint. Commits leave it to
    the checkpointer's thread: the file takes the log's pages only when that one runs."""
    from backend.store.sqlite import checkpointer

    monkeypatch.setattr(checkpointer, "CHECKPOINT_EVERY", 3600.0)  # (it waits: the commits alone)
    store = SQLiteStore(tmp_path / "state.db", create=True)
    await store.open()
    try:
        size = (tmp_path / "state.db").stat().st_size
        ids = Ids()
        big = "x" * 2000
        for _ in range(5):  # about 2,500 pages of log, in five commits
            store.save_runs([run(ids(), error_message=big, status="failed") for _ in range(1000)])
            await store.flush()
        assert (tmp_path / "state.db-wal").stat().st_size > 4096 * 2000
        assert (tmp_path / "state.db").stat().st_size == size  # no commit copied the log in
        writer = store._writer
        assert writer is not None and writer.checkpointer.checkpoints == 0
    finally:
        await store.close()
    assert (tmp_path / "state.db").stat().st_size > 2000 * 5000  # the checkpointer's last, at the close
    reopened = SQLiteStore(tmp_path / "state.db")
    await reopened.open()
    try:
        assert len(await reopened.list_runs("job", limit=10_000)) == 5000
    finally:
        await reopened.close()


async def test_pruning_keeps_each_schedules_newest_timed_slot(store: Store) -> None:
    """A schedule rarer than the retention (monthly, with 30 days kept) would otherwise
    forget that it ran, and its missed slots would be neither fired nor recorded missed.
    Only a schedule that is (defined in some instance's code, as the fleet's timings
    record, or stored): a deleted one's newest run was kept for good, one row per name ever
    created at run time (outside attack: the store's data over its life)."""
    ids = Ids()
    await defined(store, "monthly", "other")
    monthly = [run(ids(), name="monthly", scheduled_at=T0 + timedelta(days=31 * i)) for i in range(3)]
    manual = run(ids(), name="monthly", scheduled_at=T0 + timedelta(days=90), trigger="manual")
    other = [run(ids(), name="other", scheduled_at=T0 + timedelta(minutes=i)) for i in range(3)]
    only_manual = run(ids(), name="by-hand", trigger="manual")
    deleted = [run(ids(), name="tenant-42", scheduled_at=T0 + timedelta(minutes=i)) for i in range(2)]
    store.save_runs([*monthly, manual, *other, only_manual, *deleted])
    await store.flush()
    assert await store.prune_runs(T0 + timedelta(days=400)) == 8  # everything else, at any age
    assert [r.id for r in await store.list_runs("monthly", limit=10)] == [monthly[2].id]
    assert [r.id for r in await store.list_runs("other", limit=10)] == [other[2].id]
    assert await store.list_runs("by-hand", limit=10) == []
    assert await store.list_runs("tenant-42", limit=10) == []
    assert await store.last_slots(["monthly", "other", "by-hand"]) == {
        "monthly": monthly[2].scheduled_at, "other": other[2].scheduled_at,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------
# schedule state
# ---------------------------------------------------------------------------------------
async def test_schedule_state_round_trip(store: Store) -> None:
    at = datetime(2026, 3, 2, 9, 15, 30, 123_456, tzinfo=timezone(timedelta(hours=-5)))
    off = ScheduleState(name="digest", enabled=False, changed_by="alice@ops", changed_at=at, note="mail server down")
    other = ScheduleState(name="export", enabled=True, changed_by="host:1", changed_at=T0, note=None)
    await store.set_state(off)
    await store.set_state(other)
    states = await store.get_states()
    assert states == {"digest": off, "export": other}
    assert states["export"].note is None
    assert_utc(states["digest"].changed_at)
    assert states["digest"].changed_at == at
    assert states["digest"].enabled is False and states["export"].enabled is True

    on = ScheduleState(name="digest", enabled=True, changed_by="bob", changed_at=T0 + timedelta(hours=3), note=None)
    await store.set_state(on)
    assert await store.get_states() == {"digest": on, "export": other}


async def test_a_traceback_is_kept_and_read_with_one_run_only(store: Store) -> None:
    ids = Ids()
    failed = run(ids(), status="running").finish(
        "failed", T0 + timedelta(seconds=2), error_tag="KeyError", error_message="'x'", traceback="Traceback …\nKeyError: 'x'\n"
    )
    store.save_runs([failed])
    await store.flush()
    got = await store.get_run(failed.id)
    assert got is not None and got.traceback == "Traceback …\nKeyError: 'x'\n"
    assert [r.traceback for r in await store.list_runs("job", limit=5)] == [None]
    # A late version of a closed run leaves its traceback as it was.
    store.save_runs([dataclasses.replace(failed, status="succeeded", error_tag=None, traceback=None)])
    await store.flush()
    kept = await store.get_run(failed.id)
    assert kept is not None and kept.traceback == "Traceback …\nKeyError: 'x'\n"


# ---------------------------------------------------------------------------------------
# instances
# ---------------------------------------------------------------------------------------
async def test_instances_heartbeat_and_forget(store: Store) -> None:
    await store.heartbeat("host-a:1", "host-a", 1, T0)
    await store.heartbeat("host-b:2", "host-b", 2, T0 + timedelta(microseconds=7))
    assert await store.instances() == {
        "host-a:1": Beat("host-a", 1, T0),
        "host-b:2": Beat("host-b", 2, T0 + timedelta(microseconds=7)),
    }
    later = T0 + timedelta(seconds=5, microseconds=1)
    await store.heartbeat("host-a:1", "host-a2", 11, later)
    beats = await store.instances()
    assert beats["host-a:1"] == Beat("host-a2", 11, later)
    assert_utc(beats["host-a:1"][2])
    await store.forget_instance("host-b:2")
    await store.forget_instance("never-registered")
    assert await store.instances() == {"host-a:1": Beat("host-a2", 11, later)}
    # Each instance's take-over window, as the others judge it by.
    await store.heartbeat("host-a:1", "host-a2", 11, later, Membership(window=12.5))
    assert (await store.instances())["host-a:1"].window == 12.5


async def test_an_instance_is_live_for_its_own_window_where_that_is_the_longer(store: Store) -> None:
    """Instances with different --abandon-after (a rolling change of it): one of 6 s judged
    one of 30 s silent for 7 s dead, took its name, and fired in another mode beside it."""
    await store.heartbeat("old", "h", 1, T0, Membership("firing", "advisoryLock", T0, window=30))
    at, short = T0 + timedelta(seconds=10), timedelta(seconds=6)
    new = Membership("firing", "cluster", at - short, window=6)
    assert await store.heartbeat("new", "h", 2, at, new) == "waiting"
    with pytest.raises(NameTaken):
        await store.heartbeat("old", "h2", 3, at, Membership("firing", "advisoryLock", at - short, taken_before=at - short, window=6))
    later = T0 + timedelta(seconds=31)
    assert await store.heartbeat("new", "h", 2, later, new._replace(live_after=later - short)) == "firing"


async def test_fleet_lists_instances_with_when_each_last_started_a_run(store: Store) -> None:
    ids = Ids()
    await store.heartbeat("host-b:2", "host-b", 2, T0)
    await store.heartbeat("host-a:1", "host-a", 1, T0 + timedelta(seconds=1))
    assert [(i.name, i.host, i.pid, i.heartbeat_at, i.last_fired_at) for i in await store.fleet()] == [
        ("host-a:1", "host-a", 1, T0 + timedelta(seconds=1), None),
        ("host-b:2", "host-b", 2, T0, None),
    ]
    first = run(ids(), status="running", instance="host-a:1", fired_at=T0 + timedelta(seconds=2, microseconds=3))
    newer = run(ids(), status="running", instance="host-a:1", fired_at=T0 + timedelta(seconds=9))
    # Skips and misses are not starts; a run finishing later does not move the start back.
    store.save_runs([first, newer, run(ids(), status="skipped", instance="host-a:1", fired_at=T0 + timedelta(minutes=5))])
    store.save_runs([first.finish("succeeded", T0 + timedelta(seconds=20))])
    await store.flush()
    fleet = {i.name: i for i in await store.fleet()}
    assert fleet["host-a:1"].last_fired_at == T0 + timedelta(seconds=9)
    assert_utc(fleet["host-a:1"].last_fired_at)
    assert fleet["host-b:2"].last_fired_at is None


async def test_a_heartbeat_row_carries_the_clock_reading_and_an_older_versions_row_reads_without_one(store: Store) -> None:
    off = Membership("firing", "advisoryLock", T0, clock_offset=61.25, clock_off=True)
    await store.heartbeat("web-1", "h", 1, T0, off)
    await store.heartbeat("web-2", "h", 2, T0, Membership("observer", clock_offset=-0.004))
    await store.heartbeat("web-3", "h", 3, T0)  # not measured (SQLite, an injected clock)
    rows = {i.name: (i.clock_offset_s, i.clock_off, i.stands_down) for i in await store.fleet()}
    assert rows == {"web-1": (61.25, True, True), "web-2": (-0.004, False, False), "web-3": (None, False, False)}
    await store.heartbeat("web-1", "h", 1, T0 + timedelta(seconds=5), Membership("firing", "advisoryLock", T0, 0.1))
    (back,) = [i for i in await store.fleet() if i.name == "web-1"]
    assert (back.clock_offset_s, back.clock_off) == (0.1, False)  # the next heartbeat says it agrees again
    # A row an older version wrote (it knows no clock columns: they stay NULL).
    if isinstance(store, SQLiteStore):
        await store._write(lambda c: c.execute("UPDATE instances SET clock_offset = NULL, clock_off = NULL"))
    else:
        assert isinstance(store, PostgresStore)
        await store._execute("UPDATE schedtui_instances SET clock_offset = NULL, clock_off = NULL")
    assert {(i.clock_offset_s, i.clock_off) for i in await store.fleet()} == {(None, False)}


async def test_a_starting_mark_lets_a_survivor_record_a_dead_burst_once(store: Store, new_store: Callable[[], Store]) -> None:
    ids = Ids()
    slot = T0 + timedelta(minutes=1)
    await store.heartbeat("dead:1", "host-a", 1, T0)
    await store.mark_starting("dead:1", T0)
    await store.mark_starting("dead:1", slot)  # the newest burst's mark replaces the older one
    assert await store.starting_marks() == {"dead:1": slot}
    assert_utc((await store.starting_marks())["dead:1"])
    # One schedule of the burst did reach the ledger; the others did not.
    landed = run(ids(), name="landed", scheduled_at=slot, status="running", instance="dead:1")
    store.save_runs([landed])
    await store.flush()
    backfill = progress(ids(), instance="dead:1")
    await store.start_backfill(backfill)
    # What the sweep reads, in one go.
    runs, backfills, marks = await store.unfinished_work()
    assert (runs, backfills, marks) == ([landed], [backfill], {"dead:1": slot})
    assert_utc(marks["dead:1"])
    # A member's round: its own heartbeat, then the same, with every instance's heartbeat.
    work = await store.heartbeat_and_unfinished("alive:2", "host-b", 2, T0 + timedelta(seconds=5))
    assert (work.runs, work.backfills, work.marks) == ([landed], [backfill], {"dead:1": slot})
    assert work.instances == {"dead:1": Beat("host-a", 1, T0), "alive:2": Beat("host-b", 2, T0 + timedelta(seconds=5))}
    assert work.instances == await store.instances()

    def verdict(name: str) -> Run:
        return Run(ids(), name, slot, "failed", "self", "single", "dead:1", None, T0, "abandoned", "died")

    other = new_store()  # a second process sweeping at the same time
    await other.open()
    proposed = [verdict("landed"), verdict("lost-a"), verdict("lost-b")]
    first, second = await asyncio.gather(
        store.close_unrecorded("dead:1", slot, proposed),
        other.close_unrecorded("dead:1", slot, [verdict("landed"), verdict("lost-a"), verdict("lost-b")]),
    )
    assert sorted(r.name for r in first + second) == ["lost-a", "lost-b"]  # one of them wrote, once
    assert await store.starting_marks() == {}
    for name, status in (("landed", "running"), ("lost-a", "failed"), ("lost-b", "failed")):
        assert [r.status for r in await store.list_runs(name, limit=5)] == [status]
    # A mark that moved on since it was read is left alone.
    await store.mark_starting("dead:1", slot + timedelta(minutes=1))
    assert await store.close_unrecorded("dead:1", slot, [verdict("late")]) == []
    assert await store.starting_marks() == {"dead:1": slot + timedelta(minutes=1)}


# ---------------------------------------------------------------------------------------
# health and the one firer
# ---------------------------------------------------------------------------------------
async def test_health_of_a_store_that_writes(store: Store) -> None:
    health = store.health()
    assert (health.state, health.error, health.since, health.ok) == ("ok", None, None, True)
    ids = Ids()
    store.save_runs([run(ids()) for _ in range(3)])
    assert 0 <= store.health().waiting <= 3  # handed in, on their way
    await store.flush()
    assert store.health() == StoreHealth("ok", waiting=0)
    assert store.health().to_json() == {"state": "ok", "error": None, "waiting": 0, "since": None}


async def test_taking_the_firing_lock(store_kind: str, new_store: Callable[[], Store]) -> None:
    first, second = new_store(), new_store()
    await first.open()
    await second.open()
    await first.take_firing_lock("host-a:1")
    await first.take_firing_lock("host-a:1")  # again: already held
    if store_kind == "sqlite":
        with pytest.raises(InUse, match=r'instance "host-a:1" of this same process already fires'):  # (this test's)
            await second.take_firing_lock("host-b:2")
        await first.close()
    # PostgreSQL: instances coordinate through the claims; nothing to hold.
    await second.take_firing_lock("host-b:2")


# ---------------------------------------------------------------------------------------
# backfills
# ---------------------------------------------------------------------------------------
def progress(backfill_id: str, name: str = "job", **kwargs: object) -> BackfillProgress:
    fields: dict[str, object] = {
        "start": datetime(2026, 3, 1, 0, 0, tzinfo=UTC),
        "end": datetime(2026, 3, 1, 6, 0, tzinfo=UTC),
        "total": 6,
        "fired": 0,
        "failed": 0,
        "state": "running",
        "instance": "host-a:1",
        "started_at": T0 + timedelta(microseconds=42),
    }
    fields.update(kwargs)
    return BackfillProgress(id=backfill_id, name=name, **fields)  # type: ignore[arg-type]  # as the test gives them: BackfillProgress checks them


async def test_backfill_start_update_get(store: Store) -> None:
    ids = Ids()
    first = progress(ids())
    await store.start_backfill(first)
    assert await store.get_backfill(first.id) == first
    assert await store.running_backfills() == [first]

    step = dataclasses.replace(first, fired=2, failed=1, current=datetime(2026, 3, 1, 2, 0, tzinfo=UTC))
    await store.update_backfill(step)
    got = await store.get_backfill(first.id)
    assert got == step
    assert got is not None and got.current is not None
    assert_utc(got.current)
    assert_utc(got.started_at)

    done = dataclasses.replace(step, fired=6, state="done", finished_at=T0 + timedelta(minutes=3), current=None)
    await store.update_backfill(done)
    assert await store.get_backfill(first.id) == done
    assert await store.running_backfills() == []
    assert await store.get_backfill("unknown") is None


async def test_a_second_running_backfill_of_one_schedule_is_refused(store: Store) -> None:
    ids = Ids()
    first = progress(ids())
    await store.start_backfill(first)
    other_name = progress(ids(), name="other")
    await store.start_backfill(other_name)  # another schedule: fine

    clash = progress(ids(), total=9, instance="host-b:2")
    with pytest.raises(Refused) as info:
        await store.start_backfill(clash)
    assert info.value.count == 9
    assert info.value.reason == "a backfill is already running"
    assert '"job"' in info.value.message
    assert await store.get_backfill(clash.id) is None
    assert sorted(p.id for p in await store.running_backfills()) == sorted([first.id, other_name.id])

    # Once the first is over, the schedule may be backfilled again.
    await store.update_backfill(dataclasses.replace(first, state="abandoned", finished_at=T0))
    again = progress(ids())
    await store.start_backfill(again)
    assert sorted(p.id for p in await store.running_backfills()) == sorted([other_name.id, again.id])


# ---------------------------------------------------------------------------------------
# claims (coordination)
# ---------------------------------------------------------------------------------------
def claim(ids: Ids, name: str, slot: datetime, *, prune_before: datetime | None = None, run_id: str | None = None) -> Claim:
    return Claim(slot_key(name, slot), name, run_id or ids(), prune_before, scheduled_at=slot)


async def test_each_key_is_won_by_one_claimer(new_store: Callable[[], Store]) -> None:
    a, b = new_store(), new_store()
    await asyncio.gather(a.open(), b.open())
    ids = Ids()
    slots = [T0 + timedelta(seconds=i) for i in range(5)]
    first = await a.claim([claim(ids, "job", t) for t in slots[:3]], "host-a:1", T0)
    second = await b.claim([claim(ids, "job", t) for t in slots], "host-b:2", T0)
    assert first.won == {slot_key("job", t) for t in slots[:3]}
    assert second.won == {slot_key("job", t) for t in slots[3:]}
    assert await a.count_claims() == 5
    assert await b.claimed_run(slot_key("job", slots[0])) is not None
    assert await b.claimed_run("job@1999-01-01T00:00:00") is None


async def test_claimers_racing_on_overlapping_batches_never_share_a_key(new_store: Callable[[], Store]) -> None:
    stores = [new_store() for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    ids = Ids()
    names = [f"job{i}" for i in range(40)]
    results = await asyncio.gather(
        *(
            # every claimer asks in another order, some for a subset
            s.claim([claim(ids, n, T0) for n in (names[::-1] if i % 2 else names)[i:]], f"i{i}", T0)
            for i, s in enumerate(stores)
        )
    )
    won = [key for r in results for key in r.won]
    assert sorted(won) == sorted(slot_key(n, T0) for n in names)  # each once, none lost


async def test_a_won_claim_writes_a_running_placeholder_run(store: Store) -> None:
    ids = Ids()
    c = Claim(slot_key("job", T0), "job", ids(), None, scheduled_at=T0, trigger="external", outcome="external")
    assert (await store.claim([c], "host-a:1", T0)).won == {c.key}
    placeholder = await store.get_run(c.run_id)
    assert placeholder == Run(
        id=c.run_id, name="job", scheduled_at=T0, status="running", trigger="external",
        coordination_outcome="external", instance="host-a:1",
    )  # fmt: skip
    assert [r.id for r in await store.running_runs()] == [c.run_id]
    assert await store.last_slots(["job"]) == {"job": T0}
    bare = Claim(slot_key("bare", T0), "bare", ids())  # no slot given: no placeholder
    assert (await store.claim([bare], "host-a:1", T0)).won == {bare.key}
    assert await store.get_run(bare.run_id) is None


async def test_a_fired_slot_stays_taken_after_its_claim_is_pruned(store: Store) -> None:
    ids = Ids()
    first = claim(ids, "job", T0)
    assert (await store.claim([first], "a", T0)).won == {first.key}
    store.save_runs([run(first.run_id, scheduled_at=T0, coordination_outcome="wonLock", instance="a")])
    await store.flush()
    assert await store.prune_claims(None, T0 + timedelta(days=2)) == 1
    assert await store.count_claims() == 0
    late = await store.claim([claim(ids, "job", T0)], "b", T0 + timedelta(days=2))
    assert late.won == frozenset()
    # Runs that were never claimed do not take a slot: manual runs, `single` instances.
    for trigger, outcome, name in (("manual", "manual", "m"), ("self", "single", "s")):
        store.save_runs([run(ids(), name=name, scheduled_at=T0, trigger=trigger, coordination_outcome=outcome)])
    await store.flush()
    got = await store.claim([claim(ids, "m", T0), claim(ids, "s", T0)], "b", T0)
    assert got.won == {slot_key("m", T0), slot_key("s", T0)}


async def test_a_retried_claim_with_the_same_run_id_is_still_won(store: Store) -> None:
    ids = Ids()
    c = claim(ids, "job", T0)
    assert (await store.claim([c], "a", T0)).won == {c.key}
    # The reply was lost; the caller retries the very same claim: it is still its own.
    assert (await store.claim([c], "a", T0)).won == {c.key}
    # Another caller (another run id) does not get it.
    assert (await store.claim([claim(ids, "job", T0)], "b", T0)).won == frozenset()
    assert await store.claimed_run(c.key) == c.run_id


async def test_a_claim_whose_run_never_started_is_given_back_with_its_placeholder_and_only_then(store: Store) -> None:
    ids = Ids()
    c = Claim(slot_key("job", T0), "job", ids(), None, scheduled_at=T0, trigger="external", outcome="external")
    assert (await store.claim([c], "a", T0)).won == {c.key}
    assert not await store.release_claim(c.key, ids())  # not its run: nothing goes
    assert await store.release_claim(c.key, c.run_id)
    assert await store.claimed_run(c.key) is None and await store.get_run(c.run_id) is None
    assert not await store.release_claim(c.key, c.run_id)  # (gone already)
    again = Claim(slot_key("job", T0), "job", ids(), None, scheduled_at=T0, trigger="external", outcome="external")
    assert (await store.claim([again], "b", T0)).won == {again.key}  # the slot can be claimed again
    # Once its run has started (or was closed by someone), the claim stays, and so does the run.
    store.save_runs([run(again.run_id, scheduled_at=T0, status="running", fired_at=T0, trigger="external",
                         coordination_outcome="external", instance="b")])  # fmt: skip
    await store.flush()
    assert not await store.release_claim(again.key, again.run_id)
    assert await store.claimed_run(again.key) == again.run_id
    started = await store.get_run(again.run_id)
    assert started is not None and started.fired_at == T0


async def test_a_key_given_twice_in_one_batch_is_won_once(store: Store) -> None:
    ids = Ids()
    first, again = claim(ids, "job", T0), claim(ids, "job", T0)  # one key, two run ids
    other = claim(ids, "other", T0)
    result = await store.claim([first, other, again], "a", T0)
    assert result.won == {first.key, other.key}
    # The first claim of the key is the one recorded: one claim, one placeholder run.
    assert await store.claimed_run(first.key) == first.run_id
    assert await store.count_claims() == 2
    assert sorted(r.id for r in await store.running_runs()) == sorted([first.run_id, other.run_id])
    assert await store.get_run(again.run_id) is None
    # The same claim twice (one run id) is one claim too.
    twice = claim(ids, "job", T0 + timedelta(minutes=1))
    assert (await store.claim([twice, twice], "a", T0)).won == {twice.key}
    assert sorted(r.id for r in await store.running_runs() if r.name == "job") == sorted([first.run_id, twice.run_id])


async def test_winners_prune_their_schedules_old_claims_and_the_sweep_takes_the_rest(store: Store) -> None:
    ids = Ids()
    for i in range(5):
        at = T0 + timedelta(minutes=i)
        await store.claim([claim(ids, "job", at), claim(ids, "gone", at)], "a", at)
    assert await store.count_claims() == 10
    # A winner keeps its schedule's claims made at or after prune_before, drops older ones.
    at = T0 + timedelta(minutes=10)
    won = await store.claim([claim(ids, "job", at, prune_before=T0 + timedelta(minutes=3))], "a", at)
    assert len(won.won) == 1
    assert await store.count_claims() == 8  # job: minutes 3, 4, 10; gone: 0-4
    # A losing claim prunes nothing.
    await store.claim([claim(ids, "job", at, prune_before=at)], "b", at)
    assert await store.count_claims() == 8
    # "gone" (a renamed or deleted schedule) never wins again: only the sweep clears it.
    assert await store.prune_claims("gone", T0 + timedelta(minutes=2)) == 2
    assert await store.prune_claims(None, T0 + timedelta(minutes=5)) == 5
    assert await store.count_claims() == 1


async def test_claims_report_runs_in_flight_on_other_instances(store: Store) -> None:
    ids = Ids()
    t = [T0 + timedelta(minutes=i) for i in range(6)]
    started = run(ids(), name="long", scheduled_at=t[0], status="running", instance="b", coordination_outcome="wonLock")
    mine = run(ids(), name="own", scheduled_at=t[0], status="running", instance="a", coordination_outcome="wonLock")
    finished = run(ids(), name="done", scheduled_at=t[0], status="succeeded", instance="b")
    store.save_runs([started, mine, finished])
    await store.flush()
    # A slot claimed (not started yet) by b for an earlier slot, and one for a later slot.
    await store.claim([claim(ids, "queued", t[1]), claim(ids, "ahead", t[4])], "b", t[1])
    result = await store.claim(
        [claim(ids, n, t[2]) for n in ("long", "own", "done", "queued", "ahead", "free")], "a", t[2]
    )
    assert len(result.won) == 6
    assert set(result.busy) == {"long", "queued"}
    assert result.busy["long"] == started.id
    queued_run = await store.get_run(result.busy["queued"])
    assert queued_run is not None and (queued_run.instance, queued_run.fired_at) == ("b", None)


async def _in_flight(store: Store) -> dict[str, Run]:
    return {r.id: r for r in await store.running_runs()}


async def test_a_claim_meant_to_start_takes_its_schedules_turn_unless_a_run_elsewhere_holds_it(store: Store) -> None:
    """Claim.turn: the winner's placeholder holds the schedule's overlap place from the
    claim's commit on, so an instance claiming an earlier slot a moment later sees it."""
    ids = Ids()
    t = [T0 + timedelta(minutes=i) for i in range(4)]
    later = dataclasses.replace(claim(ids, "q", t[2]), turn=True)
    result = await store.claim([later], "b", t[2])
    assert (result.won, result.busy, result.turns([later])) == (frozenset({later.key}), {}, [later.run_id])
    placeholder = (await _in_flight(store))[later.run_id]
    assert (placeholder.status, placeholder.fired_at, placeholder.held) == ("running", None, True)
    # An earlier slot claimed after it, meant to start too: the later one holds the place.
    earlier = dataclasses.replace(claim(ids, "q", t[1]), turn=True)
    result = await store.claim([earlier], "a", t[2])
    assert (result.won, result.busy, result.turns([earlier])) == (frozenset({earlier.key}), {"q": later.run_id}, [])
    assert not (await _in_flight(store))[earlier.run_id].held
    # Not meant to start (turn=False): won, but the place is not taken.
    plain = claim(ids, "p", t[2])
    assert (await store.claim([plain], "b", t[2])).turns([plain]) == []
    assert not (await _in_flight(store))[plain.run_id].held
    # Closed by another instance (its sweep): the placeholder lets go of the place.
    assert await store.close_runs([placeholder.finish("failed", t[3], error_tag="abandoned")]) == {later.run_id}
    assert later.run_id not in await _in_flight(store)
    again = dataclasses.replace(claim(ids, "q", t[3]), turn=True)
    assert (await store.claim([again], "b", t[3])).busy == {"q": earlier.run_id}  # (a's, earlier: queued there)


async def test_a_run_takes_its_turn_only_while_no_run_elsewhere_holds_the_place(store: Store) -> None:
    ids = Ids()
    t = [T0 + timedelta(minutes=i) for i in range(4)]
    a1, b2 = claim(ids, "q", t[1]), claim(ids, "q", t[2])
    await store.claim([a1], "a", t[2])
    await store.claim([b2], "b", t[2])
    # b's later slot waits for a's earlier one (queued there), whoever asks first.
    assert await store.take_turn(b2.run_id, "q", t[2], "b") == Turn(False, a1.run_id)
    assert await store.take_turn(a1.run_id, "q", t[1], "a") == Turn(True)
    assert (await _in_flight(store))[a1.run_id].held
    assert await store.take_turn(b2.run_id, "q", t[2], "b") == Turn(False, a1.run_id)
    # a's run starts (its row replaced: fired, no longer held), then ends: b's turn.
    store.save_runs([run(a1.run_id, "q", t[1], status="running", instance="a", coordination_outcome="wonLock")])
    await store.flush()
    started = (await _in_flight(store))[a1.run_id]
    assert started.fired_at is not None and not started.held
    assert await store.take_turn(b2.run_id, "q", t[2], "b") == Turn(False, a1.run_id)
    store.save_runs([run(a1.run_id, "q", t[1], instance="a", coordination_outcome="wonLock")])
    await store.flush()
    assert await store.take_turn(b2.run_id, "q", t[2], "b") == Turn(True)
    # A run of this instance never blocks its own turn; a row closed meanwhile is no turn at all.
    a3 = claim(ids, "q", t[3])
    await store.claim([a3], "b", t[3])
    assert await store.take_turn(a3.run_id, "q", t[3], "b") == Turn(True)
    await store.close_runs([run(a3.run_id, "q", t[3], status="failed", instance="b", coordination_outcome="wonLock")])
    assert await store.take_turn(a3.run_id, "q", t[3], "b") == Turn(False, None)


async def test_instances_taking_the_turn_at_once_never_both_take_it(new_store: Callable[[], Store]) -> None:
    """The calls for one schedule are serialized: runs of one slot on four instances (the
    order of slots cannot tell them apart) ask at the same moment, and one of them gets it."""
    stores = [new_store() for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    ids = Ids()
    for round_ in range(5):
        slot = T0 + timedelta(minutes=round_)
        runs = [run(ids(), "q", slot, status="running", instance=f"i{i}", fired_at=None) for i in range(4)]
        stores[0].save_runs(runs)
        await stores[0].flush()
        turns = await asyncio.gather(*(s.take_turn(r.id, "q", slot, r.instance) for s, r in zip(stores, runs, strict=True)))
        assert [turn.taken for turn in turns].count(True) == 1, turns
        await stores[0].close_runs([r.finish("succeeded", slot) for r in runs])


# ---------------------------------------------------------------------------------------
# keyset, not OFFSET, for every implementation
# ---------------------------------------------------------------------------------------
def test_no_store_pages_with_offset(store_kind: str, tmp_path: Path) -> None:
    module = inspect.getmodule(type(STORE_FACTORIES[store_kind](tmp_path)))
    assert module is not None
    # The store's package: its SQL, its writer, each system's part.
    folder = Path(inspect.getfile(module)).parent
    source = "".join(path.read_text() for path in sorted(folder.glob("*.py")))
    assert "ORDER BY scheduled_at DESC, id DESC" in source
    # (OFFSET 0 is an optimisation fence, not a page.)
    assert re.search(r"\bOFFSET\s+(\?|%s|%\(|\$\d|[1-9]|\{)", source, re.IGNORECASE) is None


# ---------------------------------------------------------------------------------------
# SQLite only
# ---------------------------------------------------------------------------------------
@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await s.open()
    yield s
    await s.close()


async def test_sqlite_uses_wal(sqlite_store: Store, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "state.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_sqlite_schema_version_is_written_once(tmp_path: Path) -> None:
    from backend.store.sqlite.sql import MIGRATIONS

    url = f"sqlite:///{tmp_path / 'state.db'}"
    for _ in range(3):
        s = open_store(url)
        await s.open()
        await s.close()
    with sqlite3.connect(tmp_path / "state.db") as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(len(MIGRATIONS),)]


async def test_sqlite_relative_url_is_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = open_store("sqlite:///sub/dir/state.db")
    await s.open()
    await s.close()
    assert (tmp_path / "sub" / "dir" / "state.db").is_file()


def _ledger_log(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "schedtui.store" and r.levelno >= level]


async def test_sqlite_health_counts_a_run_once_however_many_of_its_versions_wait(sqlite_store: Store) -> None:
    """A run's start and its end, both handed in while the writer is busy, are one run
    waiting. (healthz counted each version: on a full disk it said 12 runs waiting where
    8 were, and stopped, serve kept the 8.)"""
    assert isinstance(sqlite_store, SQLiteStore)
    store, ids = sqlite_store, Ids()
    held, release = threading.Event(), threading.Event()

    def hold(_: sqlite3.Connection) -> None:  # on the writer's thread: it takes nothing meanwhile
        held.set()
        release.wait(30)

    holding = asyncio.ensure_future(store._peek(hold))
    assert await asyncio.to_thread(held.wait, 30)
    started = [run(ids(), status="running", scheduled_at=T0 + timedelta(seconds=i)) for i in range(5)]
    store.save_runs(started)
    store.save_runs([r.finish("succeeded", T0 + timedelta(minutes=1)) for r in started])
    store.save_runs([run(ids(), scheduled_at=T0 + timedelta(hours=1))])
    try:
        assert store.health().waiting == 6
    finally:
        release.set()
        await holding
    await store.flush()
    assert store.health().waiting == 0
    assert sorted(r.status for r in await store.list_runs("job", limit=10)) == ["succeeded"] * 6


async def test_sqlite_on_a_full_disk_a_write_of_no_run_says_nothing_of_runs(
    sqlite_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A verb's write (a state, a job) failing said "cannot write 0 run(s) … they are kept
    and retried" before the verb's own one line."""
    assert isinstance(sqlite_store, SQLiteStore)
    caplog.set_level(logging.INFO, logger="schedtui.store")
    sqlite_store.limit_pages(0)
    with pytest.raises(Unavailable, match="database or disk is full"):
        await sqlite_store.set_state(ScheduleState(name="x", enabled=False, changed_by="me", changed_at=T0, note="n" * 200_000))
    assert "run(s)" not in caplog.text
    sqlite_store.limit_pages(None)


async def test_sqlite_on_a_full_disk_keeps_every_run_names_the_cause_and_writes_them_later(
    sqlite_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    assert isinstance(sqlite_store, SQLiteStore)
    caplog.set_level(logging.INFO, logger="schedtui.store")
    store, ids = sqlite_store, Ids()
    store.limit_pages(0)  # SQLite now answers SQLITE_FULL, as on a full disk
    started = [run(ids(), status="running", scheduled_at=T0 + timedelta(seconds=i)) for i in range(2000)]
    store.save_runs(started)
    with pytest.raises(Unavailable, match=r"cannot be written: database or disk is full \(2000 run\(s\) waiting") as info:
        await store.flush()
    assert "rollback" not in str(info.value)
    health = store.health()
    assert (health.state, health.error, health.waiting) == ("failing", "database or disk is full", 2000)
    assert health.since is not None and not health.ok
    # Other writes do not overtake the runs waiting before them: refused, with the cause.
    with pytest.raises(Unavailable, match="database or disk is full"):
        await store.set_state(ScheduleState("job", False, "op", T0))
    # More runs, and newer versions of waiting ones, keep arriving and are kept too.
    finished = [r.finish("succeeded", T0 + timedelta(minutes=1)) for r in started[:500]]
    more = [run(ids(), scheduled_at=T0 + timedelta(hours=1, seconds=i)) for i in range(300)]
    store.save_runs(finished)
    store.save_runs(more)
    with pytest.raises(Unavailable):
        await store.flush()
    assert store.health().waiting == 2300
    assert [m for m in _ledger_log(caplog) if "cannot write" in m] == [
        f'cannot write 2000 run(s) to the ledger "{store.path}": database or disk is full; they are kept and retried'
    ]

    store.limit_pages(None)  # space again
    await store.flush()
    assert store.health() == StoreHealth("ok", waiting=0)
    assert any(m == f'run ledger "{store.path}" writable again; 2300 run(s) written' for m in _ledger_log(caplog, logging.INFO))
    stored = {r.id: r for r in await store.list_runs("job", limit=5000)}
    assert stored == {r.id: r for r in [*finished, *started[500:], *more]}
    await store.set_state(ScheduleState("job", False, "op", T0))  # writable again


async def test_sqlite_commits_a_burst_mark_at_once_only_while_its_writer_has_nothing_in_hand(
    sqlite_store: Store, tmp_path: Path
) -> None:
    assert isinstance(sqlite_store, SQLiteStore)
    store, ids = sqlite_store, Ids()

    async def marks_seen_elsewhere() -> dict[str, datetime]:
        reader = SQLiteStore(tmp_path / "state.db", create=False)
        await reader.open()
        try:
            return await reader.starting_marks()
        finally:
            await reader.close()

    await store.heartbeat("me", "host-a", 1, T0)
    # Idle writer: committed here, at once (another process sees it when this returns).
    assert store.mark_starting_now("me", T0)
    assert await marks_seen_elsewhere() == {"me": T0}
    # Another connection holds the write lock: nothing waits for it (the lock is released
    # only later, so a call that waited would succeed); the writer's path then does.
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    slot = T0 + timedelta(seconds=1)
    assert not store.mark_starting_now("me", slot)
    await store.mark_starting("me", slot)
    release.join()
    other.close()
    assert await marks_seen_elsewhere() == {"me": slot}
    # Runs handed in before and not written (a full disk): the mark never overtakes them,
    # and through the writer it is refused, naming the cause, as every later write is.
    store.limit_pages(0)
    store.save_runs([run(ids(), status="running", scheduled_at=slot + timedelta(seconds=i)) for i in range(200)])
    with pytest.raises(Unavailable):
        await store.flush()
    assert not store.mark_starting_now("me", slot + timedelta(seconds=1))
    with pytest.raises(Unavailable, match="database or disk is full"):
        await store.mark_starting("me", slot + timedelta(seconds=1))
    store.limit_pages(None)
    await store.flush()
    assert store.mark_starting_now("me", slot + timedelta(seconds=2))
    assert await marks_seen_elsewhere() == {"me": slot + timedelta(seconds=2)}


# One step of the writer under a disk that fills and empties at random: hand in a new run
# (running), finish one (hand in its finished version), hand one in again unchanged, fill
# the disk, free it, or flush.
WRITER_STEP = st.tuples(st.sampled_from(["new", "new", "finish", "again", "fill", "free", "flush", "flush"]), st.integers(1, 300))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(WRITER_STEP, min_size=3, max_size=30))
def test_sqlite_whatever_the_disk_does_every_run_lands_as_its_latest_version(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]]
) -> None:
    """The writer's invariants under random sequences: a flush that returns means everything
    handed in before it is in the ledger as its latest version; one that fails names the
    real cause; and once there is space again, every run handed in is there, nothing else."""

    async def play() -> None:
        store = SQLiteStore(tmp_path_factory.mktemp("writer") / "state.db")
        await store.open()
        ids, full = Ids(), False
        latest: dict[str, Run] = {}  # run id -> the version last handed in
        try:
            for op, n in steps:
                if op == "new":
                    batch = [run(ids(), status="running", error_message="y" * 200) for _ in range(n)]
                    store.save_runs(batch)
                    latest.update((r.id, r) for r in batch)
                elif op in ("finish", "again") and latest:
                    chosen = list(latest.values())[n % len(latest)]
                    if op == "finish" and chosen.status == "running":
                        chosen = chosen.finish("succeeded", T0 + timedelta(seconds=n))
                    store.save_runs([chosen])
                    latest[chosen.id] = chosen
                elif op in ("fill", "free"):
                    full = op == "fill"
                    store.limit_pages(0 if full else None)
                elif op == "flush":
                    try:
                        await store.flush()
                    except Unavailable as exc:
                        assert full and "database or disk is full" in str(exc), exc
                    else:
                        assert {r.id: r for r in await store.list_runs("job", limit=10_000)} == latest
            store.limit_pages(None)
            await store.flush()
            assert {r.id: r for r in await store.list_runs("job", limit=10_000)} == latest
            assert store.health() == StoreHealth("ok")
        finally:
            store.limit_pages(None)
            await store.close()

    asyncio.run(play())


async def test_sqlite_closing_a_full_store_logs_each_run_it_could_not_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    await store.open()
    store.close_patience = 0.2
    store.limit_pages(0)
    runs = [run(Ids(T0 + timedelta(days=i))(), scheduled_at=T0 + timedelta(seconds=i), error_message="x" * 4000) for i in range(5)]
    store.save_runs(runs)
    await store.close()
    lost = [m for m in _ledger_log(caplog, logging.ERROR) if m.startswith("run not written to the ledger: ")]
    assert [json.loads(m.split(": ", 1)[1]) for m in lost] == [r.to_json() for r in runs]


async def test_sqlite_a_firer_stopped_on_a_full_disk_keeps_its_runs_for_the_next_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs the disk refused when the firing process stopped go to the reserve beside the
    store; the next firer writes them to the ledger before anything else, and until they
    are written its catch-up counts their slots (last_slots), as it counts runs waiting."""
    caplog.set_level(logging.INFO, logger="schedtui.store")
    path, ids = tmp_path / "state.db", Ids()
    first = SQLiteStore(path)
    await first.take_firing_lock("first")
    await first.open()
    first.close_patience = 0.2
    first.save_runs([run(ids(), name=name, scheduled_at=T0) for name in ("a", "b")])
    await first.heartbeat("first", "host-a", 1, T0)
    await first.flush()
    assert first.mark_starting_now("first", T0 + timedelta(seconds=2))  # the burst whose rows follow
    first.limit_pages(0)
    big = {"error_message": "x" * 4000}  # past the room left in the file's last page
    waiting = [run(ids(), name=name, scheduled_at=T0 + timedelta(seconds=s), **big) for s in (1, 2) for name in ("a", "b")]
    manual = run(ids(), name="a", scheduled_at=T0 + timedelta(hours=1), trigger="manual", **big)
    first.save_runs([*waiting, manual])
    # Waiting in memory, they count already: a catch-up now must not fire their slots again.
    assert await first.last_slots(["a", "b", "c"]) == {"a": T0 + timedelta(seconds=2), "b": T0 + timedelta(seconds=2)}
    await first.close()
    assert first.health().waiting == 5 and "5 of them kept in the reserve" in (first.health().error or "")
    assert any("kept 5 run(s) in its reserve" in m for m in _ledger_log(caplog, logging.ERROR))
    assert not [m for m in _ledger_log(caplog, logging.ERROR) if m.startswith("run not written")]
    assert await _last_slots(path) == {"a": T0, "b": T0}  # not in the ledger: in the reserve

    second = SQLiteStore(path)
    await second.take_firing_lock("second")
    await second.open()
    # The stop accounted for its burst (its runs are in the reserve): no abandoned rows for it.
    assert await second.starting_marks() == {}
    assert await second.last_slots(["a", "b"]) == {"a": T0 + timedelta(seconds=2), "b": T0 + timedelta(seconds=2)}
    await second.flush()
    stored = {r.id: r for name in ("a", "b") for r in await second.list_runs(name, limit=10)}
    assert {r.id: stored.get(r.id) for r in [*waiting, manual]} == {r.id: r for r in [*waiting, manual]}
    await second.close()
    assert second.health() == StoreHealth("ok")
    assert any("5 run(s) kept in the reserve" in m and "are in the ledger" in m for m in _ledger_log(caplog, logging.INFO))
    caplog.clear()
    third = SQLiteStore(path)  # the reserve was emptied once they were written
    await third.take_firing_lock("third")
    await third.open()
    await third.close()
    assert not [m for m in _ledger_log(caplog, logging.INFO) if "reserve" in m]


async def test_sqlite_runs_the_disk_refuses_are_in_the_reserve_at_once_not_only_at_the_stop(tmp_path: Path) -> None:
    # Kept only at the end of the stop's 10 s of retries: a SIGKILL before (docker stop's
    # grace, the OOM killer) lost them, and the next start fired their slots again.
    path, ids = tmp_path / "state.db", Ids()
    store = SQLiteStore(path)
    await store.take_firing_lock("first")
    await store.open()

    def in_the_reserve() -> list[str]:  # what the next process reads, were this one killed now
        reserve = Reserve(tmp_path / "state.db.reserve")
        try:
            return [r.id for r in reserve.open().runs]
        finally:
            reserve.close()

    try:
        store.limit_pages(0)
        waiting = [run(ids(), name="a", scheduled_at=T0 + timedelta(seconds=s), error_message="x" * 4000) for s in (1, 2)]
        store.save_runs(waiting)
        with pytest.raises(Unavailable):
            await store.flush()
        assert in_the_reserve() == [waiting[-1].id, waiting[0].id]  # (the schedule's newest first)
        store.limit_pages(None)
        await store.flush()
        assert in_the_reserve() == []  # written: the next start has nothing to write again
    finally:
        await store.close()


async def _last_slots(path: Path) -> dict[str, datetime]:
    reader = SQLiteStore(path, create=False)
    await reader.open()
    try:
        return await reader.last_slots(["a", "b"])
    finally:
        await reader.close()


def test_sqlite_a_reserve_too_small_keeps_each_schedules_newest_run_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = Ids()
    runs = [run(ids(), name=f"s{i % 3}", scheduled_at=T0 + timedelta(seconds=i), error_message="x" * 300) for i in range(30)]
    line = len(json.dumps(_run_params(runs[0])).encode()) + 1  # every run's line is as long (its row)
    path, size = tmp_path / "state.db.reserve", 64 + 6 * line + line // 2  # the header, and six runs
    small = Reserve(path, size=size)
    assert small.open() == ([], {})
    left = small.keep(runs, {"me": 1})
    small.close()
    again = Reserve(path, size=size)
    kept, marks = again.open()
    again.close()
    assert marks == {}  # not every run fits: the burst's mark stays (its slot is recorded abandoned)
    assert {r.id for r in kept} | {r.id for r in left} == {r.id for r in runs} and len(kept) == 6
    assert kept[:3] == runs[-3:] and kept[3:] == runs[:3]  # the newest of each schedule, then the oldest
    # A write cut short (the header's checksum fails): read as empty, and said.
    with path.open("r+b") as f:
        f.seek(100)
        f.write(b"garbage")
    assert Reserve(path).open() == ([], {})
    assert any("cannot be read" in m for m in _ledger_log(caplog))


async def test_sqlite_a_store_file_deleted_while_open_is_noticed_and_never_recreated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
    await store.open()
    store.close_patience = 0.2
    ids = Ids()
    store.save_runs([run(ids())])
    await store.flush()
    path.unlink()
    late = run(ids())
    store.save_runs([late])
    with pytest.raises(Unavailable, match=f'the store file "{re.escape(str(path))}" was deleted or replaced while in use'):
        await store.flush()
    health = store.health()
    assert (health.state, health.error, health.waiting) == ("lost", "the store file was deleted or replaced while in use", 1)
    assert any(str(path) in m and "deleted or replaced" in m for m in _ledger_log(caplog, logging.ERROR))
    with pytest.raises(Unavailable, match="deleted or replaced"):
        await store.heartbeat("a", "h", 1, T0)
    await store.close()
    assert any(late.id in m for m in _ledger_log(caplog, logging.ERROR))
    assert not path.exists()


async def test_sqlite_a_store_file_replaced_while_open_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
    await store.open()
    store.close_patience = 0.2
    other = SQLiteStore(tmp_path / "other.db")
    await other.open()
    await other.close()
    os.replace(tmp_path / "other.db", path)
    with pytest.raises(Unavailable, match="deleted or replaced"):
        await store.set_state(ScheduleState("job", False, "op", T0))
    assert store.health().state == "lost"
    await store.close()


async def test_sqlite_a_store_that_must_exist_is_refused_naming_it_and_never_created(tmp_path: Path) -> None:
    path = tmp_path / "typo" / "state.db"
    with pytest.raises(NotFound, match=f'no store at "{re.escape(str(path))}" \\(no such file\\)'):
        open_store(f"sqlite:///{path}", create=False)
    assert not path.parent.exists()
    made = open_store(f"sqlite:///{path}")
    await made.open()
    await made.close()
    existing = open_store(f"sqlite:///{path}", create=False)
    path.unlink()  # gone between building and opening: refused again, not created
    with pytest.raises(NotFound, match="no store at"):
        await existing.open()
    assert not path.exists()


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from datetime import datetime, timedelta, timezone
    from backend.model import Run
    from backend.store.sqlite.store import SQLiteStore

    async def main(path, parent_id, first_id):
        store = SQLiteStore(path)
        await store.open()
        seen = await store.get_run(parent_id)
        t0 = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)
        runs = [
            Run(id=f"{first_id}{i:02d}", name="child", scheduled_at=t0 + timedelta(minutes=i), status="succeeded",
                trigger="self", coordination_outcome="single", instance="child",
                fired_at=t0 + timedelta(minutes=i, microseconds=i), finished_at=t0 + timedelta(minutes=i, seconds=1))
            for i in range(20)
        ]
        store.save_runs(runs)
        await store.flush()
        await store.set_state(
            __import__("backend.model", fromlist=["ScheduleState"]).ScheduleState("child", False, "child", t0, "from the child")
        )
        print(json.dumps({"seen": seen.to_json() if seen else None}))
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


async def test_sqlite_a_second_process_reads_and_writes_while_the_first_is_open(sqlite_store: Store, tmp_path: Path) -> None:
    ids = Ids()
    mine = run(ids(), status="running", instance="parent")
    sqlite_store.save_runs([mine])
    await sqlite_store.flush()
    # Keep the parent's read connection warm and its writer busy-capable across the child's life.
    assert await sqlite_store.get_run(mine.id) == mine

    child_prefix = "01ZZZZZZZZZZZZZZZZZZZZZZ"  # 24 chars + 2 digits: sorts after the parent's ids
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(tmp_path / "state.db"),
        mine.id,
        child_prefix,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    # The parent keeps writing while the child runs.
    for i in range(10):
        sqlite_store.save_runs([run(ids(), name="parent-side", scheduled_at=T0 + timedelta(minutes=i))])
        await sqlite_store.flush()
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out) == {"seen": mine.to_json()}

    child_runs = await sqlite_store.list_runs("child", limit=100)
    assert [r.id for r in child_runs] == [f"{child_prefix}{i:02d}" for i in reversed(range(20))]
    assert child_runs[-1].fired_at == T0
    assert child_runs[0].fired_at == T0 + timedelta(minutes=19, microseconds=19)
    assert (await sqlite_store.get_states())["child"].note == "from the child"
    assert len(await sqlite_store.list_runs("parent-side", limit=100)) == 10
    # The parent can still write after the child is gone.
    closed = mine.finish("succeeded", T0 + timedelta(seconds=3))
    assert await sqlite_store.close_runs([closed]) == {closed.id}
    assert await sqlite_store.get_run(mine.id) == closed


# ---------------------------------------------------------------------------------------
# PostgreSQL only
# ---------------------------------------------------------------------------------------
@pytest.mark.postgres
async def test_postgres_unreachable_is_one_line_without_the_password(pg_server: pg.PgServer) -> None:
    from backend.errors import Unavailable

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_store(f"postgresql://someone:s3cret@127.0.0.1:{port}/nowhere")
    assert store.kind == "postgresql" and store.default_coordination == "advisoryLock"
    assert store.where == f"postgresql://someone:***@127.0.0.1:{port}/nowhere"
    with pytest.raises(Unavailable) as info:
        await store.open()
    assert "\n" not in info.value.message and "s3cret" not in info.value.message
    assert "refused" in info.value.message.lower()
    with pytest.raises(Unavailable):
        store.save_runs([])  # not open


@pytest.mark.postgres
async def test_postgres_answers_out_of_step_with_their_commands_are_a_lost_connection(pg_url: str) -> None:
    """Behind PgBouncer a server connection that died answers the next command with the
    server's error and the pooler's: psycopg raises InternalError("received 2 results from
    command 'BEGIN'"), no SQLSTATE. It was taken for the server refusing the statement: a
    claim lost its slots without a missed row, the ledger dropped a run that had succeeded,
    a send answered 500. It is retried once on a fresh connection, then Unavailable."""
    store: Any = open_store(pg_url)
    await store.open()
    calls: list[int] = []

    def out_of_step(times: int) -> Callable[[Any], Awaitable[Any]]:
        async def go(conn: Any) -> Any:
            calls.append(1)
            if len(calls) <= times:
                raise psycopg.InternalError("received 2 results from command 'BEGIN'")
            return await (await conn.execute("SELECT 1")).fetchone()

        return go

    try:
        assert await store._with_conn(out_of_step(1)) == (1,)  # once: the retry answers
        calls.clear()
        with pytest.raises(Unavailable):
            await store._with_conn(out_of_step(2))
        assert len(calls) == 2
        calls.clear()
        with pytest.raises(psycopg.ProgrammingError):  # (a client's own error is no outage)

            async def wrong(conn: Any) -> Any:
                raise psycopg.ProgrammingError("the query has 1 placeholder but 2 parameters were passed")

            await store._with_conn(wrong)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_a_pool_all_in_use_is_said_as_busy_not_as_the_server_down(pg_url: str) -> None:
    """Every pooled connection checked out past the wait: the error and /healthz say the
    connections were all in use (long statements, too much at once), not that the server
    is down; once one is back, health is ok again."""
    from backend.errors import Unavailable

    store: Any = open_store(pg_url)
    await store.open()
    try:
        pool = store._pool
        held = [await pool.getconn() for _ in range(pool.max_size)]
        try:
            with pytest.raises(Unavailable) as info:
                await store._with_conn(lambda conn: conn.execute("SELECT 1"), wait=0.2)
            assert "8 connections to the server was in use for 0.2 s" in info.value.message
            assert "down" not in info.value.message
            assert store.health().state == "failing" and "in use" in (store.health().error or "")
        finally:
            for conn in held:
                await pool.putconn(conn)
        await store._with_conn(lambda conn: conn.execute("SELECT 1"))
        assert store.health().state == "ok"
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_a_pool_that_cannot_connect_says_the_servers_refusal(pg_server: pg.PgServer) -> None:
    """The pool's connections lost and its role refused at login since: the error says
    the server's refusal (learned by connecting once), not "down or unreachable"."""
    from backend.errors import Unavailable

    role = f"refused_{os.getpid()}"
    url = pg_server.create_database("refusal")
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
        try:
            params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(url).items() if v is not None}
            store: Any = open_store("postgresql://?" + urlencode({**params, "user": role}))
            await store.open()
            try:
                admin.execute(f'ALTER ROLE "{role}" NOLOGIN')
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
                with pytest.raises(Unavailable) as info:
                    for _ in range(3):  # (a connection the pool had not seen die yet is retried first)
                        await store._with_conn(lambda conn: conn.execute("SELECT 1"), wait=0.5)
                assert "not permitted to log in" in info.value.message, info.value.message
                assert "down or unreachable" not in info.value.message
                assert store.health().error == "the server refused the credentials"
            finally:
                await store.close()
        finally:
            with psycopg.connect(url, autocommit=True) as there:  # (the tables it made)
                there.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


async def waiting_for_an_advisory_lock(pg_url: str) -> None:
    """Returns once a backend of the server waits for an advisory lock."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        while not (await (await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).fetchone() or (0,))[0]:  # fmt: skip
            await asyncio.sleep(0.01)


@pytest.mark.postgres
async def test_postgres_turns_and_claims_taking_turns_never_decide_at_once(pg_url: str) -> None:
    """PostgreSQL does not serialize two transactions that each find nothing in flight and
    then mark their own row: a turn taken while another instance's claim taking the turn
    of a different slot of the schedule is in flight would see nothing of it (and the
    claim nothing of the turn), and both would start; so would two claims taking turns of
    different slots (instances whose clocks are a cron interval apart). A turn waits for
    the claim; a claim never waits (it holds its keys): it checks again under the locks it
    can take at once, and leaves a turn whose lock another holds to its run's start."""
    from backend.store.postgres.sql import CLAIM, KEEP_TURNS, TAKE_TURN, TRY_TURN_LOCKS, TURN_LOCK, _claims_json

    store = open_store(pg_url)
    await store.open()
    ids = Ids()

    async def waiting() -> None:
        await waiting_for_an_advisory_lock(pg_url)

    def turning(name: str, slot: datetime) -> Claim:
        return dataclasses.replace(claim(ids, name, slot), turn=True)

    async def held(run_id: str) -> bool:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            row = await (await conn.execute("SELECT held FROM schedtui_runs WHERE id = %s", (run_id,))).fetchone()
            assert row is not None
            return bool(row[0])

    async def claimed_by_other(other: psycopg.AsyncConnection[Any], theirs: Claim) -> None:
        """Another instance's claim that took its turn, in flight (checking under its locks)."""
        await other.execute(CLAIM, {"claims": _claims_json([theirs]), "instance": "c", "at": T0})
        assert not await (await other.execute(TRY_TURN_LOCKS, {"names": [theirs.name]})).fetchall()

    try:
        async with await psycopg.AsyncConnection.connect(pg_url) as other:
            # A turn waits for a claim in flight that took the schedule's turn.
            mine = claim(ids, "q", T0)
            await store.claim([mine], "a", T0)
            theirs = turning("q", T0 - timedelta(minutes=1))
            await claimed_by_other(other, theirs)
            turn = asyncio.ensure_future(store.take_turn(mine.run_id, "q", T0, "a"))
            await asyncio.wait_for(waiting(), 10)
            assert not turn.done()
            await other.commit()
            assert await asyncio.wait_for(turn, 10) == Turn(False, theirs.run_id)

            # A claim meeting a turn in flight does not wait: it leaves its own undecided.
            later = claim(ids, "s", T0 + timedelta(minutes=1))
            await store.claim([later], "c", T0)  # (its placeholder: not started, no turn)
            await other.execute(TURN_LOCK, {"name": "s"})
            await other.execute(TAKE_TURN, {"run_id": later.run_id, "name": "s", "slot": later.scheduled_at,
                                            "instance": "c"})  # fmt: skip
            earlier = turning("s", T0)  # (b's clock a minute behind: its "now")
            result = await asyncio.wait_for(store.claim([earlier], "b", T0), 10)
            assert result.won == {earlier.key} and result.untried == {"s"} and result.turns([earlier]) == []
            assert await held(earlier.run_id) is False
            await other.commit()  # ... and its run, starting, is refused
            assert await store.take_turn(earlier.run_id, "s", T0, "b") == Turn(False, later.run_id)

            # Nor for another claim checking its turn of a different slot.
            early, late = turning("r", T0), turning("r", T0 + timedelta(minutes=1))
            await claimed_by_other(other, early)
            result = await asyncio.wait_for(store.claim([late], "b", T0), 10)
            assert result.won == {late.key} and result.untried == {"r"} and result.turns([late]) == []
            await other.commit()
            assert (await held(late.run_id), await held(early.run_id)) == (False, True)
            assert await store.take_turn(late.run_id, "r", T0 + timedelta(minutes=1), "b") == Turn(False, early.run_id)

            # A claim that decided from a snapshot without another's turn, committed before its
            # check under the lock, gives its own back there.
            first, second = turning("t", T0), turning("t", T0 + timedelta(minutes=1))
            await other.execute(CLAIM, {"claims": _claims_json([first]), "instance": "c", "at": T0})
            async with await psycopg.AsyncConnection.connect(pg_url) as mine_conn:
                await mine_conn.execute(CLAIM, {"claims": _claims_json([second]), "instance": "b", "at": T0})
                # (neither committed: each decided from a snapshot without the other)
                await other.commit()
                assert not await (await mine_conn.execute(TRY_TURN_LOCKS, {"names": ["t"]})).fetchall()
                keep = {"names": ["t"], "firsts": [second.scheduled_at.isoformat()],  # type: ignore[union-attr]
                        "run_ids": [second.run_id], "undecided": [], "instance": "b"}  # fmt: skip
                rows = await (await mine_conn.execute(KEEP_TURNS, keep)).fetchall()
                await mine_conn.commit()
            assert rows == [("busy:t", first.run_id)]
            assert (await held(second.run_id), await held(first.run_id)) == (False, True)

            # With nobody deciding, a claim keeps its turn (and frees the lock as it commits).
            free = turning("v", T0)
            result = await store.claim([free], "b", T0)
            assert result.untried == frozenset() and result.turns([free]) == [free.run_id] and await held(free.run_id)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_a_run_now_is_committed_under_its_turn_lock_and_counts_in_flight_from_then(pg_url: str) -> None:
    """A Run now's row (``running``, its handler not started, holding its schedule's turn) is
    committed under the schedule's turn lock: a turn, or a claim's check, deciding from a
    snapshot without the row is over before it commits, and one after it sees it. From
    that commit it counts in flight for the other instances whatever its slot: here one
    pressed after the slot whose run takes its turn elsewhere. Before, the row went in
    with no lock and no turn: a turn decided in the milliseconds before its commit, or
    for a slot before the moment it was pressed, started beside it."""
    from backend.store.postgres.sql import TURN_LOCK

    store = open_store(pg_url)
    await store.open()
    ids = Ids()
    try:
        timed = claim(ids, "m", T0)
        await store.claim([timed], "b", T0)  # (its placeholder, its turn to take as it starts)
        pressed = run(ids(), name="m", scheduled_at=T0 + timedelta(seconds=30), status="running", trigger="manual",
                      instance="a", fired_at=None, held=True)  # fmt: skip
        async with await psycopg.AsyncConnection.connect(pg_url) as other:
            await other.execute(TURN_LOCK, {"name": "m"})  # another instance deciding a turn of "m"
            store.save_runs([pressed])
            flushed = asyncio.ensure_future(store.flush())
            await asyncio.wait_for(waiting_for_an_advisory_lock(pg_url), 10)  # the writer waits for it
            assert not flushed.done()
            await other.commit()
            await asyncio.wait_for(flushed, 10)
        assert await store.take_turn(timed.run_id, "m", T0, "b") == Turn(False, pressed.id)
        # Started, then finished: it lets go (a timed run's rows take no lock).
        store.save_runs([started := dataclasses.replace(pressed, fired_at=T0 + timedelta(seconds=30), held=False)])
        await store.flush()
        store.save_runs([started.finish("succeeded", T0 + timedelta(seconds=31))])
        await store.flush()
        assert await store.take_turn(timed.run_id, "m", T0, "b") == Turn(True, None)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_the_in_flight_check_does_not_grow_with_the_runs_closed(pg_url: str) -> None:
    """A claim's and a turn's check for a run in flight elsewhere (BUSY_ELSEWHERE) reads a
    few pages however many runs of the schedule were closed since the last vacuum: their
    index entries are marked dead by the first check that passes them, not read from the
    table again at each check (a bitmap scan did: a burst's claim grew with the ledger)."""
    from backend.store.postgres.sql import TAKE_TURN

    store = open_store(pg_url)
    await store.open()
    try:
        ids = Ids()
        # 20 schedules firing in turn, as a fleet's runs lie in the table: each one's among the others'.
        runs = [run(ids(), name=f"s{n:02d}", scheduled_at=T0 + timedelta(seconds=i), status="running", instance="b")
                for i in range(300) for n in range(20)]  # fmt: skip
        store.save_runs(runs)
        await store.flush()
        await store.close_runs([r.finish("succeeded", r.scheduled_at + timedelta(seconds=1)) for r in runs])
        params = {"run_id": "none", "name": "s07", "slot": T0 + timedelta(hours=2), "instance": "a"}
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            async def pages() -> int:
                cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + TAKE_TURN, params)
                plan = (await cur.fetchone())[0][0]["Plan"]  # type: ignore[index]
                return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])

            first, second = await pages(), await pages()
        assert second < 30, (first, second)  # (s07's 300 closed runs lie on some 90 pages)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_schema_version_is_written_once(pg_url: str) -> None:
    from backend.store.postgres.sql import MIGRATIONS

    for _ in range(3):
        s = open_store(pg_url)
        await s.open()
        await s.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM schedtui_schema_version").fetchall() == [(len(MIGRATIONS),)]


@pytest.mark.postgres
async def test_postgres_store_survives_a_server_restart(pg_server: pg.PgServer, pg_url: str) -> None:
    from backend.errors import Unavailable

    if not pg_server.owned:
        pytest.skip("the server comes from SCHEDTUI_TEST_DSN: it cannot be restarted here")
    store = open_store(pg_url)
    await store.open()
    ids = Ids()
    before = run(ids())
    store.save_runs([before])
    await store.flush()
    try:
        await asyncio.to_thread(pg_server.pg_ctl, "stop")
        # Down: calls fail fast with Unavailable (fail closed), runs handed in are kept.
        with pytest.raises(Unavailable):
            await store.claim([claim(ids, "job", T0)], "a", T0)
        during = run(ids(), scheduled_at=T0 + timedelta(minutes=1))
        store.save_runs([during])
        with pytest.raises(Unavailable):
            await store.flush()
        health = store.health()
        assert (health.state, health.waiting) == ("failing", 1)
        assert health.error is not None and health.since is not None
        assert pg_url.split("@")[0] not in health.error  # the cause, not the URL
    finally:
        await asyncio.to_thread(pg_server.pg_ctl, "start")
    # Back: the same store object works again, without being reopened.
    await store.flush()
    assert store.health() == StoreHealth("ok")
    assert await store.get_run(during.id) == during
    assert (await store.claim([claim(ids, "job", T0)], "a", T0)).won == {slot_key("job", T0)}
    await store.close()


@pytest.mark.postgres
async def test_postgres_keeps_runs_whose_messages_it_cannot_store_verbatim(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    ids = Ids()
    runs = [
        run(ids(), status="failed", error_tag="ValueError", error_message="nul \x00 inside"),
        run(ids(), status="failed", error_tag="UnicodeError", error_message="lone \udcff surrogate"),
        run(ids(), status="succeeded"),
    ]
    store.save_runs(runs)
    await store.flush()
    got = [await store.get_run(r.id) for r in runs]
    assert [g.error_message if g else None for g in got] == ["nul \\0 inside", "lone \\udcff surrogate", None]
    await store.close()


@pytest.mark.postgres
async def test_the_ledger_writer_ends_when_cancelled_as_its_backoff_wakes(pg_url: str) -> None:
    """A close cancels the writer. When the cancellation lands as the writer's backoff
    wakes (a flush set the event in the same moment: the close flushes first), Python
    3.11's ``asyncio.wait_for`` returns as if woken and drops the cancellation; the writer
    went on retrying for good, and the close, waiting for it, hung the process's stop
    (found by the schedule liveness machine: a crashed member's store never closed)."""
    store: Any = open_store(pg_url)
    await store.open()
    down = {"now": True}
    upsert = store._upsert

    async def refusing(conn: Any, runs: list[Run]) -> None:
        if down["now"]:
            raise Unavailable("the server is gone (test)")
        await upsert(conn, runs)

    store._upsert = refusing
    try:
        store.save_runs([run(Ids()())])
        writer = store._writer
        for _ in range(200):  # its first write fails: it waits out its backoff
            await asyncio.sleep(0)
            if store._write_failures:
                break
        assert store._write_failures == 1
        store._wake.set()  # the wake and the cancellation, in one moment
        writer.cancel()
        done, _ = await asyncio.wait({writer}, timeout=5)
        assert writer in done and writer.cancelled()
    finally:
        down["now"] = False
        store._writer = None  # (cancelled: the close has no writer left to flush)
        await store.close()
