"""Daily at 09:00 Berlin time; catches up the newest missed morning after downtime."""

from backend import define_schedule


async def send_digest(ctx):
    pass


daily_digest = define_schedule(
    name="daily-digest",
    cron="0 9 * * *",
    timezone="Europe/Berlin",
    handler=send_digest,
    backfill="latest",
    payload={"list": "all"},
    description="Morning digest",
)
