"""Forgetting a lost instance (the operator action ``forget_instance``): only one the fleet
judges gone loses its row, atomically with that judgement; its ``instance_lost`` alert
resolves; a live one, this instance, one that beats between the look and the delete and one
whose last burst is not recorded yet are refused and kept. On both stores, then over HTTP
and from the command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from backend import Engine, ManualClock, NotFound, Refused, open_store
from backend.alerts.notifier import AlertSettings
from backend.api.app import create_app
from backend.client.embedded import EmbeddedBackend
from backend.store import Store
from tests.servers import run_main
from tests.test_liveness import LeaseClock

LOST, HOST, PID = "web-3", "elsewhere", 4242


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Overrides conftest's: the engine and the lost instance share this store."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


async def started(make_engine: Callable[..., Engine]) -> Engine:
    engine = make_engine([], instance="web-1", alerting=AlertSettings())
    await engine.start()
    await engine.quiesce()
    return engine


async def killed_member(store: Store, clock: ManualClock, silent: timedelta = timedelta(minutes=5)) -> None:
    """A member on another host that beat ``silent`` ago and never again (SIGKILL, OOM)."""
    await store.heartbeat(LOST, HOST, PID, clock.now() - silent)


async def registered(engine: Engine) -> set[str]:
    return {i.name for i in await engine.instances()}


async def test_a_lost_member_is_forgotten_audited_and_its_alert_resolves(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    engine = await started(make_engine)
    await killed_member(engine.store, clock)
    await engine.alerts.evaluate()
    firing = {a.key for a in (await engine.alerts.page()).alerts if a.state == "firing"}
    assert f"instance_lost:{LOST}" in firing

    clock.advance(1)  # (a transition needs a later time than the one before: well within the interval)
    was = await engine.forget_instance(LOST)

    assert (was.name, was.host, was.pid) == (LOST, HOST, PID)
    assert await registered(engine) == {"web-1"}
    entry = (await engine.audit.list(limit=5)).entries[0]
    assert entry.detail is not None
    assert (entry.action, entry.target, entry.detail["pid"], entry.detail["host"]) == ("instance.forget", LOST, PID, HOST)
    assert "has not sent a heartbeat since" in entry.detail["why"]
    # The forget asked the evaluation loop for a round now: the page resolves without waiting
    # for the next interval (15 s; the clock moved 1 s).
    await engine.quiesce()
    alerts = {a.key: a.state for a in (await engine.alerts.page(resolved=True)).alerts}
    assert alerts[f"instance_lost:{LOST}"] == "resolved"


async def test_a_live_instance_this_one_and_an_unknown_name_are_refused_and_nothing_is_deleted(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    engine = await started(make_engine)
    await killed_member(engine.store, clock, silent=timedelta(seconds=4))  # beat 4 s ago: alive
    with pytest.raises(Refused, match=r'instance "web-3" is alive as far as the fleet can tell: its last heartbeat was 4s ago'):
        await engine.forget_instance(LOST)
    with pytest.raises(Refused, match="is the one answering"):
        await engine.forget_instance("web-1")
    with pytest.raises(NotFound, match='no instance named "web-9"'):
        await engine.forget_instance("web-9")
    assert await registered(engine) == {"web-1", LOST}
    # Silent past the take-over window (30 s): judged gone, as a member judges it.
    clock.advance(30)
    await engine.forget_instance(LOST)
    assert await registered(engine) == {"web-1"}


async def test_an_instance_that_beats_between_the_look_and_the_delete_is_kept(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """A frozen process thawing just as the operator confirms: its heartbeat lands after the
    engine judged it gone and before the delete, which then deletes nothing."""
    engine = await started(make_engine)
    await killed_member(engine.store, clock)
    store = engine.store
    marks = store.starting_marks

    async def thawed_meanwhile() -> dict[str, datetime]:
        await store.heartbeat(LOST, HOST, PID, clock.now())
        return await marks()

    store.starting_marks = thawed_meanwhile  # type: ignore[method-assign]
    with pytest.raises(Refused, match="beat again just now"):
        await engine.forget_instance(LOST)
    assert await registered(engine) == {"web-1", LOST}


async def test_a_dead_instance_whose_last_burst_is_not_recorded_yet_is_kept(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Its burst mark is on its row: deleting it would lose the runs a sweep records from it."""
    engine = await started(make_engine)
    await killed_member(engine.store, clock)
    await engine.store.mark_starting(LOST, clock.now() - timedelta(minutes=5))
    engine.registry.due_at = lambda slot: []  # (its burst stays unrecorded: nothing was due)
    with pytest.raises(Refused, match="has yet to record"):
        await engine.forget_instance(LOST)
    assert LOST in await registered(engine)


