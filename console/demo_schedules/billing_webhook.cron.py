"""Fired by the platform's scheduler (a Kubernetes CronJob, say), not by an in-process timer.

In the demo nobody runs that platform, so the demo plays it: a second instance calls
``fire_external`` at every minute, as the platform's call to ``POST /schedule/billing-webhook/fire``
would (see ``console/demo.py``).
"""

from backend import define_schedule


async def push(ctx):
    pass


billing_webhook = define_schedule(
    name="billing-webhook",
    cron="* * * * *",
    timezone="UTC",
    handler=push,
    trigger="external",
    description="Pushes usage to billing (platform-fired)",
)
