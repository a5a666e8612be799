"""``schedtui serve`` as a process and as a server: a taken port, slow clients, the body
timeout, and what reaches its log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import Engine, Run, define_schedule, open_store
from backend.api.app import create_app
from backend.api.server import MAX_BODY_PIECES, MIN_PIECE_BYTES, STOP_WITHIN, serve
from backend.client.embedded import EmbeddedBackend
from backend.ids import IdFactory
from tests.servers import cli_env, poll, start_server, until
from tests.test_cli import refusing, write_tree

EVERY_MINUTE = """
    from pathlib import Path
    from backend import define_schedule

    def work(ctx):
        with open(Path(__file__).resolve().parent.parent / "fired.log", "a") as f:
            f.write(ctx.scheduled_at.isoformat() + "\\n")

    minutely = define_schedule(name="minutely", cron="* * * * *", timezone="UTC", handler=work, backfill="all")
"""


async def _seed_and_count(url: str, seed: bool) -> int:
    """Record one run 10 minutes ago (so that catch-up has slots to fire); count the runs."""
    store = open_store(url)
    await store.open()
    try:
        if seed:
            at = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
            run = Run(id=IdFactory(lambda: at)(), name="minutely", scheduled_at=at, status="succeeded", trigger="self",
                      coordination_outcome="single", instance="earlier", fired_at=at, finished_at=at)  # fmt: skip
            store.save_runs([run])
            await store.flush()
        return len(await store.list_runs("minutely", limit=100))
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_taken_port_fails_at_once_and_fires_nothing(tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "minutely.cron.py").write_text(textwrap.dedent(EVERY_MINUTE))
    url = f"sqlite:///{tmp_path / 'state.db'}" if kind == "sqlite" else request.getfixturevalue("pg_url")
    assert asyncio.run(_seed_and_count(url, seed=True)) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "console.cli", "serve", "--schedules", "schedules", "--store", url, "--port", str(port)],
            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == f"schedtui: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "Traceback" not in done.stderr and "starting" not in done.stderr  # the engine never started
    assert not (tmp_path / "fired.log").exists()  # catch-up fired nothing
    assert asyncio.run(_seed_and_count(url, seed=False)) == 1


@pytest.mark.parametrize("how", ["full disk", "reader gone"])
def test_a_stdout_that_refuses_the_serving_line_loses_the_line_not_the_server(tmp_path: Path, how: str) -> None:
    """``schedtui serve --port 0 >/dev/full`` (a journal on a full disk, a reader gone): the
    line ``schedtui: serving URL`` raised and serve died at start (found by an outside
    attack). It is lost, the log says so once, and the server serves until stopped."""
    (tmp_path / "schedules").mkdir()
    log = tmp_path / "serve.log"
    with refusing(how) as fd, log.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "serve", "--store", f"sqlite:///{tmp_path / 'state.db'}", "--port", "0"],
            cwd=tmp_path, env=cli_env(), stdout=fd, stderr=err,
        )  # fmt: skip
    try:
        url = poll(lambda: re.search(r"API listening on (\S+)", log.read_text()), timeout=30, what="the API").group(1)
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    said = log.read_text()
    assert said.count(f"could not write `schedtui: serving {url}` to stdout") == 1, said
    assert "Traceback" not in said and "Exception ignored" not in said, said


# ---------------------------------------------------------------------------------------
# slow clients
# ---------------------------------------------------------------------------------------
@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """A real server on a loopback port, with a 0.3 s head deadline and body timeout."""
    schedule = define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=print)
    backend = EmbeddedBackend(Engine([schedule], f"sqlite:///{tmp_path / 'state.db'}", shutdown_grace=0))
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.ensure_future(
        serve(backend, port=0, stop=stop, head_timeout=0.3, body_timeout=0.3, on_ready=ready.set_result)
    )
    url = await asyncio.wait_for(ready, 30)
    host, _, port = url.removeprefix("http://").rpartition(":")
    yield host, int(port)
    stop.set()
    await task


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded for a broken test)."""
    return await asyncio.wait_for(reader.read(), timeout=15)


async def test_a_client_stalling_in_its_request_head_is_cut_off(running: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*running)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # the head never ends
    await writer.drain()
    assert await _closed_by_server(reader) == b""
    writer.close()


