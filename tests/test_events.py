"""Change signals: the bus's inboxes (coalescing, bounds, resume), run signals only after
commit, the SQLite change counter, the PostgreSQL relay (pacing, reconnect, large
batches), and ``GET /inspect/events`` on real servers: resume with ``Last-Event-ID``,
pings, a reader that never reads, a clean stop, and two ``serve`` instances on one
PostgreSQL database."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend import Engine, ManualClock, RunContext, Unavailable, define_schedule
from backend.api.server import serve
from backend.client.embedded import EmbeddedBackend
from backend.client.remote import RemoteBackend, SseParser
from backend.events.bus import RESYNC, STREAM, EventBus, Signal, Subscription
from backend.events.relay import NOTIFY_BURST, NOTIFY_RATE, PostgresRelay
from backend.runtime.loops import Loops
from backend.store import open_store
from backend.store.postgres.store import PostgresStore
from tests import pg
from tests.servers import start_server


async def noop(ctx: RunContext) -> None:
    pass


HOURLY = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=noop)
NAMES = [f"job{i}" for i in range(20)]
SCHEDULES = [define_schedule(name=n, cron="0 * * * *", timezone="UTC", handler=noop) for n in NAMES]


def pairs(batch: list[Signal]) -> list[tuple[str, str | None]]:
    return [(s.topic, s.name) for s in batch]


async def until(stream: Callable[[], Awaitable[list[Signal]]], wanted: Callable[[list[Signal]], bool],
                timeout: float = 10) -> list[Signal]:  # fmt: skip
    """Read batches until one matches; every batch read is returned (the timeout only
    bounds a broken test)."""
    seen: list[Signal] = []
    async with asyncio.timeout(timeout):
        while True:
            batch = await stream()
            seen += batch
            if wanted(batch):
                return seen


# ---------------------------------------------------------------------------------------
# the bus
# ---------------------------------------------------------------------------------------
async def test_an_inbox_keeps_each_signal_once_in_publishing_order() -> None:
    bus = EventBus()
    with bus.subscribe() as inbox:
        for topic, name in [("runs", "a"), ("runs", "b"), ("runs", "a"), ("schedules", "a"), ("audit", None)]:
            bus.publish(topic, name)
        batch = await inbox.get()
    assert pairs(batch) == [("runs", "b"), ("runs", "a"), ("schedules", "a"), ("audit", None)]
    assert [s.id for s in batch] == [f"{bus.epoch}-{n}" for n in (2, 3, 4, 5)]  # each with its latest id
    assert await inbox.get(timeout=0) == []


async def test_a_full_inbox_gives_its_signals_up_for_one_resync() -> None:
    bus = EventBus()
    inbox = bus.subscribe(limit=10)
    for i in range(10_000):  # never blocks, whoever reads or not
        bus.publish("runs", f"s{i}")
    bus.publish("stream", "down", remote=True)
    batch = await inbox.get()
    assert pairs(batch) == [(RESYNC, None), (STREAM, "down")]
    assert batch[0].id == f"{bus.epoch}-10000" and inbox.overflows == 1
    bus.publish("runs", "after")
    assert pairs(await inbox.get()) == [("runs", "after")]


async def test_a_reader_resumes_where_it_left_or_refetches() -> None:
    bus = EventBus(history=5)
    inbox = bus.subscribe()
    bus.publish("runs", "a")
    last = (await inbox.get())[-1].id
    inbox.close()
    bus.publish("runs", "b")
    bus.publish("schedules", "b")
    with bus.subscribe(since=last) as again:
        assert pairs(await again.get()) == [("runs", "b"), ("schedules", "b")]
    with bus.subscribe(since=bus.last_id) as current:
        assert await current.get(timeout=0) == []
    for since in ("someone-else-3", "garbage", f"{bus.epoch}-999"):
        with bus.subscribe(since=since) as other:
            assert pairs(await other.get()) == [(RESYNC, None)]
    for i in range(10):  # the history forgets
        bus.publish("runs", f"x{i}")
    with bus.subscribe(since=last) as late:
        assert pairs(await late.get()) == [(RESYNC, None)]


async def test_signals_published_on_another_thread_wake_the_reader() -> None:
    bus = EventBus()
    inbox = bus.subscribe()
    def publish() -> None:
        for i in range(100):
            bus.publish("runs", f"t{i}")

    thread = threading.Thread(target=publish)
    thread.start()
    got: list[Signal] = []
    async with asyncio.timeout(10):
        while len({s.name for s in got}) < 100:
            got += await inbox.get()
    thread.join()


async def test_stream_state_changes_and_a_resync_when_it_comes_back() -> None:
    bus = EventBus()
    inbox = bus.subscribe()
    bus.set_live(False)
    bus.set_live(False)  # no change, no signal
    assert pairs(await inbox.get()) == [(STREAM, "down")]
    bus.set_live(True)
    assert pairs(await inbox.get()) == [(STREAM, "up"), (RESYNC, None)]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from(["runs", "schedules", "jobs"]), st.sampled_from("abcdefg")),
        st.tuples(st.just("resync"), st.none(), st.none()),
        st.tuples(st.just("take"), st.none(), st.none()),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, limit=st.integers(min_value=1, max_value=6))
def test_every_signal_reaches_the_reader_or_a_resync_does(ops: list[tuple[str, Any, Any]], limit: int) -> None:
    """Invariant: a signal published after the inbox was made is in the next batch taken
    after it, with at least its own sequence number, or that batch is a resync from at
    least then; a batch never holds a signal twice, is in order, and is bounded."""

    async def check() -> None:
        bus = EventBus()
        inbox = bus.subscribe(limit=limit)
        owed: list[tuple[int, str, str]] = []
        for op, topic, name in [*ops, ("take", None, None)]:
            if op == "publish":
                bus.publish(topic, name)
                owed.append((int(bus.last_id.rsplit("-", 1)[1]), topic, name))
            elif op == "resync":
                bus.resync()
                owed = []  # a resync is owed now; checked below through the batch
            else:
                batch = await inbox.get(timeout=0)
                seqs = [int(s.id.rsplit("-", 1)[1]) for s in batch]
                assert seqs == sorted(seqs) and len(set(pairs(batch))) == len(batch)
                assert len(batch) <= limit
                resync = [seq for s, seq in zip(batch, seqs, strict=False) if s.topic == RESYNC]
                got = {(s.topic, s.name): seq for s, seq in zip(batch, seqs, strict=False)}
                for seq, topic, name in owed:
                    assert got.get((topic, name), -1) >= seq or (resync and resync[0] >= seq)
                owed = []

    asyncio.run(check())


# ---------------------------------------------------------------------------------------
# the engine's signals
# ---------------------------------------------------------------------------------------
async def test_a_run_signal_leaves_once_its_rows_are_committed(
    make_engine: Any, clock: ManualClock, tmp_path: Path
) -> None:
    every_minute = [define_schedule(name=n, cron="* * * * *", timezone="UTC", handler=noop) for n in NAMES]
    engine: Engine = make_engine(every_minute)
    recorded: dict[str, set[str]] = {n: set() for n in NAMES}
    engine.add_listener(lambda run: recorded[run.name].add(run.id))
    reader = sqlite3.connect(tmp_path / "state.db")  # another connection: sees only what is committed
    missing: list[str] = []
    signalled: set[str] = set()

    def at_publish(topic: str, name: str | None) -> None:
        if topic != "runs" or name is None:
            return
        signalled.add(name)
        ids = recorded[name]
        marks = ",".join("?" * len(ids))
        found = {row[0] for row in reader.execute(f"SELECT id FROM runs WHERE id IN ({marks})", sorted(ids))}
        missing.extend(ids - found)

    engine.events.taps.append(at_publish)
    await engine.start()
    inbox = engine.events.subscribe()
    for _ in range(3):
        clock.advance(60)  # a burst of 20 firings, each minute
        await engine.quiesce()
        await until(inbox.get, lambda batch: True)
    async with asyncio.timeout(10):
        while signalled != set(NAMES):
            await inbox.get()
    reader.close()
    assert missing == []


async def test_enable_disable_and_audit_signal_what_changed(make_engine: Any) -> None:
    engine: Engine = make_engine([HOURLY])
    await engine.open()
    inbox = engine.events.subscribe()
    await engine.set_enabled("hourly", False)
    got = await until(inbox.get, lambda b: ("audit", "hourly") in pairs(b))
    assert ("schedules", "hourly") in pairs(got)


async def test_sqlite_another_process_commit_asks_readers_to_refetch(
    make_engine: Any, clock: ManualClock, store_url: str
) -> None:
    watcher: Engine = make_engine([HOURLY])
    await watcher.open()
    inbox = watcher.events.subscribe()  # starts the watch
    await watcher.quiesce(runs=False)
    await watcher.set_enabled("hourly", False)  # its own change: signalled by name, no resync
    clock.advance(1)
    await watcher.quiesce(runs=False)
    await watcher.quiesce(runs=False)
    assert RESYNC not in [s.topic for s in await inbox.get(timeout=0)]

    actor: Engine = make_engine([HOURLY], store=open_store(store_url))  # another store: another writer
    await actor.open()
    await actor.set_enabled("hourly", True)
    clock.advance(1)
    await watcher.quiesce(runs=False)
    await watcher.quiesce(runs=False)
    assert RESYNC in [s.topic for s in await inbox.get(timeout=0)]


# ---------------------------------------------------------------------------------------
# PostgreSQL: the relay between instances
# ---------------------------------------------------------------------------------------
@pytest.fixture
async def fleet(pg_url: str) -> AsyncIterator[tuple[Engine, Engine]]:
    a = Engine(SCHEDULES, pg_url, instance="a", shutdown_grace=0)
    b = Engine(SCHEDULES, pg_url, instance="b", shutdown_grace=0)
    await a.open()
    await b.open()
    yield a, b
    await a.stop(0)
    await b.stop(0)


@pytest.mark.postgres
async def test_a_run_now_on_one_instance_is_signalled_on_the_other(fleet: tuple[Engine, Engine], pg_url: str) -> None:
    a, b = fleet
    inbox = a.events.subscribe()
    await listening(pg_url)
    run = await b.run_now("job3", wait=True)
    await until(inbox.get, lambda batch: ("runs", "job3") in pairs(batch))
    assert (await a.get_run(run.id)).id == run.id  # committed before the signal left
    await b.set_enabled("job4", False)
    got = await until(inbox.get, lambda batch: ("audit", "job4") in pairs(batch))
    assert ("schedules", "job4") in pairs(got)


@pytest.mark.postgres
async def test_runs_are_announced_only_while_some_process_has_readers(pg_url: str) -> None:
    # Every NOTIFY wakes every listening connection of the database: a fleet of N nobody
    # watches would pay N^2 transactions a second to announce its bursts to nobody.
    clock = ManualClock("2026-03-02T08:00:00Z")
    every_second = [define_schedule(name=f"tick{i}", cron="* * * * * *", timezone="UTC", handler=noop) for i in range(5)]
    a = Engine(SCHEDULES, pg_url, instance="a", shutdown_grace=0)
    b = Engine(every_second, pg_url, instance="b", clock=clock, shutdown_grace=0)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as ear:
        await ear.execute("LISTEN schedtui_events")

        marker = '{"from":"the-test","signals":[]}'  # well-formed: the engines ignore it

        async def heard_before_marker() -> list[str]:
            """Every notification committed before now: they arrive in commit order."""
            await b.flush()
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as mouth:
                await mouth.execute("SELECT pg_notify('schedtui_events', %s)", (marker,))
            got: list[str] = []
            async for notify in ear.notifies(timeout=10):
                if notify.payload == marker:
                    return got
                got.append(notify.payload)
            raise AssertionError("the marker never came")

        await a.start()  # it listens (for the catalog), with no reader
        try:
            await b.start()
            await b.quiesce()
            await heard_before_marker()
            clock.advance(1)
            await b.quiesce()
            assert not [p for p in await heard_before_marker() if '"runs"' in p]  # nobody reads: not announced
            inbox = a.events.subscribe()  # a reader on a: now b announces
            await listening(pg_url, count=2, readers=1)
            clock.advance(1)
            await b.quiesce()
            assert [p for p in await heard_before_marker() if '"runs"' in p]
            await until(inbox.get, lambda batch: ("runs", "tick4") in pairs(batch))
            inbox.close()  # the last reader gone: the mark goes, and the announcements stop
            await listening(pg_url, count=2, readers=0)  # (at least 0) ...
            async with asyncio.timeout(10):
                while await readers_marks(pg_url):  # ... and exactly 0
                    await asyncio.sleep(0.02)  # another connection's state: nothing to await
            clock.advance(1)
            await b.quiesce()
            assert not [p for p in await heard_before_marker() if '"runs"' in p]
        finally:
            await b.stop(0)
            await a.stop(0)


async def test_a_listener_that_cannot_connect_says_the_stream_is_down() -> None:
    # Told once, before it was ever up: readers must not take silence for a live stream.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    store = PostgresStore(f"postgresql://nobody@127.0.0.1:{port}/nowhere?connect_timeout=2")
    states: list[bool] = []
    wakes: list[str | None] = []
    events = asyncio.ensure_future(store.listen_events(lambda payload: None, states.append))
    try:
        async with asyncio.timeout(10):
            while not states:
                await asyncio.sleep(0.01)  # the connection attempt fails in the background
        jobs = asyncio.ensure_future(store.watch_jobs(wakes.append))
        await asyncio.sleep(0)
        assert states == [False] and wakes == []  # a subscriber that came later is not woken
        jobs.cancel()
        await asyncio.gather(jobs, return_exceptions=True)
    finally:
        events.cancel()
        await asyncio.gather(events, return_exceptions=True)


async def backends(url: str, condition: str) -> int:
    """Connections of the database whose ``pg_stat_activity`` row meets ``condition``."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND {condition}")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def readers_marks(url: str) -> int:
    return await backends(url, "application_name = 'schedtui-readers'")


