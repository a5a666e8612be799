"""Handlers that run in a process of their own (``define_schedule(..., isolation="process")``).

A sync handler that hangs cannot be stopped inside the engine's process (Python cannot
kill a thread), and one that burns CPU, or an async one that blocks the loop, stalls every
other schedule. Such a handler can run in a child process instead: the child imports the
definitions file again, finds the schedule by name, calls its handler with the run's
context (sync or async) and reports how it ended on its stdout as one JSON line. The
watchdog then really stops it: past the deadline the child's whole process group is
killed. It costs a Python start (tens of milliseconds) per run, so it suits work that runs
for seconds or more.

:func:`child_main` is the child (:data:`CHILD`): it reads ``{file, schedule, context}`` on stdin.
The handler's prints and its log records (the child logs at ``$SCHEDTUI_LOG_LEVEL``, INFO by
default) go to the child's stderr, which the engine reads as it comes, into the run's log
(see :mod:`backend.observability.capture`); its last part also says why a child that died
without a result did.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import inspect
import json
import logging
import os
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from backend.observability.capture import CURRENT, log_formatter

__all__ = ["IsolatedFailure", "run_isolated"]

#: The last part of a dead child's stderr kept in the run's error.
_STDERR_TAIL = 2000
#: How long, once the handler's process has ended, its stderr is read on (what is still
#: on its way) when a process it started in a session of its own holds it open.
LEFTOVER_OUTPUT_S = 1.0
#: How long the handler's process has, once it has reported how the handler ended, to exit
#: (its atexit hooks, its interpreter's end) before its process group is stopped.
EXIT_AFTER_REPORT_S = 2.0


class IsolatedFailure(Exception):
    """How a handler failed in its process: its exception's class, message and traceback,
    or the way the process ended (tag ``process_exit``)."""

    def __init__(self, tag: str, message: str, trace: str | None = None) -> None:
        super().__init__(message)
        self.tag = tag
        self.message = message
        self.trace = trace


def _package_root() -> str:
    """The folder that holds the ``backend`` package (site-packages, or a checkout)."""
    return str(Path(__file__).resolve().parents[2])


class _Exits(asyncio.subprocess.SubprocessStreamProtocol):
    """The child's pipes, and :attr:`exited` set when the process itself has exited.
    (``Process.wait()`` also waits for the pipes to close, which a process the handler
    started and left running holds open as long as it lives.)"""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def run_isolated(spec: dict[str, Any]) -> Any:
    """Run the handler ``spec`` names in a child process; its return value, or
    :class:`IsolatedFailure`. Cancelling this kills the child's process group. The run
    ends with the handler's process: what that left running in its process group is
    stopped then (a daemon meant to outlive it starts a session of its own)."""
    # The child imports as this process does: its import path is this one's (a folder the
    # application put there at run time too), and the folder of ``backend`` comes last,
    # where it shadows nothing, for the child to find it before it has read the spec.
    spec = {**spec, "path": list(sys.path)}
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Exits(loop),
        sys.executable,
        "-c",
        CHILD,
        _package_root(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: killed with everything it started
    )
    process = asyncio.subprocess.Process(transport, protocol, loop)
    capture = CURRENT.get()
    err_tail = ""

    async def read_stderr() -> None:
        nonlocal err_tail
        assert process.stderr is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while chunk := await process.stderr.read(65536):
            text = decoder.decode(chunk)
            if capture is not None:
                capture.write(text)
            err_tail = (err_tail + text)[-_STDERR_TAIL:]

    async def talk() -> bytes:
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a child that died at once
            process.stdin.write(json.dumps(spec).encode())
            await process.stdin.drain()
            process.stdin.close()
        # The report is one line, read to its end, not to the pipe's: a process the handler
        # forked holds the pipe open as long as it lives (a forked descriptor is inherited).
        out = b""
        while not out.endswith(b"\n") and (chunk := await process.stdout.read(65536)):
            out += chunk
        return out

    reading = asyncio.ensure_future(read_stderr())
    try:
        out = await talk()
        ended = True
        if out:
            # Reported: what is left is its exit. An atexit hook that sleeps, or a forked
            # helper, held the run open past max_runtime, which failed a run that had succeeded.
            try:
                await asyncio.wait_for(protocol.exited.wait(), EXIT_AFTER_REPORT_S)
            except TimeoutError:
                ended = False
        else:
            await protocol.exited.wait()
        # What it left running in its group held the run open (its inherited stderr never
        # closed) until it exited, and past max_runtime failed a run that had succeeded.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
            if capture is not None and not ended:
                capture.write(f"schedtui: the handler's process had not exited {EXIT_AFTER_REPORT_S:g}s after its "
                              "result (an atexit hook?); it was stopped, with what it started\n")  # fmt: skip
            elif capture is not None:
                capture.write("schedtui: the handler's process ended leaving processes it started running "
                              "in its process group; they were stopped with it\n")  # fmt: skip
        if not ended:
            await protocol.exited.wait()
        # A daemon in a session of its own may hold that stderr on: its output is not the run's.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), LEFTOVER_OUTPUT_S)
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await protocol.exited.wait()
        raise
    finally:
        reading.cancel()
        transport.close()  # (the pipes: a daemon it left holds its end of stderr, not ours)
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if isinstance(report, dict) and report.get("ok") is True:
        return report.get("value")
    if isinstance(report, dict) and report.get("ok") is False:
        raise IsolatedFailure(str(report["tag"]), str(report["message"]), report.get("traceback"))
    code = process.returncode
    how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"code {code}"
    tail = err_tail.strip()
    raise IsolatedFailure("process_exit", f"the handler's process exited with {how} without a result", tail or None)


# ---------------------------------------------------------------------------------------
# the child
# ---------------------------------------------------------------------------------------
def _context(data: dict[str, Any]) -> Any:
    from backend.schedules import RunContext

    def when(key: str) -> datetime:
        return datetime.fromisoformat(str(data[key]).replace("Z", "+00:00"))

    return RunContext(
        name=data["name"],
        run_id=data["run_id"],
        scheduled_at=when("scheduled_at"),
        fired_at=when("fired_at"),
        trigger=data["trigger"],
        payload=data.get("payload"),
        deadline=when("deadline"),
    )


#: How the child starts. Not ``-m backend.runtime.isolated``: importing ``backend`` imports
#: this module first, so runpy ran it a second time as ``__main__`` and said so, a
#: RuntimeWarning that began every isolated run's log.
CHILD = "import sys; sys.path.append(sys.argv[1]); from backend.runtime.isolated import child_main; sys.exit(child_main())"


def child_main() -> int:
    # The handler's own prints must not mix with the report: they go to stderr.
    report_to = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _log_to_stderr()
    try:
        from backend.definitions import load_file
        from backend.schedules import Schedule

        spec = json.loads(sys.stdin.read())
        path = spec.get("path")
        if isinstance(path, list):
            sys.path[:] = [*path, *(entry for entry in sys.path if entry not in path)]
        found = [item for item in load_file(Path(spec["file"])) if isinstance(item, Schedule)]
        schedule = next((s for s in found if s.name == spec["schedule"]), None)
        if schedule is None:
            raise LookupError(f'{spec["file"]} no longer defines the schedule "{spec["schedule"]}"')
        value = schedule.handler(_context(spec["context"]))
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = None
        report: dict[str, Any] = {"ok": True, "value": value}
    except BaseException as exc:  # noqa: BLE001 - reported to the engine, which records it
        from backend.errors import describe_exception

        tag, message, trace = describe_exception(exc)
        report = {"ok": False, "tag": tag, "message": message, "traceback": trace}
    report_to.write(json.dumps(report) + "\n")
    report_to.flush()
    return 0


def _log_to_stderr() -> None:
    """The handler's log records go to stderr (the run's log), formatted as the engine's capture does."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        root.setLevel(os.environ.get("SCHEDTUI_LOG_LEVEL", "INFO").upper())
    except ValueError:
        root.setLevel(logging.INFO)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable

