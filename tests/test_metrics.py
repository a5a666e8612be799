"""``GET /metrics`` (issue 23, metrics): every family and label set after real runs, jobs,
durable executions, locks and instances, read with prometheus_client's own parser through
a real HTTP server; the read token; the fleet snapshot's cache and its bounded cost in
statements. On SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend import Engine, JobContext, ManualClock, RunContext, define_durable, define_queue, define_schedule
from backend.api.server import serve
from backend.client.embedded import EmbeddedBackend
from backend.jobs.store import Finish
from backend.model import Run, RunStatus
from backend.observability.fleet import FleetStore
from backend.observability.metrics import DURATION_BUCKETS, EngineMetrics
from backend.store import Membership
from tests.conftest import all_runs, expect

OPERATE, READ = "op-secret", "read-secret"
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
MINUTE = 60.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Overrides conftest's: every engine of a test shares this store."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """The families (name -> type) and every sample ``(name, labels) -> value``, as
    prometheus_client's parser reads the exposition."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def counted(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """A counter's series that counted something (every schedule's and queue's are there
    from 0, see test_every_family_and_label_set_after_real_work)."""
    return {labels: v for labels, v in series(samples, name).items() if v}


def at(dt: datetime) -> float:
    return dt.timestamp()


class Gate:
    """A job handler that holds its job running until released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, job: JobContext) -> None:
        if job.payload == "hold":
            self.entered.set()
            await self.release.wait()
        elif job.payload in ("bad", "flaky"):
            raise RuntimeError(f"{job.payload} job")


async def ok(ctx: RunContext) -> None:
    pass


async def bad(ctx: RunContext) -> None:
    raise RuntimeError("boom")


async def flow(ctx: Any, input: Any) -> Any:
    if input == "nap":
        await ctx.sleep("nap", 3600)
    return input


