"""Hangs past its max_runtime: the watchdog records a timeout."""

import time

from backend import define_schedule


def import_feed(ctx):
    time.sleep(12)  # a sync handler cannot be killed: the watchdog abandons its thread


stuck_import = define_schedule(
    name="stuck-import",
    cron="*/20 * * * * *",
    timezone="Asia/Tokyo",
    handler=import_feed,
    on_overlap="parallel",
    max_runtime=4,
    description="Pulls the partner feed",
)
