"""What a ``schedtui`` command writes, and how it ends: its exit codes, its output on
standard output (a table, JSON), its own words on standard error (one line for a refusal),
and its log.

Exit codes: 0 success, 1 failure, 2 bad usage or input (one line on stderr naming the
bad value: :class:`UsageError` from the parser), 3 a refused backfill (the count and the
reason are printed), 141 a reader gone (``… | head``).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from backend.observability.capture import handler_prints_to_stderr
from backend.safetext import TerminalFormatter, in_json, in_lines, printable

__all__ = [
    "EXIT_FAILURE", "EXIT_OK", "EXIT_PIPE_CLOSED", "EXIT_REFUSED", "EXIT_USAGE", "LOG_FORMAT", "LOG_LEVELS",
    "OWN_OUTPUT", "Output", "UsageError", "cannot_write", "check_log_file", "complain", "configure_logging",
    "fill_closed_standard_streams", "flushed", "log_level", "out_of_descriptors", "print_json", "say",
    "tolerant_stdout", "unicode_stdout", "verb_output",
]  # fmt: skip

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


class UsageError(Exception):
    """Bad usage caught by the argument parser: one line on stderr, exit code 2."""


class Output:
    """Standard output while a verb writes its output to it: the stream itself, but a write
    or flush it refuses (a full disk) is remembered, so that the entry point tells that
    refusal from any other OSError (a bug: a traceback) and says it in one line."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.refused: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)  # type: ignore[no-any-return]
        except OSError as exc:
            self.refused = exc
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            self.refused = exc
            raise

    def refused_by(self, exc: BaseException) -> bool:
        """Whether ``exc`` is (or was raised in handling) the refusal of this stream."""
        seen: BaseException | None = exc
        while seen is not None:
            if seen is self.refused:
                return True
            seen = seen.__cause__ or seen.__context__
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def cannot_write(exc: OSError, stream: Any) -> int:
    """Standard output refused the verb's output (a full disk): one line saying so, exit 1
    (what was to be read is lost, whatever the verb did: a fired run's outcome is in the
    ledger, `schedtui runs`). What is still buffered for the stream, and Python's flush at
    exit, go to /dev/null: they would fail again, with a traceback."""
    complain(f"cannot write the output: {exc.strerror or exc}")
    with contextlib.suppress(OSError, ValueError, AttributeError):  # (a stream of no descriptor: in a test)
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return EXIT_FAILURE


