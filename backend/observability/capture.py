"""Capturing what a handler says, per call: its ``logging`` records and its stdout/stderr.

Many handlers of many schedules run at once in one process, on tasks and threads, so a
global redirect would mix them. Instead the call being run is a context variable,
:data:`CURRENT`, holding its :class:`Capture`; the runner sets it around each handler (an
async one on its task, a sync one on its thread). Two pieces, each installed once per
process (:func:`install`, counted, so that every engine may install and remove it), write
into whatever capture the writing code's context holds, and do nothing else when it holds
none:

* :class:`CaptureHandler`, one handler on the root logger: a record that reaches the root's
  handlers (it passed its logger's level and propagates) is also written to the capture,
  one formatted line. The record still reaches the process's own handlers: the capture is
  a copy, so what ``serve`` logs today (its journal, a log shipper) keeps every line, also
  those past a run's 64 KiB.
* :class:`CapturingStream`, one proxy in front of ``sys.stdout`` and one of ``sys.stderr``:
  a write is copied to the capture and passed on to the real stream, as before (``serve``'s
  handlers' prints reach its output today; an operator grepping it keeps them), and so is
  a write to its binary layer (``sys.stdout.buffer``), as text. Writes to
  the file descriptors themselves (``os.write``, a child process) bypass it, and so does
  what a ``logging`` handler writes as it handles a record (a ``StreamHandler``, rich's
  ``RichHandler``, one that prints: the record is captured once, as a record).

The root handler changes nothing else of the process's logging: a record that only it
takes still goes to Python's last resort (stderr), and ``logging.basicConfig`` works as
if it were not there (while installed, it is wrapped to step around it).

Where the context goes:

* child tasks (``asyncio.create_task``, ``gather``) copy their creator's context: they are
  captured with it;
* Python 3.11 threads start with an empty context. :func:`install` wraps
  ``threading.Thread.start`` so that a thread *started while a capture is active* runs in
  a copy of its starter's context (and so is captured with it); threads started anywhere
  else are untouched. A ``concurrent.futures`` pool's worker thread is left out (it serves
  whoever submits next); instead ``ThreadPoolExecutor.submit`` called while a capture is
  active runs that one work item in a copy of the submitter's context (this also covers
  ``loop.run_in_executor``). A ``multiprocessing.pool.ThreadPool`` alike: it is made
  outside any capture, and the work queued to it while one is active runs in the
  submitter's;
* a capture whose call has ended is carried no further: a thread its handler left running
  (a library's sender, started on first use and serving every later run) then writes as
  code outside any run does, to the process's output only, never into that call's log.

A capture keeps at most :data:`LIMIT` bytes (UTF-8): the first half and the last half,
the middle counted (bytes and lines) but dropped, so memory stays bounded however much a
handler writes, and in however small pieces (:class:`LogBuffer`).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import contextlib
import contextvars
import functools
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TextIO

from backend.observability.logs import LogTarget
from backend.safetext import RedactingFormatter, redact

_log = logging.getLogger("schedtui.engine")

__all__ = [
    "CURRENT",
    "HEAD_BYTES",
    "LIMIT",
    "TAIL_BYTES",
    "Capture",
    "CaptureHandler",
    "CapturingStream",
    "LogBuffer",
    "Snapshot",
    "install",
    "installed",
    "log_formatter",
    "uninstall",
    "reinstate",
    "reinstate_if_moved",
]

#: The most a call's log keeps (bytes of UTF-8): its first :data:`HEAD_BYTES` and its last
#: :data:`TAIL_BYTES`.
LIMIT: Final = 64 * 1024
HEAD_BYTES: Final = LIMIT // 2
TAIL_BYTES: Final = LIMIT - HEAD_BYTES

#: The format of a captured log record (times in UTC).
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A buffer's content at one moment: ``head`` and ``tail`` are whole characters, and
    ``size`` counts every byte written, those left out between them included."""

    head: str
    tail: str
    size: int
    omitted_bytes: int
    omitted_lines: int
    final: bool
    version: int


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


#: The most a chunk of a buffer's tail holds: a write joins the newest chunk while it fits
#: (one object per write held 6 to 22 times the bound for writes of a few bytes each).
_CHUNK_BYTES: Final = 4096