@dataclass
class Served:
    url: str
    engine: Engine
    metrics: EngineMetrics
    cache_clock: ManualClock

    async def scrape(self, token: str | None = READ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
            return await http.get("/metrics", headers=headers)

    async def samples(self) -> tuple[dict[str, str], Samples]:
        response = await self.scrape()
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        return parse(response.text)


@pytest.fixture
async def served(make_engine: Callable[..., Engine]) -> AsyncIterator[Callable[..., Any]]:
    """``await served(definitions)``: an engine on the test clock behind a real ``serve``
    (uvicorn on loopback, operator and read tokens), its metrics on a cache clock of their own."""
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start(definitions: list[Any], **kwargs: Any) -> Served:
        engine = make_engine(definitions, **kwargs)
        cache_clock = ManualClock(T0)
        metrics = EngineMetrics(engine, clock=cache_clock)
        ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.ensure_future(
            serve(EmbeddedBackend(engine), port=0, token=OPERATE, read_token=READ, stop=stop, on_ready=ready.set_result,
                  metrics=metrics)  # fmt: skip
        )
        stops.append((stop, task))
        url = await asyncio.wait_for(ready, 30)
        return Served(url, engine, metrics, cache_clock)

    yield start
    for stop, task in stops:
        stop.set()
        await task


# ---------------------------------------------------------------------------------------
# the families
# ---------------------------------------------------------------------------------------
async def test_every_family_and_label_set_after_real_work(served: Callable[..., Any], clock: ManualClock) -> None:
    gate = Gate()
    server: Served = await served(
        [
            define_schedule(name="good", cron="* * * * *", timezone="UTC", handler=ok),
            define_schedule(name="broken", cron="* * * * *", timezone="UTC", handler=bad),
            define_schedule(name="yearly", cron="0 9 1 1 *", timezone="Europe/Berlin", handler=ok),
            define_schedule(name="paused", cron="* * * * *", timezone="UTC", handler=ok, enabled=False),
            define_schedule(name="platform", cron="0 * * * *", timezone="UTC", handler=ok, trigger="external"),
            define_queue(name="mail", handler=gate, attempts=1),
            define_queue(name="retrying", handler=gate, attempts=3),
            define_queue(name="idle", handler=gate),
            define_durable(name="flow", handler=flow),
            define_durable(name="unused", handler=flow),
        ]
    )
    engine = server.engine
    clock.advance(MINUTE)  # 08:01: good and broken fire on their own
    await engine.quiesce()
    manual = await engine.run_now("good", wait=True)
    assert manual.status == "succeeded"
    await engine.disable("broken", note="flapping")
    await engine.jobs.send("mail", "ok")
    await engine.jobs.send("mail", "bad")  # its one attempt fails: dead
    await engine.jobs.send("retrying", "flaky")  # fails, retried in 10 s: queued
    await engine.jobs.send("mail", "later", delay=3600)  # queued
    await engine.durable.start_execution("flow", "done")
    await engine.durable.start_execution("flow", "nap")  # waiting for an hour
    await engine.quiesce()
    await engine.jobs.send("mail", "hold")
    await asyncio.wait_for(gate.entered.wait(), 10)  # running
    lease = await engine.locks.acquire("nightly", ttl=30)
    assert lease is not None

    types, samples = await server.samples()
    assert {name: kind for name, kind in types.items() if name.startswith("schedtui_")} == {
        "schedtui_runs": "counter",
        "schedtui_run_duration_seconds": "histogram",
        "schedtui_jobs_finished": "counter",
        "schedtui_schedule_last_success_timestamp_seconds": "gauge",
        "schedtui_schedule_next_fire_timestamp_seconds": "gauge",
        "schedtui_schedule_enabled": "gauge",
        "schedtui_jobs": "gauge",
        "schedtui_durable_executions": "gauge",
        "schedtui_locks_held": "gauge",
        "schedtui_instances": "gauge",
        "schedtui_fleet_snapshot_timestamp_seconds": "gauge",
        "schedtui_lease_lapses": "counter",
    }  # (no schedtui_clock_offset_seconds: an injected clock is not compared with the store's)
    assert value(samples, "schedtui_lease_lapses_total") == 0.0
    # The process and Python collectors, on this engine's registry.
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info", "python_gc_objects_collected"} <= set(types)

    outcome = "single" if engine.coordination == "single" else "wonLock"
    runs = {(d["schedule"], d["status"], d["outcome"], d["trigger"]): v
            for d, v in ((dict(k), v) for k, v in series(samples, "schedtui_runs_total").items())}  # fmt: skip
    # Every schedule shows its succeeded and failed counts from 0, as it is fired here (a
    # series that first appears at 1 is no increase to Prometheus: its first failure
    # would page nobody); only what happened adds more.
    expected = {(name, status, outcome, "self"): 0.0 for name in ("good", "broken", "yearly", "paused")
                for status in ("succeeded", "failed")}  # fmt: skip
    expected.update({("platform", status, "external", "external"): 0.0 for status in ("succeeded", "failed")})
    expected[("good", "succeeded", outcome, "self")] = 1.0
    expected[("good", "succeeded", "manual", "manual")] = 1.0
    expected[("broken", "failed", outcome, "self")] = 1.0
    assert runs == expected
    assert value(samples, "schedtui_run_duration_seconds_count", schedule="good") == 2.0
    assert value(samples, "schedtui_run_duration_seconds_count", schedule="broken") == 1.0
    assert value(samples, "schedtui_run_duration_seconds_sum", schedule="good") == 0.0  # the manual clock stood still
    buckets = {dict(labels)["le"] for labels in series(samples, "schedtui_run_duration_seconds_bucket")}
    assert buckets == {str(float(b)) for b in DURATION_BUCKETS} | {"+Inf"}

    # From the store: the fleet's view.
    last = value(samples, "schedtui_schedule_last_success_timestamp_seconds", schedule="good")
    assert manual.finished_at is not None
    assert last == at(manual.finished_at)
    assert set(series(samples, "schedtui_schedule_last_success_timestamp_seconds")) == {frozenset({("schedule", "good")})}
    assert {dict(k)["schedule"]: v for k, v in series(samples, "schedtui_schedule_enabled").items()} == {
        "good": 1.0, "broken": 0.0, "yearly": 1.0, "paused": 0.0, "platform": 1.0,
    }  # fmt: skip
    # From the cron definitions: only what fires here on its own and is enabled.
    assert {dict(k)["schedule"]: v for k, v in series(samples, "schedtui_schedule_next_fire_timestamp_seconds").items()} == {
        "good": at(T0 + timedelta(minutes=2)),
        "yearly": at(datetime(2027, 1, 1, 8, 0, tzinfo=UTC)),  # 09:00 in Berlin
    }
    assert {tuple(sorted(dict(k).items())): v for k, v in series(samples, "schedtui_jobs").items()} == {
        (("queue", "mail"), ("state", "queued")): 1.0,
        (("queue", "mail"), ("state", "running")): 1.0,
        (("queue", "mail"), ("state", "dead")): 1.0,
        (("queue", "retrying"), ("state", "queued")): 1.0,
        (("queue", "retrying"), ("state", "running")): 0.0,
        (("queue", "retrying"), ("state", "dead")): 0.0,
        (("queue", "idle"), ("state", "queued")): 0.0,
        (("queue", "idle"), ("state", "running")): 0.0,
        (("queue", "idle"), ("state", "dead")): 0.0,
    }
    finished = {(d["queue"], d["outcome"]): v
                for d, v in ((dict(k), v) for k, v in series(samples, "schedtui_jobs_finished_total").items())}  # fmt: skip
    assert finished == {
        (queue, outcome): float((queue, outcome) in {("mail", "succeeded"), ("mail", "dead"), ("retrying", "retried")})
        for queue in ("mail", "retrying", "idle") for outcome in ("succeeded", "retried", "dead")
    }  # every queue's outcomes from 0
    durable = {(dict(k)["function"], dict(k)["status"]): v for k, v in series(samples, "schedtui_durable_executions").items()}
    assert durable[("flow", "succeeded")] == 1.0 and durable[("flow", "waiting")] == 1.0
    assert durable[("unused", "failed")] == 0.0  # every status of every function defined here
    assert sum(durable.values()) == 2.0 and len(durable) == 12
    assert value(samples, "schedtui_locks_held") == 1.0
    assert {dict(k)["role"]: v for k, v in series(samples, "schedtui_instances").items()} == {
        "firing": 1.0, "waiting": 0.0, "standing_down": 0.0,
    }  # fmt: skip
    assert value(samples, "schedtui_fleet_snapshot_timestamp_seconds") == at(clock.now())  # read at this scrape, the first

    gate.release.set()
    await engine.locks.release_lease(lease)
    await engine.quiesce()


async def test_a_schedule_that_never_succeeded_has_no_last_success_and_skips_and_misses_are_counted(
    served: Callable[..., Any], clock: ManualClock
) -> None:
    release = asyncio.Event()

    async def slow(ctx: RunContext) -> None:
        await release.wait()

    server: Served = await served([define_schedule(name="slow", cron="* * * * *", timezone="UTC", handler=slow)])
    engine = server.engine
    first = expect(engine, lambda run: run.status == "running")
    clock.advance(MINUTE)
    await first
    skipped = expect(engine, lambda run: run.status == "skipped")
    clock.advance(MINUTE)  # the 08:02 slot finds 08:01 running: skipped (on_overlap="skip")
    await skipped
    _, samples = await server.samples()
    outcome = "single" if engine.coordination == "single" else "wonLock"
    assert counted(samples, "schedtui_runs_total") == {
        frozenset({"schedule": "slow", "status": "skipped", "outcome": outcome, "trigger": "self"}.items()): 1.0,
    }
    assert series(samples, "schedtui_run_duration_seconds_count") == {}  # nothing ran to an end
    assert series(samples, "schedtui_schedule_last_success_timestamp_seconds") == {}
    release.set()
    await engine.quiesce()


async def test_only_firing_members_with_a_fresh_heartbeat_count(
    served: Callable[..., Any], make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    server: Served = await served([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)],
                                  coordination="advisoryLock")  # fmt: skip
    observer = make_engine([], instance="console")  # a console or a CLI verb: opens, fires nothing
    await observer.open()
    member = make_engine([], instance="second", coordination="advisoryLock")
    await member.start()
    _, samples = await server.samples()
    assert value(samples, "schedtui_instances", role="firing") == 2.0
    assert value(samples, "schedtui_instances", role="waiting") == 0.0

    await member.stop()  # a clean stop forgets the member
    now = clock.now()
    store = server.engine.store
    await store.heartbeat("gone", "elsewhere", 1, now - timedelta(seconds=31), Membership("firing", "advisoryLock"))
    await store.heartbeat("late", "elsewhere", 2, now - timedelta(seconds=29), Membership("waiting", "single"))
    await store.heartbeat("old-version", "elsewhere", 3, now, Membership(None))  # type: ignore[arg-type]  # an older version's heartbeat: no role
    skewed = Membership("firing", "advisoryLock", clock_offset=61.0, clock_off=True)  # its clock a minute off
    await store.heartbeat("skewed", "elsewhere", 4, now, skewed)
    server.cache_clock.advance(5)
    await server.metrics.fleet.settled()
    _, samples = await server.samples()
    assert value(samples, "schedtui_instances", role="firing") == 2.0  # this one, and a row that says no role
    assert value(samples, "schedtui_instances", role="waiting") == 1.0  # its heartbeat is within the window
    assert value(samples, "schedtui_instances", role="standing_down") == 1.0  # fresh, but it takes no work


@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_member_is_counted_live_by_its_own_window_when_it_is_longer(
    where: str, request: pytest.FixtureRequest, make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A fleet in a rolling change of ``--abandon-after``: a member of a 60 s window silent
    for 45 s is alive to every other instance (none takes its work over), so the metrics of
    a 30 s instance count it too; silent past its own window, it is gone."""
    engine = make_engine([], store=request.getfixturevalue("pg_url" if where == "postgres" else "store_url"))
    await engine.open()
    now = clock.now()
    beat = engine.store.heartbeat
    await beat("patient", "elsewhere", 1, now - timedelta(seconds=45), Membership("firing", "advisoryLock", window=60.0))
    await beat("gone", "elsewhere", 2, now - timedelta(seconds=61), Membership("firing", "advisoryLock", window=60.0))
    await beat("short", "elsewhere", 3, now - timedelta(seconds=31), Membership("firing", "advisoryLock", window=10.0))
    await beat("fresh", "elsewhere", 4, now - timedelta(seconds=29), Membership("firing", "advisoryLock", window=10.0))
    snapshot = await cast(FleetStore, engine.store).fleet_snapshot([], now=now, live_after=now - timedelta(seconds=30), lock_now=now)
    assert snapshot.instances["firing"] == 2  # patient, and fresh (within the reader's window)


# ---------------------------------------------------------------------------------------
# the token
# ---------------------------------------------------------------------------------------
async def test_the_read_token_is_needed_and_enough(served: Callable[..., Any]) -> None:
    server: Served = await served([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    missing = await server.scrape(None)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "unauthorized"
    assert (await server.scrape("wrong")).status_code == 401
    assert (await server.scrape(READ)).status_code == 200
    assert (await server.scrape(OPERATE)).status_code == 200
    async with httpx.AsyncClient(base_url=server.url) as http:
        doc = (await http.get("/openapi.json", headers={"Authorization": f"Bearer {READ}"})).json()
    operation = doc["paths"]["/metrics"]["get"]
    assert "text/plain" in operation["responses"]["200"]["content"] and "401" in operation["responses"]


# ---------------------------------------------------------------------------------------
# the cache and the cost of a snapshot
# ---------------------------------------------------------------------------------------
class Statements:
    """Counts the SQL statements the store executes for the metrics' snapshots: those of
    the reads (through both stores' read plumbing) that a snapshot's task asks for, not
    those of the engine's own tasks meanwhile."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        counter = self
        snapshotting: contextvars.ContextVar[bool] = contextvars.ContextVar("snapshotting", default=False)

        class Counting:
            def __init__(self, conn: Any, counted: bool) -> None:
                self._conn = conn
                self._counted = counted

            def execute(self, *args: Any, **kwargs: Any) -> Any:
                counter.count += self._counted
                return self._conn.execute(*args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

        if store.kind == "sqlite":
            read = store._read

            def counted_read(fn: Any) -> Any:
                counted = snapshotting.get()  # asked on the loop, run on the reader's thread
                return read(lambda conn: fn(Counting(conn, counted)))

            monkeypatch.setattr(store, "_read", counted_read)
        else:
            with_conn = store._with_conn

            async def counted_conn(fn: Any, **kwargs: Any) -> Any:
                counted = snapshotting.get()

                async def go(conn: Any) -> Any:
                    return await fn(Counting(conn, counted))

                return await with_conn(go, **kwargs)

            monkeypatch.setattr(store, "_with_conn", counted_conn)
        snapshot = store.fleet_snapshot

        async def marked(*args: Any, **kwargs: Any) -> Any:
            snapshotting.set(True)  # in the snapshot's own task only
            return await snapshot(*args, **kwargs)

        monkeypatch.setattr(store, "fleet_snapshot", marked)

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


async def test_a_scrape_within_the_window_reads_nothing_and_the_next_window_reads_again(
    make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=ok)])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock)  # the default window: 5 s
    await engine.start()
    statements = Statements(engine.store, monkeypatch)

    _, first = parse((await metrics.render()).decode())
    assert statements.take() == 5 and metrics.fleet.reads == 1
    assert value(first, "schedtui_schedule_enabled", schedule="s") == 1.0
    await engine.disable("s")
    clock.advance(MINUTE)  # a run would count at once (it is this instance's), but s is disabled
    await engine.quiesce()
    statements.take()
    cache_clock.advance(4.999)
    _, second = parse((await metrics.render()).decode())
    assert statements.take() == 0 and metrics.fleet.reads == 1
    assert value(second, "schedtui_schedule_enabled", schedule="s") == 1.0  # the snapshot of the window
    cache_clock.advance(0.001)  # the next read, in the background
    await asyncio.wait_for(metrics.fleet.next_read(), 10)
    _, third = parse((await metrics.render()).decode())
    assert statements.take() == 5 and metrics.fleet.reads == 2
    assert value(third, "schedtui_schedule_enabled", schedule="s") == 0.0


async def test_the_fleet_is_read_in_the_background_on_the_clock_and_a_scrape_never_waits_for_it(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=ok)])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock)
    await engine.start()
    await metrics.render()  # the first scrape waits for the first read
    assert metrics.fleet.reads == 1
    cache_clock.advance(5)  # no scrape: the clock alone brings the next read
    await asyncio.wait_for(metrics.fleet.next_read(), 10)
    assert metrics.fleet.reads == 2

    healthy = cast(FleetStore, engine.store).fleet_snapshot
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await healthy(*args, **kwargs)

    monkeypatch.setattr(engine.store, "fleet_snapshot", slow)
    await engine.disable("s")
    cache_clock.advance(5)
    await asyncio.wait_for(entered.wait(), 10)  # the read is under way, and held
    _, held = parse((await metrics.render()).decode())  # answered from the snapshot before
    assert value(held, "schedtui_schedule_enabled", schedule="s") == 1.0
    assert value(held, "schedtui_fleet_snapshot_timestamp_seconds") == at(engine.clock.now())
    read = metrics.fleet.next_read()
    release.set()
    await asyncio.wait_for(read, 10)
    _, after = parse((await metrics.render()).decode())
    assert value(after, "schedtui_schedule_enabled", schedule="s") == 0.0 and metrics.fleet.reads == 3


