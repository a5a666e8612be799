"""Whether another process committed to the SQLite file (a mixin of
:class:`~backend.store.sqlite.store.SQLiteStore`; see :mod:`backend.events.relay`).

``PRAGMA data_version`` on a connection changes when any *other* connection commits. The
writer's connection makes all of this process's commits, so on it the counter moves only
for other processes: read there, outside any transaction (no lock is taken).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

__all__ = ["SQLiteEvents"]

T = TypeVar("T")

DATA_VERSION = "PRAGMA data_version"


class SQLiteEvents:
    if TYPE_CHECKING:

        async def _peek(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def change_counter(self) -> int:
        return await self._peek(lambda c: int(c.execute(DATA_VERSION).fetchone()[0]))