class LogBuffer:
    """A call's output, bounded: the first ``head`` bytes (one bytearray), the last ``tail``
    bytes (a ring of chunks of up to 4 KiB, small writes joined) and what fell
    between them, counted. Thread-safe: a sync handler's threads write while the engine's
    loop takes snapshots.

    Contract: whatever is written, it holds at most ``head + tail`` bytes plus the newest
    write's slice, in memory within a small factor of that however small the writes;
    ``size`` counts every byte written; head and tail are cut at character boundaries; a
    closed buffer takes no more writes."""

    __slots__ = ("_head", "_head_room", "_lock", "_omitted", "_omitted_lines", "_tail", "_tail_size", "_tail_room",
                 "closed", "size", "version")  # fmt: skip

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self._lock = threading.Lock()
        self._head = bytearray()
        self._head_room = head
        self._tail: deque[bytearray] = deque()
        self._tail_size = 0
        self._tail_room = tail
        self._omitted = 0
        self._omitted_lines = 0
        self.size = 0
        """Bytes written in all."""
        self.version = 0
        """Bumped by every write (the flusher writes a buffer again only when it changed)."""
        self.closed = False

    def write(self, text: str) -> None:
        if not text:
            return
        if "\x00" in text:  # no store can keep a NUL in text
            text = text.replace("\x00", "\\x00")
        data = text.encode("utf-8", "backslashreplace")  # (lone surrogates, as \udcff)
        with self._lock:
            if self.closed:
                return
            self.size += len(data)
            self.version += 1
            room = self._head_room
            if room:
                if len(data) <= room:
                    self._head += data
                    self._head_room = room - len(data)
                    return
                cut = room
                while cut and _is_continuation(data[cut]):
                    cut -= 1
                self._head += data[:cut]
                self._head_room = 0
                data = data[cut:]
            tail = self._tail
            if tail and len(tail[-1]) + len(data) <= _CHUNK_BYTES:
                tail[-1] += data
            else:
                tail.append(bytearray(data))
            self._tail_size += len(data)
            self._trim()

    def _trim(self) -> None:
        """Drop the oldest bytes of the tail beyond its room (counted, never kept)."""
        excess = self._tail_size - self._tail_room
        tail = self._tail
        while excess > 0:
            first = tail[0]
            cut = min(excess, len(first))
            while cut < len(first) and _is_continuation(first[cut]):
                cut += 1  # never start the tail inside a character
            self._omitted += cut
            self._omitted_lines += first.count(b"\n", 0, cut)
            self._tail_size -= cut
            excess -= cut
            if cut == len(first):
                tail.popleft()
            else:
                del first[:cut]  # (in place: a bytearray gives its memory back once half is free)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                self._head.decode("utf-8", "replace"), b"".join(self._tail).decode("utf-8", "replace"), self.size,
                self._omitted, self._omitted_lines, self.closed, self.version,
            )  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.version += 1


_creating = threading.Lock()


class Capture:
    """What one handler call writes: the base of the runner's invocations (one object per
    call, on the firing path: no second one for its capture). Its :class:`LogBuffer` is made
    at the first write, by ``opener(self)`` (which also registers it to be written): most
    handlers write nothing, and those cost no buffer and no store write. A call whose
    output is not kept has no ``opener`` and is never made :data:`CURRENT`."""

    __slots__ = ("buffer", "opener", "told_late")

    has_ended: bool = False
    """Whether the call has ended (its handler returned): the runner's invocation sets its
    own. An ended capture is carried no further (see :func:`_live`), and opens no log."""

    def __init__(self) -> None:
        self.buffer: LogBuffer | None = None
        self.opener: Callable[[Capture], LogBuffer] | None = None
        self.told_late = False
        """Whether output written after the call ended (a thread it left running) was said
        to be lost (once a call, in the process's log)."""

    @property
    def over(self) -> bool:
        """Whether the call has ended, or its log was closed: nothing more joins it."""
        if self.has_ended:
            return True
        buffer = self.buffer
        return buffer is not None and buffer.closed

    def log_target(self) -> LogTarget | None:
        """What the output is kept as (asked at the first write)."""
        return None

    def write(self, text: str) -> None:
        buffer = self.buffer
        if buffer is None:
            with _creating:  # two threads of one handler may write their first line at once
                buffer = self.buffer
                if buffer is None:
                    opener = self.opener
                    if opener is None:
                        return
                    if not self.has_ended:  # (else a run that wrote nothing got a log after its end)
                        buffer = self.buffer = opener(self)
        if buffer is not None:
            buffer.write(text)
            if not buffer.closed:
                return
        self.tell_late()

    def tell_late(self) -> None:
        """Say, once a call, in the process's log, that output came after it ended."""
        if getattr(self, "told_late", False):  # (subclasses set their own slots)
            return
        self.told_late = True
        target = self.log_target()
        whose = f"{target.kind} {target.id}" if target is not None else "a call"
        outside = CURRENT.set(None)  # (the process's log, not a closed one's)
        try:
            _log.warning("%s: output written after it ended (by a thread it left running?) is not kept in its "
                         "log; it reaches the process's output only", whose)  # fmt: skip
        finally:
            CURRENT.reset(outside)


