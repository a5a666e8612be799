"""One instance name, one engine: the name is who holds work in the store.

The default name is ``hostname:pid``. A :func:`connect` client opened inside a ``serve``
process (a job handler sending a job, a web app beside its engine) went by the serving
engine's name: it recorded that instance an observer, and on closing deleted its row;
the next heartbeat round of another instance then took over, at once, every job the
serving engine was running ("instance … is no longer registered"), and ran it a second
time while the first attempt ran on."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, InUse, JobContext, ManualClock, connect, define_queue, define_schedule, open_store
from backend.model import InstanceInfo
from backend.scheduler import names
from backend.store import Membership
from tests.servers import cli_env, dead_pid, in_a_forked_child
from tests.test_liveness import LeaseClock


async def test_a_client_opened_in_a_serving_process_leaves_its_work_alone(pg_url: str, clock: ManualClock) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    attempts: list[tuple[str, Any, int]] = []

    async def slow(job: JobContext) -> None:
        attempts.append(("serving", job.payload, job.attempt))
        if job.payload == "once":
            started.set()
            await release.wait()

    async def other(job: JobContext) -> None:
        attempts.append(("other", job.payload, job.attempt))

    serving = Engine([define_queue(name="q", handler=slow)], pg_url, clock=clock, shutdown_grace=0, abandon_after=30)
    watcher = Engine([define_queue(name="q", handler=other)], pg_url, clock=clock, instance="other", shutdown_grace=0,
                     abandon_after=30)  # fmt: skip
    await serving.start()
    try:
        await serving.jobs.send("q", "once")
        await asyncio.wait_for(started.wait(), 20)  # (the bound only stops a broken test)
        await watcher.start()
        async with connect(pg_url) as client:  # the default name, in the serving process
            await client.jobs.send("q", "sent from inside")
        for _ in range(2):  # the other instance's heartbeat rounds, which take over the dead's work
            clock.advance(5)
            await asyncio.wait_for(watcher.quiesce(runs=False), 20)
            await asyncio.wait_for(serving.quiesce(runs=False), 20)
        release.set()
        await asyncio.wait_for(serving.quiesce(), 20)
        await asyncio.wait_for(watcher.quiesce(), 20)
        # (The job sent from inside is due by the real clock, which the client keeps.)
        assert attempts == [("serving", "once", 1)]  # not taken over, not run a second time
        fleet = {i.name: i.role for i in await watcher.store.fleet()}
        assert fleet[serving.instance] == "firing"  # the client went by a name of its own
        assert client.engine.instance == f"{serving.instance}/2"
    finally:
        release.set()
        await watcher.stop()
        await serving.stop()


def _default() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def test_default_names_are_distinct_while_their_engines_live(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    first = Engine([], store)
    second = Engine([], store)
    assert (first.instance, second.instance) == (_default(), f"{_default()}/2")
    async with first, second:  # both open on one store: each its own instance
        assert {i.name for i in await first.store.fleet()} == {first.instance, second.instance}
    assert Engine([], store).instance == _default()  # stopped engines let their names go


async def test_an_explicit_name_another_engine_of_the_process_holds_on_the_store_is_refused(tmp_path: Path) -> None:
    store, elsewhere = (f"sqlite:///{tmp_path / name}" for name in ("state.db", "other.db"))
    first = Engine([], store, instance="worker-1")
    async with first:
        twin = Engine([], store, instance="worker-1")
        with pytest.raises(InUse, match='the instance name "worker-1" is already used by another engine of this process'):
            await twin.open()
        async with Engine([], elsewhere, instance="worker-1"):  # another store: another fleet
            pass
    async with Engine([], store, instance="worker-1") as again:  # once the first has stopped
        assert again.instance == "worker-1"


# ---------------------------------------------------------------------------------------
# across processes: a name is held by one live process at a time
# ---------------------------------------------------------------------------------------
async def test_serve_under_the_name_of_a_live_process_on_this_host_is_refused(pg_url: str, tmp_path: Path) -> None:
    holder = Engine([], pg_url, instance="worker", shutdown_grace=0)
    async with holder:
        (tmp_path / "schedules").mkdir()
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "console.cli", "serve", "--instance", "worker", "--store", pg_url],
            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f'schedtui: the instance name "worker" is held by another live process (pid {os.getpid()} on host')
        assert "give each instance its own name (--instance)" in last
        fleet = {i.name: (i.pid, i.role) for i in await holder.store.fleet()}
        assert fleet["worker"] == (os.getpid(), "observer")  # the row is still the holder's


ELSEWHERE = "another-host#0a1b2c3d#4026531836"


async def _open_in_background(engine: Engine) -> asyncio.Task[None]:
    """The engine's open, once it waits on the clock (or has ended). Not after a while of
    real time: on a loaded machine an open still on its way then read the clock only once
    the test had moved it, and waited that much longer than the test counted on."""
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    task = asyncio.ensure_future(engine.open())

    async def waiting() -> None:
        while not task.done() and not clock.sleepers:
            await asyncio.sleep(0.01)  # (a store's answer on its way: nothing to await here)

    await asyncio.wait_for(waiting(), 20)  # (the bound only stops a broken test)
    return task


async def _advance_while_it_waits(clock: ManualClock, opening: asyncio.Task[None], seconds: int) -> None:
    """Move the clock 5 s at a time, each time until the opening waits on it again (or ends)."""

    async def parked() -> None:
        while not opening.done() and not clock.sleepers:
            await asyncio.sleep(0)

    for _ in range(seconds // 5):
        clock.advance(5)
        await asyncio.wait_for(parked(), 20)  # (the bound only stops a broken test)


async def _took_the_name(engine: Engine, other: Engine, opening: asyncio.Task[None]) -> None:
    """The opening ends with the name this process's in the store; then it stops."""
    await asyncio.wait_for(opening, 20)
    try:
        fleet = {i.name: (i.host, i.pid) for i in await other.store.fleet()}
        assert fleet["worker"] == (engine.registry.host, os.getpid())
    finally:
        await engine.stop()