async def test_a_keep_alive_client_stalling_in_its_next_head_is_cut_off(running: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*running)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=15)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    body = await asyncio.wait_for(reader.readexactly(length), timeout=15)
    assert head.startswith(b"HTTP/1.1 200") and b'"status":"ok"' in body
    writer.write(b"GET /healthz HTTP/1.1\r\nHo")  # the next request stalls
    await writer.drain()
    assert await _closed_by_server(reader) == b""
    writer.close()


async def test_a_body_that_does_not_arrive_is_408(running: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*running)
    writer.write(
        b"POST /inspect/schedules/s/disable HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{\"note\": "
    )
    await writer.drain()
    answer = await _closed_by_server(reader)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    writer.close()


def _chunked(method: str, path: str, pieces: list[bytes]) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    return head + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


async def _answer(running: tuple[str, int], request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*running)
    writer.write(request)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=15)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    body = await asyncio.wait_for(reader.readexactly(length), timeout=15)
    writer.close()
    return head + body


async def test_a_body_in_too_many_small_pieces_is_refused_before_it_costs_the_loop(running: tuple[str, int]) -> None:
    """h11 parses every chunk on the engine's loop, read by the route or not: 65,000 chunks
    of one byte cost it 0.4 s."""
    refused = await _answer(running, _chunked("POST", "/inspect/schedules/s/disable", [b" "] * (MAX_BODY_PIECES + 1)))
    assert refused.startswith(b"HTTP/1.1 400") and b"connection: close" in refused.lower()
    error = json.loads(refused.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "too_many_pieces" and f"more than {MAX_BODY_PIECES} pieces" in error["message"]
    ignored = await _answer(running, _chunked("GET", "/inspect/info", [b" "] * 65_000))  # a body no route reads
    assert ignored.startswith(b"HTTP/1.1 400") and b"too_many_pieces" in ignored
    async with httpx.AsyncClient(base_url=f"http://{running[0]}:{running[1]}") as http:
        [schedule] = (await http.get("/inspect/schedules")).json()["schedules"]
        assert schedule["enabled"]  # the refused disable did nothing
    # What real clients send passes: up to the bound, and larger pieces beyond it.
    assert (await _answer(running, _chunked("POST", "/inspect/schedules/s/disable", [b" "] * MAX_BODY_PIECES))).startswith(
        b"HTTP/1.1 200"
    )
    # (Such a body is over this route's 64 KiB: refused for its size, as the large routes' are not.)
    large = await _answer(running, _chunked("POST", "/inspect/schedules/s/enable", [b" " * MIN_PIECE_BYTES] * (MAX_BODY_PIECES + 10)))
    assert large.startswith(b"HTTP/1.1 413") and b"too_large" in large


async def test_requests_pipelined_on_one_connection_share_its_bound_of_pieces(running: tuple[str, int]) -> None:
    """Counted by request, a client pipelining requests of 1,000 one-byte chunks each on one
    connection never met the bound: eight such connections made a 1-second schedule fire
    0.4 s late (an outside attack). The bound is the connection's (each request's first
    piece free: a client's bodies in one piece each never meet it)."""
    reader, writer = await asyncio.open_connection(*running)
    writer.write(_chunked("GET", "/inspect/info", [b" "] * 600) * 3)
    await writer.drain()
    answers = await _pipelined_answers(reader, 3)
    writer.close()
    assert answers[0].startswith(b"HTTP/1.1 200") and answers[1].startswith(b"HTTP/1.1 400"), answers
    assert b"too_many_pieces" in answers[1] and len(answers) == 2
    # Bodies in one piece each, a thousand and more on one connection, pass.
    reader, writer = await asyncio.open_connection(*running)
    writer.write(_chunked("GET", "/inspect/info", [b" "]) * 1100)
    await writer.drain()
    answers = await _pipelined_answers(reader, 1100)
    writer.close()
    assert len(answers) == 1100 and all(answer.startswith(b"HTTP/1.1 200") for answer in answers)


async def _pipelined_answers(reader: asyncio.StreamReader, most: int) -> list[bytes]:
    """Each answer's status line and the start of its body, until one closes the connection."""
    answers: list[bytes] = []
    while len(answers) < most:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=15)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        answers.append(head.partition(b"\r\n")[0] + b" " + (await reader.readexactly(length))[:40])
        if b"connection: close" in head.lower():
            break
    return answers


