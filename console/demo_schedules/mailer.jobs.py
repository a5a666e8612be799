"""A job queue: mail goes out a few at a time; one address bounces on every attempt.

``sync-report`` sends a mail for each report it builds, and the demo queues a few more at
start (``console/demo.py``): the mail to ``ops@bounce.example`` fails, waits 10 s, then 20 s,
and is dead after its third attempt (``R`` in the Jobs view retries it); the newsletter
waits an hour.
"""

import asyncio

from backend import define_queue


async def deliver(job):
    await asyncio.sleep(0.05)
    if job.payload.get("to", "").endswith("@bounce.example"):
        raise ConnectionResetError("mx.bounce.example reset the connection")


mailer = define_queue(
    name="mailer",
    handler=deliver,
    concurrency=2,
    attempts=3,
    max_runtime=60,
    description="Sends outgoing mail",
)