CURRENT: contextvars.ContextVar[Capture | None] = contextvars.ContextVar("schedtui_capture", default=None)
"""The capture of the handler call whose code is running, if any."""


def _live(*, writing: bool = False) -> Capture | None:
    """:data:`CURRENT`, unless its call has ended: a thread a handler started and left
    running (a library's sender thread, started by whichever run used it first, serves
    every later run) then writes as code outside any run does, to the process's output
    only, never into the ended run's log. ``writing``: a write is lost to that log, said
    once (:meth:`Capture.tell_late`)."""
    capture = CURRENT.get()
    if capture is not None and capture.over:
        if writing:
            capture.tell_late()
        return None
    return capture


class _Formatter(RedactingFormatter):
    """:data:`LOG_FORMAT`, written directly (a handler's every record passes here, on its
    own time: the generic formatter's steps cost several times as much), then redacted."""

    converter = staticmethod(time.gmtime)
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._second: tuple[int, str] = (-1, "")
        """The last whole second formatted, and its text (many records share one)."""

    def format(self, record: logging.LogRecord) -> str:
        second, stamp = self._second
        if int(record.created) != second:
            second = int(record.created)
            stamp = time.strftime(self.default_time_format, time.gmtime(second))
            self._second = (second, stamp)
        text = f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        return redact(text)


def log_formatter() -> logging.Formatter:
    """How a captured record is written: ``2026-11-30T15:38:44.123Z WARNING name: message``
    (secrets redacted, as in the engine's own log)."""
    return _Formatter(LOG_FORMAT)


class CaptureHandler(logging.Handler):
    """The one root handler: a record logged while a capture is active is written to it
    (see the module). Costs one context-variable read per record otherwise."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(log_formatter())

    def handle(self, record: logging.LogRecord) -> bool:
        # Overridden: without a capture, take no lock and format nothing.
        capture = _live(writing=True)
        if capture is not None:
            try:
                capture.write(self.format(record) + "\n")
            except Exception:
                self.handleError(record)
        if _only_handler(record):
            # Python sends a record no handler took to its last resort (stderr, WARNING and
            # up); this handler must not take that away from a process that configured none.
            last = logging.lastResort
            if last is not None and record.levelno >= last.level:
                last.handle(record)
        return capture is not None

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


def _only_handler(record: logging.LogRecord) -> bool:
    """Whether this module's handler is the only one the record reaches."""
    root = logging.root
    if len(root.handlers) != 1:
        return False
    logger = logging.Logger.manager.loggerDict.get(record.name)
    while isinstance(logger, logging.Logger) and logger is not root:
        if logger.handlers:
            return False
        if not logger.propagate:
            return False
        logger = logger.parent
    return True


class _Emitting(threading.local):
    """``on`` while a ``logging`` handler handles a record on this thread, in a capture: what
    it writes to the streams meanwhile (a ``StreamHandler``, rich's ``RichHandler``, one that
    prints) is that record, captured already, as itself, by :class:`CaptureHandler`."""

    on = False


_emitting = _Emitting()


