"""Takes longer than its interval, so the next slot finds it running and is skipped."""

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
    description="Rebuilds the search index",
)
