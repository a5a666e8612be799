"""The locks through every surface: the backend interface (embedded and remote, against a
real ``schedtui serve``), the HTTP API, and the ``schedtui locks`` verbs in real
subprocesses."""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from backend import BadInput, Forbidden, NotFound, Refused, connect
from backend.client.interface import Backend
from tests.servers import Server
from tests.test_cli import Cli, cli  # noqa: F401 - fixtures
from tests.test_contract import OPERATE, READ, backend, read_only_backend, server  # noqa: F401 - fixtures

_names = itertools.count()


def store_of(backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The SQLite store the backend under test works on (the remote server's, or this test's)."""
    if backend.info().kind == "remote":
        srv: Server = request.getfixturevalue("server")
        return f"sqlite:///{srv.log.parent / 'state.db'}"
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
async def held(backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, int]]:  # noqa: F811
    """A lock held (by another process's client) on the backend's store: (name, token)."""
    name = f"contract-{next(_names)}"
    async with connect(store_of(backend, request, tmp_path), instance="holder:1") as st:
        lease = await st.locks.acquire(name, ttl=300)
        assert lease is not None
        yield name, lease.token


async def test_locks_are_listed_with_their_holder_and_released_by_force(backend: Backend, held: tuple[str, int]) -> None:  # noqa: F811
    name, token = held
    snapshot = await backend.list_locks()
    [lock] = [lock for lock in snapshot.locks if lock.name == name]
    assert (lock.holder, lock.token, lock.state(snapshot.now)) == ("holder:1", token, "held")
    assert lock.expires_at > snapshot.now
    done = await backend.release_lock(name)
    assert done.released and (done.lock.holder, done.lock.token) == ("holder:1", token)
    again = await backend.release_lock(name)
    assert not again.released and again.lock.holder is None
    snapshot = await backend.list_locks()
    [lock] = [lock for lock in snapshot.locks if lock.name == name]
    assert (lock.holder, lock.token, lock.state(snapshot.now)) == (None, token, "free")


async def test_a_release_for_a_token_no_longer_the_locks_is_refused_and_releases_nothing(
    backend: Backend, held: tuple[str, int]
) -> None:  # noqa: F811
    """The lease an operator saw (its token) is gone: the release is a 409 naming the lock's
    holder and token now, and the lock stays held; for the current token it releases."""
    name, token = held
    with pytest.raises(Refused, match=f'lock "{name}" is held by holder:1 \\(token {token}\\) now, no longer token {token + 1}'):
        await backend.release_lock(name, if_token=token + 1)
    [lock] = [lock for lock in (await backend.list_locks()).locks if lock.name == name]
    assert (lock.holder, lock.token) == ("holder:1", token)
    done = await backend.release_lock(name, if_token=token)
    assert done.released and done.lock.token == token
    with pytest.raises(Refused, match=f"is free \\(token {token}\\) now, no longer token {token + 7}"):
        await backend.release_lock(name, if_token=token + 7)
    with pytest.raises(BadInput, match="if_token 0 is out of range \\(1-9007199254740992\\)"):
        await backend.release_lock(name, if_token=0)


async def test_unknown_and_bad_lock_names(backend: Backend) -> None:  # noqa: F811
    with pytest.raises(NotFound, match='no lock named "never-held"'):
        await backend.release_lock("never-held")
    with pytest.raises(BadInput, match="invalid lock name 'a b'"):
        await backend.release_lock("a b")


async def test_a_read_only_backend_lists_locks_but_may_not_release_them(read_only_backend: Backend) -> None:  # noqa: F811
    await read_only_backend.list_locks()
    with pytest.raises(Forbidden):
        await read_only_backend.release_lock("anything")


async def test_the_api_answers_locks_as_documented(server: Server) -> None:  # noqa: F811
    async with httpx.AsyncClient(base_url=server.url) as http:
        read = {"Authorization": f"Bearer {READ}"}
        operate = {"Authorization": f"Bearer {OPERATE}"}
        listed = await http.get("/inspect/locks", headers=read)
        assert listed.status_code == 200 and set(listed.json()) == {"now", "locks"}
        assert (await http.post("/inspect/locks/x/release", headers=read)).status_code == 403
        missing = await http.post("/inspect/locks/never-held/release", headers=operate)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        bad = await http.post("/inspect/locks/a%20b/release", headers=operate)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "name"
        paths = (await http.get("/openapi.json", headers=read)).json()["paths"]
        assert {"/inspect/locks", "/inspect/locks/{name}/release"} <= set(paths)


# ---------------------------------------------------------------------------------------
# the CLI
# ---------------------------------------------------------------------------------------
async def hold_in(cli: Cli, name: str) -> int:  # noqa: F811
    """Take a lock on the CLI's store and keep it (the lock's row outlives this client's
    process only as a held lock with a long ttl: it is not released on exit here)."""
    async with connect(cli.store, instance="web-2:77") as st:
        lease = await st.locks.acquire(name, ttl=600)
        assert lease is not None
        lease.released = True  # leave it held, as a holder that died would
        return lease.token


async def test_locks_table_json_and_forced_release(cli: Cli) -> None:  # noqa: F811
    empty = cli("locks", "--schedules", "schedules")
    assert (empty.returncode, empty.stdout) == (0, "no locks\n")
    token = await hold_in(cli, "nightly-rollup")
    table = cli.ok("locks", "--schedules", "schedules").stdout.splitlines()
    assert table[0].split() == ["NAME", "HOLDER", "TOKEN", "STATE", "EXPIRES", "LAST", "RENEWAL"]
    assert table[1].split()[:5] == ["nightly-rollup", "web-2:77", str(token), "held", "in"]
    [lock] = cli.json("locks", "--schedules", "schedules")
    assert set(lock) == {"name", "holder", "token", "acquired_at", "expires_at", "renewed_at", "state"}
    assert (lock["name"], lock["holder"], lock["token"], lock["state"]) == ("nightly-rollup", "web-2:77", token, "held")

    refused = cli("locks", "release", "nightly-rollup", "--schedules", "schedules")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "add --yes" in refused.stderr
    assert cli.json("locks", "--schedules", "schedules")[0]["state"] == "held"  # nothing released
    moved = cli("locks", "release", "nightly-rollup", "--if-token", str(token + 1), "--yes", "--schedules", "schedules")
    assert moved.returncode == 3 and moved.stderr.count("\n") == 1, moved
    assert f"held by web-2:77 (token {token}) now, no longer token {token + 1}: nothing was released" in moved.stderr
    assert cli.json("locks", "--schedules", "schedules")[0]["state"] == "held"
    done = cli.ok("locks", "release", "nightly-rollup", "--if-token", str(token), "--yes", "--schedules", "schedules")
    assert done.stdout == (
        f'lock "nightly-rollup" released (was held by web-2:77, token {token}); the next holder gets a greater token\n'
    )
    again = json.loads(cli.ok("locks", "release", "nightly-rollup", "--yes", "--json", "--schedules", "schedules").stdout)
    assert again["released"] is False and again["lock"]["state"] == "free"
    assert await hold_in(cli, "nightly-rollup") > token


def test_locks_release_of_an_unknown_or_bad_name_and_read_only(cli: Cli) -> None:  # noqa: F811
    unknown = cli("locks", "release", "nope", "--yes", "--schedules", "schedules")
    assert (unknown.returncode, unknown.stderr) == (2, 'schedtui: no lock named "nope"\n')
    bad = cli("locks", "release", "a b", "--yes", "--schedules", "schedules")
    assert bad.returncode == 2 and "invalid lock name 'a b'" in bad.stderr
    ro = cli("locks", "release", "x", "--yes", "--read-only", "--schedules", "schedules")
    assert ro.returncode == 1 and "read-only" in ro.stderr


def test_locks_over_the_remote_api(cli: Cli, server: Server) -> None:  # noqa: F811
    done = cli("locks", "--json", "--url", server.url, "--token", OPERATE, store=False)
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)
    missing = cli("locks", "release", "never-held", "--yes", "--url", server.url, "--token", OPERATE, store=False)
    assert missing.returncode == 2 and "no lock named" in missing.stderr


async def test_a_holder_name_never_reaches_the_terminal_as_a_command(cli: Cli) -> None:  # noqa: F811
    """A holder given with control characters is refused; one stored by an earlier release
    (written here behind the engine's back) is shown escaped by the table, the forced
    release's line and the audit log, never as an escape sequence, a carriage return that
    draws over the row, or a bidirectional override that reverses the rest of it."""
    evil = "evil\x1b[2J\x1b]0;pwned\x07\rX\u202eabc"
    async with connect(cli.store, instance="web-2:77") as st:
        with pytest.raises(BadInput, match="holder"):
            await st.locks.acquire("shown", holder=evil)
    token = await hold_in(cli, "shown")
    with sqlite3.connect(cli.store.removeprefix("sqlite:///")) as db:
        assert db.execute("UPDATE locks SET holder = ? WHERE name = 'shown'", (evil,)).rowcount == 1
    escaped = "evil\\x1b[2J\\x1b]0;pwned\\x07\\x0dX\\u202eabc"
    table = cli.ok("locks", "--schedules", "schedules").stdout
    done = cli.ok("locks", "release", "shown", "--yes", "--schedules", "schedules").stdout
    audit = cli.ok("audit", "--schedules", "schedules").stdout
    for shown in (table, done, audit):
        assert escaped in shown and not any(c in shown for c in "\x1b\x07\r\u202e"), shown
    assert f"(was held by {escaped}, token {token})" in done