class _PassedOn:
    """A wrapped stream of the process that a handler's write must never fail on: when it
    refuses one (``serve | head -1`` with ``PYTHONUNBUFFERED``, a log file on a full disk,
    a closed stream), the copy is lost, not the run (its log has the text), and the log
    says so once per kind of failure. Outside any handler it fails as the stream does."""

    wrapped: Any
    _failing: str | None = None

    def _pass_on(self, write: Callable[[], int], length: int) -> int:
        if _live() is None:
            return write()
        try:
            return write()
        except (OSError, ValueError) as exc:
            self._refused(exc)
            return length

    def flush(self) -> None:
        self._pass_on(lambda: self.wrapped.flush() or 0, 0)

    def _refused(self, exc: BaseException) -> None:
        if self._failing != type(exc).__name__:
            self._failing = type(exc).__name__
            name = getattr(self.wrapped, "name", None)
            where = {"<stdout>": "stdout", "<stderr>": "stderr", 1: "stdout", 2: "stderr"}.get(name, "the process's stream")
            # Outside the handler's capture: the process's log says it, not the run's (it
            # landed there between the print's text and its newline, one line spliced).
            outside = CURRENT.set(None)
            try:
                _log.warning("a handler's print could not reach %s (%s: %s): it is kept in its run's log only",
                             where, type(exc).__name__, exc)  # fmt: skip
            finally:
                CURRENT.reset(outside)


class CapturingStream(_PassedOn):
    """``sys.stdout`` or ``sys.stderr`` as a handler sees it: each write is copied to the
    capture of the writing code's context, if any, and passed on to the stream it wraps;
    everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO, *, stdout: bool = False) -> None:
        self.wrapped = stream
        self.stdout = stdout
        """It stands for ``sys.stdout`` (see :func:`handler_prints_to_stderr`)."""
        self._bytes: CapturingBytes | None = None

    def write(self, text: str) -> int:
        capture = _live(writing=True)
        if capture is None:
            return self.wrapped.write(text)  # type: ignore[no-any-return]
        if isinstance(text, str) and not _emitting.on:
            try:
                capture.write(text)
            except Exception:  # noqa: S110 - a capture must never break a print
                pass
        onward = self.onward()
        return self._pass_on(lambda: onward.write(text), len(text))

    def flush(self) -> None:
        onward = self.onward() if _live() is not None else self.wrapped  # (a handler's flush: its prints')
        self._pass_on(lambda: onward.flush() or 0, 0)

    def onward(self) -> Any:
        """Where a handler's write goes on to: the wrapped stream, but stderr for stdout's
        in a command that keeps stdout for its own output (:func:`handler_prints_to_stderr`)."""
        if self.stdout and _handlers_print_to_stderr:
            err = sys.stderr
            return err.wrapped if isinstance(err, CapturingStream) else err
        return self.wrapped

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        """A handler does not close the process's stream (every later write of the engine,
        and of every other handler, failed: its runs stayed ``running`` for good): it is
        flushed instead. Code outside any handler closes it as it would the stream itself."""
        if _live() is not None:
            self.flush()
        else:
            self.wrapped.close()

    @property
    def buffer(self) -> CapturingBytes:
        """The wrapped stream's bytes (``sys.stdout.buffer.write(b"...")``), each write
        copied too: it went round the capture, and was missing from the run's log."""
        raw = self.wrapped.buffer  # (AttributeError, as the wrapped stream's, if it has none)
        if self._bytes is None or self._bytes.wrapped is not raw:
            self._bytes = CapturingBytes(raw, self)
        return self._bytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


class CapturingBytes(_PassedOn):
    """The binary layer of a :class:`CapturingStream`: each write is copied to the capture
    as text (UTF-8, each byte that is not as its escape, ``\\xff``) and passed on."""

    def __init__(self, raw: Any, text: CapturingStream | None = None) -> None:
        self.wrapped = raw
        self.text = text

    def _refused(self, exc: BaseException) -> None:
        if self.text is not None:  # (said once for the stream, whichever layer)
            self.text._refused(exc)
        else:
            super()._refused(exc)

    def write(self, data: Any) -> int:
        capture = _live(writing=True)
        if capture is not None and not _emitting.on:
            try:
                capture.write(bytes(data).decode("utf-8", "backslashreplace"))
            except Exception:  # noqa: S110 - a capture must never break a write
                pass
        onward = self.wrapped
        if self.text is not None and self.text.stdout and _handlers_print_to_stderr and capture is not None:
            onward = getattr(self.text.onward(), "buffer", onward)  # (stderr's bytes)
        return self._pass_on(lambda: onward.write(data), len(data))

    def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        """As :meth:`CapturingStream.close`: a handler's close is a flush."""
        if _live() is not None:
            self.flush()
        else:
            self.wrapped.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