@pytest.mark.postgres
async def test_while_signals_are_heard_the_state_poll_is_only_a_backstop(pg_url: str) -> None:
    # An idle member of a PostgreSQL fleet used to read the catalog and the states every
    # second; with its LISTEN connection up it reads them every ten rounds, and a change
    # made elsewhere still arrives at once, by its signal.
    clock = ManualClock("2026-03-02T08:00:00Z")
    a = Engine(SCHEDULES, pg_url, instance="a", shutdown_grace=0)
    b = Engine(SCHEDULES, pg_url, instance="b", clock=clock, shutdown_grace=0)
    await a.open()
    try:
        await b.start()
        async with asyncio.timeout(10):
            while not b.relay.hears_others:  # b's LISTEN connection: another connection's state
                await asyncio.sleep(0.01)
        await b.quiesce()
        reads: list[int] = []
        get_states = b.store.get_states

        async def counting() -> Any:
            reads.append(1)
            return await get_states()

        b.store.get_states = counting  # type: ignore[method-assign]  # counts the reads
        for _ in range(20):
            clock.advance(1)
            await b.quiesce()
        # Two backstop reads in twenty rounds (was 20), and on a loaded machine at most one
        # more: a signal of a's opening heard late makes b read the states once on its own.
        assert 1 <= len(reads) <= 3
        await a.set_enabled("job1", False)
        async with asyncio.timeout(10):
            while b.is_enabled("job1"):  # told by a's NOTIFY, with b's clock standing still
                await asyncio.sleep(0.01)
    finally:
        await b.stop(0)
        await a.stop(0)


