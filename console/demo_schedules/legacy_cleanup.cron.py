"""Disabled by an operator (with a note) in the demo."""

from backend import define_schedule


async def cleanup(ctx):
    pass


legacy_cleanup = define_schedule(
    name="legacy-cleanup",
    cron="*/15 * * * *",
    timezone="UTC",
    handler=cleanup,
    description="Prunes the old session table",
)
