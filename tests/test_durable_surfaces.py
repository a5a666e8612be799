"""Durable executions through every surface: the backend interface (embedded and remote,
against a real ``schedtui serve``), the HTTP API's statuses and OpenAPI document, the CLI
(exit codes, ``--json`` objects), and ``connect()``/``connect_sync()``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import BadInput, Engine, Forbidden, NotFound, Refused, TooLarge, connect, connect_sync
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import Backend
from backend.client.remote import RemoteBackend
from backend.definitions import discover_definitions
from tests.servers import Server, cli_env, poll, run_main, start_server

DEFINITIONS = """
    from backend.durable import define_durable

    async def approve(ctx, input):
        await ctx.step("prepare", lambda: input)
        return await ctx.wait_for("approval", timeout=3 * 86400)

    async def boom(ctx, input):
        await ctx.step("explode", lambda: 1 / 0, retry=False)

    release = define_durable(name="release", handler=approve)
    broken = define_durable(name="broken", handler=boom)
"""
OPERATE, READ = "op-durable-token", "read-durable-token"


def write_definitions(root: Path) -> Path:
    folder = root / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "release.durable.py").write_text(textwrap.dedent(DEFINITIONS))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("durable-remote")
    write_definitions(root)
    srv = start_server(root, "--schedules", "defs", "--store", f"sqlite:///{root / 'state.db'}",
                       "--token", OPERATE, "--read-token", READ)  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()


@pytest.fixture(params=["embedded", "remote"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    impl: Backend
    if request.param == "embedded":
        folder = write_definitions(tmp_path)
        impl = EmbeddedBackend(Engine(discover_definitions(folder), f"sqlite:///{tmp_path / 'state.db'}"))
    else:
        impl = RemoteBackend(request.getfixturevalue("server").url, OPERATE)
    await impl.connect()
    yield impl
    await impl.close()


# ---------------------------------------------------------------------------------------
# the backend interface, embedded (nothing runs here) and remote (serve runs them)
# ---------------------------------------------------------------------------------------
async def test_start_signal_cancel_and_show(backend: Backend) -> None:
    started = await backend.start_execution("release", {"version": "1.2"})
    execution = await backend.get_execution(started.id)
    assert (execution.function, execution.input) == ("release", {"version": "1.2"})
    assert execution.status in ("queued", "running", "waiting")
    sent = await backend.signal_execution(started.id, "approval", {"by": "ops"})
    assert (sent.execution_id, sent.name) == (started.id, "approval")
    page = await backend.list_executions("release", limit=100)
    assert started.id in [e.id for e in page.executions]
    other = await backend.start_execution("release")
    cancelled = await backend.cancel_execution(other.id)
    # Running: it stops at its next step boundary; a wait it reaches meanwhile is woken at
    # once to be cancelled. Either way it ends cancelled, soon.
    assert cancelled.status in ("cancelled", "running", "waiting")
    for _ in range(200):
        if cancelled.status == "cancelled":
            break
        await asyncio.sleep(0.05)
        cancelled = await backend.get_execution(other.id)
    assert cancelled.status == "cancelled"
    with pytest.raises(Refused, match="only a failed execution can be retried"):
        await backend.retry_execution(other.id)


async def test_bad_input_and_unknown_names(backend: Backend) -> None:
    with pytest.raises(NotFound, match='no durable function named "nope"'):
        await backend.start_execution("nope")
    with pytest.raises(NotFound, match='no execution with id "not-an-id"'):
        await backend.get_execution("not-an-id")
    with pytest.raises(NotFound):
        await backend.get_execution("01JD3Z6Q0V9W4C7PAXH3KJ1M2B")
    started = await backend.start_execution("release")
    with pytest.raises(BadInput, match="signal name"):
        await backend.signal_execution(started.id, "no spaces please")
    with pytest.raises(BadInput, match="input is not JSON"):
        await backend.start_execution("release", {1, 2})
    with pytest.raises(BadInput, match='status "done" is not one of'):
        await backend.list_executions(status="done")


async def test_a_failed_execution_is_retried_from_its_failed_step(server: Server) -> None:
    backend = RemoteBackend(server.url, OPERATE)
    await backend.connect()
    try:
        started = await backend.start_execution("broken")
        failed = await _until(backend, started.id, "failed")
        assert (failed.error_tag, [s.name for s in failed.steps or []]) == ("ZeroDivisionError", ["explode"])
        retried = await backend.retry_execution(started.id)
        assert retried.status in ("queued", "running", "failed")
        again = await _until(backend, started.id, "failed")
        assert any("retried by" in line.message for line in again.logs or [])
    finally:
        await backend.close()


async def _until(backend: Backend, id_: str, status: str) -> Any:
    import asyncio

    for _ in range(400):
        execution = await backend.get_execution(id_)
        if execution.status == status and not any(s.status == "running" for s in execution.steps or []):
            if status != "failed" or execution.logs and execution.logs[-1].message.startswith("failed"):
                return execution
        await asyncio.sleep(0.025)  # polling a real server: nothing to wait on
    raise AssertionError(f"execution {id_} did not become {status}")


async def test_a_read_token_reads_but_does_not_act(server: Server) -> None:
    backend = RemoteBackend(server.url, READ)
    await backend.connect()
    try:
        assert backend.read_only
        await backend.list_executions()
        with pytest.raises(Forbidden):
            await backend.start_execution("release")
    finally:
        await backend.close()


# ---------------------------------------------------------------------------------------
# the HTTP API
# ---------------------------------------------------------------------------------------
async def test_an_input_up_to_its_limit_is_taken_and_one_over_it_is_too_large(backend: Backend) -> None:
    # Over HTTP too: the body of a start may carry an input at its limit (256 KiB).
    started = await backend.start_execution("release", "x" * (256 * 1024 - 2))  # 256 KiB with its quotes
    assert (await backend.get_execution(started.id)).input == "x" * (256 * 1024 - 2)
    with pytest.raises(TooLarge, match=r"input is 262,145 bytes of JSON; the limit is 262,144 bytes \(256 KiB\)") as raised:
        await backend.start_execution("release", "x" * (256 * 1024 - 1))
    assert raised.value.field == "input"
    sent = await backend.signal_execution(started.id, "approval", "y" * (64 * 1024 - 2))
    assert not sent.duplicate
    with pytest.raises(TooLarge, match="payload is 65,537 bytes of JSON"):
        await backend.signal_execution(started.id, "other", "y" * (64 * 1024 - 1))


def test_api_answers_an_input_over_its_limit_with_413(server: Server) -> None:
    headers = {"Authorization": f"Bearer {OPERATE}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=10) as http:
        escaped = http.post("/inspect/durable/release/start", content=json.dumps({"input": "é" * 40000}).encode())
        assert escaped.status_code == 201, escaped.text  # 240,000 bytes of body, 40,002 of input
        big = http.post("/inspect/durable/release/start", json={"input": "x" * (256 * 1024)})
        error = big.json()["error"]
        assert (big.status_code, error["code"], error["field"]) == (413, "too_large", "input"), big.text
        huge = http.post("/inspect/durable/release/start", content=b"[" + b"0," * (1024 * 1024) + b"0]")
        assert huge.status_code == 413  # past the body's own limit: refused unread
        id_ = escaped.json()["id"]
        payload = http.post(f"/inspect/durable/executions/{id_}/signal/approval", json={"payload": "y" * (64 * 1024)})
        assert (payload.status_code, payload.json()["error"]["field"]) == (413, "payload")
        responses = http.get("/openapi.json").json()["paths"]["/inspect/durable/{function}/start"]["post"]["responses"]
        assert {"201", "404", "413", "422"} <= set(responses)


def test_api_statuses_and_openapi(server: Server) -> None:
    headers = {"Authorization": f"Bearer {OPERATE}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=10) as http:
        started = http.post("/inspect/durable/release/start", json={"input": {"n": 1}})
        assert started.status_code == 201 and set(started.json()) == {"id", "duplicate"}
        id_ = started.json()["id"]
        assert http.post("/inspect/durable/nope/start", json={}).status_code == 404
        assert http.post("/inspect/durable/release/start", content=b"{bad").json()["error"]["field"] == "body"
        signal = http.post(f"/inspect/durable/executions/{id_}/signal/approval", json={"payload": True})
        assert signal.status_code == 200 and signal.json() == {"execution_id": id_, "name": "approval", "duplicate": False}
        bad = http.post(f"/inspect/durable/executions/{id_}/signal/bad%20name", json={})
        assert (bad.status_code, bad.json()["error"]["field"]) == (422, "name")
        poll(lambda: http.get(f"/inspect/durable/executions/{id_}").json()["status"] == "succeeded",
             timeout=20, what="the execution to finish")  # fmt: skip
        detail = http.get(f"/inspect/durable/executions/{id_}").json()
        assert detail["output"] is True and [s["name"] for s in detail["steps"]] == ["prepare", "approval"]
        assert set(detail["steps"][0]) >= {"seq", "name", "status", "attempt", "started_at", "finished_at", "error_message"}
        refused = http.post(f"/inspect/durable/executions/{id_}/cancel")
        assert refused.status_code == 409 and "has finished (succeeded)" in refused.json()["error"]["message"]
        assert http.get("/inspect/durable/executions?status=nope").status_code == 422
        assert http.get("/inspect/durable/executions/nope").status_code == 404
        listed = http.get("/inspect/durable/executions", params={"function": "release", "limit": 1}).json()
        assert len(listed["executions"]) == 1 and "steps" not in listed["executions"][0]
        paths = http.get("/openapi.json").json()["paths"]
        assert {
            "/inspect/durable/executions",
            "/inspect/durable/executions/{execution_id}",
            "/inspect/durable/{function}/start",
            "/inspect/durable/executions/{execution_id}/signal/{name}",
            "/inspect/durable/executions/{execution_id}/cancel",
            "/inspect/durable/executions/{execution_id}/retry",
        } <= set(paths)


# ---------------------------------------------------------------------------------------
# the CLI
# ---------------------------------------------------------------------------------------
def cli(cwd: Path, *args: str, real: bool = False) -> subprocess.CompletedProcess[str]:
    """In this process (main(argv)); ``real``: the entry point in a process of its own."""
    if not real:
        return run_main(cwd, *args)
    return subprocess.run([sys.executable, "-m", "console.cli", *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_cli_embedded_and_remote(tmp_path: Path, server: Server) -> None:
    write_definitions(tmp_path)
    store = ["--schedules", "defs", "--store", f"sqlite:///{tmp_path / 'state.db'}"]
    assert cli(tmp_path, "durable", "list", *store, real=True).returncode == 2  # no store yet: refused, not created
    import asyncio

    from backend.store import open_store

    async def create() -> None:
        created = open_store(f"sqlite:///{tmp_path / 'state.db'}")
        await created.open()
        await created.close()

    asyncio.run(create())
    started = cli(tmp_path, "durable", "start", "release", "--input", '{"v": 2}', "--json", *store)
    assert started.returncode == 0, started.stderr
    id_ = json.loads(started.stdout)["id"]
    assert set(json.loads(started.stdout)) == {"id"}
    listed = cli(tmp_path, "durable", "list", "release", "--status", "queued", "--json", *store)
    assert [e["id"] for e in json.loads(listed.stdout)] == [id_]
    shown = cli(tmp_path, "durable", "show", id_, *store)
    assert shown.returncode == 0 and f"execution {id_} of release: ○ queued" in shown.stdout and "no steps yet" in shown.stdout
    signal = cli(tmp_path, "durable", "signal", id_, "approval", "--payload", "[1]", "--json", *store)
    assert json.loads(signal.stdout) == {"execution_id": id_, "name": "approval", "duplicate": False}
    cancelled = cli(tmp_path, "durable", "cancel", id_, *store)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"execution {id_}: cancelled"
    show = json.loads(cli(tmp_path, "durable", "show", id_, "--json", *store).stdout)
    assert show["error_message"] == f"cancelled by {__import__('getpass').getuser()}"
    again = cli(tmp_path, "durable", "cancel", id_, *store)
    assert (again.returncode, again.stderr.strip()) == (
        1, f"schedtui: execution {id_} has finished (cancelled); there is nothing to cancel"
    )
    for args, message in [
        (["durable", "start", "nope"], 'no durable function named "nope"'),
        (["durable", "start", "release", "--input", "{bad"], '--input "{bad" is not valid JSON'),
        (["durable", "show", "nope"], 'no execution with id "nope"'),
        (["durable", "signal", id_, "bad name"], "signal name"),
        # A byte that is not UTF-8 reaches Python as a lone surrogate: no store could keep it.
        (["durable", "start", "release", "--input", '"a\udcff"'], "input holds a lone surrogate (\\udcff)"),
    ]:
        result = cli(tmp_path, *args, *store, real="\udcff" in args[-1])  # the byte goes through the OS's argv
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result
    remote = ["--url", server.url, "--token-file", str(_token_file(tmp_path))]
    started = cli(tmp_path, "durable", "start", "release", "--json", *remote)
    assert started.returncode == 0, started.stderr
    remote_id = json.loads(started.stdout)["id"]
    shown = cli(tmp_path, "durable", "show", remote_id, *remote)
    assert shown.returncode == 0 and "release" in shown.stdout


def _token_file(folder: Path) -> Path:
    path = folder / "token"
    path.write_text(OPERATE)
    return path


# ---------------------------------------------------------------------------------------
# connect() and connect_sync()
# ---------------------------------------------------------------------------------------
async def test_connect_starts_and_signals_and_serve_runs_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    definitions = discover_definitions(write_definitions(tmp_path))
    async with connect(url, actor="web", create=True) as st:  # no definitions: it cannot check names
        started = await st.durable.start("release", {"from": "web"})
        await st.durable.signal(started.id, "approval", "yes")
        assert (await st.durable.get(started.id)).status == "queued"  # nothing runs in a client
    engine = Engine(definitions, url, shutdown_grace=0)  # the real clock, as the client's
    await engine.start()
    try:
        await engine.quiesce()
        assert (await engine.durable.get(started.id)).output == "yes"
    finally:
        await engine.stop()
    with connect_sync(url, definitions=write_definitions(tmp_path)) as sync:
        executions, _ = sync.durable.list("release")
        assert [e.id for e in executions] == [started.id]
        with pytest.raises(NotFound):
            sync.durable.start("nope")  # with definitions, names are checked
