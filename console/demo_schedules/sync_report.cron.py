"""A plain (sync) function, run on a thread, every ten seconds in Berlin time; it mails each
report it builds through the ``mailer`` queue."""

import time

from backend import define_schedule


def build_report(ctx):
    time.sleep(0.2)
    ctx.jobs.sync.send("mailer", {"to": "finance@example.com", "report": f"usage-{ctx.scheduled_at:%H%M%S}.csv"})


sync_report = define_schedule(
    name="sync-report",
    cron="5-55/10 * * * * *",
    timezone="Europe/Berlin",
    handler=build_report,
    payload={"format": "csv"},
    description="Rebuilds the usage report",
)
