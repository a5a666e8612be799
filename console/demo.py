"""The demo: bundled schedules on a temporary store, seeded so every status and every
coordination outcome shows within a minute.

* The engine runs in ``advisoryLock`` mode (SQLite has a claims table too), so its own
  firings are recorded ``wonLock``.
* ``daily-digest`` has one run from four days ago, recorded ``single``: it stands for the
  history from before this deployment became a fleet. The boot catch-up then finds the
  mornings since: the older ones are recorded ``missed``, the newest fires.
* ``legacy-cleanup`` is disabled with a note, as an operator would have left it.
* ``billing-webhook`` has ``trigger="external"``: a platform scheduler would call
  ``POST /schedule/billing-webhook/fire`` every minute. The demo plays that platform with a
  small background task on a second instance (``demo-2``) that calls
  :meth:`~backend.scheduler.engine.Engine.fire_external` at each minute: outcome ``external``.
* One Run now at start (``heartbeat``): outcome ``manual``.
* The rest come from the schedules themselves: ``flaky-export`` fails every other slot,
  ``slow-reindex`` outlives its interval (``running``, then ``skipped`` overlaps) holding
  the lock ``search-index``, ``stuck-import`` hits its watchdog (``failed``/``timeout``),
  ``sync-report`` mails each report through the ``mailer`` queue, and ``cpu-hog`` holds
  the engine's loop for two seconds (the console's countdowns keep ticking regardless).
* The queue ``mailer`` also gets, at the start, two mails that go out at once, one to an
  address that bounces (retried after 10 s and 20 s, then ``dead``) and a newsletter an
  hour away; the durable function ``release`` gets two executions: 2.3.9, approved at
  once, runs to its end, and 2.4.0 waits for the signal ``approval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from datetime import timedelta
from pathlib import Path

from backend import Engine, Run
from backend.client.interface import Backend
from backend.clock import Clock
from backend.definitions import discover_definitions
from backend.errors import SchedtuiError

DEMO_SCHEDULES = Path(__file__).parent / "demo_schedules"
EXTERNAL = "billing-webhook"
"""The demo's external schedule, fired by :class:`ExternalPlatform`."""
RUN_NOW = "heartbeat"
"""The schedule the demo runs once at start (a manual run)."""
QUEUE = "mailer"
"""The demo's job queue."""
BOUNCING = "ops@bounce.example"
"""The address whose mail fails every attempt, so the demo shows a dead job."""
RELEASE = "release"
"""The demo's durable function."""

log = logging.getLogger("schedtui.demo")


def store_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'state.db'}"


def demo_engine(folder: Path, *, clock: Clock | None = None, instance: str = "demo-1") -> Engine:
    """An engine over the demo schedules and the store in ``folder`` (not opened)."""
    return Engine(
        discover_definitions(DEMO_SCHEDULES).items, store_url(folder), clock=clock, instance=instance,
        coordination="advisoryLock", shutdown_grace=2,
    )


async def seed_demo(folder: Path, *, clock: Clock | None = None) -> None:
    """Write the demo's history into a fresh store in ``folder`` (then close it again, so
    the engine that runs the demo can open it on a loop of its own)."""
    engine = demo_engine(folder, clock=clock)
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
                # History from before the demo switched to a fleet (advisoryLock): one
                # instance fired it alone, so its outcome is "single".
                coordination_outcome="single",
                instance="demo-1",
                fired_at=last_morning + timedelta(milliseconds=4),
                finished_at=last_morning + timedelta(milliseconds=310),
            )
        ]
    )
    await engine.store.flush()
    await engine.set_enabled("legacy-cleanup", False, note="paused during the session-store migration", by="ops")
    await engine.jobs.send_many(
        QUEUE,
        [
            {"payload": {"to": "ana@example.com", "subject": "Your invoice"}},
            {"payload": {"to": "li@example.com", "subject": "Password reset"}},
            {"payload": {"to": BOUNCING, "subject": "Disk usage at 91%"}, "key": "disk-usage-alert"},
            {"payload": {"to": "all@example.com", "subject": "Weekly newsletter"}, "delay": 3600, "key": "newsletter"},
        ],
    )
    approved = await engine.durable.start_execution(RELEASE, {"version": "2.3.9"})
    await engine.durable.signal(approved.id, "approval", {"by": "ops"})  # kept until the code asks for it
    await engine.durable.start_execution(RELEASE, {"version": "2.4.0"})
    await engine.stop(grace=0)


async def prepare_demo(folder: Path, *, clock: Clock | None = None) -> Engine:
    """The seeded store, and an opened (not started) engine over it on this loop."""
    await seed_demo(folder, clock=clock)
    engine = demo_engine(folder, clock=clock)
    await engine.open()
    return engine


async def play_platform(engine: Engine, name: str = EXTERNAL) -> None:
    """Call ``fire_external`` now and then at every slot of ``name``, as a platform
    scheduler calling ``POST /schedule/NAME/fire`` would. Runs until cancelled."""
    clock = engine.clock
    cron = engine.schedules[name].cron
    while True:
        try:
            firing = await engine.fire_external(name)
            log.info("platform fired %s: run %s", name, firing.run_id)
        except SchedtuiError as exc:
            log.warning("platform could not fire %s: %s", name, exc.message)
        await clock.sleep_until(cron.next(clock.now()))


class ExternalPlatform:
    """The platform scheduler, played by a second instance (``demo-2``) on a thread and
    event loop of its own, so it shares nothing with the console's engine but the store."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="schedtui-demo-platform", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        engine = demo_engine(self.folder, instance="demo-2")
        try:
            await engine.open()
        finally:
            self._ready.set()
        task = asyncio.ensure_future(play_platform(engine))
        await self._stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await engine.stop(grace=2)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


async def run_now_at_start(backend: Backend) -> None:
    """The demo's one Run now, so a ``manual`` run is there from the first second."""
    await backend.run_now(RUN_NOW)
