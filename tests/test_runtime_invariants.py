"""Invariants of schedules created at run time, under random sequences (Hypothesis):
create, update (cron), enable, disable and delete, interleaved with the manual clock
moving, on an engine that fires (and is restarted, time passing while it is down) and an
operator engine that acts on the same store, and another release writing a row this one
cannot run (a zone its time zone database lacks) or correcting it. After every step: at
most one self run per (schedule, slot), and no run of a deleted schedule at a slot after
its deletion, nor of one created again at a slot between the deletion and its creation (a
restart's catch-up must not take where the deleted namesake left off for its own), nor of
one at a slot while its row was not valid here; and every schedule is listed, with a
problem exactly while its row is not valid here (never hidden)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from backend import BadInput, Engine, ManualClock
from backend.errors import NotFound
from backend.jobs import JobContext, define_queue
from backend.scheduler.stored import NameTaken, NotValidHere
from tests.bounded import run_within

NAMES = ("a", "b")
#: A zone no time zone database has: what a newer release's row is to this one.
FOREIGN_ZONE = "Mars/Olympus_Mons"
CRONS = ("* * * * *", "*/2 * * * *", "*/3 * * * *")


async def _job(ctx: JobContext) -> None:
    pass


class RuntimeSchedules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = Path(tempfile.mkdtemp())
        self.clock = ManualClock("2026-03-02T08:00:00Z")
        self.url = url = f"sqlite:///{self.folder / 'state.db'}"
        queue = define_queue(name="mail", handler=_job)
        self.firer = Engine([queue], url, clock=self.clock, instance="firer", shutdown_grace=0)
        self.operator = Engine([queue], url, clock=self.clock, instance="operator", shutdown_grace=0)
        self.run(self.firer.start())
        self.run(self.operator.open())
        self.run(self.firer.quiesce())
        self.deleted: dict[str, datetime] = {}
        """name -> when it was last deleted (while it does not exist now)"""
        self.gaps: list[tuple[str, datetime, datetime]] = []
        """(name, deleted at, created again at): no slot in between is the new one's"""
        self.exists: set[str] = set()
        self.disabled: set[str] = set()
        self.invalid: dict[str, datetime] = {}
        """name -> since when its row is not valid here (another release wrote it)"""
        self.invalid_spans: list[tuple[str, datetime, datetime]] = []
        """(name, made invalid at, corrected or deleted at): no slot in between fires"""
        self.unchanged: dict[str, str] = {}
        """name -> "cron backfill", for schedules not changed since their create (both engines act
        as the same operator: the same create again answers with the schedule)"""

    def run(self, coro: Any) -> Any:
        try:
            return run_within(self.loop, coro, 60)
        except AssertionError as exc:  # (a quiesce that did not end: say what it waited for)
            if "did not end within" not in str(exc):
                raise
            waiting = {engine.instance: engine.unsettled() for engine in (self.firer, self.operator)}
            raise AssertionError(f"{exc}; still busy: {waiting}") from None

    def actor(self, on_firer: bool) -> Engine:
        return self.firer if on_firer else self.operator

    @rule(name=st.sampled_from(NAMES), cron=st.sampled_from(CRONS), on_firer=st.booleans(),
          backfill=st.sampled_from(["skip", "all"]))  # fmt: skip
    def create(self, name: str, cron: str, on_firer: bool, backfill: str) -> None:
        spec = {"name": name, "cron": cron, "timezone": "UTC", "queue": "mail", "backfill": backfill}
        wanted = f"{cron} {backfill}"  # what a repeat must match
        try:
            self.run(self.actor(on_firer).create_schedule(spec))
        except NameTaken:
            assert name in self.exists and (self.unchanged.get(name) != wanted or name in self.disabled)
            return
        if name in self.exists:
            assert self.unchanged.get(name) == wanted and name not in self.disabled, (
                "a create repeated over a changed schedule answered"
            )
            return
        self.exists.add(name)
        self.unchanged[name] = wanted
        gone = self.deleted.pop(name, None)
        if gone is not None:
            self.gaps.append((name, gone, self.clock.now()))

    @rule(name=st.sampled_from(NAMES), cron=st.sampled_from(CRONS), on_firer=st.booleans())
    def update(self, name: str, cron: str, on_firer: bool) -> None:
        try:
            self.run(self.actor(on_firer).update_schedule(name, {"cron": cron}))
        except NotFound:
            assert name not in self.exists
            return
        except BadInput as exc:  # its zone is still one this release lacks: corrected first
            assert name in self.invalid and FOREIGN_ZONE in exc.message
            return
        self.unchanged.pop(name, None)

    @rule(name=st.sampled_from(NAMES), enabled=st.booleans())
    def set_enabled(self, name: str, enabled: bool) -> None:
        try:
            self.run(self.firer.set_enabled(name, enabled))
        except NotFound:
            assert name not in self.exists
            return
        except NotValidHere:
            assert name in self.invalid
            return
        (self.disabled.discard if enabled else self.disabled.add)(name)

    @rule(name=st.sampled_from(NAMES), on_firer=st.booleans())
    def delete(self, name: str, on_firer: bool) -> None:
        try:
            self.run(self.actor(on_firer).delete_schedule(name))
        except NotFound:
            assert name not in self.exists
            return
        self.exists.discard(name)
        self.disabled.discard(name)
        self.unchanged.pop(name, None)
        self.deleted[name] = self.clock.now()
        self._valid_again(name)

    def _valid_again(self, name: str) -> None:
        since = self.invalid.pop(name, None)
        if since is not None:
            self.invalid_spans.append((name, since, self.clock.now()))

    @rule(name=st.sampled_from(NAMES), valid=st.booleans())
    def another_release_writes(self, name: str, valid: bool) -> None:
        """A release whose time zone database differs rewrites the row: with a zone this
        one lacks (not valid here), or back to one it has (corrected)."""
        store = self.operator.catalog.store
        rows = {row.name: row for row in self.run(store.stored_schedules())[1]}
        row = rows.get(name)
        if row is None:
            assert name not in self.exists
            return
        zone = "UTC" if valid else FOREIGN_ZONE
        if row.timezone == zone:
            return
        written = replace(row, timezone=zone, updated_at=self.clock.now(), updated_by="another release")
        assert self.run(store.update_stored_schedule(written, row.version)) is not None
        self.unchanged.pop(name, None)
        if valid:
            self._valid_again(name)
        else:
            self.invalid[name] = self.clock.now()

    @rule(seconds=st.sampled_from([0.5, 1.0, 20.0, 59.0]))
    def advance(self, seconds: float) -> None:
        """In steps of a second over each minute's turn, when slots fall due (the firer polls
        every second for the operator's changes), and of up to 4 s between (below the 5 s
        heartbeat: only a poll falls due there, whose news the step before the minute
        brings as well)."""
        left = seconds
        while left > 0:
            now = self.clock.now()
            to_minute = 60 - now.second - now.microsecond / 1e6
            step = min(left, 1.0 if to_minute <= 2 else min(4.0, to_minute - 1))
            self.clock.advance(step)
            left -= step
            self.run(self.firer.quiesce())

    @rule(name=st.sampled_from(NAMES), cron=st.sampled_from(CRONS), backfill=st.sampled_from(["skip", "all"]),
          gap=st.sampled_from([59.0, 150.0]))  # fmt: skip
    def recreate(self, name: str, cron: str, backfill: str, gap: float) -> None:
        """The operator deletes a schedule and, a while later, creates one of that name."""
        self.delete(name, on_firer=False)
        self.advance(gap)
        self.create(name, cron, on_firer=False, backfill=backfill)

    @rule(down=st.sampled_from([0.0, 90.0, 300.0]))
    def restart_firer(self, down: float) -> None:
        """A deploy: the firer stops, time passes, a new process of it starts (and catches
        up what was due meanwhile)."""
        self.run(self.firer.stop(grace=0))
        self.clock.advance(down)
        queue = define_queue(name="mail", handler=_job)
        self.firer = Engine([queue], self.url, clock=self.clock, instance="firer", shutdown_grace=0)
        self.run(self.firer.start())
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
            for gap_name, deleted_at, created_at in self.gaps:
                if gap_name == name:
                    between = [r.scheduled_at for r in runs if deleted_at + timedelta(seconds=1) < r.scheduled_at <= created_at]
                    assert between == [], (name, deleted_at, created_at, between)
            spans = [(start, end) for n, start, end in self.invalid_spans if n == name]
            if name in self.invalid:
                spans.append((self.invalid[name], self.clock.now()))
            for start, end in spans:  # (heard within one poll, as a delete)
                while_invalid = [r.scheduled_at for r in runs if start + timedelta(seconds=1) < r.scheduled_at <= end]
                assert while_invalid == [], (name, start, end, while_invalid)

    @invariant()
    def every_schedule_is_listed_with_a_problem_exactly_while_not_valid_here(self) -> None:
        listed = {view.name: view.problem for view in self.run(self.firer.list_schedules())}
        assert set(listed) == self.exists, (listed, self.exists)
        assert {name for name, problem in listed.items() if problem is not None} == set(self.invalid), listed

    def teardown(self) -> None:
        try:
            self.run(self.firer.stop(grace=0))
            self.run(self.operator.stop(grace=0))
        finally:
            self.loop.close()
            shutil.rmtree(self.folder, ignore_errors=True)


RuntimeSchedules.TestCase.settings = settings(
    max_examples=int(os.environ.get("SCHEDTUI_HYPOTHESIS_EXAMPLES", "40")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_runtime_schedule_invariants = RuntimeSchedules.TestCase