def out_of_descriptors(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    return "Too many open files" in str(exc)


def complain(message: str) -> None:
    """``schedtui: message`` on stderr (by :func:`say`), its control characters,
    bidirectional controls and lone surrogates escaped (``\\x1b``, ``\\u202e``): a name, or a
    server's answer, quoted in a message never reaches the terminal as a command (an escape
    sequence retitles the window, clears the screen; an override draws the rest of the line
    backwards)."""
    say(f"schedtui: {in_lines(message)}")


def say(text: str = "", *, end: str = "\n") -> None:
    """``text`` on stderr: the command's own words beside its output (a run fired, a
    backfill's progress, a warning, a refusal). A stream that refuses it (a full disk, a
    reader gone, a closed stream) loses the words, never the work the verb waits for, nor
    the exit code that says how that work went: the refusal left the verb, whose engine
    then closed, and a backfill running in this process was abandoned after its first slot."""
    with contextlib.suppress(OSError, ValueError):  # (ValueError: a stream closed)
        print(text, end=end, file=sys.stderr, flush=True)


def unicode_stdout() -> bool:
    """Whether standard output takes any character (UTF-8), as nearly every terminal does."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def tolerant_stdout() -> None:
    """On a standard output that is not UTF-8 (a legacy ISO-8859 locale, ``PYTHONIOENCODING=
    ascii``), what it cannot take goes out as an escape (``\\u2713``): a status glyph or a
    name failed the verb with a traceback. (JSON goes out in ASCII there: see print_json.)"""
    if not unicode_stdout() and isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")


def print_json(value: Any) -> None:
    # \u escapes where standard output is not UTF-8: the JSON stays valid and the same.
    # (and what a terminal would act on, a C1 control or a bidirectional override, as \u escapes)
    print(in_json(json.dumps(value, indent=2, ensure_ascii=not unicode_stdout())))


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: What ``$SCHEDTUI_LOG_LEVEL`` may name, in any case (a number is refused: it reads as a
#: mistake, and no release took one).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level() -> int:
    """``$SCHEDTUI_LOG_LEVEL``'s level; INFO when it is unset or empty. Any other value is
    refused (:class:`UsageError`, naming it and the levels there are): it crashed serve,
    demo and the console with a traceback, and the other verbs took it silently for INFO."""
    value = os.environ.get("SCHEDTUI_LOG_LEVEL", "").strip()
    if not value:
        return logging.INFO
    if value.upper() not in LOG_LEVELS:
        raise UsageError(f'schedtui: $SCHEDTUI_LOG_LEVEL "{printable(value)}" is not one of {", ".join(LOG_LEVELS)}')
    return logging.getLevelNamesMapping()[value.upper()]


def check_log_file() -> None:
    """``$SCHEDTUI_LOG_FILE`` (where the console logs; empty is unset) can be opened to
    append to, or a :class:`UsageError` names it and why: the console ended with a
    traceback, once its engine had started."""
    path = os.environ.get("SCHEDTUI_LOG_FILE")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f'schedtui: $SCHEDTUI_LOG_FILE "{printable(path)}" cannot be opened: {exc.strerror or exc}') from None


#: The commands that set up their own logging and streams (a journal, a screen).
OWN_OUTPUT = frozenset({"serve", "console", "demo"})


@contextlib.contextmanager
def verb_output(output: Output) -> Iterator[None]:
    """A verb's stdout is its own output (a table, JSON), written through ``output`` (which
    remembers a refusal): what the handlers it runs (``fire``, ``backfill``) print goes on
    to stderr, and the records they log at ``$SCHEDTUI_LOG_LEVEL`` (INFO by default) are
    made, so that their runs' logs keep them as ``serve``'s do (below the root's default,
    WARNING, they were never made). Nothing more is printed: the verb's own words are its
    output and its one line on stderr."""
    root = logging.getLogger()
    level = root.level
    sys.stdout = output
    root.setLevel(log_level())  # (checked as the command was read)
    try:
        with handler_prints_to_stderr():
            yield
    finally:
        root.setLevel(level)
        if sys.stdout is output:  # (else an engine left open still wraps it: its capture puts it back)
            sys.stdout = output.stream


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TerminalFormatter(LOG_FORMAT))  # no store password, no token, no escape sequence, ever
    logging.basicConfig(level=log_level(), handlers=[handler])


#: The exit status of a verb whose reader went away (``… | head``): what a shell reports for
#: a process that SIGPIPE ended (128 + 13).
EXIT_PIPE_CLOSED = 141


def fill_closed_standard_streams() -> None:
    """Started with a standard stream closed (``>&-``, ``<&-``, some init scripts and
    daemonizers), Python gives ``None`` for it: every verb then ended with a traceback and
    exit 1, a clean stop of serve too, and the console with one (``'NoneType' object has no
    attribute 'isatty'``). What it writes there goes to /dev/null instead, and it reads /dev/null
    (the console then says it needs a terminal, as with ``</dev/null``); nor is the number
    left free for the next file opened (the store's) to take."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:
            continue
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        try:
            os.fstat(fd)
        except OSError:  # still closed: the stream's own number, so children inherit it too
            os.dup2(null, fd)
            os.close(null)
            null = fd
        setattr(sys, name, open(null, mode, encoding="utf-8", errors="backslashreplace"))  # noqa: SIM115 - the process's stream


def flushed(status: int) -> int:
    """``status``, once what is still buffered for standard output is written (here, not at
    exit): a closed pipe raises (see :func:`run`); a full disk is one line and exit 1."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        return cannot_write(exc, sys.stdout)
    return status
