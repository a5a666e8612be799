"""Deleting many rows as many short transactions.

SQLite has one writer: a delete of a whole retention backlog in one transaction (a first
start after a long stop, a lower retention) held every other write behind it (a firing's
run row, a heartbeat, an operator's action) for seconds, and grew the write-ahead log to
the size of what it deleted. Deleted :data:`PRUNE_BATCH` rows at a time, the writer takes
what was handed in meanwhile between two transactions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable

__all__ = ["PRUNE_BATCH", "delete_in_batches"]

#: Most rows one transaction of a retention sweep deletes (of the table it walks).
PRUNE_BATCH = 500


async def delete_in_batches(
    write: Callable[[Callable[[sqlite3.Connection], int]], Awaitable[int]],
    delete: Callable[[sqlite3.Connection, int], int],
    limit: int | None = None,
) -> int:
    """Run ``delete(conn, n)`` (delete at most ``n`` rows, return how many it did) as one
    transaction after another through ``write``, until one deletes fewer than it may, or
    ``limit`` rows are gone. How many were."""
    removed = 0
    while limit is None or removed < limit:
        batch = PRUNE_BATCH if limit is None else min(PRUNE_BATCH, limit - removed)
        done = await write(lambda conn, batch=batch: delete(conn, batch))  # type: ignore[misc]
        removed += done
        if done < batch:
            break
    return removed