HANDLER: Final = CaptureHandler()
_EXECUTOR_WORKER = getattr(concurrent.futures.thread, "_worker", None)
_install_lock = threading.Lock()
_installs = 0
_handlers_print_to_stderr = False
_thread_start = threading.Thread.start
_submit = concurrent.futures.ThreadPoolExecutor.submit
_basic_config = logging.basicConfig
_handler_handle = logging.Handler.handle
_thread_pool_originals: dict[str, Any] = {}
"""What :func:`install` replaced on ``multiprocessing.pool.ThreadPool`` (None: inherited)."""
#: ``ThreadPool``'s methods that queue work, each taking the function first: every other
#: way in (``apply``, ``map``, ``starmap`` and their ``_async``) goes through one of them.
_THREAD_POOL_SUBMITS: Final = ("apply_async", "_map_async", "imap", "imap_unordered")


def _start(self: threading.Thread) -> None:
    """``Thread.start``, carrying an active capture into the thread (see the module)."""
    if _live() is not None and getattr(self, "_target", None) is not _EXECUTOR_WORKER:
        context = contextvars.copy_context()
        run = self.run
        self.run = lambda: context.run(run)  # type: ignore[method-assign]
    _thread_start(self)


def _submit_in_context(
    self: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> concurrent.futures.Future[Any]:
    """``ThreadPoolExecutor.submit``: a work item submitted while a capture is active runs
    in a copy of its submitter's context."""
    if _live() is not None:
        return _submit(self, contextvars.copy_context().run, fn, *args, **kwargs)
    return _submit(self, fn, *args, **kwargs)


class _InCopyOf:
    """A function queued to a ``multiprocessing.pool.ThreadPool`` while a capture is active:
    each call runs in a copy of the submitter's context (a ``map``'s calls run on several
    threads at once, and one context is entered by one thread at a time)."""

    __slots__ = ("context", "fn")

    def __init__(self, context: contextvars.Context, fn: Callable[..., Any]) -> None:
        self.context = context
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.context.copy().run(self.fn, *args, **kwargs)


def _queued_in_context(method: Callable[..., Any]) -> Callable[..., Any]:
    """A ``ThreadPool`` method that queues work, as ``ThreadPoolExecutor.submit`` is made:
    work queued while a capture is active runs in the submitter's capture."""

    @functools.wraps(method)
    def queued(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        if _live() is not None:
            context = contextvars.copy_context()
            if args:
                args = (_InCopyOf(context, args[0]), *args[1:])
            elif "func" in kwargs:
                kwargs["func"] = _InCopyOf(context, kwargs["func"])
        return method(self, *args, **kwargs)

    return queued


def _made_outside(init: Callable[..., None]) -> Callable[..., None]:
    """``ThreadPool.__init__``, outside any capture: its threads serve whoever queues work
    next (made lazily by whichever run used it first, they carried that run's capture and
    all later runs' work went to its log)."""

    @functools.wraps(init)
    def made(self: Any, /, *args: Any, **kwargs: Any) -> None:
        outside = CURRENT.set(None)
        try:
            init(self, *args, **kwargs)
        finally:
            CURRENT.reset(outside)

    return made


def _patch_thread_pool() -> None:
    try:
        from multiprocessing.pool import ThreadPool  # (here: only an engine that captures pays its import)
    except (OSError, ImportError):
        # Out of file descriptors (ulimit -n), the extension module cannot be loaded: dlopen's
        # failure is an ImportError, not an OSError. Nothing can make a ThreadPool then, so
        # there is nothing to patch; what the process does next says so, in one line.
        return
    patches = {"__init__": _made_outside(ThreadPool.__init__)}
    patches.update((name, _queued_in_context(getattr(ThreadPool, name))) for name in _THREAD_POOL_SUBMITS)
    for name, patch in patches.items():
        _thread_pool_originals[name] = ThreadPool.__dict__.get(name)
        setattr(ThreadPool, name, patch)


def _unpatch_thread_pool() -> None:
    if not _thread_pool_originals:
        return  # (never patched)
    from multiprocessing.pool import ThreadPool  # (imported by the patch)

    for name, original in _thread_pool_originals.items():
        if original is None:
            delattr(ThreadPool, name)
        else:
            setattr(ThreadPool, name, original)
    _thread_pool_originals.clear()


def _handle_marked(self: logging.Handler, record: logging.LogRecord) -> bool:
    """``logging.Handler.handle``, marked on its thread while it runs in a capture (see
    :class:`_Emitting`): a record a handler writes to stdout was captured twice, once as the
    handler's rendering and once as the record's line, unless it was a ``StreamHandler``."""
    if CURRENT.get() is None:
        return _handler_handle(self, record)
    was, _emitting.on = _emitting.on, True
    try:
        return _handler_handle(self, record)
    finally:
        _emitting.on = was


def _basic_config_around(**kwargs: Any) -> None:
    """``logging.basicConfig``, as if this module's root handler were not there (it checks
    that the root has no handler; ``force=True`` removes them all)."""
    root = logging.getLogger()
    ours = HANDLER in root.handlers
    if ours:
        root.removeHandler(HANDLER)
    try:
        _basic_config(**kwargs)
    finally:
        if ours and HANDLER not in root.handlers:
            root.addHandler(HANDLER)


def installed() -> bool:
    return _installs > 0


def reinstate_if_moved() -> None:
    """:func:`reinstate`, when something moved what it puts back (a few attribute reads
    otherwise: this runs as each handler starts)."""
    if (
        sys.stdout.__class__ is not CapturingStream
        or sys.stderr.__class__ is not CapturingStream
        or HANDLER not in logging.root.handlers
    ):
        reinstate()


def reinstate() -> None:
    """Put the root handler back if something removed it, and the proxies in front of
    ``sys.stdout`` and ``sys.stderr`` where something replaced them since :func:`install`
    (a test runner between its phases, a terminal UI while it runs, a program setting its
    root logger's handlers): called as each handler starts, so captures survive them."""
    if not _installs:
        return
    root = logging.root
    if HANDLER not in root.handlers:
        root.addHandler(HANDLER)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and type(stream) is not CapturingStream:
            setattr(sys, name, CapturingStream(stream, stdout=name == "stdout"))


@contextlib.contextmanager
def handler_prints_to_stderr() -> Iterator[None]:
    """Within it, what the handlers print to stdout goes on to stderr (their runs' logs
    keep it as ever): for a command whose stdout is its own output (``schedtui fire
    --json``: a handler's print came before the JSON and no script could read it).
    ``serve`` keeps the copy on stdout, its journal."""
    global _handlers_print_to_stderr
    was, _handlers_print_to_stderr = _handlers_print_to_stderr, True
    try:
        yield
    finally:
        _handlers_print_to_stderr = was


def install() -> None:
    """Install the root handler, the two stream proxies and the thread hooks, once per
    process however many callers install them (each :func:`uninstall` undoes one)."""
    global _installs
    with _install_lock:
        _installs += 1
        if _installs > 1:
            return
        reinstate()
        threading.Thread.start = _start  # type: ignore[method-assign]
        concurrent.futures.ThreadPoolExecutor.submit = _submit_in_context  # type: ignore[method-assign,assignment]
        _patch_thread_pool()
        logging.Handler.handle = _handle_marked  # type: ignore[method-assign]
        logging.basicConfig = _basic_config_around


def uninstall() -> None:
    """Undo one :func:`install`; the last one removes everything (a stream that someone
    replaced since is left as it is)."""
    global _installs
    with _install_lock:
        if _installs == 0:
            return
        _installs -= 1
        if _installs:
            return
        logging.getLogger().removeHandler(HANDLER)
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, CapturingStream):
                setattr(sys, name, stream.wrapped)
        threading.Thread.start = _thread_start  # type: ignore[method-assign]
        concurrent.futures.ThreadPoolExecutor.submit = _submit  # type: ignore[method-assign]
        _unpatch_thread_pool()
        logging.Handler.handle = _handler_handle  # type: ignore[method-assign]
        logging.basicConfig = _basic_config