@pytest.mark.postgres
async def test_a_burst_of_runs_is_announced_by_the_ledgers_own_commit(pg_url: str) -> None:
    # The runs' notification rides the group commit that writes their rows: a burst costs
    # the database one transaction, not the rows' and then a NOTIFY's.
    clock = ManualClock("2026-03-02T08:00:00Z")
    every_second = [define_schedule(name=f"tick{i}", cron="* * * * * *", timezone="UTC", handler=noop) for i in range(20)]
    a = Engine(SCHEDULES, pg_url, instance="a", shutdown_grace=0)
    b = Engine(every_second, pg_url, instance="b", clock=clock, shutdown_grace=0)
    await a.open()
    try:
        inbox = a.events.subscribe()
        await listening(pg_url)
        await b.start()
        await b.quiesce()
        relay, store = b.relay.postgres, b.store
        assert relay is not None and isinstance(store, PostgresStore)
        sent, rows = relay.sent, store.rows_written
        clock.advance(1)
        await b.quiesce()
        await b.flush()
        heard: set[str] = set()

        def all_heard(batch: list[Signal]) -> bool:
            heard.update(n for t, n in pairs(batch) if t == "runs" and n)
            return len(heard) == 20

        await until(inbox.get, all_heard)
        assert heard == {f"tick{i}" for i in range(20)}
        assert store.rows_written > rows
        assert relay.sent == sent  # no NOTIFY of its own: it rode the rows' commit
    finally:
        await b.stop(0)
        await a.stop(0)


