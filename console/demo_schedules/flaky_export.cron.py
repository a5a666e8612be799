"""Fails on every other slot: what a failure looks like in the ledger."""

from backend import define_schedule


async def export(ctx):
    if ctx.scheduled_at.second % 20 == 0 and ctx.trigger == "self":
        raise ConnectionRefusedError("smtp.example.internal:587 refused the connection")


flaky_export = define_schedule(
    name="flaky-export",
    cron="*/10 * * * * *",
    timezone="America/New_York",
    handler=export,
    description="Mails the hourly export",
)