async def test_an_absolute_form_target_is_served_as_its_path(running: tuple[str, int]) -> None:
    """RFC 9112 section 3.2.2: a server must accept ``GET http://host/path``; its authority
    is then the request's Host (what a server without tokens checks)."""
    host, port = running
    for target in (f"http://{host}:{port}/inspect/info", f"HTTP://localhost:{port}/inspect/info?"):
        answer = await _answer(running, f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 200") and b'"actor":"anonymous"' in answer, answer
    rebound = await _answer(running, f"GET http://evil.example/inspect/info HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert rebound.startswith(b"HTTP/1.1 403") and b"evil.example" in rebound


@pytest.mark.parametrize(
    "request_",
    [
        b"GET /healthz HTTP/1.1 junk\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /inspect/schedules/s/enable HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"GET /inspect/\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    ],
)
async def test_a_request_h11_cannot_parse_is_answered_in_json(running: tuple[str, int], request_: bytes) -> None:
    answer = await _answer(running, request_)
    assert answer.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in answer.lower()
    error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "bad_request" and error["message"].startswith("invalid HTTP request")


async def test_a_request_h11_cannot_parse_is_not_a_warning_in_the_log(
    running: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn logged "Invalid HTTP request received." at WARNING for each, before our JSON
    400: 3,000 malformed request lines in 3 s were 3,000 lines of the log, with no token
    needed (an outside attack)."""
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            answer = await _answer(running, b"GET / HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400"), answer
    assert [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn")] == []


@contextlib.asynccontextmanager
async def _serving_two(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """An in-process server (on the test's loop) bounded to 2 open connections."""
    schedule = define_schedule(name="s", cron="0 0 1 1 *", timezone="UTC", handler=print)
    backend = EmbeddedBackend(Engine([schedule], f"sqlite:///{tmp_path / 'state.db'}", shutdown_grace=0))
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve(backend, port=0, stop=stop, max_connections=2, on_ready=ready.set_result))
    host, _, port = (await asyncio.wait_for(ready, 30)).removeprefix("http://").rpartition(":")
    try:
        yield host, int(port)
    finally:
        stop.set()
        await task


async def test_past_max_connections_the_answer_is_json_and_nothing_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn answered text/plain and logged a WARNING for each refused request (and two
    for each Upgrade header): log volume anyone could drive."""
    async with _serving_two(tmp_path) as running:
        with caplog.at_level(logging.DEBUG, logger="uvicorn"):
            upgrade = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            assert (await _answer(running, upgrade)).startswith(b"HTTP/1.1 200")
            idle = [await asyncio.open_connection(*running) for _ in range(2)]
            for _, writer in idle:  # (a connection that has sent nothing does not count)
                writer.write(b"GET /healthz HTTP/1.1\r\n")
            await until(lambda: _accepted(running[1]) >= 2, "two connections accepted")
            refused = await _answer(running, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            for _, writer in idle:
                writer.close()
    assert refused.startswith(b"HTTP/1.1 503") and b"content-type: application/json" in refused.lower()
    error = json.loads(refused.partition(b"\r\n\r\n")[2])["error"]
    assert error == {"code": "unavailable", "message": "the server is at its limit of 2 open connections; try again shortly"}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def _accepted(port: int) -> int:
    """Connections to ``port`` on this host that its server has accepted (``/proc/net/tcp``:
    one still in the listen queue has no socket inode yet)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01" and fields[9] != "0":
            count += 1
    return count


async def test_past_twice_max_connections_no_connection_is_accepted_until_one_closes(tmp_path: Path) -> None:
    """asyncio accepted every connection at once, each with a protocol and a timer, on the
    engine's loop: 10,000 bare connects (no byte, no token) made a 1-second schedule fire
    up to 0.85 s late and the process hold 10,000 descriptors. Past twice the bound of
    open connections, the rest now wait in the system's listen queue."""
    async with _serving_two(tmp_path) as (host, port):
        bare = [await asyncio.open_connection(host, port) for _ in range(10)]  # (the system completes them)
        for _, started in bare:  # a head begun: they hold their place (see the test below for silent ones)
            started.write(b"GET /healthz HTTP/1.1\r\n")
        await until(lambda: _accepted(port) >= 4, "four connections accepted")
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        with pytest.raises(TimeoutError):  # (it cannot be accepted: four are open)
            await asyncio.wait_for(reader.read(1), 0.5)
        assert _accepted(port) == 4
        for _, idle in bare:
            idle.close()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=15)
        assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")), head  # (503 if it came before the bare ones left)
        writer.close()


async def test_connections_that_send_nothing_give_their_place_to_the_requests_of_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """600 bare connects (no byte, no token), each reopened as the server closed it, kept
    both bounds full: /healthz and the platform's external triggers were refused 503 or
    never accepted for as long as the flood went on (an outside attack). Connections that
    have sent nothing no longer count toward the bound of requests, and at the bound of
    open ones the oldest of them gives its place to the next."""
    async with _serving_two(tmp_path) as (host, port):
        with caplog.at_level(logging.DEBUG, logger="schedtui.server"):
            bare = [await asyncio.open_connection(host, port) for _ in range(12)]
            await until(lambda: _accepted(port) >= 4, "four connections accepted")
            heads = []
            for _ in range(3):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                heads.append((await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).partition(b"\r\n")[0])
                writer.close()
            evicted = 0
            for reader, _ in bare[:4]:
                evicted += await asyncio.wait_for(reader.read(1), 10) == b""
            for _, writer in bare:
                writer.close()
    assert heads == [b"HTTP/1.1 200 OK"] * 3
    assert evicted == 4  # the oldest went first
    assert "closing a connection that has sent nothing, for a new one" in caplog.text


# ---------------------------------------------------------------------------------------
# web pages in the operator's browser
# ---------------------------------------------------------------------------------------
async def test_a_server_without_tokens_refuses_what_a_web_page_sent(running: tuple[str, int]) -> None:
    """A page on any site may POST a simple request (text/plain, no preflight) to loopback,
    and a DNS-rebinding page (its own name pointed at 127.0.0.1) may read the answers."""
    host, port = running
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
        csrf = [
            {"Origin": "https://evil.example", "Content-Type": "text/plain;charset=UTF-8"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
        ]
        for headers in csrf:
            r = await http.post("/inspect/schedules/s/disable", content=b'{"note": "csrf"}', headers=headers)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (headers, r.text)
            assert "web page" in r.json()["error"]["message"]
        fired = await http.post("/inspect/schedules/s/fire", headers=csrf[0])
        assert '(from "https://evil.example")' in fired.json()["error"]["message"]
        for rebound in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "0.0.0.0", f"[::2]:{port}"):
            r = await http.get("/inspect/schedules", headers={"Host": rebound})
            assert r.status_code == 403 and f'the Host "{rebound}"' in r.json()["error"]["message"], r.text
        assert (await http.get("/healthz", headers={"Host": "evil.example"})).status_code == 403
        [schedule] = (await http.get("/inspect/schedules")).json()["schedules"]
        assert schedule["enabled"] and (await http.get("/inspect/audit")).json()["entries"] == []  # nothing was done
        for own in ("localhost", f"LOCALHOST:{port}", f"127.0.0.1:{port}", "127.1.2.3", f"[::1]:{port}", "[::1]"):
            assert (await http.get("/inspect/info", headers={"Host": own})).status_code == 200, own
        # Our clients (httpx, curl) send no Origin: they act as before, and a page's GET is no act.
        assert (await http.post("/inspect/schedules/s/disable", headers={"Sec-Fetch-Site": "same-origin"})).status_code == 200
        assert (await http.get("/inspect/info", headers={"Origin": "https://evil.example"})).status_code == 200


async def test_a_server_without_tokens_takes_the_host_it_was_bound_to(make_engine: Any) -> None:
    """``serve --host NAME`` (a name of this machine resolving to loopback): NAME is how its
    clients address it."""
    backend = EmbeddedBackend(make_engine([]))
    app = create_app(backend, host="Build-Box")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://build-box:8787") as http:
        assert (await http.get("/inspect/info")).status_code == 200
        assert (await http.get("/inspect/info", headers={"Host": "other-box:8787"})).status_code == 403


class _Exploding:
    """A backend whose get_run fails as no backend should: the API must log it, escaped."""

    read_only = False

    async def get_run(self, run_id: str) -> Any:
        raise RuntimeError("boom")


async def test_a_request_path_is_logged_escaped(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(_Exploding())  # type: ignore[arg-type]  # a stand-in backend: only get_run is asked
    # As uvicorn hands it on: the path percent-decoded, control characters and all.
    scope = {"type": "http", "method": "GET", "path": "/inspect/runs/x\nFAKE log line\x1b[2J", "raw_path": b"",
             "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http", "server": ("t", 80)}  # fmt: skip
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    with caplog.at_level(logging.ERROR, logger="schedtui.api"):
        await app(scope, receive, send)
    assert sent[0]["status"] == 500 and b'"internal"' in sent[1]["body"]
    [record] = caplog.records
    message = record.getMessage()
    assert "\n" not in message and "\x1b" not in message
    assert message == "unexpected error in GET /inspect/runs/x\\nFAKE log line\\x1b[2J"


async def fire_until_ended(http: httpx.AsyncClient, name: str) -> str:
    """Run ``name`` now through the API and wait until its run has ended; its id."""
    fired = await http.post(f"/inspect/schedules/{name}/fire")
    assert fired.status_code == 202, fired.text
    run_id: str = fired.json()["run_id"]

    async def ended() -> bool:
        return bool((await http.get(f"/inspect/runs/{run_id}")).json()["status"] != "running")

    await until(ended, f"{name}'s run to end")
    return run_id


async def test_a_system_exit_or_keyboard_interrupt_a_handlers_own_task_raises_fails_its_run_not_serve(tmp_path: Path) -> None:
    """asyncio lets ``SystemExit`` and ``KeyboardInterrupt`` out of the loop when a task or a
    callback raises them: a handler whose TaskGroup child called ``sys.exit(3)`` ended
    ``serve`` with exit code 3 (a child's KeyboardInterrupt with 130, a
    ``loop.call_soon(sys.exit, 7)`` with 7), its run left ``running`` for the next process
    to close as abandoned. The handler fails its run with it, and serve runs on."""
    write_tree(tmp_path, {"schedules/exits.cron.py": """
        import asyncio, sys
        from backend import define_schedule

        async def child_exits(ctx):
            async def child():
                sys.exit(3)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(child())

        async def child_interrupts(ctx):
            async def child():
                raise KeyboardInterrupt
            await asyncio.create_task(child())

        async def callback_exits(ctx):
            asyncio.get_running_loop().call_soon(sys.exit, 7)

        a = define_schedule(name="child-exits", cron="0 * * * *", timezone="UTC", handler=child_exits)
        b = define_schedule(name="child-interrupts", cron="0 * * * *", timezone="UTC", handler=child_interrupts)
        c = define_schedule(name="callback-exits", cron="0 * * * *", timezone="UTC", handler=callback_exits)
    """})  # fmt: skip
    names = {"child-exits": "SystemExit", "child-interrupts": "KeyboardInterrupt", "callback-exits": None}
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", "alice=op-secret")  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": "Bearer op-secret"}) as http:
            for name in names:
                for _ in range(2):
                    await fire_until_ended(http, name)
            assert (await http.get("/healthz")).status_code == 200
        assert srv.process.poll() is None, srv.log_text()
    finally:
        assert srv.stop() == 0, srv.log_text()
    said = srv.log_text()
    assert "SystemExit (3) was raised out of the event loop by a task or callback it ran" in said, said
    assert "KeyboardInterrupt (KeyboardInterrupt()) was raised out of the event loop" in said, said
    assert "SystemExit (7) was raised out of the event loop" in said, said
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        for name, tag in names.items():
            recorded = [(r.status, r.error_tag) for r in await store.list_runs(name, limit=10)]
            assert recorded == [("failed", tag) if tag else ("succeeded", None)] * 2, (name, recorded)
    finally:
        await store.close()


async def test_a_child_a_handler_forked_that_returns_into_the_engine_ends_there_and_serve_still_stops(tmp_path: Path) -> None:
    """An async handler that ``os.fork()``s and returns in the child (no ``os._exit``): the
    child ran on as a copy of serve, whose event loop shares its epoll instance with the
    parent's; as the copy wound down it took the parent's self-pipe out of it, and serve
    was deaf to SIGINT and SIGTERM for good. The child ends where its handler returns (or
    raises), saying so, and the run is the parent's alone."""
    write_tree(tmp_path, {"schedules/forks.cron.py": """
        import asyncio, os
        from backend import define_schedule

        async def forks(ctx):
            pid = os.fork()
            if pid == 0:
                if ctx.payload == "raise":
                    raise RuntimeError("failed in the child")
                return "the child's"
            _, status = await asyncio.to_thread(os.waitpid, pid, 0)
            print("child status", os.waitstatus_to_exitcode(status), flush=True)

        def forks_sync(ctx):  # (its child waited a minute on the pool's thread before)
            pid = os.fork()
            if pid == 0:
                return "the child's"
            _, status = os.waitpid(pid, 0)
            print("child status", os.waitstatus_to_exitcode(status), flush=True)

        returns = define_schedule(name="returns", cron="0 * * * *", timezone="UTC", handler=forks)
        raises = define_schedule(name="raises", cron="0 * * * *", timezone="UTC", handler=forks, payload="raise")
        sync = define_schedule(name="sync", cron="0 * * * *", timezone="UTC", handler=forks_sync)
    """})  # fmt: skip
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", "alice=op-secret")  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": "Bearer op-secret"}) as http:
            for name in ("returns", "raises", "sync"):
                run_id = await fire_until_ended(http, name)
                log = (await http.get(f"/inspect/runs/{run_id}/log")).text
                assert f"child status {1 if name == 'raises' else 0}" in log, log
    finally:
        stopped = srv.stop()  # (SIGINT: a deaf serve is killed after 15 s)
    said = srv.log_text()
    assert stopped == 0, said
    assert "its handler forked this process" in said and "and returned in the child" in said, said
    assert "and raised in the child" in said and "which ends here with exit code 1" in said, said
    assert said.count("its handler forked this process") == 3, said
    assert "was opened in process" not in said, said  # (the child's copy of the engine never used the store)
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        for name in ("returns", "raises", "sync"):
            assert [(r.status, r.error_tag) for r in await store.list_runs(name, limit=10)] == [("succeeded", None)]
    finally:
        await store.close()