@pytest.mark.postgres
async def test_a_burst_is_one_notification_and_a_huge_one_names_its_topics(fleet: tuple[Engine, Engine], pg_url: str) -> None:
    a, b = fleet
    inbox = a.events.subscribe()
    b_inbox = b.events.subscribe()  # b listens too: it must not take its own notifications for news
    await listening(pg_url, count=2)
    relay = b.relay.postgres
    assert relay is not None
    sent = relay.sent
    for i in range(100):  # in one go: one NOTIFY carries them all
        b.events.publish("locks", f"lock{i % 10}")
    got = await until(inbox.get, lambda batch: ("locks", "lock9") in pairs(batch))
    assert {name for topic, name in pairs(got) if topic == "locks"} == {f"lock{i}" for i in range(10)}
    # a's listener may hear the NOTIFY before b's send has returned and counted it.
    for _ in range(500):
        if relay.sent != sent:
            break
        await asyncio.sleep(0.01)
    assert relay.sent == sent + 1
    for i in range(2000):  # more than one notification can hold: the topic, without names
        b.events.publish("jobs", f"queue-with-a-long-name-{i}")
    got = await until(inbox.get, lambda batch: ("jobs", None) in pairs(batch))
    assert RESYNC not in [s.topic for s in got]  # not "refetch everything" for one busy topic
    # An instance never hears its own notifications back as someone else's: once b has a
    # signal a sent after them, its own have come back (in commit order) and were skipped.
    a.events.publish("durable", "marker")
    await until(b_inbox.get, lambda batch: ("durable", "marker") in pairs(batch))
    assert sum(1 for _, topic, name in b.events._history if (topic, name) == ("locks", "lock0")) == 10