async def test_counts_are_rendered_between_scrapes_so_a_scrape_has_only_the_last_second_left(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=ok)])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock)
    await engine.start()
    await metrics.render()  # a scrape starts the renders between scrapes
    tallies = metrics.tallies
    for n in range(40):  # more than a scrape renders on the loop
        tallies.run_finished(took(f"s{n:02}", 0.3))
    rendered = metrics.next_render()
    cache_clock.advance(1)
    await asyncio.wait_for(rendered, 10)
    # (and the first scrape's counts of "s" at 0, which has no histogram yet)
    assert not tallies.pending and [family.rendered for family in tallies.texts][:2] == [41, 40]
    tallies.run_finished(took("s00", 2.0))  # one more since: the scrape renders it alone
    _, families = parse((await metrics.render()).decode())
    assert [family.rendered for family in tallies.texts][:2] == [42, 41]
    assert value(families, "schedtui_runs_total", schedule="s00", status="succeeded", outcome="single", trigger="self") == 2.0
    assert value(families, "schedtui_runs_total", schedule="s39", status="succeeded", outcome="single", trigger="self") == 1.0
    metrics.close()


async def test_the_first_scrape_waits_for_the_first_read_at_most_wait_seconds(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    metrics = EngineMetrics(engine, clock=ManualClock(T0), wait=0.01)  # the bound under test, in real time
    await engine.start()
    healthy = cast(FleetStore, engine.store).fleet_snapshot
    release = asyncio.Event()

    async def hung(*args: Any, **kwargs: Any) -> Any:
        await release.wait()
        return await healthy(*args, **kwargs)

    monkeypatch.setattr(engine.store, "fleet_snapshot", hung)
    types, samples = parse((await metrics.render()).decode())
    assert "schedtui_schedule_enabled" not in types  # not read yet: left out, never made up
    assert value(samples, "schedtui_schedule_next_fire_timestamp_seconds", schedule="s") is None  # nothing taken yet
    assert "the store has not answered within 0.01s" in caplog.text
    read = metrics.fleet.next_read()
    release.set()
    await asyncio.wait_for(read, 10)
    _, samples = parse((await metrics.render()).decode())
    assert value(samples, "schedtui_schedule_enabled", schedule="s") == 1.0 and metrics.fleet.reads == 1


async def test_nobody_scraping_stops_the_reads_and_the_next_scrape_waits_for_a_new_one(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock, idle_after=60)
    await engine.start()
    await metrics.render()
    for _ in range(12):  # a minute of reads every 5 s, nobody scraping
        cache_clock.advance(5)
        await asyncio.wait_for(metrics.fleet.next_read(), 10)
    assert metrics.fleet.reads == 13
    cache_clock.advance(3600)  # the reads have stopped: nothing due
    await metrics.fleet.settled()
    assert metrics.fleet.reads == 13 and cache_clock.sleepers == 0
    await engine.disable("s")
    _, samples = parse((await metrics.render()).decode())  # an hour-old snapshot is not shown: read again
    assert metrics.fleet.reads == 14 and value(samples, "schedtui_schedule_enabled", schedule="s") == 0.0


async def test_closed_metrics_count_and_read_no_more(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=ok)])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock)
    await engine.start()
    await metrics.render()
    counted_before = metrics.tallies.changes  # (the schedule's counts at 0)
    metrics.close()
    clock.advance(MINUTE)
    await engine.quiesce()
    cache_clock.advance(60)
    assert metrics.fleet.reads == 1 and cache_clock.sleepers == 0 and metrics.tallies.changes == counted_before


