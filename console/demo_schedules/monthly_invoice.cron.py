"""Fired by the platform's scheduler (a Kubernetes CronJob), not by an in-process timer."""

from backend import define_schedule


async def invoice(ctx):
    pass


monthly_invoice = define_schedule(
    name="monthly-invoice",
    cron="0 3 1 * *",
    timezone="UTC",
    handler=invoice,
    trigger="external",
    description="Bills last month",
)
