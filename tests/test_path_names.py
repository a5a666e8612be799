"""Every valid name reaches its route: names that an HTTP path could misread, sent by the
remote client (what the CLI's and the console's ``--url`` use) to a real ``schedtui serve``.

A lock name may hold "/" ("a/b", "x/release", "/"); a schedule, queue, durable function or
signal may be named "." or "..", which a client resolves as a step up the path unless it
escapes them. Each action must reach the thing it names, never "no route" (or another
route)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from backend import NotFound, connect
from backend.client.remote import RemoteBackend
from tests.servers import Server, cli_env, start_server

OPERATE = "op-names-token"
DEFINITIONS = """
    from backend import define_durable, define_queue, define_schedule

    async def work(ctx):
        pass

    async def deliver(job):
        pass

    async def waits(ctx, input):
        return await ctx.wait_for("..", timeout=3600)

    up = define_schedule(name="..", cron="0 * * * *", timezone="UTC", handler=work)
    here = define_schedule(name=".", cron="* * * * *", timezone="UTC", handler=work, trigger="external")
    queue = define_queue(name="..", handler=deliver)
    function = define_durable(name="..", handler=waits)
"""
LOCK_NAMES = ["a/b", "x/release", "/", "a/../b", ".."]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("names")
    (root / "schedules").mkdir()
    (root / "schedules" / "names.cron.py").write_text(textwrap.dedent(DEFINITIONS))
    srv = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{root / 'state.db'}", "--token", OPERATE)
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()


@pytest.fixture
async def remote(server: Server) -> AsyncIterator[RemoteBackend]:
    backend = RemoteBackend(server.url, OPERATE)
    await backend.connect()
    yield backend
    await backend.close()


def store_of(server: Server) -> str:
    return f"sqlite:///{server.log.parent / 'state.db'}"


async def test_schedules_named_with_dots(remote: RemoteBackend) -> None:
    assert len(await remote.upcoming("..", 2)) == 2
    assert (await remote.run_now("..")).name == ".."
    assert not (await remote.set_enabled("..", False, note="dots")).enabled
    assert (await remote.set_enabled("..", True)).enabled
    now = await remote.now()
    assert (await remote.plan_backfill("..", now - timedelta(hours=3), now)).count == 3
    fired = await remote.fire_external(".")
    assert fired.run is not None and fired.run.name == "."
    created = await remote.create_schedule({"name": "...", "cron": "0 * * * *", "timezone": "UTC", "queue": ".."})
    assert created.name == "..."
    assert (await remote.update_schedule("...", {"description": "three dots"})).description == "three dots"
    await remote.delete_schedule("...")
    assert "..." not in {s.name for s in (await remote.list_schedules()).schedules}


async def test_a_queue_named_with_dots(remote: RemoteBackend) -> None:
    assert (await remote.set_queue_paused("..", True)).paused
    first = await remote.send_job("..", 1, delay=3600)
    second = await remote.send_job("..", 2, delay=3600)
    assert {j.id for j in (await remote.list_jobs("..")).jobs} >= {first.id, second.id}
    assert await remote.cancel_job("..", first.id)
    await remote.delete_job("..", second.id)
    with pytest.raises(NotFound, match=f'no job with id "{second.id}" in queue ".."'):
        await remote.retry_job("..", second.id)  # the route was reached: the job is gone
    assert not (await remote.set_queue_paused("..", False)).paused


async def test_a_durable_function_and_a_signal_named_with_dots(remote: RemoteBackend) -> None:
    started = await remote.start_execution("..", None)
    assert (await remote.get_execution(started.id)).function == ".."
    signalled = await remote.signal_execution(started.id, "..", {"ok": True})
    assert (signalled.name, signalled.duplicate) == ("..", False)


async def test_every_lock_name_is_released_remotely(server: Server, remote: RemoteBackend) -> None:
    async with connect(store_of(server), instance="holder:1") as st:
        for name in LOCK_NAMES:
            assert await st.locks.acquire(name, ttl=300) is not None, name
        for name in LOCK_NAMES:
            done = await remote.release_lock(name)
            assert (done.released, done.lock.name, done.lock.holder) == (True, name, "holder:1"), name


async def test_the_cli_releases_a_lock_whose_name_holds_a_slash(server: Server, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(OPERATE)
    argv = [sys.executable, "-m", "console.cli", "locks", "release", "team/nightly", "--yes",
            "--url", server.url, "--token-file", str(tmp_path / "token")]  # fmt: skip
    async with connect(store_of(server), instance="holder:2") as st:
        assert await st.locks.acquire("team/nightly", ttl=300) is not None
        done = await asyncio.to_thread(
            subprocess.run, argv, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('lock "team/nightly" released (was held by holder:2'), done.stdout
