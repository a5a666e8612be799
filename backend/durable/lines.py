"""An execution's log lines on their way to the store, and which write carries each.

The code runs again from its start on every claim, replaying its recorded steps, so a
line it logs (``ctx.log``) may have been written the first time through. Whether it was
must be readable from the store: a line the code logs is held by its task until that task
reaches its next step, sleep or wait. If that one is recorded, its checkpoint wrote the
line, which is dropped; if not, the line is written in the transaction that records it
(its result, its at-most-once mark, its retry's wait), never with a sibling's checkpoint.
So a line is in the store exactly when its step is, whatever order a replay reaches the
branches of a gather in. A line logged inside a step's function (on its task, or on the
thread a sync one runs on) goes with that step's own record, for the same reason: a step
not recorded runs again on the next claim, and logs it again. A task that ended hands its
last lines to the next step any task reaches; at the code's end, every line still held is
written with the end. The engine's own notes (``resumed on …``, a failed attempt) go with
the next write of any kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Any

from backend.durable.store import LOG_LINES, StepRecord

__all__ = ["ExecutionLines"]

#: A line waiting to be written: the step whose record carries it (None: any write), its text.
Entry = tuple[str | None, str]

#: While a step's function runs: whose lines, and which step (see :meth:`ExecutionLines.inside`).
#: A context variable, so that the tasks the function starts, and the thread a sync one runs
#: on (and the threads it starts, which copy the context: see backend.observability.capture),
#: know it too.
_INSIDE: contextvars.ContextVar[tuple[ExecutionLines, str] | None] = contextvars.ContextVar(
    "schedtui_durable_step", default=None
)


class ExecutionLines:
    """The lines of one claim of an execution (see the module's docstring).

    Contract: :meth:`take` hands a write every engine note and every line tagged with a
    step the write records, in the order they came, and keeps the others; of a chatty
    stretch only the newest :data:`LOG_LINES` are kept, the only ones that can be read."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        """The thread the code's loop runs on (one loop a thread runs at a time)."""
        self.entries: list[Entry] = []
        self.held: dict[asyncio.Task[Any], list[str]] = {}
        """Lines logged on each of the code's tasks since that task last reached a step."""

    def note(self, text: str) -> None:
        """A line of the engine's own about this execution: written with the next write."""
        self.entries.append((None, text))

    def hold(self, line: str) -> None:
        """A line the code logged: held until its task reaches its next step. One logged
        inside a step's function (in progress on its task, or on its thread) goes with that
        step's record: while steps run at once, the next write may be a sibling's, and a
        crash before this step's own would leave the line written and the step to run (and
        log it) again."""
        inside = _INSIDE.get()
        step = inside[1] if inside is not None and inside[0] is self else None
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not on the loop's thread: a sync step's function (or a thread of the code's)
            # Handed to the loop in order: before the step's outcome, which its thread hands over after.
            with contextlib.suppress(RuntimeError):  # (the loop has closed: nothing will be written)
                self._loop.call_soon_threadsafe(self._add, (line,), step)
            return
        if step is not None or task is None:  # (task None: a callback of the loop's)
            self._add((line,), step)
            return
        held = self.held.setdefault(task, [])
        held.append(line)
        if len(held) > 2 * LOG_LINES:
            del held[:-LOG_LINES]

    def within(self) -> str | None:
        """The step whose function runs here (on its task, a task it started, or its thread,
        or a loop that thread runs), if any: of this claim's code."""
        inside = _INSIDE.get()
        return inside[1] if inside is not None and inside[0] is self else None

    def on_its_loop(self) -> bool:
        """Whether this runs on the event loop of the code (not on another a thread runs).
        Asked by the thread: a thread runs one loop at a time, and get_running_loop() costs
        a system call (the process id, in 3.11) at every step."""
        return threading.get_ident() == self._thread

    def inside(self, step: str) -> contextvars.Token[tuple[ExecutionLines, str] | None]:
        """The function of ``step`` runs from now on, in this context: the lines logged in it
        go with that step's record (see :meth:`hold`). Hand the token to :meth:`outside`."""
        return _INSIDE.set((self, step))

    @staticmethod
    def outside(token: contextvars.Token[tuple[ExecutionLines, str] | None]) -> None:
        _INSIDE.reset(token)

    def on_thread(self, step: str, fn: Callable[..., Any], arguments: tuple[Any, ...]) -> Any:
        """``fn(*arguments)``, the function of the sync step ``step``, on its thread (whose
        context is not the code's)."""
        token = _INSIDE.set((self, step))
        try:
            return fn(*arguments)
        finally:
            _INSIDE.reset(token)

    def reached(self, task: asyncio.Task[Any] | None, name: str, recorded: bool) -> None:
        """``task`` reached the step, sleep or wait ``name``, ``recorded`` or not: the lines
        it holds, and those of the code's tasks that ended since (a gathered branch's last
        lines, which belong to what comes after it, as the lines after a gather do), go
        with ``name``'s record, or are dropped if it is recorded: it wrote them."""
        held = self.held
        lines = [line for other in [t for t in held if t.done()] for line in held.pop(other)]
        if task is not None:
            lines += held.pop(task, ())
        if lines and not recorded:
            self._add(lines, name)

    def release(self) -> None:
        """The code has ended: the lines its tasks still hold, and those of steps whose
        record was never written (left in flight, cancelled), go with its end."""
        for lines in self.held.values():
            self._add(lines, None)
        self.held.clear()
        self.entries = [(None, text) for _, text in self.entries]

    def take(self, records: Sequence[StepRecord]) -> tuple[list[Entry], list[str]]:
        """What a write recording ``records`` carries: the entries (to :meth:`put_back` if
        it fails) and their texts."""
        taken = self.entries
        if not taken:
            return taken, []
        names = {record.name for record in records}
        kept = [entry for entry in taken if entry[0] is not None and entry[0] not in names]
        if kept:
            taken = [entry for entry in taken if entry[0] is None or entry[0] in names]
        self.entries = kept
        return taken, [text for _, text in taken]

    def put_back(self, taken: list[Entry]) -> None:
        """A write that carried ``taken`` failed: they wait again, first."""
        self.entries = [*taken, *self.entries]

    def _add(self, lines: Sequence[str], step: str | None) -> None:
        entries = self.entries
        entries.extend((step, line) for line in lines)
        if len(entries) > 2 * LOG_LINES:
            del entries[:-LOG_LINES]