async def test_a_name_last_heard_elsewhere_is_waited_for_and_refused_if_heard_again(
    store_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with connect(store_url, create=True) as other:  # a process elsewhere, by its heartbeats
        await other.engine.store.heartbeat("worker", ELSEWHERE, 1, clock.now())
        engine = Engine([], store_url, instance="worker", clock=clock, shutdown_grace=0, abandon_after=30)
        opening = await _open_in_background(engine)
        assert not opening.done()
        assert 'the instance name "worker" was last heard from pid 1 on host "another-host"' in caplog.text
        clock.advance(5)
        await other.engine.store.heartbeat("worker", ELSEWHERE, 1, clock.now())  # it is alive
        clock.advance(5)
        with pytest.raises(InUse, match='the instance name "worker" is held by another live process'):
            await asyncio.wait_for(opening, 20)
        fleet = {i.name: i.host for i in await other.engine.store.fleet()}
        assert fleet["worker"] == ELSEWHERE


async def test_a_name_silent_elsewhere_for_the_window_is_taken_and_its_runs_closed(
    store_url: str, clock: ManualClock
) -> None:
    async with connect(store_url, create=True) as other:
        await other.engine.store.heartbeat("worker", ELSEWHERE, 1, clock.now())  # then it crashed
        engine = Engine([], store_url, instance="worker", clock=clock, shutdown_grace=0, abandon_after=30)
        opening = await _open_in_background(engine)
        await _advance_while_it_waits(clock, opening, 30)
        await _took_the_name(engine, other.engine, opening)
        assert "worker" not in {i.name for i in await other.engine.store.fleet()}  # its own row, let go of


async def test_a_name_whose_holder_crashed_with_its_clock_ahead_is_taken_once_silent_for_the_window(
    pg_url: str, clock: ManualClock
) -> None:
    """Its holder's clock was five minutes ahead (it stood down for it) when it crashed;
    the replacement, on a host whose clock is right, waited for its heartbeat's stamp plus
    the window: five minutes and a half. The holder is judged by when it beat on the
    database server's clock: its stamp less the offset it recorded."""
    async with connect(pg_url) as other:
        ahead = clock.now() + timedelta(minutes=5)
        await other.engine.store.heartbeat("worker", ELSEWHERE, 1, ahead,
                                           Membership(clock_offset=300.0, clock_off=True, window=30.0))  # fmt: skip
        engine = Engine([], pg_url, instance="worker", clock=clock, shutdown_grace=0, abandon_after=30)
        opening = await _open_in_background(engine)
        await _advance_while_it_waits(clock, opening, 30)
        await _took_the_name(engine, other.engine, opening)


async def test_a_name_held_elsewhere_with_a_longer_window_is_waited_for_by_that_window(
    store_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling change of ``--abandon-after``: the name's holder elsewhere beat with a 60 s
    window. A process of 30 s takes the name once the holder has been silent for 60 s, as
    every other instance judges that holder, and says 60 s while it waits (it said 30)."""
    async with connect(store_url, create=True) as other:
        await other.engine.store.heartbeat("worker", ELSEWHERE, 1, clock.now(), Membership(window=60.0))  # then it crashed
        engine = Engine([], store_url, instance="worker", clock=clock, shutdown_grace=0, abandon_after=30)
        opening = await _open_in_background(engine)
        assert 'was last heard from pid 1 on host "another-host"' in caplog.text
        assert "waiting until it has been silent for 60s" in caplog.text
        await _advance_while_it_waits(clock, opening, 45)  # past this process's window, within the holder's
        assert not opening.done()
        await _advance_while_it_waits(clock, opening, 20)
        await _took_the_name(engine, other.engine, opening)


async def test_an_instance_whose_name_another_process_took_stops_its_work_and_leaves_that_row(
    pg_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(job: JobContext) -> None:
        started.set()
        await release.wait()

    lease_clock = LeaseClock()
    engine = Engine([define_queue(name="q", handler=slow)], pg_url, instance="worker", clock=clock,
                    shutdown_grace=0, abandon_after=30, lease_clock=lease_clock)  # fmt: skip
    await engine.start()
    try:
        await engine.jobs.send("q", 1)
        await asyncio.wait_for(started.wait(), 20)
        # A twin under this name (started while this one was frozen past the window, or at
        # the same instant) writes the row first.
        await engine.store.heartbeat("worker", ELSEWHERE, 1, clock.now() + timedelta(seconds=1))
        for _ in range(5):  # its heartbeats fail: the lease is not renewed, and lapses
            clock.advance(5)
            lease_clock.now += 5
            await asyncio.wait_for(engine.quiesce(runs=False), 20)
            await engine.store.heartbeat("worker", ELSEWHERE, 1, clock.now())  # the twin beats on
        engine.lease.check()
        assert engine.lease.lapsed
        assert "held by another live process (pid 1 on host \"another-host\"" in caplog.text
    finally:
        release.set()
        await engine.stop()
    fleet = {i.name: (i.host, i.pid) for i in await open_fleet(pg_url)}
    assert fleet["worker"] == (ELSEWHERE, 1)  # stopping left the twin's row alone


async def open_fleet(url: str) -> list[InstanceInfo]:
    store = open_store(url)
    await store.open()
    try:
        return await store.fleet()
    finally:
        await store.close()


def test_an_engine_made_before_a_fork_is_refused_in_the_child(tmp_path: Path) -> None:
    """gunicorn --preload, a multiprocessing pool: every child would go by the parent's
    default name (its pid), and take the others' work for its own."""
    engine = Engine([], f"sqlite:///{tmp_path / 'state.db'}")
    said = in_a_forked_child(engine.open)
    child = re.search(r"is opened in process (\d+)", said)
    assert child is not None, said
    assert said == (
        f"BadInput: this engine was made in process {os.getpid()} and is opened in process {child[1]} (a fork): its "
        f'default instance name, "{engine.instance}", is the first one\'s; make the engine after the fork, or give it '
        "instance=…"
    )
    assert not (tmp_path / "state.db").exists()  # refused before anything opened



class FreezesAt:
    """A store that freezes its process at a call: from the next call of ``at`` on, every
    call hangs (a SIGSTOP there) until :meth:`thaw`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.at: str | None = None
        self.reached = asyncio.Event()
        self.thawed = asyncio.Event()

    def thaw(self) -> None:
        self.at = None
        self.thawed.set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(value):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            if name == self.at:
                self.reached.set()
            if self.reached.is_set() and not self.thawed.is_set():
                await self.thawed.wait()
            return await value(*args, **kwargs)

        return call


async def test_an_instance_frozen_in_its_sweep_and_replaced_closes_none_of_the_new_holders_work(
    pg_url: str, clock: ManualClock
) -> None:
    """An instance is frozen in the middle of its sweep for an earlier process's work
    (after its heartbeat, before it reads what runs under its name), past the window, and
    a process under its name starts elsewhere in its place and runs a job. Thawed, the
    old one read the new holder's running job as its predecessor's and closed it: retried,
    it ran a second time beside its first attempt. It now judges its own name's work only
    while its lease holds, which it lost frozen."""
    attempts: list[tuple[str, int]] = []
    release = asyncio.Event()

    def handler(who: str) -> Any:
        async def handle(job: JobContext) -> None:
            attempts.append((who, job.attempt))
            await release.wait()

        return handle

    lease_a = LeaseClock()
    store_a = FreezesAt(open_store(pg_url))
    a = Engine([define_queue(name="q", handler=handler("a"))], store_a, instance="worker", clock=clock,
               shutdown_grace=0, abandon_after=30, lease_clock=lease_a)  # fmt: skip
    await a.start()
    b: Engine | None = None
    try:
        store_a.at = "running_jobs"  # its next sweep freezes there, its heartbeat written
        clock.advance(5)
        lease_a.now += 5
        await asyncio.wait_for(store_a.reached.wait(), 20)
        for _ in range(7):  # 35 s frozen: past its lease and the window
            clock.advance(5)
            lease_a.now += 5
            await asyncio.sleep(0)
        # Its replacement, elsewhere (another process, to this process's guard).
        names.let_go(store_a.where, "worker", a)
        b = Engine([define_queue(name="q", handler=handler("b"))], pg_url, instance="worker", clock=clock,
                   shutdown_grace=0, abandon_after=30)  # fmt: skip
        b.registry.host, b.registry.pid = ELSEWHERE, dead_pid()
        await b.start()
        await b.jobs.send("q", 1)
        # Its first claim: at once, or (a loaded machine) on its next round of the clock.
        for _ in range(10):
            await asyncio.wait_for(b.quiesce(runs=False), 20)
            if attempts:
                break
            clock.advance(1)
            lease_a.now += 1
        assert attempts == [("b", 1)]
        store_a.thaw()
        for _ in range(3):
            await asyncio.wait_for(a.quiesce(runs=False), 20)
            await asyncio.wait_for(b.quiesce(runs=False), 20)
            clock.advance(5)
            lease_a.now += 5
        (job,) = (await b.jobs.list_jobs("q")).jobs
        assert (job.status, job.attempt) == ("running", 1), job
        assert attempts == [("b", 1)]  # not abandoned, not run a second time
        assert a.lease.lapsed
    finally:
        release.set()
        store_a.thaw()  # else a's stop, after a failure above, hangs on its frozen store
        for engine in (b, a):
            if engine is not None:
                await engine.stop(grace=0)


async def test_an_instance_that_lost_its_name_closes_none_of_the_new_holders_runs(pg_url: str, clock: ManualClock) -> None:
    """The schedule runs' side of the same rule. An instance frozen past the window and
    replaced under its name, asked to close what the gone left running (``close_abandoned``),
    took the new holder's running run for an earlier process's and closed it as abandoned.
    (Its periodic sweep reads in its heartbeat's transaction, which is refused once the
    name is taken: only this direct call reached the rule.)"""
    release = asyncio.Event()

    async def slow(run: Any) -> None:
        await release.wait()

    def schedules() -> list[Any]:  # a yearly slot: nothing but the Run now below fires
        return [define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=slow)]

    lease_a = LeaseClock()
    store_a = FreezesAt(open_store(pg_url))
    a = Engine(schedules(), store_a, instance="worker", clock=clock, shutdown_grace=0, abandon_after=30,
               lease_clock=lease_a)  # fmt: skip
    await a.start()
    b: Engine | None = None
    try:
        store_a.at = "heartbeat_and_unfinished"  # frozen at its next round
        clock.advance(5)
        lease_a.now += 5
        await asyncio.wait_for(store_a.reached.wait(), 20)
        for _ in range(7):  # 35 s: past its lease and the window
            clock.advance(5)
            lease_a.now += 5
            await asyncio.sleep(0)
        names.let_go(store_a.where, "worker", a)
        b = Engine(schedules(), pg_url, instance="worker", clock=clock, shutdown_grace=0, abandon_after=30)
        b.registry.host, b.registry.pid = ELSEWHERE, dead_pid()
        await b.start()
        run = await b.run_now("s")
        store_a.thaw()
        await asyncio.wait_for(a.quiesce(runs=False), 20)  # its round's heartbeat: refused
        assert await a.close_abandoned() == []
        assert a.lease.lapsed
        (still,) = [r for r in await b.store.running_runs() if r.id == run.id]
        assert (still.status, still.instance) == ("running", "worker")
        release.set()
        await asyncio.wait_for(b.quiesce(), 20)
        (ended,) = [r for r in await b.store.list_runs("s", limit=10) if r.id == run.id]
        assert (ended.status, ended.error_tag) == ("succeeded", None)
    finally:
        release.set()
        store_a.thaw()  # else a's stop, after a failure above, hangs on its frozen store
        for engine in (b, a):
            if engine is not None:
                await engine.stop(grace=0)
