"""Copying the write-ahead log into the store's file, on a thread of its own.

SQLite checkpoints on the connection whose commit takes the log past a thousand pages,
inside that commit: three fsyncs (the log, the file, the log again). On a slow disk (a
network volume, a throttled cloud disk, a busy host) that held the ledger writer's commit
for seconds; the runs about to start waited for it, the timers with them (two seconds at
most), and every-second schedules lost their next slots at each checkpoint. So no
connection of the store checkpoints when it commits (``wal_autocheckpoint = 0``), and this
thread checkpoints instead, every :data:`CHECKPOINT_EVERY` seconds when something was
committed since the last time, and as soon as :data:`CHECKPOINT_COMMITS` commits were (a
log left to grow for seconds of a busy writer slowed every read, which searches it), with
``PASSIVE`` (never waiting for a reader or a writer: writers go on appending to the log
meanwhile). Commits never fsync then (WAL with
``synchronous = NORMAL``): a slow disk slows the checkpoints, not the writer.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Final

__all__ = ["CHECKPOINT_EVERY", "Checkpointer"]

log = logging.getLogger("schedtui.store")

#: Seconds between two checkpoints while the store is written to.
CHECKPOINT_EVERY: Final = 2.0
#: Commits after which a checkpoint is due at once (a few hundred pages of log).
CHECKPOINT_COMMITS: Final = 100


class Checkpointer(threading.Thread):
    """Checkpoints ``connect()``'s connection's database while ``written()`` (a count of
    commits) moves; :meth:`stop` ends it (after the checkpoint under way)."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], written: Callable[[], int]) -> None:
        super().__init__(name="schedtui-sqlite-checkpointer", daemon=True)
        self.connect = connect
        self.written = written
        self.checkpoints = 0
        self._done = 0
        """What ``written()`` said at the last checkpoint."""
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._failing: str | None = None

    def run(self) -> None:
        try:
            conn = self.connect()
        except sqlite3.Error as exc:  # the writer says what is wrong with the file
            log.debug("the checkpointer could not open the store: %s", exc)
            return
        try:
            self._done = self.written()
            while not self._stopping.is_set():
                self._due.wait(CHECKPOINT_EVERY)
                self._due.clear()
                now = self.written()
                if now != self._done and self.checkpoint(conn):
                    self._done = now
            self.checkpoint(conn)  # (what the last seconds wrote: the next open reads less log)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> bool:
        """One ``PASSIVE`` checkpoint; whether it ran (a full disk or a locked file fails it,
        quietly: the writer names that trouble, and the next round tries again)."""
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            if str(exc) != self._failing:
                log.debug("a checkpoint failed: %s", exc)
            self._failing = str(exc)
            return False
        self._failing = None
        self.checkpoints += 1
        return True

    def committed(self, written: int) -> None:
        """The writer committed (``written``: the count so far): a checkpoint is due at once
        after :data:`CHECKPOINT_COMMITS` of them."""
        if written - self._done >= CHECKPOINT_COMMITS:
            self._due.set()

    def stop(self) -> None:
        self._stopping.set()
        self._due.set()