@pytest.mark.postgres
async def test_the_listener_reconnects_and_readers_refetch(fleet: tuple[Engine, Engine], pg_url: str) -> None:
    a, b = fleet
    inbox = a.events.subscribe()
    await listening(pg_url)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'schedtui-listen' AND datname = current_database()"
        )
    got = await until(inbox.get, lambda batch: (STREAM, "up") in pairs(batch))
    assert (STREAM, "down") in pairs(got) and (RESYNC, None) in pairs(got)  # what was sent meanwhile is lost
    assert a.events.live
    await listening(pg_url)
    await b.set_enabled("job1", False)
    await until(inbox.get, lambda batch: ("schedules", "job1") in pairs(batch))


@pytest.mark.postgres
async def test_a_process_listens_on_one_connection_for_signals_and_job_wake_ups(pg_url: str) -> None:
    # PostgreSQL wakes every listening connection of the database for every NOTIFY, a
    # transaction each: a process that runs queues must not listen twice.
    listener, sender = open_store(pg_url), open_store(pg_url)
    assert isinstance(listener, PostgresStore) and isinstance(sender, PostgresStore)
    await listener.open()
    await sender.open()
    payloads: asyncio.Queue[str] = asyncio.Queue()
    wakes: asyncio.Queue[str | None] = asyncio.Queue()
    states: list[bool] = []
    events = asyncio.ensure_future(listener.listen_events(payloads.put_nowait, states.append))
    jobs = asyncio.ensure_future(listener.watch_jobs(wakes.put_nowait))
    try:
        assert await asyncio.wait_for(wakes.get(), 10) is None  # up: look at every queue
        assert states == [True]
        assert await listening_backends(pg_url) == 1
        await sender.notify_events("hello", "hello")
        await sender.notify_jobs(["mail"])
        assert await asyncio.wait_for(payloads.get(), 10) == "hello"
        assert await asyncio.wait_for(wakes.get(), 10) == "mail"
        assert payloads.empty()  # a job wake-up is not a signal
        events.cancel()
        await asyncio.gather(events, return_exceptions=True)
        await sender.notify_jobs(["audio"])
        assert await asyncio.wait_for(wakes.get(), 10) == "audio"  # held for the queue's workers
        assert await listening_backends(pg_url) == 1
    finally:
        for task in (events, jobs):
            task.cancel()
        await asyncio.gather(events, jobs, return_exceptions=True)
        await sender.close()
        await listener.close()
    async with asyncio.timeout(10):
        while await listening_backends(pg_url):  # nobody listens: the connection is closed
            await asyncio.sleep(0.02)  # another backend's state: there is nothing to await


async def listening_backends(url: str) -> int:
    return await backends(url, "query ILIKE 'LISTEN%'")


class CountingNotifier:
    """A store that only counts notifications (when they were sent, by the wall clock)."""

    def __init__(self) -> None:
        self.sent: list[float] = []

    async def notify_events(self, payload: str, unread: str | None = None) -> None:
        self.sent.append(time.monotonic())

    async def listen_events(self, on_payload: Any, on_state: Any) -> None:
        await asyncio.Future()

    async def hold_readers_mark(self, has_readers: Any, changed: Any) -> None:
        await asyncio.Future()


async def test_a_busy_instance_notifies_at_most_a_few_times_a_second(clock: ManualClock) -> None:
    store = CountingNotifier()
    bus = EventBus()
    relay = PostgresRelay(store, bus, Loops(clock))
    relay.open()
    started = time.monotonic()
    for i in range(150):  # a signal every ~10 ms for ~1.5 s: the load, not a synchronisation
        bus.publish("runs", f"s{i % 7}")
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - started
    await relay.stop()
    # The first three at once (the burst), then at most five a second.
    assert len(store.sent) <= NOTIFY_BURST + elapsed * NOTIFY_RATE + 1
    assert store.sent[0] - started < 0.1  # a quiet instance tells at once
    assert len(store.sent) >= 3


# ---------------------------------------------------------------------------------------
# GET /inspect/events on real servers
# ---------------------------------------------------------------------------------------
SCHEDULE_FILE = """
from backend import define_schedule

async def work(ctx):
    pass

hourly = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=work)
daily = define_schedule(name="daily", cron="0 0 * * *", timezone="UTC", handler=work)
"""
TOKEN = "alice=op-secret"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "s.cron.py").write_text(SCHEDULE_FILE)
    return tmp_path


class Reader:
    """An SSE client of a server: the signals as they come, and the last id seen."""

    def __init__(self, url: str, since: str | None = None) -> None:
        self.backend = RemoteBackend(url, "op-secret")
        self.stream = self.backend.changes(since=since)
        self.last: str | None = since

    async def next(self) -> list[Signal]:
        batch = await anext(self.stream)
        if batch:
            self.last = batch[-1].id
        return batch

    async def close(self) -> None:
        assert isinstance(self.stream, AsyncGenerator)
        await self.stream.aclose()
        await self.backend.close()


def test_sse_resumes_with_last_event_id_and_refetches_from_an_unknown_one(folder: Path) -> None:
    server = start_server(folder, "--schedules", "schedules", "--store", f"sqlite:///{folder / 'state.db'}",
                          "--token", TOKEN)  # fmt: skip

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer op-secret"}) as api:
            reader = Reader(server.url)
            ready = await reader.next()
            assert ready[0].topic == "ready" and ready[0].name == "file"
            await api.post("/inspect/schedules/hourly/fire")
            await until(reader.next, lambda b: ("runs", "hourly") in pairs(b))
            last = reader.last
            await reader.close()

            await api.post("/inspect/schedules/daily/disable")  # while nobody listens
            again = Reader(server.url, since=last)
            got = await until(again.next, lambda b: ("schedules", "daily") in pairs(b))
            assert (RESYNC, None) not in pairs(got) and ("audit", "daily") in pairs(got)
            await again.close()

            stranger = Reader(server.url, since="0badc0de-17")
            assert (RESYNC, None) in pairs(await until(stranger.next, lambda b: (RESYNC, None) in pairs(b)))
            await stranger.close()

            raw = await api.get("/inspect/events", headers={"Authorization": "Bearer wrong"})
            assert raw.status_code == 401
            head = await api.head("/inspect/events")
            assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")

    try:
        asyncio.run(scenario())
    finally:
        assert server.stop() == 0, server.log_text()


def test_serve_stops_promptly_with_streams_open(folder: Path) -> None:
    server = start_server(folder, "--schedules", "schedules", "--store", f"sqlite:///{folder / 'state.db'}")

    async def scenario() -> None:
        reader = Reader(server.url)
        await reader.next()
        server.process.send_signal(2)
        with pytest.raises(Exception, match="ended the event stream|broke"):
            async with asyncio.timeout(10):
                while True:
                    await reader.next()
        await reader.close()

    asyncio.run(scenario())
    assert server.process.wait(15) == 0, server.log_text()


@pytest.fixture
async def live_server(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, Engine]]:
    """A real HTTP server in this process (uvicorn on loopback), pinging every 0.2 s."""
    monkeypatch.setattr("backend.api.events.PING_EVERY", 0.2)
    engine: Engine = make_engine([HOURLY])
    backend = EmbeddedBackend(engine)
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(serve(backend, port=0, stop=stop, on_ready=ready.set_result))
    url = await ready
    yield url, engine
    stop.set()
    await task


async def test_a_quiet_stream_pings(live_server: tuple[str, Engine]) -> None:
    url, _ = live_server
    backend = RemoteBackend(url)
    stream = backend.changes()
    try:
        await anext(stream)
        assert await anext(stream) == []  # a ping
        assert await anext(stream) == []
    finally:
        assert isinstance(stream, AsyncGenerator)
        await stream.aclose()
        await backend.close()