async def test_a_handler_that_stops_the_event_loop_fails_nothing_and_serve_runs_on(tmp_path: Path) -> None:
    """``loop.stop()`` in a handler ended asyncio.run: every task cancelled (the request
    that fired it answered a bare 500), the process gone. The loop runs on instead, and
    the log says what happened."""
    write_tree(tmp_path, {"schedules/stops.cron.py": """
        import asyncio
        from backend import define_schedule

        async def stops(ctx):
            asyncio.get_running_loop().stop()

        stops = define_schedule(name="stops", cron="0 * * * *", timezone="UTC", handler=stops)
    """})  # fmt: skip
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", "alice=op-secret")  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": "Bearer op-secret"}) as http:
            for _ in range(4):  # it stops the loop each time; serve answers on
                fired = await http.post("/inspect/schedules/stops/fire")
                assert fired.status_code == 202, fired.text
            assert (await http.get("/healthz")).status_code == 200
        assert srv.process.poll() is None
    finally:
        assert srv.stop() == 0, srv.log_text()  # (its runs recorded by then)
    assert "the event loop was stopped by the code it ran (loop.stop() in a handler?); it runs on" in srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        assert [(r.status, r.error_tag) for r in await store.list_runs("stops", limit=10)] == [("succeeded", None)] * 4
    finally:
        await store.close()


