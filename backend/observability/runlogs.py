"""Per-run logs: keeping what this process's handlers say, and reading anyone's.

Each schedule run and each job attempt is a
:class:`~backend.observability.capture.Capture` (the runner's invocation is one), whose
buffer is made and registered here at its first write (:meth:`RunLogs.register`). One loop, off the firing path, writes the
buffers that changed every :data:`FLUSH_INTERVAL_S` (a follower sees a long run's progress)
and, soon after a handler has returned, its final version, all in one batch (one store
transaction for however many runs). A run that writes nothing costs no row and no write.

The reads answer the ``run_log``, ``job_log`` and ``execution_log`` actions. A log this
process still holds is read from memory (fresher than the store); ``running`` stays true
while the run is in flight or its final lines may still be on their way (a row not yet
final, written less than :data:`SETTLE_S` ago: a process that died leaves its last row
unfinished, and its readers must not wait for ever). A run or job attempt whose instance is
known dead (as the abandoned-work sweep judges it: :meth:`InstanceRegistry.gone
<backend.scheduler.registry.InstanceRegistry.gone>`) is not in flight, though its row still
says ``running`` until that sweep closes it.

A job's log is its newest attempt's by default: the one running, else the last to end (one
that has written nothing yet, or ended silent, has an empty log, not an earlier one's). An
attempt is addressed by its number among the job's attempts, on across retries from dead,
and its log found by the claim it ran under. A
durable execution's log is read by line: its ``size`` is the store's id of its newest line,
which stays where it is as older lines leave its window (:data:`LOG_LINES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Protocol, cast

from backend.clock import Clock
from backend.durable.store import LOG_LINES
from backend.errors import NotFound, Unavailable
from backend.observability import capture
from backend.observability.capture import Capture, LogBuffer, Snapshot
from backend.observability.logs import LogKind, LogStore, LogTarget, RunLog, StoredLog, compose
from backend.runtime.loops import Loops
from backend.safetext import escape_text

if TYPE_CHECKING:
    from backend.durable.model import Execution, ExecutionLog
    from backend.jobs.model import JobDetail
    from backend.model import Run
    from backend.scheduler.registry import InstanceRegistry

__all__ = ["FLUSH_INTERVAL_S", "RunLogs", "SETTLE_S"]

log = logging.getLogger("schedtui.engine")

#: How often the logs of handlers still running are written (seconds).
FLUSH_INTERVAL_S: Final = 1.0
#: How long after a handler returned its final lines are waited for at most (seconds): a
#: batch of ends is written together, once this much has passed since the last write.
FINAL_BATCH_S: Final = 0.1
#: A log row not final and older than this is as final as it will get (its process died).
SETTLE_S: Final = 5.0
#: Ended logs kept in memory while the store cannot take them; beyond, the oldest go.
MAX_PENDING: Final = 1000


class DurableLogReads(Protocol):
    """The store's read of a durable execution's log by line (both stores have it)."""

    async def durable_log_lines(self, id: str, after: int) -> tuple[list[tuple[int, ExecutionLog]], int | None]:
        """The newest :data:`LOG_LINES` lines, oldest first, each with its id; and how many
        lines with an id above ``after`` are older than them (``None``: cannot be told)."""


class RunLogs:
    """See the module.

    Contract: every buffer registered is written at least once after its handler returned
    (final), unless the store stays unavailable past :data:`MAX_PENDING` more ends or the
    process ends; writes of one buffer land in order; nothing here runs on the firing path
    (a call's first write registers its buffer, on the handler's own time)."""

    def __init__(
        self,
        *,
        store: LogStore,
        clock: Clock,
        loops: Loops,
        get_run: Callable[[str], Awaitable[Run]],
        get_job: Callable[[str], Awaitable[JobDetail]],
        get_execution: Callable[[str], Awaitable[Execution]],
        judge: InstanceRegistry | None = None,
        enabled: bool = True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.loops = loops
        self.enabled = enabled
        """Whether handlers' output is captured at all (``Engine(capture_logs=…)``)."""
        self._get_run = get_run
        self._get_job = get_job
        self._get_execution = get_execution
        self.judge = judge
        """Says whether the instance a run or job attempt is recorded running on is gone
        (``None``: each is taken as alive while its row says it runs)."""
        self._lock = threading.Lock()  # buffers are registered from handler threads
        self._open: dict[LogBuffer, LogTarget] = {}
        self._ended: dict[LogBuffer, LogTarget] = {}
        """Buffers whose handler returned, not yet written final."""
        self._written: dict[LogBuffer, int] = {}
        """The version of each open buffer last written."""
        self._by_target: dict[LogTarget, LogBuffer] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._installed = False
        self._failing = False
        self._idle = False
        self._nudged = False
        self._quiet = asyncio.Event()
        self.busy: Callable[[], bool] | None = None
        """Whether a burst of runs is being started now: the log keeper writes after it
        (call :meth:`quiet_again` when it ends), never between its handlers' starts."""
        self.writes = 0
        """Store writes made (each a batch)."""

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        """The engine opened (on its loop): capture from now on."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._quiet = asyncio.Event()
        self._flushing = asyncio.Lock()
        if self.enabled and not self._installed:
            capture.install()
            self._installed = True

    async def close(self) -> None:
        """The engine stops: write what is left (a handler still running is written as it
        is, final: this process writes nothing more), and stop capturing."""
        task, self._task = self._task, None
        self._loop = None  # a handler thread still writing starts no loop any more
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with self._lock:
            for buffer, target in self._open.items():
                self._ended[buffer] = target
            self._open.clear()
        for buffer in list(self._ended):
            buffer.close()
        try:
            await self.flush()
        except Unavailable as exc:
            log.warning("could not write the logs of %d run(s) or job attempt(s): %s", len(self._ended), exc)
        if self._installed:
            capture.uninstall()
            self._installed = False

    # -- capturing (the runner) -----------------------------------------------------------
    def register(self, captured: Capture) -> LogBuffer:
        """A capture's first write (on any thread): its buffer, registered to be written."""
        buffer = LogBuffer()
        target = captured.log_target()
        if target is None:
            buffer.close()  # nothing to keep it as: writes go nowhere
            return buffer
        with self._lock:
            self._open[buffer] = target
            self._by_target[target] = buffer
            nudge = not self._nudged and (self._task is None or self._idle)
            if nudge:
                self._nudged = True  # one nudge for a burst of first writes, not one each
        loop = self._loop
        if nudge and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the engine stopped
                loop.call_soon_threadsafe(self._nudge)
        return buffer

    def ended(self, captured: Capture) -> None:
        """The handler of ``captured`` has returned (on the engine's loop): its log is final."""
        buffer = captured.buffer
        if buffer is None:
            return
        buffer.close()
        with self._lock:
            target = self._open.pop(buffer, None)
            if target is None:
                return
            self._ended[buffer] = target
        self._wake.set()

    def quiet_again(self) -> None:
        """A burst of runs has been started (on the engine's loop)."""
        self._quiet.set()

    def _nudge(self) -> None:
        """On the loop: start the writing loop, or wake it from its idle park."""
        with self._lock:
            self._nudged = False
        if self._loop is None:
            return
        if self._task is None:
            self._task = self.loops.keep(self._keep, "run logs")
        elif self._idle:
            self._wake.set()

    async def _keep(self) -> None:
        """The loop: idle while no log is open; else the logs that changed are written every
        :data:`FLUSH_INTERVAL_S`, and soon after a handler returns (see :meth:`flush`)."""
        interval, batch = timedelta(seconds=FLUSH_INTERVAL_S), timedelta(seconds=FINAL_BATCH_S)
        while True:
            with self._lock:
                busy, ended = bool(self._open or self._ended), bool(self._ended)
            if not busy:
                self._idle = True
                try:
                    await self.loops.park("run logs", None, self._wake)
                finally:
                    self._idle = False
                continue
            if not ended or self._failing:
                await self.loops.park("run logs", self.clock.now() + interval, self._wake)  # an end wakes it
                with self._lock:
                    ended = bool(self._ended)
            if ended and not self._failing:
                # Let the ends of the same moment (a burst's) join one batch.
                await self.loops.park("run logs", self.clock.now() + batch)
            starting = self.busy
            if starting is not None and starting():
                # A burst is starting its handlers: taking the buffers and handing a batch to
                # the store's writer now would delay the later ones. Right after it, then.
                self._quiet.clear()
                await self.loops.park("run logs", self.clock.now() + interval, self._quiet)
            try:
                await self.flush()
                if self._failing:
                    self._failing = False
                    log.info("run logs: the store takes them again")
            except Unavailable as exc:
                if not self._failing:
                    self._failing = True
                    log.warning("run logs: cannot write them now (%s); kept in memory and retried", exc)
                self._drop_excess()

    def _drop_excess(self) -> None:
        with self._lock:
            excess = len(self._ended) - MAX_PENDING
            if excess <= 0:
                return
            dropped = list(self._ended)[:excess]
            for buffer in dropped:
                self._forget(buffer, self._ended.pop(buffer))
        log.error("run logs: dropped the logs of %d ended run(s) the store could not take", excess)

    def _forget(self, buffer: LogBuffer, target: LogTarget) -> None:
        self._written.pop(buffer, None)
        if self._by_target.get(target) is buffer:
            del self._by_target[target]

    # -- writing ----------------------------------------------------------------------------
    async def flush(self) -> None:
        """Write every log that changed since it was last written (one batch); raises
        :class:`Unavailable` (the logs are kept, to be written again)."""
        async with self._flushing:
            with self._lock:
                due = [(b, t) for b, t in self._open.items() if b.version != self._written.get(b)]
                due += list(self._ended.items())
            if not due:
                return
            now = self.clock.now()
            rows: list[StoredLog] = []
            done: list[tuple[LogBuffer, LogTarget, Snapshot]] = []
            for buffer, target in due:
                shot = buffer.snapshot()
                done.append((buffer, target, shot))
                rows.append(_row(target, shot, now))
            await self.store.save_logs(rows)
            self.writes += 1
            with self._lock:
                for buffer, target, shot in done:
                    if shot.final:
                        self._ended.pop(buffer, None)
                        self._forget(buffer, target)
                    else:
                        self._written[buffer] = shot.version

    # -- reading ------------------------------------------------------------------------------
    def _local(self, target: LogTarget) -> StoredLog | None:
        """The log of ``target`` as this process holds it, if it does (not yet all written)."""
        with self._lock:
            buffer = self._by_target.get(target)
        if buffer is None:
            return None
        shot = buffer.snapshot()
        # Not final to a reader until written: a reader elsewhere could not see it yet.
        return _row(target, shot, self.clock.now(), final=False)

    def _local_claim(self, job_id: str, seq: int | None, *, past: int = 0) -> StoredLog | None:
        """The log this process holds of a job's claim ``seq``, or (``None``) of its newest
        claim past ``past``."""
        with self._lock:
            held = [t for t in self._by_target
                    if t.kind == "job" and t.id == job_id and (t.seq == seq if seq is not None else t.seq > past)]  # fmt: skip
        return self._local(max(held, key=lambda t: t.seq)) if held else None

    def _settling(self, stored: StoredLog | None) -> bool:
        return stored is not None and not stored.final and (self.clock.now() - stored.updated_at).total_seconds() < SETTLE_S

    async def _gone(self, id: str, instance: str | None) -> bool:
        """Whether the instance recorded running ``id`` (a run, a job) is dead, as the
        abandoned-work sweep judges it (its row says ``running`` until the sweep closes it)."""
        judge = self.judge
        if judge is None or instance is None or judge.is_ours(id):
            return False
        beats = await judge.store.instances()
        return judge.gone(beats, instance, judge.clock.now()) is not None

    def _answer(
        self, kind: LogKind, id: str, name: str, status: str, running: bool, stored: StoredLog | None, after: int,
        attempt: int | None = None,
    ) -> RunLog:  # fmt: skip
        if stored is None:
            return RunLog(kind, id, status, running, "", 0, attempt=attempt, name=name)
        # Escaped on the way out, as every read of stored text is (an escape sequence a
        # handler printed must not reach an operator's terminal).
        text = escape_text(compose(stored.head, stored.tail, stored.size, stored.omitted_bytes, stored.omitted_lines, after))
        return RunLog(kind, id, status, running, text, stored.size, stored.omitted_bytes, stored.omitted_lines, attempt, name)

    async def run_log(self, run_id: str, *, after: int = 0) -> RunLog:
        """What a run's handler logged and printed (see the module)."""
        run = await self._get_run(run_id)
        target = LogTarget("run", run_id)
        stored = self._local(target) or await self.store.get_run_log(run_id)
        running = self._settling(stored) or (run.status == "running" and not await self._gone(run_id, run.instance))
        return self._answer("run", run_id, run.name, run.status, running, stored, after)

    async def job_log(self, job_id: str, attempt: int | None = None, *, after: int = 0) -> RunLog:
        """What a job attempt's handler logged and printed: the newest attempt's (the one
        running, else the last to end), or that of the attempt numbered ``attempt`` (its
        :attr:`~backend.jobs.model.Attempt.number`, as ``jobs show`` lists it; the one
        running, or one no end was recorded of, is numbered after the last that ended)."""
        detail = await self._get_job(job_id)
        job, ended = detail.job, detail.attempts
        running_now = job is not None and job.status == "running"
        after_ended = len(ended) + 1
        number = attempt
        if number is None:
            number = after_ended if running_now or not ended else len(ended)
        if 1 <= number <= len(ended):
            this = ended[number - 1]
            local = self._local_claim(job_id, this.seq)
            stored = local or await self.store.get_job_log(job_id, this.seq)
            return self._answer("job", job_id, detail.queue, this.status, self._settling(stored), stored, after, number)
        if number != after_ended:
            raise _no_attempt(job_id, number, len(ended))
        # The attempt after the last that ended: running, or left by a process that died
        # (or ran on after its job was deleted): its claim is past the last ended one's.
        past = ended[-1].seq if ended else 0
        stored = await self.store.get_job_log(job_id)
        if stored is not None and stored.target.seq <= past:
            stored = None  # the last ended attempt's: this one has said nothing yet
        local = self._local_claim(job_id, None, past=past)
        if local is not None and (stored is None or local.target.seq >= stored.target.seq):
            stored = local
        status: str
        if running_now:
            status = "running"
        elif stored is not None:
            status = job.status if job is not None else "unknown"
        elif attempt is None:  # queued, never tried yet
            return RunLog("job", job_id, job.status if job is not None else "unknown", False, "", 0, name=detail.queue)
        else:
            raise _no_attempt(job_id, number, len(ended))
        running = self._settling(stored) or (running_now and job is not None and not await self._gone(job_id, job.instance))
        return self._answer("job", job_id, detail.queue, status, running, stored, after, number)

    async def execution_log(self, execution_id: str, *, after: int = 0) -> RunLog:
        """A durable execution's log (the newest :data:`LOG_LINES` lines, as ``durable
        show`` gives them), read by line: ``size`` is the store's id of its newest line and
        ``after`` such an id (see the module)."""
        execution = await self._get_execution(execution_id)  # first: no line is written after it ended
        lines, left_out = await cast(DurableLogReads, self.store).durable_log_lines(execution_id, after)
        text = "".join(f"{_stamp(line.at)}  {line.message}\n" for n, line in lines if n > after)
        if text and left_out != 0:
            text = _left_out(left_out) + text
        size = lines[-1][0] if lines else 0
        return RunLog("durable", execution_id, execution.status, not execution.done, escape_text(text), size,
                      name=execution.function)  # fmt: skip


def _no_attempt(job_id: str, number: int, ended: int) -> NotFound:
    known = f"its attempts are numbered 1 to {ended}" if ended else "none has run yet"
    return NotFound(f"job {job_id} has no attempt {number} ({known})")


def _left_out(lines: int | None) -> str:
    """The marker line for lines of a durable execution's log a reader did not see, that
    left its window before it read them (``None``: how many, if any, cannot be told)."""
    what = "older lines may have been" if lines is None else f"{lines:,} line{'s' if lines != 1 else ''}"
    return f"[… {what} left out: a durable execution's log keeps its newest {LOG_LINES} lines …]\n"


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _row(target: LogTarget, shot: Snapshot, now: datetime, *, final: bool | None = None) -> StoredLog:
    return StoredLog(
        target, shot.head, shot.tail, shot.size, shot.omitted_bytes, shot.omitted_lines,
        shot.final if final is None else final, now,
    )  # fmt: skip
