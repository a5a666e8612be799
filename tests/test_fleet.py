"""A fleet of real ``schedtui serve`` processes on one PostgreSQL database, on the real clock.

Every check reads the ledger with SQL: exactly one run per (schedule, slot), no slot
missing between a schedule's first and last, every run won through the claims table.
Faults are real too: SIGKILL of an instance, a PostgreSQL restart, clocks 300 ms apart.
Tests wait by polling a condition (the ledger, a server's log) against a deadline, never
by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backend.cron import Cron
from backend.ids import IdFactory
from backend.model import Run
from backend.store import open_store
from tests import pg
from tests.servers import poll

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
UTC = UTC
SECOND = timedelta(seconds=1)

TICKS = """
    import asyncio
    from backend import define_schedule

    async def tick(ctx):
        pass

    async def slow(ctx):
        await asyncio.sleep(120)

    for i in range({ticks}):
        globals()[f"t{{i}}"] = define_schedule(name=f"tick{{i:02d}}", cron="* * * * * *", timezone="UTC", handler=tick)

    if {slow}:
        slow_job = define_schedule(name="slow", cron="* * * * * *", timezone="UTC", handler=slow, max_runtime=600)

    daily = define_schedule(name="daily", cron="0 0 * * *", timezone="UTC", handler=tick, backfill="latest")