async def test_forgetting_over_http_answers_the_instance_404_and_409_as_json(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    engine = await started(make_engine)
    await killed_member(engine.store, clock)
    await engine.store.heartbeat("web-2", "elsewhere", 4343, clock.now())  # alive
    app = create_app(EmbeddedBackend(engine), token="T", read_token="R")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://schedtui.test") as http:
        operator = {"Authorization": "Bearer T"}
        reader = (await http.delete(f"/inspect/instances/{LOST}", headers={"Authorization": "Bearer R"}))
        assert reader.status_code == 403
        alive = await http.delete("/inspect/instances/web-2", headers=operator)
        assert alive.status_code == 409 and "is alive as far as the fleet can tell" in alive.json()["error"]["message"]
        unknown = await http.delete("/inspect/instances/nobody", headers=operator)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
        done = await http.delete(f"/inspect/instances/{LOST}", headers=operator)
        assert done.status_code == 200, done.text
        assert (done.json()["name"], done.json()["pid"]) == (LOST, PID)
    assert await registered(engine) == {"web-1", "web-2"}


async def test_the_cli_asks_for_yes_then_forgets_and_refuses_a_live_one_on_one_line(
    store_url: str, tmp_path: Path
) -> None:
    store = open_store(store_url)
    await store.open()
    try:  # on the real clock: the command judges by it
        now = datetime.now(UTC)
        await store.heartbeat(LOST, HOST, PID, now - timedelta(minutes=5))
        await store.heartbeat("web-2", HOST, 4343, now)
    finally:
        await store.close()
    asked = run_main(tmp_path, "instances", "forget", LOST, "--store", store_url)
    assert asked.returncode == 2 and asked.stdout == "", asked
    assert asked.stderr.count("\n") == 1 and f'Forget instance "{LOST}"?' in asked.stderr and "add --yes" in asked.stderr
    alive = run_main(tmp_path, "instances", "forget", "web-2", "--yes", "--store", store_url)
    assert alive.returncode == 3 and alive.stderr.count("\n") == 1, alive
    assert 'instance "web-2" is alive as far as the fleet can tell' in alive.stderr
    done = run_main(tmp_path, "instances", "forget", LOST, "--yes", "--store", store_url)
    assert done.returncode == 0, done
    assert done.stdout.startswith(f"instance {LOST} forgotten (pid {PID} on {HOST}, last heartbeat ")
    listed = run_main(tmp_path, "instances", "--json", "--store", store_url)
    names = {i["name"] for i in json.loads(listed.stdout)}
    assert LOST not in names and "web-2" in names


async def test_an_instance_whose_own_lease_lapsed_judges_nobody_gone(
    make_engine: Callable[..., Engine], clock: ManualClock
) -> None:
    """Cut off or frozen past its bound, its view of the others' silence says nothing: it
    refuses, as its sweep takes no work over then, and the row stays."""
    lease_clock = LeaseClock()
    engine = make_engine([], instance="web-1", lease_clock=lease_clock, exit_when_lease_lapses=False)
    await engine.start()
    await engine.quiesce()
    await killed_member(engine.store, clock)
    lease_clock.now += 21
    engine.lease.check()
    with pytest.raises(Refused, match=r'instance "web-3" cannot be judged gone by this instance now'):
        await engine.forget_instance(LOST)
    assert LOST in await registered(engine)
