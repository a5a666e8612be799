"""Starting real ``schedtui serve`` processes for tests (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import pytest

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SCHEDTUI_TOKEN", None)
    env.pop("SCHEDTUI_READ_TOKEN", None)
    env.pop("SCHEDTUI_URL", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_main(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``schedtui ARGS`` in this process, through ``main(argv)``, in ``cwd`` with the
    environment a child would get (``env``, by default :func:`cli_env`'s): what it printed
    and its exit code, as ``subprocess.run`` returns them. A Python start-up costs about
    0.6 s of CPU; tests that run verbs dozens of times run them here, and leave the process
    boundary (the installed entry point, argv bytes through the OS, a process per run) to a
    few real runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_main(cwd, args, env)
    # From an async test: main's asyncio.run needs a thread without a loop; the test's loop
    # waits for it, as it would for a subprocess.
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(_run_main, cwd, args, env).result()


def _run_main(cwd: Path, args: tuple[str, ...], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    from console.cli.main import main

    # Encoded as a child's pipes are: stdout strict UTF-8 (a lone surrogate printed raises,
    # as it would there), stderr with backslash escapes.
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    with _environ(cli_env() if env is None else env), contextlib.chdir(cwd):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # as the process would end
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    out.flush()
    err.flush()
    printed = [stream.buffer.getvalue().decode("utf-8") for stream in (out, err)]
    return subprocess.CompletedProcess(["schedtui", *args], code, *printed)


async def until(condition: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    """Wait for a condition that code on this event loop (or another process) makes true:
    :func:`poll` for a test that shares the loop; ``condition`` may be a coroutine
    function. The bound only ends a broken test."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (await condition() if asyncio.iscoroutinefunction(condition) else condition()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def poll(condition: Callable[[], T | Literal[False] | None], *, timeout: float, what: str, every: float = 0.05) -> T:
    """Return ``condition()``'s first truthy value; fail after ``timeout`` seconds. For real
    processes on a real clock, where there is nothing to await."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def readline_within(stream: IO[str], timeout: float) -> str:
    """The next line of a child's pipe, or ``""`` if it ends or gives none within
    ``timeout`` seconds (a child stuck before its first line must not hold the test).
    After a timeout the reader thread stays parked on the pipe until the child is killed."""
    box: queue.Queue[str] = queue.Queue(1)
    threading.Thread(target=lambda: box.put(stream.readline()), daemon=True).start()
    try:
        return box.get(timeout=max(timeout, 0))
    except queue.Empty:
        return ""


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    log: Path

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(2)
            try:
                return self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                return self.process.wait(5)
        return self.process.returncode

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def dead_pid() -> int:
    """The pid of a process of this host that has exited (a pid nothing here runs under now)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def store_for(request: pytest.FixtureRequest, root: Path, name: str) -> str:
    """The store a fixture parametrized ``sqlite``/``postgresql`` runs on: a SQLite file in
    ``root``, or a new database ``name`` on the suite's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{root / 'state.db'}"
    return str(request.getfixturevalue("pg_server").create_database(name))


def start_server(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 20.0) -> Server:
    """``schedtui serve --port 0 …``; returns once it prints the URL it listens on."""
    log = cwd / f"serve-{time.monotonic_ns()}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=cwd,
        env=env or cli_env(),
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = readline_within(process.stdout, deadline - time.monotonic())
        if not line:  # it exited, or it has said nothing in time
            break
        if line.startswith("schedtui: serving "):
            return Server(process, line.split()[-1].strip(), log)
    process.kill()
    raise AssertionError(f"schedtui serve did not start:\n{log.read_text()}")


#: What a schedtui server's ``GET /inspect/info`` answers (backend/api/app.py), for a
#: :func:`json_server` that gets as far as the client's first read.
INSPECT_INFO = {"instance": "web-1:4242", "coordination": "single", "store_kind": "sqlite", "access": "operate",
                "actor": "alice", "now": "2026-03-02T08:00:00Z",
                "systems": ["schedules", "jobs", "durable", "locks", "audit", "alerts", "health"]}


@dataclass(frozen=True)
class Reply:
    """An answer of :func:`json_server` other than a 200 of JSON: any status, any body."""

    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"


#: What another service at the URL may answer, with what the client says came instead.
FOREIGN_ANSWERS = [
    (Reply(404, b"<!doctype html><title>404</title>"), "no JSON (text/html)"),
    (Reply(404, b'{"detail": "Not Found"}', "application/json"), "JSON that is no schedtui error"),
    (Reply(401, b'{"error": "login first"}', "application/json"), "JSON that is no schedtui error"),
    (Reply(405, b"", ""), "no JSON"),
    (Reply(200, b"hello", "text/plain"), "no JSON (text/plain)"),
]


@contextlib.contextmanager
def json_server(answer: Callable[[str, str], object]) -> Iterator[str]:
    """A real HTTP server on loopback that is not schedtui's (another service at the URL an
    operator gave, a proxy's status page): every request, whatever its method and path, is
    answered 200 with ``answer(method, path)`` as JSON, or as the :class:`Reply` it is.
    Yields its URL."""
    import http.server
    import json

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            said = answer(self.command, self.path)
            reply = said if isinstance(said, Reply) else Reply(200, json.dumps(said).encode(), "application/json")
            body = reply.body
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def in_a_forked_child(act: Callable[[], Any]) -> str:
    """Run ``act`` in a child forked now; what it raised (or ``ok``), as its class and text."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe, then ends at once
        try:
            asyncio.run(asyncio.wait_for(act(), timeout=10))
            said = "ok"
        except BaseException as exc:  # noqa: BLE001 - whatever it was, the parent asserts on it
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(child, 0)
    return said