"""




def sql(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute(query, params).fetchall()


@dataclass
class Instance:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, timeout: float = 20, *, signalled: bool = False) -> int:
        if not signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"{self.name} did not stop within {timeout}s:\n{self.log()}")


class Fleet:
    """``schedtui serve`` processes sharing one database and one schedules folder."""

    def __init__(
        self, root: Path, url: str, *, ticks: int, slow: bool = False, args: Sequence[str] = (), read_url: str | None = None
    ) -> None:
        self.root = root
        self.url = url
        self.read_url = read_url or url
        """Where the checks read the ledger (the server itself when ``url`` goes through a pooler)."""
        self.args = list(args)
        """Extra ``serve`` options for every instance (``--coordination cluster``)."""
        self.instances: list[Instance] = []
        folder = root / "schedules"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "fleet.cron.py").write_text(textwrap.dedent(TICKS.format(ticks=ticks, slow=slow)))

    def start(self, name: str, *, offset_ms: int = 0, wait: bool = True) -> Instance:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDTUI_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env["SCHEDTUI_LOG_LEVEL"] = "INFO"
        if offset_ms:
            env["SCHEDTUI_CLOCK_OFFSET_MS"] = str(offset_ms)
        log_path = self.root / f"{name}-{len(self.instances)}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "serve", "--schedules", "schedules", "--store", self.url, "--instance", name,
             *self.args],
            cwd=self.root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_path.open("w"),
            preexec_fn=pg.die_with_parent,
        )
        instance = Instance(name, proc, log_path)
        self.instances.append(instance)
        if wait:
            self.wait_ready(instance)
        return instance

    def wait_ready(self, *instances: Instance) -> None:
        for instance in instances:

            def started(instance: Instance = instance) -> bool:
                return "claims retention" in instance.log() or instance.proc.poll() is not None

            poll(started, timeout=30, what=f"{instance.name} to start")
            assert instance.proc.poll() is None, f"{instance.name} exited:\n{instance.log()}"

    def live(self) -> list[Instance]:
        return [i for i in self.instances if i.proc.poll() is None]

    def stop_all(self, *, interrupt: bool = False) -> None:
        """SIGINT every live instance; with ``interrupt``, a second one once each waits for its
        runs in flight (they are recorded interrupted instead of awaited)."""
        live = self.live()
        for instance in live:
            instance.proc.send_signal(signal.SIGINT)
        if interrupt:
            for instance in live:

                def waiting(instance: Instance = instance) -> bool:
                    return "run(s) in flight" in instance.log() or instance.proc.poll() is not None

                poll(waiting, timeout=15, what=f"{instance.name} to wait for its runs")
                if instance.proc.poll() is None:
                    instance.proc.send_signal(signal.SIGINT)
        for instance in live:
            assert instance.stop(signalled=True) == 0, instance.log()

    def kill_all(self) -> None:
        for instance in self.live():
            instance.proc.kill()
            instance.proc.wait()

    def assert_healthy_logs(self) -> None:
        for instance in self.instances:
            text = instance.log()
            assert "Traceback" not in text and "crashed" not in text, f"{instance.name}:\n{text}"

    # -- the ledger ----------------------------------------------------------------------
    def slots(self, name: str, since: datetime | None = None) -> int:
        rows = sql(
            self.read_url,
            "SELECT count(DISTINCT scheduled_at) FROM schedtui_runs WHERE name = %s AND scheduled_at > %s",
            (name, since or datetime(1970, 1, 1, tzinfo=UTC)),
        )
        return int(rows[0][0])

    def runs(self) -> list[Run]:
        rows = sql(
            self.read_url,
            "SELECT id, name, scheduled_at, fired_at, finished_at, status, trigger, outcome, instance, "
            "error_tag, error_message FROM schedtui_runs ORDER BY name, scheduled_at, id",
        )
        return [
            Run(id=r[0], name=r[1], scheduled_at=r[2].astimezone(UTC), fired_at=r[3], finished_at=r[4], status=r[5],
                trigger=r[6], coordination_outcome=r[7], instance=r[8], error_tag=r[9], error_message=r[10])
            for r in rows
        ]  # fmt: skip


def by_name(runs: list[Run]) -> dict[str, list[Run]]:
    grouped: dict[str, list[Run]] = {}
    for run in runs:
        grouped.setdefault(run.name, []).append(run)
    return grouped


def assert_once_and_contiguous(runs: list[Run], step: timedelta = SECOND) -> None:
    """One run per slot, and no slot missing between the first and the last."""
    slots = [r.scheduled_at for r in runs]
    assert len(slots) == len(set(slots)), f"{runs[0].name}: a slot ran twice: {sorted(s for s in slots if slots.count(s) > 1)[:5]}"
    gaps = [(a, b) for a, b in zip(slots, slots[1:], strict=False) if b - a != step]
    assert not gaps, f"{runs[0].name}: slots missing between {gaps[:3]}"


@pytest.fixture
def fleets(tmp_path: Path, pg_url: str) -> Iterator[Callable[..., Fleet]]:
    """Make a fleet on a fresh database; whatever still runs at the end is killed."""
    made: list[Fleet] = []

    def make(**kwargs: Any) -> Fleet:
        fleet = Fleet(tmp_path, pg_url, **kwargs)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.kill_all()


def seed_daily(url: str, days_ago: int) -> datetime:
    """A run of ``daily`` long ago, as if the fleet had been down since: returns its slot."""
    slot = Cron("0 0 * * *", "UTC").latest(datetime.now(UTC)) - timedelta(days=days_ago)

    async def seed() -> None:
        store = open_store(url)
        await store.open()
        store.save_runs([Run(id=IdFactory(lambda: datetime.now(UTC))(), name="daily", scheduled_at=slot, status="succeeded",
                             trigger="self", coordination_outcome="wonLock", instance="long-gone:1")])  # fmt: skip
        await store.close()

    asyncio.run(seed())
    return slot


# ---------------------------------------------------------------------------------------
def test_four_instances_fire_every_slot_once_and_catch_up_once_across_a_restart(fleets: Callable[..., Fleet]) -> None:
    ticks = 20
    fleet = fleets(ticks=ticks)
    seeded = seed_daily(fleet.url, days_ago=3)
    boot = datetime.now(UTC)
    first = [fleet.start(name, wait=False) for name in ("a", "b", "c", "d")]  # all four boot at once
    fleet.wait_ready(*first)
    poll(lambda: fleet.slots("tick00") >= 6, timeout=30, what="6 s of slots")
    # A rolling restart: two instances stop and come back; the others keep firing.
    for old in first[1:3]:
        assert old.stop() == 0, old.log()
    fleet.wait_ready(fleet.start("b2", wait=False), fleet.start("c2", wait=False))
    poll(lambda: fleet.slots("tick00") >= 14, timeout=40, what="14 s of slots")
    fleet.stop_all()
    fleet.assert_healthy_logs()

    runs = by_name(fleet.runs())
    assert sorted(runs) == ["daily", *(f"tick{i:02d}" for i in range(ticks))]
    for i in range(ticks):
        mine = runs[f"tick{i:02d}"]
        assert_once_and_contiguous(mine)
        assert len(mine) >= 14
        odd = [(r.scheduled_at, r.status, r.instance, r.error_message) for r in mine if r.status != "succeeded"]
        assert {(r.status, r.trigger, r.coordination_outcome) for r in mine} == {("succeeded", "self", "wonLock")}, odd

    # The daily schedule was caught up once by the four booting together (latest: the
    # newest missed slot fires, the older ones are recorded missed), and not again by
    # the two that restarted.
    daily = runs["daily"]
    assert_once_and_contiguous(daily, step=timedelta(days=1))
    assert daily[0].scheduled_at == seeded
    newest_at_boot = Cron("0 0 * * *", "UTC").latest(boot)
    expected = [(seeded, "succeeded")] + [
        (seeded + timedelta(days=d), "missed" if seeded + timedelta(days=d) < newest_at_boot else "succeeded")
        for d in range(1, (daily[-1].scheduled_at - seeded).days + 1)
    ]
    assert [(r.scheduled_at, r.status) for r in daily] == expected
    assert {r.coordination_outcome for r in daily[1:]} == {"wonLock"}


def test_a_killed_instance_loses_no_slot_and_a_live_one_closes_its_run(fleets: Callable[..., Fleet]) -> None:
    fleet = fleets(ticks=8, slow=True)
    fleet.wait_ready(*(fleet.start(name, wait=False) for name in ("a", "b", "c")))

    def slow_running() -> tuple[str, str] | None:
        rows = sql(fleet.url, "SELECT id, instance FROM schedtui_runs WHERE name = 'slow' AND status = 'running' AND fired_at IS NOT NULL")
        return rows[0] if rows else None

    run_id, victim_name = poll(slow_running, timeout=20, what="the slow schedule to be running")

    def skipped_elsewhere() -> bool:  # overlap across instances: the others skip while it runs
        rows = sql(
            fleet.url,
            "SELECT count(*) FROM schedtui_runs WHERE name = 'slow' AND status = 'skipped' AND instance <> %s "
            "AND error_message LIKE %s",
            (victim_name, f"%{run_id} (on another instance)%"),
        )
        return bool(rows[0][0])

    poll(skipped_elsewhere, timeout=20, what="another instance to skip a slot while the slow run is in flight")
    victim = next(i for i in fleet.instances if i.name == victim_name)
    victim.proc.send_signal(signal.SIGKILL)
    assert victim.proc.wait(10) == -signal.SIGKILL  # reaped: its pid is gone, not a zombie
    killed_at = datetime.now(UTC)

    def closed() -> tuple[Any, ...] | None:
        rows = sql(fleet.url, "SELECT status, error_tag, error_message, finished_at FROM schedtui_runs WHERE id = %s", (run_id,))
        return rows[0] if rows and rows[0][0] != "running" else None

    status, tag, message, finished_at = poll(closed, timeout=20, what="the killed instance's run to be closed")
    assert (status, tag) == ("failed", "abandoned")
    assert f"(pid {victim.proc.pid}) is no longer running" in message
    # Same machine: a live instance notices the dead pid at its next heartbeat round.
    assert finished_at - killed_at < timedelta(seconds=8)
    after = datetime.now(UTC)
    poll(lambda: fleet.slots("tick00", since=after) >= 3, timeout=20, what="3 more slots after the kill")
    survivors = fleet.live()
    assert len(survivors) == 2
    fleet.stop_all(interrupt=True)
    fleet.assert_healthy_logs()

    runs = by_name(fleet.runs())
    for name, mine in runs.items():
        if name == "daily":
            continue
        assert_once_and_contiguous(mine)
        assert {r.coordination_outcome for r in mine} == {"wonLock"}
        # A slot the victim had just won, if any, is closed abandoned, never left running.
        assert {r.status for r in mine} <= {"succeeded", "failed", "skipped"}
        assert all(r.error_tag == "abandoned" for r in mine if r.status == "failed" and r.name != "slow")
    slow = runs["slow"]
    # Once the killed run was closed, a live instance ran the schedule again.
    later = [r for r in slow if r.fired_at is not None and r.id != run_id and r.instance != victim_name]
    assert later and all(r.instance in {i.name for i in survivors} for r in later)
    assert [r for r in fleet.runs() if r.status == "running"] == []


def test_a_postgres_restart_double_fires_nothing_and_the_lost_slots_show_as_missed(
    fleets: Callable[..., Fleet], pg_server: pg.PgServer
) -> None:
    if not pg_server.owned:
        pytest.skip("the server comes from SCHEDTUI_TEST_DSN: this test cannot restart it")
    fleet = fleets(ticks=10)
    instances = [fleet.start(name, wait=False) for name in ("a", "b", "c")]
    fleet.wait_ready(*instances)
    poll(lambda: fleet.slots("tick00") >= 3, timeout=20, what="3 s of slots")
    down_at = datetime.now(UTC)
    try:
        pg_server.pg_ctl("stop")
        # Down until every instance has failed to claim a slot (fail closed, one warning each).
        poll(lambda: all("cannot claim" in i.log() for i in instances), timeout=15, what="every instance to notice")
    finally:
        pg_server.pg_ctl("start")
    up_at = datetime.now(UTC)
    poll(lambda: fleet.slots("tick00", since=up_at) >= 3, timeout=30, what="firing to resume by itself")
    poll(lambda: all("store reachable again" in i.log() for i in instances), timeout=15, what="every instance to recover")
    assert [i.proc.poll() for i in instances] == [None, None, None]  # nobody crashed
    fleet.stop_all()
    fleet.assert_healthy_logs()

    runs = by_name(fleet.runs())
    missed = []
    for name, mine in runs.items():
        assert_once_and_contiguous(mine)
        assert {r.coordination_outcome for r in mine} == {"wonLock"}
        assert {r.status for r in mine} <= {"succeeded", "missed", "skipped"}, name
        missed += [r for r in mine if r.status == "missed"]
        # Skipped only by the overlap policy (skip, the default), around the outage: a slot
        # fired late as the instances recovered (a catch-up's current slot) can still be in
        # flight on one instance when the next slot is claimed on another.
        skipped = [r for r in mine if r.status == "skipped"]
        assert all(r.error_tag == "overlap" and r.scheduled_at >= down_at - SECOND for r in skipped), skipped
    assert missed, "the slots of the outage should be recorded missed"
    assert all(down_at - SECOND <= r.scheduled_at <= up_at + SECOND for r in missed)
    # Recorded by the recovery of unclaimable slots, or by the catch-up of an instance that
    # fell behind while a claim waited for the dead server.
    reasons = {(r.error_message or "").split(" (")[0] for r in missed}
    assert reasons <= {
        "not fired: the store was unreachable when it was due",
        "missed while the engine was behind",
    }, reasons
    assert [r for r in fleet.runs() if r.status == "running"] == []


def test_an_instance_a_minute_off_the_databases_clock_fires_nothing_and_says_why(fleets: Callable[..., Fleet]) -> None:
    """Its heartbeats compare its clock with the database server's: a minute off, its lease
    lapses at once, so it fires no slot (a minute early, as its clock would have it) and
    closes no run of the instance on time (whose heartbeats look a minute old to it)."""
    fleet = fleets(ticks=3)
    ahead = fleet.start("ahead", offset_ms=60_000, wait=False)
    on_time = fleet.start("on-time", wait=False)
    fleet.wait_ready(ahead, on_time)
    poll(lambda: fleet.slots("tick00") >= 5, timeout=30, what="5 s of slots")
    fleet.stop_all()
    fleet.assert_healthy_logs()
    runs = by_name(fleet.runs())
    for mine in runs.values():
        assert_once_and_contiguous(mine)
        assert {(r.status, r.instance) for r in mine} == {("succeeded", "on-time")}
    log = ahead.log()
    assert "CLOCK: this instance's clock is 60." in log and "ahead of the database server's" in log, log
    assert "LEASE LAPSED: this instance's clock is 60." in log, log
    assert "CLOCK" not in on_time.log()


def test_clocks_300_ms_ahead_and_behind_never_double_fire(fleets: Callable[..., Fleet]) -> None:
    fleet = fleets(ticks=10)
    fleet.wait_ready(
        fleet.start("ahead", offset_ms=300, wait=False),
        fleet.start("behind", offset_ms=-300, wait=False),
        fleet.start("on-time", wait=False),
    )
    poll(lambda: fleet.slots("tick00") >= 6, timeout=30, what="6 s of slots")
    fleet.stop_all()
    fleet.assert_healthy_logs()
    runs = by_name(fleet.runs())
    for _name, mine in runs.items():
        assert_once_and_contiguous(mine)
        assert {(r.status, r.coordination_outcome) for r in mine} == {("succeeded", "wonLock")}
    # The fast clock reaches each slot first, so it wins nearly all of them.
    winners = [r.instance for rs in runs.values() for r in rs]
    assert winners.count("ahead") > len(winners) / 2
