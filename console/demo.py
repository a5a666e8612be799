"""The demo: bundled schedules on a temporary store, seeded so every status shows at once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from backend import Engine, Run, discover
from backend.clock import Clock

DEMO_SCHEDULES = Path(__file__).parent / "demo_schedules"


async def prepare_demo(folder: Path, *, clock: Clock | None = None) -> Engine:
    """An opened (not started) engine over the demo schedules in a fresh store in ``folder``.

    The store is seeded with one ``daily-digest`` run from four days ago, so the boot
    catch-up finds three missed mornings (recorded ``missed``) and fires the newest, and
    ``legacy-cleanup`` is disabled with a note, as an operator would have left it.
    """
    engine = Engine(discover(DEMO_SCHEDULES), f"sqlite:///{folder / 'state.db'}", clock=clock, instance="demo")
    await engine.open()
    now = engine.clock.now()
    digest = engine.schedules["daily-digest"]
    last_morning = digest.cron.latest(now - timedelta(days=4))
    engine.store.save_runs(
        [
            Run(
                id=engine.new_id(),
                name="daily-digest",
                scheduled_at=last_morning,
                status="succeeded",
                trigger="self",
                coordination_outcome=engine.coordinator.outcome,
                instance="demo",
                fired_at=last_morning + timedelta(milliseconds=4),
                finished_at=last_morning + timedelta(milliseconds=310),
            )
        ]
    )
    await engine.store.flush()
    await engine.set_enabled("legacy-cleanup", False, note="paused during the session-store migration", by="ops")
    return engine