def test_a_client_that_never_reads_its_answers_holds_no_stop(tmp_path: Path) -> None:
    """A client pipelining requests and reading nothing held a SIGTERM for as long as it
    stayed, the schedules firing on meanwhile: past STOP_WITHIN, its requests are cut."""
    write_tree(tmp_path, {"schedules/tick.cron.py": """
        from backend import define_schedule

        async def tick(ctx):
            pass

        tick = define_schedule(name="tick", cron="* * * * * *", timezone="UTC", handler=tick)
    """})  # fmt: skip
    srv = start_server(tmp_path, "--schedules", "schedules", "--store", f"sqlite:///{tmp_path / 'state.db'}",
                       "--token", "alice=op-secret")  # fmt: skip
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    reader = socket.socket()
    try:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect((host, int(port)))
        request = f"GET /openapi.json HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer op-secret\r\n\r\n".encode()
        reader.sendall(request * 300)  # ~18 MB of answers it never reads
        client_port = reader.getsockname()[1]
        seen: list[int] = []

        def stuck() -> bool:  # the answers piled up, and no more goes out: the server waits on the client
            seen.append(_send_queue(int(port), client_port))
            return len(seen) > 10 and seen[-1] > 100_000 and len(set(seen[-10:])) == 1

        poll(stuck, timeout=30, what="the server's answers to pile up", every=0.1)
        srv.process.send_signal(15)
        try:
            code = srv.process.wait(STOP_WITHIN + 25)  # (waited as long as the client stayed)
        finally:
            if srv.process.poll() is None:
                srv.process.kill()
    finally:
        reader.close()
    assert code == 0, srv.log_text()
    log = srv.log_text()
    assert f"stopping: requests still in progress after {STOP_WITHIN}s were cut short" in log, log
    assert "Traceback" not in log, log


def _send_queue(local_port: int, remote_port: int) -> int:
    """Bytes queued to send on this host's TCP connection from ``local_port`` to ``remote_port``
    (``/proc/net/tcp``: what the peer has not read)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
            return int(queues.split(":")[0], 16)
    return 0
