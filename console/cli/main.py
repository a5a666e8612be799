"""The ``schedtui`` command's entry point: reads the command line, runs the command's
verb on an event loop of its own, and turns what it raised into one line and an exit code.

With no verb, the console. The command line is :mod:`console.cli.parsing`'s; what a
command writes, and its exit codes, :mod:`console.cli.output`'s; the verbs are the verb
modules' (:data:`~console.cli.parsing.VERB_MODULES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from backend import BadInput, DefinitionError, NotFound, Refused, SchedtuiError, Unauthorized
from backend.errors import describe_exception
from backend.safetext import in_line, in_lines
from backend.store.sqlite.file import short_of_descriptors
from console.cli import exitwatch
from console.cli.output import (
    EXIT_FAILURE,
    EXIT_PIPE_CLOSED,
    EXIT_REFUSED,
    EXIT_USAGE,
    OWN_OUTPUT,
    Output,
    UsageError,
    cannot_write,
    complain,
    fill_closed_standard_streams,
    flushed,
    out_of_descriptors,
    say,
    tolerant_stdout,
    verb_output,
)
from console.cli.parsing import commands, parse_args

__all__ = ["main", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    tolerant_stdout()
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        say(in_lines(str(exc)))
        return EXIT_USAGE
    handler = commands()[args.command]
    output = Output(sys.stdout)
    try:
        with contextlib.nullcontext() if args.command in OWN_OUTPUT else verb_output(output):
            return _run(handler(args), args.command)
    except KeyboardInterrupt:
        return 130
    except (BadInput, NotFound, DefinitionError) as exc:
        complain(exc.message)
        return EXIT_USAGE
    except Refused as exc:
        complain(exc.message)
        return EXIT_REFUSED
    except Unauthorized as exc:
        complain(f"{exc.message}: give the token with --token-file PATH or $SCHEDTUI_TOKEN")
        return EXIT_FAILURE
    except SchedtuiError as exc:
        complain(exc.message)
        return EXIT_FAILURE
    except (OSError, ImportError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError) and output.refused_by(exc):
            return cannot_write(exc, output.stream)  # (a reader gone is run()'s: exit 141)
        # Out of file descriptors where no store or server said it first: a lazy import
        # (dlopen's failure is an ImportError), a log file, a socket. One line, not a traceback.
        if not out_of_descriptors(exc):
            raise
        complain(f"{exc}: {short_of_descriptors() or 'this process has no file descriptor left (raise it: ulimit -n)'}")
        return EXIT_FAILURE


def _run(verb: Coroutine[Any, Any, int], name: str) -> int:
    """``asyncio.run(verb)``, but a loop stopped from inside (a handler that called
    ``loop.stop()``) runs on: the verb has not ended, and asyncio.run would have cancelled
    every task (the runs, the API's requests) and ended the process. So does a loop that a
    ``SystemExit`` or ``KeyboardInterrupt`` left, raised by a task or callback it ran (a
    handler's own task: asyncio lets these two out of the loop) rather than by the verb or
    Ctrl-C. Once the verb has
    ended, threads a handler left running do not hold the process (see :mod:`exitwatch`:
    closing the loop joins its executor's threads)."""
    with asyncio.Runner() as runner:
        task = runner.get_loop().create_task(verb)
        while True:
            try:
                status = runner.run(_awaiting(task))  # (Ctrl-C cancels the waiter, and so the verb)
            except RuntimeError:
                if task.done():
                    exitwatch.arm(EXIT_FAILURE, name)
                    raise
                logging.getLogger("schedtui").warning(
                    "the event loop was stopped by the code it ran (loop.stop() in a handler?); it runs on"
                )
            except (KeyboardInterrupt, SystemExit) as exc:
                interrupts: int = getattr(runner, "_interrupt_count", 0)  # Ctrl-C's, as asyncio.Runner counts them
                if task.done() or interrupts > 0:  # the verb's own, or Ctrl-C
                    exitwatch.arm(130 if isinstance(exc, KeyboardInterrupt) else EXIT_FAILURE, name)
                    raise
                # Raised by a task or a callback the loop ran, not by the verb: asyncio lets
                # these two out of the loop (a handler's child task that called sys.exit(),
                # a TaskGroup's, a loop.call_soon(sys.exit)); the task has it as its
                # exception, and whoever awaits it (the handler) fails with it.
                tag, message, _ = describe_exception(exc)
                logging.getLogger("schedtui").warning(
                    "%s (%s) was raised out of the event loop by a task or callback it ran (a handler's own task?), "
                    "not by this command: it runs on", tag, in_line(message[:200]),
                )  # fmt: skip
            except BaseException:
                exitwatch.arm(EXIT_FAILURE, name)
                raise
            else:
                exitwatch.arm(status, name)
                return status


async def _awaiting(task: asyncio.Task[int]) -> int:
    return await task


def run() -> None:
    """The console script."""
    exitwatch.allow()
    fill_closed_standard_streams()
    # As `python -m` and uvicorn do: the working directory first on the import path, so that
    # definitions import the project's own modules (a console script's own folder is the
    # environment's bin/, which holds none of them).
    with contextlib.suppress(OSError):  # (a working directory deleted meanwhile)
        here = os.getcwd()
        if "" not in sys.path and here not in sys.path:
            sys.path.insert(0, here)
    try:
        status = flushed(main())
    except BrokenPipeError:
        # The reader stopped reading (`schedtui runs … --json | head`): nothing more to say,
        # and no traceback; Python's own flush at exit would fail again without this.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_PIPE_CLOSED)
    sys.exit(status)


if __name__ == "__main__":
    run()
