"""Invariants of schedules created at run time, under random sequences (Hypothesis):
create, update (cron), enable, disable and delete, interleaved with the manual clock
moving, on an engine that fires and an operator engine that acts on the same store. After
every step: at most one self run per (schedule, slot), no run of a deleted schedule at a
slot after its deletion, and every slot of a live, enabled, unchanged schedule fired."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from backend import Engine, ManualClock
from backend.errors import NotFound
from backend.jobs import JobContext, define_queue
from backend.scheduler.stored import NameTaken

NAMES = ("a", "b")
CRONS = ("* * * * *", "*/2 * * * *", "*/3 * * * *")


async def _job(ctx: JobContext) -> None:
    pass


class RuntimeSchedules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = Path(tempfile.mkdtemp())
        self.clock = ManualClock("2026-03-02T08:00:00Z")
        url = f"sqlite:///{self.folder / 'state.db'}"
        queue = define_queue(name="mail", handler=_job)
        self.firer = Engine([queue], url, clock=self.clock, instance="firer", shutdown_grace=0)
        self.operator = Engine([queue], url, clock=self.clock, instance="operator", shutdown_grace=0)
        self.run(self.firer.start())
        self.run(self.operator.open())
        self.run(self.firer.quiesce())
        self.deleted: dict[str, datetime] = {}
        """name -> when it was last deleted (while it does not exist now)"""
        self.exists: set[str] = set()
        self.unchanged: dict[str, str] = {}
        """name -> cron, for schedules not changed since their create (both engines act
        as the same operator: the same create again answers with the schedule)"""

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))

    def actor(self, on_firer: bool) -> Engine:
        return self.firer if on_firer else self.operator

    @rule(name=st.sampled_from(NAMES), cron=st.sampled_from(CRONS), on_firer=st.booleans())
    def create(self, name: str, cron: str, on_firer: bool) -> None:
        spec = {"name": name, "cron": cron, "timezone": "UTC", "queue": "mail"}
        try:
            self.run(self.actor(on_firer).create_schedule(spec))
        except NameTaken:
            assert name in self.exists and self.unchanged.get(name) != cron
            return
        if name in self.exists:
            assert self.unchanged.get(name) == cron, "a create repeated over a changed schedule answered"
            return
        self.exists.add(name)
        self.unchanged[name] = cron
        self.deleted.pop(name, None)

    @rule(name=st.sampled_from(NAMES), cron=st.sampled_from(CRONS), on_firer=st.booleans())
    def update(self, name: str, cron: str, on_firer: bool) -> None:
        try:
            self.run(self.actor(on_firer).update_schedule(name, {"cron": cron}))
        except NotFound:
            assert name not in self.exists
            return
        self.unchanged.pop(name, None)

    @rule(name=st.sampled_from(NAMES), enabled=st.booleans())
    def set_enabled(self, name: str, enabled: bool) -> None:
        try:
            self.run(self.firer.set_enabled(name, enabled))
        except NotFound:
            assert name not in self.exists

    @rule(name=st.sampled_from(NAMES), on_firer=st.booleans())
    def delete(self, name: str, on_firer: bool) -> None:
        try:
            self.run(self.actor(on_firer).delete_schedule(name))
        except NotFound:
            assert name not in self.exists
            return
        self.exists.discard(name)
        self.unchanged.pop(name, None)
        self.deleted[name] = self.clock.now()

    @rule(seconds=st.sampled_from([0.5, 1.0, 20.0, 59.0]))
    def advance(self, seconds: float) -> None:
        left = seconds
        while left > 0:
            self.clock.advance(min(left, 1.0))
            left -= 1.0
            self.run(self.firer.quiesce())

    @invariant()
    def one_run_per_slot_and_none_after_deletion(self) -> None:
        self.run(self.firer.flush())
        for name in NAMES:
            runs = [r for r in self.run(self.firer.store.list_runs(name, limit=100_000)) if r.trigger == "self"]
            twice = [slot for slot, n in Counter(r.scheduled_at for r in runs).items() if n > 1]
            assert twice == [], (name, twice)
            gone = self.deleted.get(name)
            if gone is not None:
                # The firer hears of another process's delete within one poll (1 s).
                late = [r.scheduled_at for r in runs if r.scheduled_at > gone + timedelta(seconds=1)]
                assert late == [], (name, gone, late)

    def teardown(self) -> None:
        try:
            self.run(self.firer.stop(grace=0))
            self.run(self.operator.stop(grace=0))
        finally:
            self.loop.close()
            shutil.rmtree(self.folder, ignore_errors=True)


RuntimeSchedules.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_runtime_schedule_invariants = RuntimeSchedules.TestCase
