"""The stop signals an engine's loop handles (``backend.runtime.signals``), in processes of
their own: a fork is not made inside the test worker."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FORKS_A_CHILD_AND_TERMINATES_IT = """
import asyncio, os, signal
from backend.runtime.signals import on_stop_signals

async def main():
    stopped = []
    on_stop_signals(stopped.append, lambda: None)
    pid = os.fork()  # what multiprocessing's fork start method does in a handler
    if pid == 0:
        os.kill(os.getpid(), signal.SIGTERM)  # Process.terminate(), a pool's exit
        os._exit(3)  # (reached only if the SIGTERM did not end it)
    _, status = os.waitpid(pid, 0)
    for _ in range(5):  # (the loop reads its wake-up descriptor in its next rounds)
        await asyncio.sleep(0)
    print(os.waitstatus_to_exitcode(status), stopped)

asyncio.run(main())
"""


def test_a_child_forked_by_a_handler_and_terminated_does_not_stop_the_engine() -> None:
    """A handler that forked a child (a multiprocessing pool, ``Process.terminate()``) and
    sent it SIGTERM stopped the whole ``serve``: the child kept the loop's no-op handler and
    its wake-up descriptor, so the signal did not end the child and the parent's loop read
    it as its own (exit code 0: no supervisor started it again). The child has the signals
    as they were before the loop took them."""
    done = subprocess.run([sys.executable, "-c", FORKS_A_CHILD_AND_TERMINATES_IT], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [str(-signal.SIGTERM), "[]\n"]


def _serve_stopped(tmp_path: Path, file: str, definitions: str, ready: Callable[[], object]) -> tuple[int, str]:
    """``serve`` over one definitions file, stopped by SIGTERM once ``ready()`` returns: its
    exit code (within EXIT_WITHIN and some; without the exit watch, never) and its log."""
    from console.cli.exitwatch import EXIT_WITHIN
    from tests.servers import start_server

    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / file).write_text(definitions)
    server = start_server(tmp_path, "--schedules", "defs", "--store", f"sqlite:///{tmp_path / 'state.db'}")
    try:
        ready()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(EXIT_WITHIN + 20)
    finally:
        server.process.kill()
    return code, server.log_text()


HANGS_IN_A_THREAD = '''
import asyncio, time
from pathlib import Path
from backend import define_schedule

async def fetch(ctx):
    Path("started").touch()
    await asyncio.to_thread(time.sleep, 3600)  # a requests.get with no timeout, that never returns

fetch_job = define_schedule(name="fetch", cron="* * * * * *", timezone="UTC", handler=fetch, max_runtime=1)
'''


def test_serve_ends_once_stopped_whatever_thread_a_handler_left_hanging(tmp_path: Path) -> None:
    """A handler's ``asyncio.to_thread`` call that never returned (the watchdog failed its run;
    a thread cannot be stopped) held ``serve`` after its stop for ever: closing the loop, and
    the interpreter's exit, join the executor's threads; further SIGTERMs changed nothing. It
    ends :data:`~console.cli.exitwatch.EXIT_WITHIN` seconds after the stop, naming them."""
    from tests.servers import poll

    code, log = _serve_stopped(tmp_path, "fetch.cron.py", HANGS_IN_A_THREAD, lambda: poll(
        lambda: (tmp_path / "started").exists(), timeout=20, what="the handler to start"))  # fmt: skip
    assert code == 0, log
    assert "thread(s) a handler left running still hold the process (asyncio_0" in log, log


HANGS_AT_EXIT = '''
import atexit, time
from backend import define_schedule

def flush_telemetry():
    time.sleep(3600)  # a library's flush at exit, with no timeout, to a collector that never answers

atexit.register(flush_telemetry)

def tick(ctx):
    pass

tick_job = define_schedule(name="tick", cron="0 0 1 1 *", timezone="UTC", handler=tick)
'''


def test_serve_ends_once_stopped_whatever_exit_hook_a_definitions_module_left_hanging(tmp_path: Path) -> None:
    """An ``atexit`` hook that never returned (registered by a definitions module, or a
    library it imports) held ``serve`` after its stop for ever, as a hung thread did: the
    interpreter runs the hooks after the verb ends. It ends :data:`EXIT_WITHIN` seconds
    after the stop too, naming the hook."""
    code, log = _serve_stopped(tmp_path, "tick.cron.py", HANGS_AT_EXIT, lambda: None)
    assert code == 0, log
    assert "an exit hook (atexit) still runs in flush_telemetry (" in log, log
    assert "tick.cron.py:" in log, log


IGNORES_SIGTERM = """
import asyncio, os, signal
from backend.runtime import signals

async def main():
    stopped = []
    signals.KEEP_EVERY = 0.05
    signals.on_stop_signals(stopped.append, lambda: None)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what an async handler did, on the loop's thread
    while signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:  # (set back within a look)
        await asyncio.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)
    while not stopped:
        await asyncio.sleep(0.01)
    print(stopped)

asyncio.run(main())
"""


def test_a_stop_signal_a_handler_ignored_is_set_back() -> None:
    """An async handler's ``signal.signal(SIGTERM, SIG_IGN)`` (it runs on the loop's thread,
    the main one) left ``serve`` deaf to SIGTERM, silently: two SIGTERMs were ignored. The
    stop signals' handlers are looked at every second and set back, with a warning."""
    done = subprocess.run([sys.executable, "-c", IGNORES_SIGTERM], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"[{signal.SIGTERM!r}]\n"
    assert "SIGTERM's handler was changed by code the engine ran" in done.stderr