async def test_a_reader_that_never_reads_costs_a_bounded_inbox_and_then_a_resync(
    live_server: tuple[str, Engine],
) -> None:
    url, engine = live_server
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(b"GET /inspect/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    async with asyncio.timeout(10):
        while engine.events.subscribers == 0:
            await asyncio.sleep(0.01)  # the server subscribes when the request arrives
    inbox: Subscription = engine.events._subscriptions[0]
    for round_ in range(200):  # far more than the socket and the transport hold
        for i in range(1000):
            engine.events.publish("runs", f"schedule-{round_}-{i}")
        await asyncio.sleep(0)  # let the stream write what it can
    assert inbox.overflows > 0 and len(inbox._pending) <= 256

    # The engine's API still answers while that reader is stuck.
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/inspect/schedules")).status_code == 200

    sock.setblocking(False)
    received = b""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(20):
        while b"event: resync" not in received:
            received += await loop.sock_recv(sock, 1 << 20)
    sock.close()


@pytest.mark.postgres
def test_two_serve_instances_on_postgresql_share_signals_and_the_audit_log(
    folder: Path, pg_server: pg.PgServer
) -> None:
    store = pg_server.create_database("events")
    a = start_server(folder, "--schedules", "schedules", "--store", store, "--token", TOKEN, "--instance", "a")
    b = start_server(folder, "--schedules", "schedules", "--store", store, "--token", "bob=op-bob", "--instance", "b")

    async def scenario() -> None:
        reader = Reader(a.url)
        ready = await reader.next()
        assert ready[0].name == "notify"
        await listening(store)
        async with httpx.AsyncClient(base_url=b.url, headers={"Authorization": "Bearer op-bob"}) as on_b:
            fired = await on_b.post("/inspect/schedules/hourly/fire")
            assert fired.status_code == 202
            await until(reader.next, lambda batch: ("runs", "hourly") in pairs(batch))
        async with httpx.AsyncClient(base_url=a.url, headers={"Authorization": "Bearer op-secret"}) as on_a:
            entries = (await on_a.get("/inspect/audit")).json()["entries"]
            assert [(e["actor"], e["action"], e["target"]) for e in entries] == [("bob", "schedule.fire", "hourly")]
            runs = (await on_a.get("/inspect/schedules/runs", params={"name": "hourly"})).json()["runs"]
            assert runs[0]["id"] == fired.json()["run_id"] and runs[0]["instance"] == "b"
        await reader.close()

    try:
        asyncio.run(scenario())
    finally:
        assert a.stop() == 0, a.log_text()
        assert b.stop() == 0, b.log_text()


async def listening(url: str, count: int = 1, readers: int = 1) -> None:
    """Wait until ``count`` instances' LISTEN connections are registered with the server,
    and ``readers`` processes say they have readers (the others announce runs then)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with asyncio.timeout(10):
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FILTER (WHERE application_name = 'schedtui-listen' AND query ILIKE 'LISTEN%%'), "
                    "count(*) FILTER (WHERE application_name = 'schedtui-readers') "
                    "FROM pg_stat_activity WHERE datname = current_database()"
                )
                row = await cur.fetchone()
                if row and row[0] >= count and row[1] >= readers:
                    return
                await asyncio.sleep(0.02)  # polling another process: there is nothing to await


def test_the_sse_parser_reads_events_split_anywhere() -> None:
    text = (
        "retry: 2000\n\n"
        'id: e-1\nevent: ready\ndata: {"name":"notify","instance":"a"}\n\n'
        ": ping\n\n"
        'id: e-2\r\nevent: runs\r\ndata: {"name":"hourly"}\r\n\r\n'
        "id: e-3\nevent: mystery\ndata: {}\n\n"
        'id: e-4\nevent: resync\ndata: {"name":null}\n\n'
    )
    for cut in range(len(text)):
        parser = SseParser()
        out = [parser.feed(text[:cut]), parser.feed(text[cut:])]
        signals = [s for batch in out if batch for s in batch]
        assert [(s.id, s.topic, s.name) for s in signals] == [
            ("e-1", "ready", "notify"), ("e-2", "runs", "hourly"), ("e-4", "resync", None),
        ]  # fmt: skip
    assert SseParser().feed(": ping\n\n") == [] and SseParser().feed("retry: 1\n\n") is None


async def test_an_event_stream_whose_event_never_ends_is_given_up_past_its_bound() -> None:
    """A URL that streams without a blank line (not an event stream, or a broken one) was
    held in memory whole, and joined again at every chunk: the console grew without a word.
    An event past 64 KiB is an answer the client cannot read, said so; the stream is let go
    (the console then says the stream dropped and connects again, as for any other)."""

    class Endless(httpx.AsyncByteStream):
        sent = 0

        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield b"id: e-1\nevent: runs\ndata: "
            while True:
                Endless.sent += 4096
                yield b"x" * 4096

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Endless())

    remote = RemoteBackend("http://schedtui.test:8787", transport=httpx.MockTransport(answer))
    try:
        with pytest.raises(Unavailable, match=r"GET /inspect/events with an event of more than 65,536 characters; is it a"):
            async for _ in remote.changes():
                pass
    finally:
        await remote.close()
    assert 64 * 1024 <= Endless.sent < 80 * 1024
    with pytest.raises(Exception, match="more than 65,536"):
        SseParser().feed("data: " + "x" * 70_000)


@pytest.mark.postgres
async def test_a_listening_connection_gone_silent_is_given_up_and_listened_on_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition leaves the listener's TCP connection open and silent: nothing says it is
    lost. A question it has not answered by the next check gives it up (the subscribers
    told the stream is down), and the listener connects again once the path is back."""
    from backend.store.postgres import events as listening
    from tests.tcp_relay import relay_to, via

    monkeypatch.setattr(listening, "LISTEN_CHECK", 0.2)
    with relay_to(pg_url) as relay:
        listener, sender = open_store(via(pg_url, relay.port)), open_store(pg_url)
        assert isinstance(listener, PostgresStore) and isinstance(sender, PostgresStore)
        await listener.open()
        await sender.open()
        payloads: asyncio.Queue[str] = asyncio.Queue()
        states: asyncio.Queue[bool] = asyncio.Queue()
        events = asyncio.ensure_future(listener.listen_events(payloads.put_nowait, states.put_nowait))
        try:
            assert await asyncio.wait_for(states.get(), 10) is True
            await sender.notify_events("before", "before")
            assert await asyncio.wait_for(payloads.get(), 10) == "before"
            relay.freeze()
            assert await asyncio.wait_for(states.get(), 10) is False  # (0.4 s: a check, then its question unanswered)
            relay.thaw()
            assert await asyncio.wait_for(states.get(), 10) is True
            await sender.notify_events("after", "after")
            assert await asyncio.wait_for(payloads.get(), 10) == "after"
        finally:
            relay.thaw()
            events.cancel()
            await asyncio.gather(events, return_exceptions=True)
            await sender.close()
            await listener.close()


@pytest.mark.postgres
async def test_a_listening_connection_that_fails_lets_go_of_its_socket_before_its_number_is_reused(pg_url: str) -> None:
    """libpq closes the socket of a connection it finds dead; the next socket opened may get
    its number. The listener must stop watching that number in the callback that saw the
    failure, never later, when it may be someone else's (an HTTP client's connection, in
    the failure this was found by: its reader replaced, the client reset)."""
    import os
    import socket as sockets

    listener, probe = open_store(pg_url), None
    assert isinstance(listener, PostgresStore)
    await listener.open()
    states: asyncio.Queue[bool] = asyncio.Queue()
    events = asyncio.ensure_future(listener.listen_events(lambda payload: None, states.put_nowait))
    ours, theirs = sockets.socketpair()
    try:
        assert await asyncio.wait_for(states.get(), 10) is True
        assert listener._listener is not None
        fd = listener._listener.fd
        assert fd is not None
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'schedtui-listen'")

        async def closed() -> None:
            while True:
                try:
                    os.fstat(fd)
                except OSError:
                    return
                await asyncio.sleep(0)

        await asyncio.wait_for(closed(), 10)
        # At once, in the loop turn that saw it closed: the number is someone else's now.
        os.dup2(ours.fileno(), fd)
        probe = fd
        got = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, got.set)  # refused (the stale watch) or undone later, before the fix
        assert await asyncio.wait_for(states.get(), 10) is False
        theirs.send(b"x")
        await asyncio.wait_for(got.wait(), 10)  # still watched: nobody took it away
    finally:
        if probe is not None:
            asyncio.get_running_loop().remove_reader(probe)
            os.close(probe)
        ours.close()
        theirs.close()
        events.cancel()
        await asyncio.gather(events, return_exceptions=True)
        await listener.close()