async def test_a_removed_schedule_s_fleet_series_go_and_a_changed_one_is_rendered_again(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    engine = make_engine([define_schedule(name=name, cron="* * * * *", timezone="UTC", handler=ok) for name in ("a", "b", "c")])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock)
    await engine.start()
    clock.advance(MINUTE)  # all three succeed once
    await engine.quiesce()
    _, first = parse((await metrics.render()).decode())
    assert len(series(first, "schedtui_schedule_last_success_timestamp_seconds")) == 3
    last_success = metrics.fleet.texts[1]
    rendered = last_success.rendered

    clock.advance(1)
    await engine.run_now("a", wait=True)  # a's last success moves on; b's stays
    engine.remove_schedule("c")
    cache_clock.advance(5)
    await metrics.fleet.settled()
    _, second = parse((await metrics.render()).decode())
    assert last_success.rendered == rendered + 1  # a's line alone
    assert {dict(k)["schedule"] for k in series(second, "schedtui_schedule_last_success_timestamp_seconds")} == {"a", "b"}
    assert {dict(k)["schedule"] for k in series(second, "schedtui_schedule_enabled")} == {"a", "b"}
    assert {dict(k)["schedule"] for k in series(second, "schedtui_schedule_next_fire_timestamp_seconds")} == {"a", "b"}
    # This instance's counts of c go too (see test_a_deleted_schedule_s_series_go_on_every_instance).
    assert not shown(second, "c")
    assert (await metrics.render()).split(b"# HELP process_")[0] == generate_latest_text(metrics)


def shown(samples: Samples, schedule: str) -> list[tuple[str, frozenset[tuple[str, str]]]]:
    """Every sample of any family that names ``schedule``."""
    return [key for key in samples if ("schedule", schedule) in key[1]]


async def scraped(metrics: EngineMetrics, *, snapshot: bool = False) -> Samples:
    """A scrape's samples (with ``snapshot``, once the store's families were read again:
    they are kept ``cache_for``, 5 s)."""
    if snapshot:
        cast(ManualClock, metrics.fleet.clock).advance(5)
        await metrics.render()
        await metrics.fleet.settled()
    return parse((await metrics.render()).decode())[1]


def counts_of(samples: Samples, schedule: str) -> list[tuple[str, frozenset[tuple[str, str]]]]:
    """This instance's counts of ``schedule`` (runs, durations)."""
    return [key for key in shown(samples, schedule) if key[0].startswith(("schedtui_runs_", "schedtui_run_duration_"))]


async def test_a_deleted_schedule_s_series_go_on_every_instance(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    """A stored schedule deleted at run time kept its run counts and its duration
    histogram (a dozen series) on every instance that had run it, until a restart: a fleet
    that creates and deletes schedules grew its series without bound. They go at the next
    scrape on the instance that deleted it, and on another once its catalog's refresh has
    told it; created again, the schedule counts from 0 (a counter reset to Prometheus)."""
    mail = define_queue(name="mail", handler=_no_job)
    firer = make_engine([mail])
    firer_metrics = EngineMetrics(firer, clock=ManualClock(T0))
    await firer.start()
    operator = make_engine([mail], instance="cli")
    operator_metrics = EngineMetrics(operator, clock=ManualClock(T0))
    await operator.open()
    await operator.create_schedule({"name": "reap", "cron": "* * * * *", "timezone": "UTC", "queue": "mail"})
    await operator.run_now("reap", wait=True)  # counted by the operator's instance
    for _ in range(61):  # (the firer reads the catalog every second, then fires 08:01)
        clock.advance(1)
        await firer.quiesce()
    for metrics in (firer_metrics, operator_metrics):
        _, samples = parse((await metrics.render()).decode())
        assert value(samples, "schedtui_run_duration_seconds_count", schedule="reap") == 1.0, metrics.engine.instance
    await operator.delete_schedule("reap")
    assert counts_of(await scraped(operator_metrics), "reap") == []  # at once
    assert shown(await scraped(operator_metrics, snapshot=True), "reap") == []  # the store's families at their next read
    for _ in range(30):  # until the firer's catalog refresh has told it
        if "reap" not in firer.schedules:
            break
        clock.advance(1)
        await firer.quiesce()
    assert "reap" not in firer.schedules
    assert counts_of(await scraped(firer_metrics), "reap") == []
    assert shown(await scraped(firer_metrics, snapshot=True), "reap") == []
    assert (await firer_metrics.render()).split(b"# HELP process_")[0] == generate_latest_text(firer_metrics)
    await operator.create_schedule({"name": "reap", "cron": "0 0 1 1 *", "timezone": "UTC", "queue": "mail"})
    _, again = parse((await operator_metrics.render()).decode())
    assert {dict(labels)["status"]: n for labels, n in series(again, "schedtui_runs_total").items()
            if ("schedule", "reap") in labels} == {"succeeded": 0.0, "failed": 0.0}  # fmt: skip
    assert series(again, "schedtui_run_duration_seconds_count") == {}


async def test_a_run_in_flight_when_its_schedule_is_deleted_brings_no_series_back(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    release = asyncio.Event()

    async def slow(ctx: RunContext) -> None:
        await release.wait()

    engine = make_engine([define_schedule(name="slow", cron="0 0 1 1 *", timezone="UTC", handler=slow),
                          define_schedule(name="kept", cron="0 0 1 1 *", timezone="UTC", handler=ok)])  # fmt: skip
    metrics = EngineMetrics(engine, clock=ManualClock(T0))
    await engine.start()
    release.set()
    await engine.run_now("slow", wait=True)  # one run counted, with its duration
    release.clear()
    assert shown(parse((await metrics.render()).decode())[1], "slow")
    in_flight = await engine.run_now("slow")
    engine.remove_schedule("slow")
    assert counts_of(await scraped(metrics), "slow") == []
    release.set()
    await engine.quiesce()
    assert (await engine.get_run(in_flight.id)).status == "succeeded"  # recorded, not counted
    after = await scraped(metrics, snapshot=True)
    assert shown(after, "slow") == [] and counts_of(after, "kept")
    assert metrics._gone == set()  # (nothing of it left to end here: no longer watched for)


def generate_latest_text(metrics: EngineMetrics) -> bytes:
    """The registry's families of schedtui rendered at once by prometheus_client (what the
    kept texts must add up to)."""
    from prometheus_client import generate_latest

    from backend.observability.exposition import Families

    return generate_latest(Families([*metrics.tallies.collect(), *metrics.fleet.collect()]))


class WallClock:
    """A clock set by hand, backwards too (as NTP may step a wall clock)."""

    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at

    async def sleep_until(self, deadline: datetime) -> None:
        await asyncio.Event().wait()  # never on its own: only a scrape's word wakes the reads


async def test_a_clock_stepped_back_reads_again(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    wall = WallClock(T0)
    metrics = EngineMetrics(engine, clock=wall)
    await engine.start()
    await metrics.render()
    wall.at = T0 - timedelta(seconds=1)  # the snapshot's age is unknown now
    read = metrics.fleet.next_read()
    await metrics.render()
    await asyncio.wait_for(read, 10)
    assert metrics.fleet.reads == 2
    await metrics.render()
    await metrics.fleet.settled()
    assert metrics.fleet.reads == 2


async def test_concurrent_scrapes_share_one_read(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    metrics = EngineMetrics(engine, clock=ManualClock(T0))
    await engine.start()
    bodies = await asyncio.gather(*(metrics.render() for _ in range(5)))
    assert metrics.fleet.reads == 1
    assert all(b'schedtui_schedule_enabled{schedule="s"} 1.0' in body for body in bodies)


async def _no_job(job: JobContext) -> None:
    pass


async def test_every_schedule_counts_from_zero_so_that_its_first_failure_is_an_increase(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Prometheus's ``increase()`` sees nothing in a series that first appears at 1: a rule on
    ``schedtui_runs_total{status="failed"}`` (as `schedtui alerts rules` writes) missed a
    schedule's first failure after a start, or after it was created. Each schedule's
    succeeded and failed counts show at 0 from the first scrape (a stored schedule's from
    the first after its creation), each queue's finished jobs too, and a failure moves that
    same series from 0 to 1."""
    engine = make_engine([define_schedule(name="broken", cron="* * * * *", timezone="UTC", handler=bad),
                          define_queue(name="mail", handler=_no_job)])  # fmt: skip
    metrics = EngineMetrics(engine, clock=ManualClock(T0))
    await engine.start()
    outcome = "single" if engine.coordination == "single" else "wonLock"
    _, before = parse((await metrics.render()).decode())
    failed = {"status": "failed", "outcome": outcome, "trigger": "self"}
    assert value(before, "schedtui_runs_total", schedule="broken", **failed) == 0.0
    assert value(before, "schedtui_jobs_finished_total", queue="mail", outcome="dead") == 0.0
    await engine.create_schedule({"name": "reap", "cron": "0 0 1 1 *", "timezone": "UTC", "queue": "mail"})
    _, created = parse((await metrics.render()).decode())
    assert value(created, "schedtui_runs_total", schedule="reap", **failed) == 0.0
    clock.advance(MINUTE)
    await engine.quiesce()
    _, after = parse((await metrics.render()).decode())
    assert value(after, "schedtui_runs_total", schedule="broken", **failed) == 1.0
    assert set(series(after, "schedtui_runs_total")) == set(series(created, "schedtui_runs_total"))


async def test_the_run_counts_show_at_once_between_snapshots(make_engine: Callable[..., Engine], clock: ManualClock) -> None:
    engine = make_engine([define_schedule(name="s", cron="* * * * *", timezone="UTC", handler=ok)])
    metrics = EngineMetrics(engine, clock=ManualClock(T0))
    await engine.start()
    _, before = parse((await metrics.render()).decode())
    assert counted(before, "schedtui_runs_total") == {}
    clock.advance(MINUTE)
    await engine.quiesce()
    _, after = parse((await metrics.render()).decode())
    assert sum(series(after, "schedtui_runs_total").values()) == 1.0 and metrics.fleet.reads == 1


async def test_runs_a_killed_instance_left_are_counted_once_by_the_instance_that_closes_them(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """The operator's incident: a run whose process was SIGKILLed is closed ``failed``
    (``abandoned``) by a survivor's sweep, and the webhook alert fired, but no instance
    counted it in ``schedtui_runs_total``: the ``SchedtuiFailing`` rule never saw it. Both
    ways of closing a dead instance's runs count: its run left ``running``, and the runs of
    the burst it was starting, whose rows never landed."""
    schedules = [
        define_schedule(name="nightly", cron="0 3 * * *", timezone="UTC", handler=ok),
        define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=ok),
    ]
    engine = make_engine(schedules, abandon_after=30)
    metrics = EngineMetrics(engine, clock=ManualClock(T0))
    await engine.start()
    store = engine.store
    three = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
    await store.heartbeat("killed", "another-host", 4242, clock.now())
    store.save_runs([Run(engine.new_id(), "nightly", three, "running", "self", "single", "killed", three)])
    await store.mark_starting("killed", T0)  # its 08:00 burst: hourly's row never landed
    await store.flush()
    clock.advance(31)  # its heartbeat is past the take-over window: the sweep closes its work
    await engine.quiesce()
    closed = [(r.name, r.status, r.error_tag) for name in ("nightly", "hourly") for r in await all_runs(engine, name)]
    assert closed == [("nightly", "failed", "abandoned"), ("hourly", "failed", "abandoned")]
    _, samples = parse((await metrics.render()).decode())
    assert counted(samples, "schedtui_runs_total") == {
        frozenset({"schedule": "nightly", "status": "failed", "outcome": "single", "trigger": "self"}.items()): 1.0,
        frozenset({"schedule": "hourly", "status": "failed", "outcome": "single", "trigger": "self"}.items()): 1.0,
    }
    # Its end is when the survivor noticed, not how long it ran: no duration.
    assert series(samples, "schedtui_run_duration_seconds_count") == {}
    await engine.close_abandoned()  # a later sweep finds nothing more: counted once
    _, samples = parse((await metrics.render()).decode())
    assert sum(series(samples, "schedtui_runs_total").values()) == 2.0


@pytest.mark.parametrize("count", [10, 300])
async def test_a_snapshot_costs_the_same_statements_whatever_the_number_of_schedules(
    count: int, make_engine: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedules = [define_schedule(name=f"s{n:03}", cron="* * * * *", timezone="UTC", handler=ok) for n in range(count)]
    engine = make_engine([*schedules, define_queue(name="q", handler=Gate()), define_durable(name="f", handler=flow)])
    metrics = EngineMetrics(engine, clock=ManualClock(T0))
    await engine.start()
    clock.advance(MINUTE)  # every schedule has a success to look up
    await engine.quiesce()
    await engine.disable("s000")
    statements = Statements(engine.store, monkeypatch)
    _, samples = parse((await metrics.render()).decode())
    assert statements.take() == 5
    assert len(series(samples, "schedtui_schedule_last_success_timestamp_seconds")) == count
    assert sum(series(samples, "schedtui_schedule_enabled").values()) == count - 1
    assert len(series(samples, "schedtui_schedule_next_fire_timestamp_seconds")) == count - 1


async def test_a_store_that_cannot_be_read_leaves_the_fleet_out_until_it_can(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from backend import Unavailable

    engine = make_engine([define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    cache_clock = ManualClock(T0)
    metrics = EngineMetrics(engine, clock=cache_clock)
    await engine.start()
    healthy = cast(FleetStore, engine.store).fleet_snapshot

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("the store is down (test)")

    monkeypatch.setattr(engine.store, "fleet_snapshot", down)
    types, samples = parse((await metrics.render()).decode())
    assert "schedtui_schedule_enabled" not in types and "schedtui_instances" not in types
    assert value(samples, "schedtui_schedule_next_fire_timestamp_seconds", schedule="s") == at(datetime(2027, 1, 1, tzinfo=UTC))
    assert "the fleet's state is left out for 5s: the store is down (test)" in caplog.text
    monkeypatch.setattr(engine.store, "fleet_snapshot", healthy)
    await metrics.render()
    assert metrics.fleet.reads == 1  # not before the window has passed
    cache_clock.advance(5)
    await metrics.fleet.settled()
    _, samples = parse((await metrics.render()).decode())
    assert value(samples, "schedtui_schedule_enabled", schedule="s") == 1.0


async def test_several_engines_in_one_process_count_apart(make_engine: Callable[..., Engine], tmp_path: Path) -> None:
    first = make_engine([define_schedule(name="a", cron="0 0 1 1 *", timezone="UTC", handler=ok)])
    second = make_engine([define_schedule(name="b", cron="0 0 1 1 *", timezone="UTC", handler=ok)],
                         store=f"sqlite:///{tmp_path / 'other.db'}")  # fmt: skip
    one, two = EngineMetrics(first), EngineMetrics(second)
    await first.start()
    await second.start()
    run = await first.run_now("a", wait=True)
    assert run.status == "succeeded"
    _, a = parse((await one.render()).decode())
    _, b = parse((await two.render()).decode())
    assert sum(series(a, "schedtui_runs_total").values()) == 1.0
    assert counted(b, "schedtui_runs_total") == {}
    assert one.registry is not two.registry


def test_a_failing_meter_is_logged_and_never_stops_a_recording(caplog: pytest.LogCaptureFixture) -> None:
    from backend.scheduler.ledger import RunLedger

    saved: list[list[Run]] = []

    class Store:
        def save_runs(self, runs: list[Run]) -> None:
            saved.append(list(runs))

    ledger = RunLedger(Store())  # type: ignore[arg-type]  # a stand-in that only saves runs
    told: list[str] = []

    def failing(run: Run) -> None:
        raise ZeroDivisionError("division by zero")  # a meter that fails (as 1 / 0 does)

    ledger.meters.append(failing)
    ledger.meters.append(lambda run: told.append(run.id))

    async def record() -> None:
        ledger.record(Run("r1", "s", T0, "succeeded", "self", "single", "i", T0, T0))
        ledger.record(Run("r2", "s", T0, "running", "self", "single", "i", T0))
        ledger.handoff()

    asyncio.run(record())
    assert told == ["r1"]  # final statuses only
    assert [run.id for batch in saved for run in batch] == ["r1", "r2"]
    assert "a run meter failed" in caplog.text


def took(name: str, seconds: float, status: RunStatus = "succeeded") -> Run:
    return Run(f"{name}-{seconds}-{status}", name, T0, status, "self", "single", "i", T0, T0 + timedelta(seconds=seconds))


def test_only_the_schedules_that_finished_a_run_are_rendered_again_and_the_text_is_prometheus_clients() -> None:
    from prometheus_client import generate_latest

    from backend.observability.metrics import Tallies

    tallies = Tallies()

    def scrape() -> tuple[str, list[int]]:
        tallies.freeze()
        text = tallies.text(tallies.frozen).decode()
        whole = generate_latest(tallies).decode()  # the families as one, rendered at once
        assert text == whole
        return text, [family.rendered for family in tallies.texts]

    tallies.run_finished(took("a", 0.3))
    tallies.run_finished(took("b", 42.0, "failed"))
    tallies.run_finished(took("c", 1.0))
    text, rendered = scrape()
    assert rendered == [3, 3, 0]  # each schedule's counts and histogram, once
    _, first = parse(text)
    assert (value(first, "schedtui_run_duration_seconds_bucket", schedule="a", le="0.1"),
            value(first, "schedtui_run_duration_seconds_bucket", schedule="a", le="0.5")) == (0.0, 1.0)  # fmt: skip
    assert value(first, "schedtui_run_duration_seconds_sum", schedule="b") == 42.0

    tallies.run_finished(took("a", 2000.0))
    tallies.run_finished(took("b", 1.0, "skipped"))  # counted, not timed: b's histogram stays as it was
    text, rendered = scrape()
    assert rendered == [3 + 2, 3 + 1, 0]
    _, second = parse(text)
    assert value(second, "schedtui_run_duration_seconds_bucket", schedule="a", le="1800.0") == 1.0
    assert value(second, "schedtui_run_duration_seconds_bucket", schedule="a", le="3600.0") == 2.0
    assert value(second, "schedtui_run_duration_seconds_sum", schedule="a") == 2000.3
    assert value(second, "schedtui_runs_total", schedule="b", status="skipped", outcome="single", trigger="self") == 1.0
    assert value(second, "schedtui_runs_total", schedule="a", status="succeeded", outcome="single", trigger="self") == 2.0

    assert scrape()[1] == [5, 4, 0]  # nothing finished since: nothing rendered
    tallies.job_finished(Finish("j1", "q", 1, "dead", 1, T0, T0, "i"))
    text, rendered = scrape()
    assert rendered == [5, 4, 1]
    assert value(parse(text)[1], "schedtui_jobs_finished_total", queue="q", outcome="dead") == 1.0

    tallies.run_finished(took("0-new", 1.0))  # a schedule new here takes its place in the order
    tallies.run_finished(took("b", 7.0))
    text, rendered = scrape()
    assert rendered == [5 + 2, 4 + 2, 1]
    for family in text_string_to_metric_families(text):
        shown = [s.labels["schedule"] for s in family.samples if "schedule" in s.labels]
        assert shown == sorted(shown) and set(shown) == ({"0-new", "a", "b", "c"} if shown else set())


def test_a_family_text_drops_the_groups_gone_and_keeps_the_order_given() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from backend.observability.exposition import Families, FamilyText

    def make() -> GaugeMetricFamily:
        return GaugeMetricFamily("g", 'with "quotes", a \\ and\na newline', labels=["k"])

    def add(family: GaugeMetricFamily, key: str, v: float) -> None:
        family.add_metric([key], v)

    text = FamilyText(make, add)
    odd = 'line\nbreak "quoted" \\ back\rcr'  # label values prometheus_client must escape
    groups = [("b", 1.0), (odd, 2.0), ("a", 3.0)]
    assert text.update(groups) == generate_latest(Families([text.family(groups)]))
    groups = [("a", 3.0), (odd, 5.0)]  # b gone, the order changed, one value changed
    assert text.update(groups) == generate_latest(Families([text.family(groups)]))
    assert text.rendered == 4
    assert text.update([]) == text.header
