"""Recording runs: every version of every run goes through one :class:`RunLedger`.

The ledger tells listeners at once (on the engine's loop) and hands the rows to the store's
group-committing writer soon after, never making a handler wait for the disk. While a
burst of due slots is being started, the hand-off is held back (:meth:`RunLedger.hold`):
the writer's work holds the GIL, and handing it batches between slices of a burst would
make every later handler of the burst wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator

from backend.model import Run
from backend.store import Store

__all__ = ["RunLedger", "RunListener"]

log = logging.getLogger("schedtui.engine")

RunListener = Callable[[Run], None]
"""Called on the engine's loop with every run version the engine records."""


class RunLedger:
    """Buffers recorded runs, tells listeners, and hands batches to the store.

    Contract: runs reach the store in the order they were recorded; :meth:`flush` returns
    once everything recorded before it is committed; a failing listener is logged and
    never stops a recording.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.listeners: list[RunListener] = []
        self.stats: dict[str, int] = defaultdict(int)
        self._buffer: list[Run] = []
        self._pending = False
        self._held = False
        self.on_finished: Callable[[Run], None] | None = None
        """Called for every run recorded in a final status (the claims' bookkeeping)."""
        self.meters: list[RunListener] = []
        """Told every run this engine records in a final status, and every run of another
        instance it closes (:meth:`closed`), once (the metrics); a failing one is logged,
        as a listener is."""
        self.on_handoff: list[Callable[[], None]] = []
        """Called after each hand-off of rows to the store (the change signals wait for it)."""

    @property
    def holding(self) -> bool:
        """Whether a burst is being started (see :meth:`hold`): other writers wait for its end."""
        return self._held

    @property
    def buffered(self) -> bool:
        """Whether recorded runs wait in the buffer, not yet handed to the store."""
        return bool(self._buffer)

    def record(self, run: Run) -> None:
        status = run.status
        if status != "running":
            if self.on_finished is not None:
                self.on_finished(run)
            self._meter(run)
        self.keep(run)
        self.stats[status] += 1
        for listener in self.listeners:  # tell(run), inlined: twice per run
            try:
                listener(run)
            except Exception:
                log.exception("a run listener failed")

    def keep(self, run: Run) -> None:
        """Hand a version of a run to the store only: one that says no more than what was
        recorded already but for :attr:`Run.held` (its overlap place held, or let go)."""
        self._buffer.append(run)
        if not self._pending and not self._held:
            self._pending = True
            # After the tasks already scheduled (handlers starting), not before them.
            asyncio.get_running_loop().call_soon(self._scheduled_handoff)

    def closed(self, run: Run) -> None:
        """A run of another instance that this engine closed in the store (its instance
        gone): counted here, once, as this engine is the only one that sees it end, and
        told to the listeners."""
        self._meter(run)
        self.tell(run)

    def _meter(self, run: Run) -> None:
        _tell_each(self.meters, run, "meter")

    def tell(self, run: Run) -> None:
        """Tell the listeners about a run version (also one written by someone else)."""
        _tell_each(self.listeners, run, "listener")

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep recorded runs in the buffer until the block ends, then hand them off."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self.handoff()

    def _scheduled_handoff(self) -> None:
        self._pending = False
        if not self._held:
            self.handoff()

    def handoff(self) -> None:
        self._pending = False
        if self._buffer:
            batch, self._buffer = self._buffer, []
            self.store.save_runs(batch)
            for hook in self.on_handoff:
                hook()

    async def flush(self) -> None:
        """Return once every run recorded so far is committed to the store."""
        self.handoff()
        await self.store.flush()


def _tell_each(callbacks: list[RunListener], run: Run, kind: str) -> None:
    """Call each of them with the run; one that fails is logged and stops nothing."""
    for callback in callbacks:
        try:
            callback(run)
        except Exception:
            log.exception("a run %s failed", kind)
