"""A run's ``running`` row in the store before its handler starts.

A run launched without a row of its own (a Run now, a backfill's, a catch-up's) has its
row written first, and its handler starts once that row is committed: a handler that
kills its process still leaves its run in the ledger, to be closed as abandoned, and the
other instances' overlap checks count a Run now in flight from that commit on. The rows
of the runs launched in one loop iteration share one write. The wait for a commit is
bounded (:data:`PLACE_WAIT_S`): a store that slow is failing, and its runs start with
their rows waiting in the writer rather than not at all.

The timers' mark that this instance starts a slot's runs (:meth:`Store.mark_starting`)
is committed the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from backend.model import Run
from backend.store import MarksNow, Store

__all__ = ["PLACE_WAIT_S", "RowPlacement"]

log = logging.getLogger("schedtui.engine")

#: How long a run waits for its ``running`` row to be committed before its handler starts
#: anyway (a store that is this slow is failing: its rows wait in the writer meanwhile).
PLACE_WAIT_S = 2.0


class RowPlacement:
    """Writes the rows of runs about to start, and says when they are committed.

    Contract: every row handed in is written (now, or by the store's writer once it
    answers); each future resolves (never cancelled, never raising) with True once the
    write is committed, False when the store refused it or is failing, and None when it
    has not answered within :data:`PLACE_WAIT_S`; while one write is that slow, the next
    ones do not wait at all."""

    def __init__(self, *, store: Store, instance: str) -> None:
        self.store = store
        self.instance = instance
        self.placed: set[str] = set()
        """Run ids whose ``running`` row this instance wrote before starting them and that
        are not recorded finished yet."""
        self._batch: tuple[list[Run], asyncio.Future[bool | None]] | None = None
        self._slow_flush: asyncio.Future[None] | None = None
        self._mark_now = store.mark_starting_now if isinstance(store, MarksNow) else None

    def soon(self, run: Run) -> asyncio.Future[bool | None]:
        """Add ``run``'s row to the batch written at the end of this loop iteration. The
        future is the whole batch's: await it shielded (a run stopped alone as it waits
        must not cancel it under the others, which would then fail as cancelled)."""
        if self._batch is None:
            self._batch = ([], asyncio.get_running_loop().create_future())
            asyncio.ensure_future(self._write_batch())
        rows, gate = self._batch
        rows.append(run)
        return gate

    async def _write_batch(self) -> None:
        await asyncio.sleep(0)  # let the rest of this iteration's launches join the batch
        assert self._batch is not None
        (rows, gate), self._batch = self._batch, None
        committed: bool | None = False
        try:
            committed = await self.place(rows)
        finally:
            gate.set_result(committed)  # (never cancelled: each run awaits it shielded)

    def place(self, runs: list[Run]) -> asyncio.Future[bool | None]:
        """Hand the ``running`` rows of runs about to start to the store now; the future
        resolves once they are committed (after :data:`PLACE_WAIT_S` at most, and at once
        while the store is that slow: their rows then wait in the writer). A Run now's row
        holds its schedule's turn (:attr:`Run.held`), and a store that decides turns with
        locks commits it under its schedule's (see :meth:`Store.take_turn`): no other
        instance decides a turn of it from a view without that row."""
        self.placed.update(run.id for run in runs)
        self.store.save_runs(runs)
        return asyncio.ensure_future(self._committed())

    async def mark_starting(self, slot: datetime) -> None:
        """Commit the store's mark that this instance starts the runs due at ``slot`` (see
        :meth:`Store.mark_starting`), waiting as :meth:`place` does (or not at all, when
        the store can commit it at once)."""
        if self._mark_now is not None and self._mark_now(self.instance, slot):
            return
        await self._committed(lambda: self.store.mark_starting(self.instance, slot))

    async def _committed(self, write: Callable[[], Awaitable[None]] | None = None) -> bool | None:
        """Wait for ``write`` (default: a flush of the rows handed in) to commit, at most
        :data:`PLACE_WAIT_S`, and not at all while the store is failing or that slow. True
        once committed, False when the store refused it (or is failing), None when it has
        not answered yet (slow)."""
        if not self.store.health().ok:
            return False  # the store says why, once; its rows wait in the writer
        if self._slow_flush is not None:
            if not self._slow_flush.done():
                return None
            self._slow_flush = None
        flush = asyncio.ensure_future(write() if write is not None else self.store.flush())
        done, _ = await asyncio.wait({flush}, timeout=PLACE_WAIT_S)
        if not done:
            self._slow_flush = flush
            flush.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, never raised
            log.warning(
                "the store did not commit within %gs: runs start without their row committed first "
                "(their rows wait in the writer) until it does",
                PLACE_WAIT_S,
            )
            return None
        if flush.exception() is not None:
            log.warning("could not commit the rows of runs about to start (%s); starting them anyway", flush.exception())
            return False
        return True
