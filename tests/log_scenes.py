"""A run's log in the console's fixture ledger, as of its frozen instant.

The newest run of flaky-export (its 08:00:00 slot, which failed) wrote more than a run
keeps: its log is its head, a count of what was left out, and its tail ending with the
traceback. Written straight into the store (a captured log's lines carry the wall clock's
times; these are fixed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from backend.observability.logs import LogTarget, StoredLog
from backend.store import open_store
from tests.console_fixtures import FROZEN

HEAD = "".join(
    [
        "2026-03-02T08:00:00.004Z INFO export: exporting the hourly orders (America/New_York 02:00-03:00)\n",
        "2026-03-02T08:00:00.011Z INFO export: 41,922 orders to send in 168 pages\n",
        *(f"2026-03-02T08:00:00.{12 + 9 * n:03d}Z INFO export: page {n} of 168 sent (250 orders)\n" for n in range(1, 5)),
    ]
)
TAIL = "".join(
    [
        *(f"2026-03-02T08:00:04.{(n - 160) * 11 + 700:03d}Z INFO export: page {n} of 168 sent (250 orders)\n" for n in range(163, 166)),
        "2026-03-02T08:00:04.912Z WARNING export: page 166: the export API is slow (12.1s)\n",
        "Traceback (most recent call last):\n",
        '  File "schedules/flaky_export.cron.py", line 31, in export\n',
        "    send_page(session, page)\n",
        "TimeoutError: export API answered 504 after 30s\n",
    ]
)
OMITTED_BYTES = 91_204
OMITTED_LINES = 1_162


async def add_run_logs(url: str) -> str:
    """Give flaky-export's newest run its log; returns the run's id."""
    store: Any = open_store(url)
    await store.open()
    try:
        run = (await store.list_runs("flaky-export", limit=1))[0]
        size = len(HEAD.encode()) + OMITTED_BYTES + len(TAIL.encode())
        at = datetime.fromisoformat(FROZEN.replace("Z", "+00:00"))
        await store.save_logs([StoredLog(LogTarget("run", run.id), HEAD, TAIL, size, OMITTED_BYTES, OMITTED_LINES, True, at)])
        return str(run.id)
    finally:
        await store.close()
