"""Takes longer than its interval, so the next slot finds it running and is skipped; each run
holds the lock ``search-index`` (the Locks view shows it held, its token rising run by run)."""

import asyncio

from backend import define_schedule


async def reindex(ctx):
    await asyncio.sleep(14)


slow_reindex = define_schedule(
    name="slow-reindex",
    cron="*/10 * * * * *",
    timezone="UTC",
    handler=reindex,
    on_overlap="skip",
    max_runtime=60,
    lock="search-index",
    lock_ttl=30,
    description="Rebuilds the search index",
)
