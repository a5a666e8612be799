"""An async handler that burns CPU without awaiting: it holds the engine's event loop.

In the console the engine runs on a thread of its own, so the countdowns keep ticking
while this runs; the other schedules show a fired lag of up to two seconds instead.
"""

import time

from backend import define_schedule


async def crunch(ctx):
    end = time.monotonic() + 2.0
    total = 0
    while time.monotonic() < end:  # deliberately never awaits
        total += sum(range(1000))


cpu_hog = define_schedule(
    name="cpu-hog",
    cron="15,45 * * * * *",
    timezone="UTC",
    handler=crunch,
    max_runtime=60,
    description="Burns CPU for 2 s in an async handler",
)
