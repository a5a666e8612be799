"""The stop signals an engine's loop handles (``backend.runtime.signals``), in processes of
their own: a fork is not made inside the test worker."""

from __future__ import annotations

import signal
import subprocess
import sys
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
