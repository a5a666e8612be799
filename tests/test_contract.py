"""One contract for the shared backend interface, run against both implementations:
the embedded one (engine in this process) and the remote one (httpx against a real
``schedtui serve`` on a loopback port)."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from backend import BadInput, Engine, Forbidden, NotFound, Refused, discover
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import SYSTEMS, Backend
from backend.client.remote import RemoteBackend
from backend.events.audit import os_user
from tests.servers import Server, start_server

#: The hour of the external schedule's daily slot: twelve hours from when the tests start, so
#: its newest slot is never within the fire tolerance while they run (a fixed time made
#: ``test_external_fires`` fail for ten minutes a month).
EXT_HOUR = (datetime.now(UTC).hour + 12) % 24

SCHEDULES = {
    "hourly.cron.py": """
        from backend import define_schedule

        async def work(ctx):
            pass

        hourly = define_schedule(name="hourly", cron="0 * * * *", timezone="Europe/Berlin", handler=work,
                                 description="every hour", payload={"n": 1})
    """,
    "failing.cron.py": """
        from backend import define_schedule

        def boom(ctx):
            raise RuntimeError("disk full")

        failing = define_schedule(name="failing", cron="0 0 1 1 *", timezone="UTC", handler=boom)
    """,
    "ext.cron.py": """
        from backend import define_schedule

        async def invoice(ctx):
            pass

        ext = define_schedule(name="ext", cron="0 EXT_HOUR * * *", timezone="UTC", handler=invoice, trigger="external")
    """.replace("EXT_HOUR", str(EXT_HOUR)),
    "slow.cron.py": """
        import asyncio
        from backend import define_schedule

        async def crawl(ctx):
            await asyncio.sleep(0.3)

        slow = define_schedule(name="slow", cron="0 * * * *", timezone="UTC", handler=crawl)
    """,
}
OPERATE, READ = "op-secret-token", "read-secret-token"


def write_schedules(folder: Path) -> Path:
    target = folder / "schedules"
    target.mkdir()
    for name, text in SCHEDULES.items():
        (target / name).write_text(textwrap.dedent(text))
    return target


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("remote")
    write_schedules(root)
    srv = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{root / 'state.db'}",
                       "--token", OPERATE, "--read-token", READ)
    yield srv
    assert srv.stop() == 0, srv.log_text()


@pytest.fixture(params=["embedded", "remote"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        folder = write_schedules(tmp_path)
        impl: Backend = EmbeddedBackend(Engine(discover(folder), f"sqlite:///{tmp_path / 'state.db'}"))
    else:
        impl = RemoteBackend(request.getfixturevalue("server").url, OPERATE)
    await impl.connect()
    yield impl
    await impl.close()


@pytest.fixture(params=["embedded", "remote"])
async def read_only_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        folder = write_schedules(tmp_path)
        impl: Backend = EmbeddedBackend(Engine(discover(folder), f"sqlite:///{tmp_path / 'state.db'}"), read_only=True)
    else:
        impl = RemoteBackend(request.getfixturevalue("server").url, READ)
    await impl.connect()
    yield impl
    await impl.close()


def now() -> datetime:
    return datetime.now(UTC)


async def test_connect_describes_the_connection(backend: Backend) -> None:
    info = await backend.connect()
    assert info.coordination == "single" and info.instance and not info.read_only
    assert info.kind in ("embedded", "remote")
    assert info.where.endswith("state.db") if info.kind == "embedded" else info.where.startswith("http://127.0.0.1:")


async def test_list_schedules(backend: Backend) -> None:
    snapshot = await backend.list_schedules()
    by_name = {s.name: s for s in snapshot.schedules}
    assert set(by_name) >= {"hourly", "failing", "ext"}
    hourly = by_name["hourly"]
    assert (hourly.cron, hourly.timezone, hourly.trigger, hourly.on_overlap, hourly.backfill) == (
        "0 * * * *", "Europe/Berlin", "self", "skip", "skip")
    assert (hourly.description, hourly.payload, hourly.max_runtime_s) == ("every hour", {"n": 1}, 1800.0)
    assert hourly.next_fire_at is not None and hourly.next_fire_at.minute == 0
    assert timedelta(0) < hourly.next_fire_at - snapshot.now <= timedelta(hours=1)
    assert by_name["ext"].trigger == "external" and by_name["ext"].next_fire_at is None
    assert abs(snapshot.now - now()) < timedelta(seconds=30)


async def test_upcoming(backend: Backend) -> None:
    slots = await backend.upcoming("hourly", 5)
    assert len(slots) == 5 and all(b - a == timedelta(hours=1) for a, b in zip(slots, slots[1:], strict=False))


async def test_run_now_and_wait(backend: Backend) -> None:
    run = await backend.run_now("hourly")
    assert (run.name, run.trigger, run.coordination_outcome) == ("hourly", "manual", "manual")
    done = await backend.wait_run(run.id)
    assert done.status == "succeeded" and done.duration_ms is not None
    assert (await backend.get_run(run.id)).status == "succeeded"
    page = await backend.list_runs("hourly", limit=50)
    assert run.id in [r.id for r in page.runs]


async def test_a_failing_run_carries_its_error(backend: Backend) -> None:
    run = await backend.run_now("failing")
    done = await backend.wait_run(run.id)
    assert (done.status, done.error_tag, done.error_message) == ("failed", "RuntimeError", "disk full")


async def test_runs_are_paged_by_keyset(backend: Backend) -> None:
    end = now().replace(minute=0, second=0, microsecond=0) - timedelta(days=30)
    progress = await backend.start_backfill("hourly", end - timedelta(hours=7), end)
    assert progress.total == 7
    progress = await backend.wait_backfill(progress.id)
    assert (progress.state, progress.fired, progress.failed) == ("done", 7, 0)
    seen: list[str] = []
    before = None
    sizes = []
    while True:
        page = await backend.list_runs("hourly", limit=3, before=before)
        sizes.append(len(page.runs))
        seen += [r.id for r in page.runs]
        if page.next_before is None:
            break
        before = page.next_before
    assert len(seen) == len(set(seen)) >= 7
    assert all(size == 3 for size in sizes[:-1]) and sizes[-1] <= 3
    # Newest first by scheduled time, although the backfill wrote these old slots last.
    runs = [await backend.get_run(i) for i in seen]
    assert [(r.scheduled_at, r.id) for r in runs] == sorted(((r.scheduled_at, r.id) for r in runs), reverse=True)


async def test_last_run_is_the_newest_slot_and_manual_runs_are_shown_as_such(backend: Backend) -> None:
    end = now().replace(minute=0, second=0, microsecond=0) - timedelta(days=3)
    progress = await backend.wait_backfill((await backend.start_backfill("failing", end - timedelta(days=400), end,
                                                                       confirm=True)).id)
    assert progress.state == "done" and progress.fired >= 1
    view = {s.name: s for s in (await backend.list_schedules()).schedules}["failing"]
    assert view.last_run is None  # a backfill is manual: no self/external slot of it has run
    assert view.latest_manual is not None and view.latest_manual.trigger == "manual"
    run = await backend.wait_run((await backend.run_now("hourly")).id)
    view = {s.name: s for s in (await backend.list_schedules()).schedules}["hourly"]
    assert view.latest_manual is not None and view.latest_manual.id == run.id
    assert view.last_run is None or view.last_run.trigger != "manual"


async def test_runs_between_reads_a_window_of_several_schedules(backend: Backend) -> None:
    end = now().replace(minute=0, second=0, microsecond=0) - timedelta(days=5)
    progress = await backend.wait_backfill((await backend.start_backfill("hourly", end - timedelta(hours=6), end)).id)
    assert progress.fired == 6
    window = await backend.runs_between(["hourly", "failing"], end - timedelta(hours=4), end, limit_per_name=100)
    assert list(window) == ["hourly"]  # failing has no runs there
    slots = [r.scheduled_at for r in window["hourly"]]
    assert slots == [end - timedelta(hours=h) for h in (1, 2, 3, 4)]  # [from, to), newest first
    newest = await backend.runs_between(["hourly"], end - timedelta(hours=4), end, limit_per_name=2)
    assert [r.scheduled_at for r in newest["hourly"]] == slots[:2]
    with pytest.raises(NotFound, match="nope"):
        await backend.runs_between(["hourly", "nope"], end - timedelta(hours=1), end)
    with pytest.raises(BadInput, match="limit_per_name"):
        await backend.runs_between(["hourly"], end - timedelta(hours=1), end, limit_per_name=0)
    with pytest.raises(BadInput, match="before"):
        await backend.runs_between(["hourly"], end, end - timedelta(hours=1))


async def test_instances_are_listed_with_their_heartbeats(backend: Backend) -> None:
    info = await backend.connect()
    found = {i.name: i for i in await backend.instances()}
    assert info.instance in found
    mine = found[info.instance]
    assert mine.pid > 0 and mine.host and abs(mine.heartbeat_at - now()) < timedelta(seconds=60)
    assert mine.heartbeat_at.utcoffset() == timedelta(0)
    assert info.systems == SYSTEMS and "schedules" in SYSTEMS


async def test_a_backfill_plan_counts_the_slots_that_already_succeeded_and_can_skip_them(backend: Backend) -> None:
    end = now().replace(minute=0, second=0, microsecond=0) - timedelta(days=7)
    first = await backend.wait_backfill((await backend.start_backfill("hourly", end - timedelta(hours=3), end)).id)
    assert (first.state, first.fired) == ("done", 3)
    plan = await backend.plan_backfill("hourly", end - timedelta(hours=5), end)
    assert (plan.count, plan.already_succeeded) == (5, 3)
    skipping = await backend.wait_backfill(
        (await backend.start_backfill("hourly", end - timedelta(hours=5), end, skip_succeeded=True)).id
    )
    assert (skipping.total, skipping.fired) == (2, 2)
    assert (await backend.plan_backfill("hourly", end - timedelta(hours=5), end)).already_succeeded == 5
    with pytest.raises(Refused) as info:
        await backend.start_backfill("hourly", end - timedelta(hours=5), end, skip_succeeded=True)
    assert info.value.reason == "nothing to run"


async def test_a_running_backfill_can_be_cancelled(backend: Backend) -> None:
    end = now().replace(minute=0, second=0, microsecond=0) - timedelta(days=9)
    progress = await backend.start_backfill("slow", end - timedelta(hours=20), end)
    assert progress.total == 20
    cancelled = await backend.cancel_backfill(progress.id)
    assert cancelled.state == "cancelled" and cancelled.finished_at is not None
    assert cancelled.fired < 20 and cancelled.remaining == 20 - cancelled.fired
    final = await backend.wait_backfill(progress.id)
    # Counted again once the run in flight has ended (the ledger's count), if it had by then.
    assert final.state == "cancelled" and final.fired in (cancelled.fired, cancelled.fired + 1)
    assert (await backend.cancel_backfill(progress.id)).state == "cancelled"  # again: nothing more to do
    with pytest.raises(NotFound):
        await backend.cancel_backfill("nope")


async def test_the_running_backfill_of_a_schedule_can_be_found_from_anywhere(backend: Backend) -> None:
    """How a console finds a backfill to reopen and stop after its dialog was closed."""
    end = now().replace(minute=0, second=0, microsecond=0) - timedelta(days=11)
    assert await backend.running_backfills("slow") == []
    progress = await backend.start_backfill("slow", end - timedelta(hours=20), end)
    try:
        [found] = await backend.running_backfills("slow")
        assert (found.id, found.name, found.state, found.total) == (progress.id, "slow", "running", 20)
        assert progress.id in [p.id for p in await backend.running_backfills()]
        assert await backend.running_backfills("hourly") == []
        with pytest.raises(NotFound):
            await backend.running_backfills("nope")
    finally:
        await backend.cancel_backfill(progress.id)
    assert await backend.running_backfills("slow") == []


async def test_enable_disable_with_a_note(backend: Backend) -> None:
    view = await backend.set_enabled("hourly", False, note="vendor outage")
    assert (view.enabled, view.next_fire_at) == (False, None)
    assert view.state_note is not None and view.state_note.note == "vendor outage"
    listed = {s.name: s for s in (await backend.list_schedules()).schedules}["hourly"]
    assert not listed.enabled and listed.state_note is not None and listed.state_note.note == "vendor outage"
    view = await backend.set_enabled("hourly", True)
    assert view.enabled and view.next_fire_at is not None


async def test_backfill_plans_fire_nothing(backend: Backend) -> None:
    end = now() - timedelta(days=2)
    reversed_plan = await backend.plan_backfill("hourly", end, end - timedelta(hours=1))
    assert not reversed_plan.ok and "reversed" in (reversed_plan.refusal or "")
    big = await backend.plan_backfill("hourly", end - timedelta(days=2), end)
    assert big.count in (47, 48, 49) and big.needs_confirmation and not big.ok
    assert (await backend.plan_backfill("hourly", end - timedelta(days=2), end, confirm=True)).ok
    future = await backend.plan_backfill("hourly", end, now() + timedelta(hours=3))
    assert not future.ok and "future" in (future.refusal or "")
    huge = await backend.plan_backfill("hourly", end - timedelta(days=100), end, confirm=True)
    assert not huge.ok and "limit" in (huge.refusal or "")
    assert big.first is not None and big.last is not None and big.first < big.last


async def test_refused_backfill_says_count_and_reason(backend: Backend) -> None:
    end = now() - timedelta(days=2)
    with pytest.raises(Refused) as info:
        await backend.start_backfill("hourly", end - timedelta(days=2), end)
    assert info.value.reason == "needs confirmation" and info.value.count in (47, 48, 49)


async def test_unknowns_are_not_found(backend: Backend) -> None:
    with pytest.raises(NotFound, match="nope"):
        await backend.list_runs("nope")
    with pytest.raises(NotFound):
        await backend.run_now("nope")
    with pytest.raises(NotFound):
        await backend.set_enabled("nope", False)
    with pytest.raises(NotFound):
        await backend.get_run("01ZZZZZZZZZZZZZZZZZZZZZZZZ")
    with pytest.raises(NotFound):
        await backend.backfill_progress("nope")


async def test_bad_input(backend: Backend) -> None:
    with pytest.raises(BadInput, match="limit"):
        await backend.list_runs("hourly", limit=0)
    with pytest.raises(BadInput, match="10,000"):
        await backend.plan_backfill("hourly", now() - timedelta(days=1), now(), limit=20_000)


async def test_read_only_reads_but_may_not_act(read_only_backend: Backend) -> None:
    info = await read_only_backend.connect()
    assert info.read_only and read_only_backend.read_only
    assert (await read_only_backend.list_schedules()).schedules
    await read_only_backend.plan_backfill("hourly", now() - timedelta(days=1), now() - timedelta(hours=2))
    with pytest.raises(Forbidden):
        await read_only_backend.run_now("hourly")
    with pytest.raises(Forbidden):
        await read_only_backend.set_enabled("hourly", False)
    with pytest.raises(Forbidden):
        await read_only_backend.start_backfill("hourly", now() - timedelta(hours=3), now() - timedelta(hours=1))
    with pytest.raises(Forbidden):
        await read_only_backend.cancel_backfill("any")
    assert await read_only_backend.instances()
    await read_only_backend.runs_between(["hourly"], now() - timedelta(days=1), now())


async def test_what_the_api_asks_of_a_backend(backend: Backend) -> None:
    info = backend.info()
    assert info.coordination == "single" and info.instance
    health = await backend.health()
    assert (health.status, health.instance, health.coordination) == ("ok", info.instance, "single")
    assert abs(await backend.now() - now()) < timedelta(seconds=30)
    assert await backend.schedule_zone("hourly") == "Europe/Berlin"
    with pytest.raises(NotFound, match="nope"):
        await backend.schedule_zone("nope")


async def test_external_fires(backend: Backend) -> None:
    with pytest.raises(Refused) as info:
        await backend.fire_external("hourly")  # on its own timer
    assert info.value.reason == "not an external schedule"
    with pytest.raises(Refused) as info:
        await backend.fire_external("ext")  # its slot is twelve hours off: none is due now
    assert info.value.reason == "no slot due"
    with pytest.raises(NotFound):
        await backend.fire_external("nope")
    await backend.set_enabled("ext", False, note="incident")
    with pytest.raises(Refused, match="incident") as info:
        await backend.fire_external("ext")  # disabled: refused before anything else is looked at
    assert info.value.reason == "disabled"


async def test_ids_and_notes_that_cannot_be_are_refused_alike(backend: Backend) -> None:
    for bad in ("\x00", "nope", "01ZZZZZZZZZZZZZZZZZZZZZZZ\ud800"):
        with pytest.raises(NotFound):
            await backend.get_run(bad)
        with pytest.raises(NotFound):
            await backend.backfill_progress(bad)
        with pytest.raises(BadInput, match="before"):
            await backend.list_runs("hourly", before=bad)
    for note in ("on call\x00", "half \ud800", "\x1b[2J"):
        with pytest.raises(BadInput, match="note"):
            await backend.set_enabled("hourly", False, note=note)
    assert {s.name: s for s in (await backend.list_schedules()).schedules}["hourly"].enabled


async def test_backfill_times_out_of_range_are_bad_input(backend: Backend) -> None:
    ancient = datetime(1, 1, 2, tzinfo=UTC)
    with pytest.raises(BadInput, match="out of range"):
        await backend.plan_backfill("hourly", ancient, now() - timedelta(days=1))
    with pytest.raises(BadInput, match="out of range"):
        await backend.start_backfill("hourly", now() - timedelta(days=1), datetime(9999, 12, 31, tzinfo=UTC))


async def test_read_only_may_not_fire_external(read_only_backend: Backend) -> None:
    with pytest.raises(Forbidden):
        await read_only_backend.fire_external("ext")


async def test_the_audit_log_names_who_acted(backend: Backend) -> None:
    who = "operator" if backend.info().kind == "remote" else os_user()  # a bare token's name; the OS user
    assert backend.info().actor == who
    view = await backend.set_enabled("hourly", False, note="contract")
    assert view.state_note is not None and view.state_note.by == who
    (entry,) = (await backend.audit(limit=1)).entries
    assert (entry.actor, entry.action, entry.target) == (who, "schedule.disable", "hourly")
    assert entry.detail == {"note": "contract", "was_enabled": True}
    await backend.set_enabled("hourly", True)
    page = await backend.audit(limit=1)
    assert page.entries[0].action == "schedule.enable" and page.next_before == page.entries[0].id
    older = await backend.audit(limit=1, before=page.next_before)
    assert older.entries == [entry]
    with pytest.raises(BadInput, match="before"):
        await backend.audit(before="nope")
    with pytest.raises(BadInput, match="limit"):
        await backend.audit(limit=0)


async def test_changes_say_ready_then_what_changed(backend: Backend) -> None:
    stream = backend.changes(idle=5)
    try:
        ready = await anext(stream)
        assert ready[0].topic == "ready" and ready[0].name in ("file", "none")
        await backend.run_now("hourly")
        seen: set[tuple[str, str | None]] = set()
        async with asyncio.timeout(10):  # bounds a broken test only
            while ("runs", "hourly") not in seen:
                seen |= {(s.topic, s.name) for s in await anext(stream)}
    finally:
        assert isinstance(stream, AsyncGenerator)
        await stream.aclose()
