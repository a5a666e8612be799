"""Quick async work every ten seconds: the steady green line."""

import asyncio

from backend import define_schedule


async def beat(ctx):
    await asyncio.sleep(0.05)


heartbeat = define_schedule(
    name="heartbeat",
    cron="*/10 * * * * *",
    timezone="UTC",
    handler=beat,
    description="Pings the upstream API",
)
