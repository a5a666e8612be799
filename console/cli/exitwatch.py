"""Once a verb has ended, nothing a handler left running keeps the process from ending.

After a verb's work is done (``serve`` has stopped, its runs have ended or been recorded),
Python still joins every thread that is not a daemon before the process exits: the loop's
default executor's (``asyncio.to_thread``, ``run_in_executor``) and any a handler started.
A handler whose ``asyncio.to_thread(requests.get, url)`` never returned held ``serve``
after its stop for ever: a second SIGTERM, and a SIGINT, changed nothing; only SIGKILL
ended it. So the console script (:func:`allow`) arms a watch when the verb ends
(:func:`arm`): if such a thread is still alive :data:`EXIT_WITHIN` seconds later, it says
which, and the process ends with the verb's exit code. A process that is only slow to
exit (its output flushed into a full pipe a reader has not read yet) has no such thread,
and is left to finish.
"""

from __future__ import annotations

import os
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


def _holding() -> list[threading.Thread]:
    """The threads the interpreter would wait for at exit (not daemons, not the main one)."""
    main = threading.main_thread()
    # (asyncio's own thread that shuts the executor down waits for the others: not named)
    return [t for t in threading.enumerate()
            if t is not main and not t.daemon and t.is_alive() and not t.name.endswith("(_do_shutdown)")]  # fmt: skip


def arm(code: int, verb: str) -> None:
    """The verb ended with ``code``: see the module."""
    if not _allowed[0]:
        return

    def watch() -> None:
        threading.Event().wait(EXIT_WITHIN)
        holding = _holding()
        if not holding:
            return
        names = ", ".join(sorted({t.name for t in holding}))
        message = (
            f"schedtui: {verb} ended {EXIT_WITHIN:g}s ago, but {len(holding)} thread(s) a handler left running "
            f"still hold the process ({names}: a call that never returned, in asyncio.to_thread or an executor); "
            f"it exits now with code {code}\n"
        )
        try:
            os.write(2, message.encode("utf-8", "backslashreplace"))
        finally:
            os._exit(code)

    threading.Thread(target=watch, name="schedtui exit watch", daemon=True).start()
