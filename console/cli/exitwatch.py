"""Once a verb has ended, nothing a handler left running keeps the process from ending.

After a verb's work is done (``serve`` has stopped, its runs have ended or been recorded),
Python still joins every thread that is not a daemon before the process exits: the loop's
default executor's (``asyncio.to_thread``, ``run_in_executor``) and any a handler started.
A handler whose ``asyncio.to_thread(requests.get, url)`` never returned held ``serve``
after its stop for ever: a second SIGTERM, and a SIGINT, changed nothing; only SIGKILL
ended it. So the console script (:func:`allow`) arms a watch when the verb ends
(:func:`arm`): if such a thread is still alive :data:`EXIT_WITHIN` seconds later, it says
which, and the process ends with the verb's exit code. So does an ``atexit`` hook that
still runs then (a library's flush with no timeout held ``serve`` the same way). A process
that is only slow to exit (its output flushed into a full pipe a reader has not read yet)
has no such thread and runs no Python code, and is left to finish.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Final

__all__ = ["EXIT_WITHIN", "allow", "arm"]

#: Seconds after its verb ended that a process held open by threads ends anyway.
EXIT_WITHIN: Final = 10.0

_allowed = [False]


def allow() -> None:
    """This process is the console script's: it may end itself (never a test's process that
    calls the CLI in-process)."""
    _allowed[0] = True
    atexit.register(_hooks_done.set)


def _holding() -> list[threading.Thread]:
    """The threads the interpreter would wait for at exit (not daemons, not the main one)."""
    main = threading.main_thread()
    # (asyncio's own thread that shuts the executor down waits for the others: not named)
    return [t for t in threading.enumerate()
            if t is not main and not t.daemon and t.is_alive() and not t.name.endswith("(_do_shutdown)")]  # fmt: skip


_hooks_done = threading.Event()
"""Set by this module's own ``atexit`` hook, registered before any definitions module is
imported: hooks run last registered first, so the others have all returned by then."""


def _in_exit_hook() -> str | None:
    """Where the main thread is, when the interpreter is past its threads' shutdown (the
    main thread marked stopped) and still in an ``atexit`` hook a definitions module or a
    library registered (a telemetry flush with no timeout); ``None`` while the verb's own
    end still runs, or once the hooks have run (flushing output into a pipe nobody reads
    yet is not a hang of a hook)."""
    main = threading.main_thread()
    if main.is_alive() or main.ident is None or _hooks_done.is_set():
        return None
    frame = sys._current_frames().get(main.ident)
    if frame is None:
        return "a hook with no Python frame (a C call such as time.sleep)"
    code = frame.f_code
    return f"{code.co_name} ({code.co_filename}:{frame.f_lineno})"


def arm(code: int, verb: str) -> None:
    """The verb ended with ``code``: see the module."""
    if not _allowed[0]:
        return

    def watch() -> None:
        threading.Event().wait(EXIT_WITHIN)
        holding = _holding()
        if holding:
            names = ", ".join(sorted({t.name for t in holding}))
            message = (
                f"schedtui: {verb} ended {EXIT_WITHIN:g}s ago, but {len(holding)} thread(s) a handler left running "
                f"still hold the process ({names}: a call that never returned, in asyncio.to_thread or an executor); "
                f"it exits now with code {code}\n"
            )
        else:
            hook = _in_exit_hook()
            if hook is None:
                return
            message = (
                f"schedtui: {verb} ended {EXIT_WITHIN:g}s ago, but an exit hook (atexit) still runs in {hook}; "
                f"it exits now with code {code}\n"
            )
        try:
            os.write(2, message.encode("utf-8", "backslashreplace"))
        finally:
            os._exit(code)

    threading.Thread(target=watch, name="schedtui exit watch", daemon=True).start()
