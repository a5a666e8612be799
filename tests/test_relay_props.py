"""The PostgreSQL relay's announcements, as a state machine: three processes' engines on one
database, readers coming and going on any of them, signals of every topic and real runs
published anywhere, and a probe that hears every notification the database carries.

Invariants, after every step (once what was published is sent and committed):

* **A reader misses nothing.** While any process has a reader, every signal published on
  any process reaches every reader (or a resync does, which makes it refetch everything).
* **Nobody reads, nobody is woken for nothing.** While no process has a reader, no
  notification carries a signal only readers need (runs, jobs, durable, locks, audit):
  every NOTIFY wakes every listening connection of the database.
* **The engines always hear what changes what they run.** ``schedules`` signals are sent
  whether or not anyone reads.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from backend import Engine, RunContext, define_schedule
from backend.events.bus import RESYNC, Subscription
from backend.events.relay import ENGINE_TOPICS
from tests import pg

PROCESSES = ["a", "b", "c"]
TOPICS = ["jobs", "durable", "locks", "audit", "schedules"]
NAMES = ["x", "y"]
SETTINGS = settings(
    max_examples=8, stateful_step_count=12, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


async def noop(ctx: RunContext) -> None:
    pass


SCHEDULES = [define_schedule(name=n, cron="0 * * * *", timezone="UTC", handler=noop) for n in NAMES]
_markers = itertools.count()


class AnnouncementMachine(RuleBasedStateMachine):
    URL = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.engines = {p: Engine(SCHEDULES, self.URL, instance=p, shutdown_grace=0) for p in PROCESSES}
        self.readers: dict[str, list[Subscription]] = {p: [] for p in PROCESSES}
        self.run(self._open())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _open(self) -> None:
        for engine in self.engines.values():
            await engine.open()
            relay = engine.relay.postgres
            assert relay is not None
            # The test sends what is pending itself (send_now), so that it knows when it left.
            relay.gather = 3600.0
        self.probe = await psycopg.AsyncConnection.connect(self.URL, autocommit=True)
        await self.probe.execute("LISTEN schedtui_events")

    def teardown(self) -> None:
        async def close() -> None:
            for inboxes in self.readers.values():
                for inbox in inboxes:
                    inbox.close()
            for engine in self.engines.values():
                await engine.stop(0)
            await self.probe.close()

        self.run(close())
        self.loop.close()

    # -- the readers ----------------------------------------------------------------------
    @rule(p=st.sampled_from(PROCESSES))
    def subscribe(self, p: str) -> None:
        async def subscribe() -> None:
            self.readers[p].append(self.engines[p].events.subscribe())
            await self._marks_settle(listener=p)

        self.run(subscribe())

    @rule(p=st.sampled_from(PROCESSES))
    def unsubscribe(self, p: str) -> None:
        if self.readers[p]:
            self.readers[p].pop().close()
            self.run(self._marks_settle())

    async def _marks_settle(self, listener: str | None = None) -> None:
        """Until the server shows one readers mark per process with readers (and the
        listener of ``listener`` is up): other processes' state, so it is polled."""
        wanted = sum(1 for inboxes in self.readers.values() if inboxes)
        async with asyncio.timeout(10):
            while True:
                cur = await self.probe.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'schedtui-readers'"
                )
                row = await cur.fetchone()
                hearing = listener is None or self._relay(listener).hearing
                if row is not None and row[0] == wanted and hearing:
                    return
                await asyncio.sleep(0.01)

    def _relay(self, p: str) -> Any:
        return self.engines[p].relay.postgres

    # -- what is published ----------------------------------------------------------------
    @rule(p=st.sampled_from(PROCESSES), topics=st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3),
          name=st.sampled_from(NAMES))  # fmt: skip
    def publish(self, p: str, topics: list[str], name: str) -> None:
        for topic in topics:
            self.engines[p].events.publish(topic, name)
        self.run(self._check({(topic, name) for topic in topics}))

    @rule(p=st.sampled_from(PROCESSES), name=st.sampled_from(NAMES))
    def run_now(self, p: str, name: str) -> None:
        async def fire() -> None:
            await self.engines[p].run_now(name, wait=True)

        self.run(fire())
        self.run(self._check({("runs", name)}))

    async def _check(self, published: set[tuple[str, str | None]]) -> None:
        for engine in self.engines.values():
            await engine.flush()  # the runs' rows, and their notification, committed
            assert engine.relay.postgres is not None  # a PostgreSQL store's relay
            await engine.relay.postgres.send_now()
        marker = f"marker-{next(_markers)}"
        async with await psycopg.AsyncConnection.connect(self.URL, autocommit=True) as mouth:
            payload = json.dumps({"from": "probe", "signals": [["schedules", marker]]})
            await mouth.execute("SELECT pg_notify('schedtui_events', %s)", (payload,))
        heard = await self._probe_until(marker)
        someone_reads = any(self.readers.values())
        if someone_reads:
            # The runs of a run_now come with its audit entry; what was published is all there.
            assert published <= heard, f"not announced while a reader was there: {published - heard}"
        else:
            only_for_readers = {signal for signal in heard if signal[0] not in ENGINE_TOPICS}
            assert not only_for_readers, f"announced while nobody reads: {only_for_readers}"
            wanted = {signal for signal in published if signal[0] in ENGINE_TOPICS}
            assert wanted <= heard, f"an engine topic was not sent: {wanted - heard}"
        for inboxes in self.readers.values():
            for inbox in inboxes:
                got = await self._inbox_until(inbox, marker)
                if (RESYNC, None) not in got:
                    assert published <= got, f"a reader missed {published - got}"

    async def _probe_until(self, marker: str) -> set[tuple[str, str | None]]:
        """The signals of every notification committed before the marker (they arrive in
        commit order)."""
        heard: set[tuple[str, str | None]] = set()
        async with asyncio.timeout(10):
            async for notify in self.probe.notifies():
                data = json.loads(notify.payload)
                if data.get("resync"):
                    heard.add((RESYNC, None))
                    continue
                signals = {(topic, name) for topic, name in data["signals"]}
                if ("schedules", marker) in signals:
                    return heard
                heard |= signals
        raise AssertionError("unreachable")

    async def _inbox_until(self, inbox: Subscription, marker: str) -> set[tuple[str, str | None]]:
        got: set[tuple[str, str | None]] = set()
        async with asyncio.timeout(10):
            while True:
                for signal in await inbox.get():
                    if (signal.topic, signal.name) == ("schedules", marker):
                        return got
                    got.add((signal.topic, signal.name))


@pytest.mark.postgres
def test_announcements_reach_every_reader_and_wake_nobody_while_nobody_reads(pg_server: pg.PgServer) -> None:
    class OnADatabase(AnnouncementMachine):
        URL = pg_server.create_database("relay")

    run_state_machine_as_test(OnADatabase, settings=SETTINGS)
