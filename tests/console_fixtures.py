"""A frozen, repeatable ledger for the console's tests, snapshots and screenshots.

:func:`build_ledger` runs a real engine on a :class:`ManualClock` for a simulated minute and
leaves a store holding every run status (succeeded, failed, skipped, missed, running) and
every coordination outcome (single, wonLock, external, manual), with deterministic run ids.
:func:`console_backend` then opens a second engine over that store at the frozen instant,
as the console would see it. Nothing here reads the wall clock or a random source.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from backend import Engine, ManualClock, Run, Schedule, define_schedule
from backend.alerts.model import AlertState, Condition, SubjectKind
from backend.client.embedded import EmbeddedBackend
from backend.client.interface import (
    ConnectionInfo,
    RunsPage,
    SchedulesSnapshot,
)
from backend.clock import Clock
from backend.errors import Unavailable
from backend.events.audit import AuditEntry, AuditPage, AuditStore
from backend.events.bus import Signal
from backend.ids import IdFactory
from backend.model import BackfillPlan, BackfillProgress, InstanceInfo, Outcome, RunStatus, ScheduleView, Trigger
from backend.store import open_store

START = "2026-03-02T07:59:00Z"
"""When the simulated minute starts (08:59 in Berlin; the daily digest is due at 09:00)."""
FROZEN = "2026-03-02T08:00:05Z"
"""The instant the console is opened at: every countdown on screen is computed from it."""
WHERE = "state.db"
"""What the header shows as the store (never a temporary path)."""


def seeded_ids(clock: Clock, seed: int) -> IdFactory:
    rng = random.Random(seed)
    return IdFactory(clock.now, random_bits=lambda: rng.getrandbits(80))


def console_schedules(clock: Clock) -> list[Schedule]:
    """The fixture's schedules; handlers that take time wait on ``clock`` (no real time)."""

    async def digest(ctx: Any) -> None:
        if ctx.trigger == "manual":
            await clock.sleep_until(ctx.fired_at + timedelta(seconds=35))
            return
        if ctx.scheduled_at.day == 1:
            raise ConnectionRefusedError("smtp.example.internal:587 refused the connection")

    async def quick(ctx: Any) -> None:
        return None

    async def export(ctx: Any) -> None:
        if ctx.trigger == "self" and ctx.scheduled_at.second % 20 == 0:
            raise TimeoutError("export API answered 504 after 30s")

    async def reindex(ctx: Any) -> None:
        await clock.sleep_until(ctx.fired_at + timedelta(seconds=14))

    async def stuck(ctx: Any) -> None:
        await asyncio.Event().wait()  # hangs until the watchdog cancels it

    return [
        define_schedule(
            name="daily-digest", cron="0 9 * * *", timezone="Europe/Berlin", handler=digest,
            backfill="latest", max_runtime=1800, description="Morning digest", payload={"list": "all"},
        ),
        define_schedule(
            name="heartbeat", cron="*/10 * * * * *", timezone="UTC", handler=quick,
            description="Pings the upstream API",
        ),
        define_schedule(
            name="flaky-export", cron="*/10 * * * * *", timezone="America/New_York", handler=export,
            description="Mails the hourly export",
        ),
        define_schedule(
            name="slow-reindex", cron="*/10 * * * * *", timezone="UTC", handler=reindex, on_overlap="skip",
            max_runtime=60, description="Rebuilds the search index",
        ),
        define_schedule(
            name="stuck-import", cron="*/20 * * * * *", timezone="Asia/Tokyo", handler=stuck, max_runtime=5,
            description="Pulls the partner feed",
        ),
        define_schedule(
            name="billing-webhook", cron="* * * * *", timezone="UTC", handler=quick, trigger="external",
            description="Fired by the platform's scheduler",
        ),
        define_schedule(
            name="legacy-cleanup", cron="*/15 * * * *", timezone="UTC", handler=quick,
            description="Prunes the old session table",
        ),
    ]


async def build_ledger(folder: Path) -> str:
    """Fill a store in ``folder`` by running an engine through a simulated minute; returns
    its URL. Deterministic: same rows, same ids, every time."""
    url = f"sqlite:///{folder / 'state.db'}"
    clock = ManualClock(START)
    engine = Engine(
        console_schedules(clock), url, clock=clock, instance="web-1", coordination="advisoryLock",
        ids=seeded_ids(clock, 7), shutdown_grace=0, actor="alice",
        capture_logs=False,  # the fixture's logs are written by tests/log_scenes.py, with fixed times and paths
    )
    await engine.open()
    # History from before this deployment became a fleet: one instance, coordination single.
    seed_at = datetime.fromisoformat("2026-02-26T08:00:00+00:00")
    engine.store.save_runs([
        Run(
            id=engine.new_id(), name="daily-digest", scheduled_at=seed_at, status="succeeded", trigger="self",
            coordination_outcome="single", instance="web-0", fired_at=seed_at + timedelta(milliseconds=4),
            finished_at=seed_at + timedelta(milliseconds=310),
        )
    ])
    await engine.store.flush()
    await engine.set_enabled("legacy-cleanup", False, note="paused during the session-store migration", by="ops")
    await engine.start()  # catch-up: two mornings missed, the newest fired (and it fails)
    await engine.quiesce(runs=False)
    await engine.fire_external("billing-webhook")
    await engine.quiesce(runs=False)
    for _ in range(13):  # 07:59:00 -> 08:00:05 in steps of 5 s
        clock.advance(5)
        await engine.quiesce(runs=False)
        if clock.now() == datetime.fromisoformat("2026-03-02T07:59:30+00:00"):
            await engine.run_now("daily-digest")  # manual; still in flight at 09:00, so that slot is skipped
        if clock.now() == datetime.fromisoformat("2026-03-02T08:00:00+00:00"):
            await engine.fire_external("billing-webhook")
    await engine.quiesce()
    await engine.stop(grace=0)
    # An operator on another replica pressed Run now a second ago; it is still running.
    other = seeded_ids(clock, 11)
    store = engine.store
    await store.open()
    await store.heartbeat("web-2", "web-2.internal", 4242, clock.now())
    # A replica killed 40 minutes ago (its row stays until it has been silent a day).
    await store.heartbeat("web-3", "web-3.internal", 5151, clock.now() - timedelta(minutes=40))
    fired = clock.now() - timedelta(seconds=1)
    store.save_runs([
        Run(id=other(), name="daily-digest", scheduled_at=fired, status="running", trigger="manual",
            coordination_outcome="manual", instance="web-2", fired_at=fired)
    ])
    await store.flush()
    await store.close()
    assert clock.now() == datetime.fromisoformat(FROZEN.replace("Z", "+00:00"))
    return url


def ledger_copy(ledger: Path, folder: Path) -> str:
    """The URL of a private copy of the store file ``ledger`` (and its WAL) in ``folder``:
    a test acts on its own."""
    for file in ledger.parent.glob(ledger.name + "*"):
        shutil.copy(file, folder / file.name)
    return f"sqlite:///{folder / ledger.name}"


async def add_locks(url: str) -> None:
    """Locks for the Locks view, on the lock clock at the frozen instant: one held (renewed
    2 s ago), one whose holder stopped renewing it, one released."""
    frozen = datetime.fromisoformat(FROZEN.replace("Z", "+00:00"))
    store: Any = open_store(url)
    await store.open()
    held = await store.acquire_lock("nightly-rollup", "web-2:77 (rollup)", timedelta(seconds=60), frozen - timedelta(seconds=12))
    await store.renew_lock("nightly-rollup", held.token, timedelta(seconds=60), frozen - timedelta(seconds=2))
    await store.acquire_lock("partner-sync", "web-1:4242", timedelta(seconds=30), frozen - timedelta(seconds=95))
    done = await store.acquire_lock("reindex", "web-3:9", timedelta(minutes=5), frozen - timedelta(minutes=20))
    await store.release_lock("reindex", done.token, frozen - timedelta(minutes=18))
    await store.close()


async def add_timeline_history(url: str) -> None:
    """An hour of history before the fixture's minute, written straight into the store, for
    the timeline: many runs per cell with failures (``flaky-export``), an engine outage
    (``stuck-import``: no rows for 15 minutes, then slots recorded ``missed``), and a
    platform that stopped calling (``billing-webhook``: minutes without a run, two of them
    backfilled later). Deterministic ids."""
    clock = ManualClock("2026-03-02T07:00:00Z")
    ids = seeded_ids(clock, 31)
    base = datetime.fromisoformat("2026-03-02T07:00:00+00:00")
    runs: list[Run] = []

    def ran(name: str, slot: datetime, status: RunStatus = "succeeded", outcome: Outcome = "wonLock", trigger: Trigger = "self",
            fired: datetime | None = None, error: tuple[str, str] | None = None) -> None:
        start = fired or slot + timedelta(milliseconds=3)
        clock.set(max(clock.now(), start))
        runs.append(Run(id=ids(), name=name, scheduled_at=slot, status=status,
                        trigger=trigger, coordination_outcome=outcome, instance="web-1",
                        fired_at=None if status == "missed" else start,
                        finished_at=None if status == "missed" else start + timedelta(milliseconds=40),
                        error_tag=error[0] if error else None, error_message=error[1] if error else None))

    for n in range(0, 59 * 60, 10):  # flaky-export: every 10 s; 07:20-07:25 the export API fails
        slot = base + timedelta(seconds=n)
        failing = timedelta(minutes=20) <= slot - base < timedelta(minutes=25) and n % 20 == 0
        ran("flaky-export", slot, "failed" if failing else "succeeded",
            error=("TimeoutError", "export API answered 504 after 30s") if failing else None)
    for n in range(0, 59 * 60, 20):  # stuck-import: down 07:30-07:45 (nothing), then caught up as missed
        slot = base + timedelta(seconds=n)
        if timedelta(minutes=30) <= slot - base < timedelta(minutes=45):
            continue
        if timedelta(minutes=45) <= slot - base < timedelta(minutes=50):
            ran("stuck-import", slot, "missed", error=None)
        else:
            ran("stuck-import", slot)
    for minute in range(59):  # billing-webhook: the platform missed 07:40-07:44
        slot = base + timedelta(minutes=minute)
        if not 40 <= minute <= 44:
            ran("billing-webhook", slot, outcome="external", trigger="external")
    for minute in (40, 41):  # an operator backfilled two of them at 07:55
        ran("billing-webhook", base + timedelta(minutes=minute), outcome="manual", trigger="manual",
            fired=base + timedelta(minutes=55, seconds=minute - 40))
    store = open_store(url)
    await store.open()
    store.save_runs(sorted(runs, key=lambda r: r.id))
    # What operators did in that hour (the fixture's minute adds alice's and ops' actions).
    audit_clock = ManualClock("2026-03-02T07:00:00Z")
    audit_ids = seeded_ids(audit_clock, 41)
    actions: list[tuple[str, str, str, str, dict[str, Any]]] = [
        ("07:40:12", "carol", "schedule.disable", "stuck-import",
         {"note": "partner feed down, INC-2231", "was_enabled": True}),
        ("07:47:03", "carol", "schedule.enable", "stuck-import", {"note": None, "was_enabled": False}),
        ("07:55:00", "bob", "schedule.backfill", "billing-webhook",
         {"backfill_id": "01KJP9ZV800000000000000000", "from": "2026-03-02T07:39:00Z",
          "to": "2026-03-02T07:41:00Z", "count": 2}),
        ("07:58:40", "ci-deploy@ops", "schedule.fire", "heartbeat", {"run_id": "01KJPA9W0000000000000000AB"}),
    ]  # fmt: skip
    for at, actor, action, target, detail in actions:
        audit_clock.set(datetime.fromisoformat(f"2026-03-02T{at}+00:00"))
        entry = AuditEntry(audit_ids(), audit_clock.now(), actor, action, target, detail)
        await cast(AuditStore, store).append_audit(entry)
    await store.close()


async def add_jobs(url: str) -> None:
    """Job queues for view 3, written through the store's queue API (no engine: the
    schedules' ledger and the heartbeats stay as they are). At the frozen instant:
    ``mailer`` has two dead jobs (three failed attempts each), one running on ``web-2``, a
    keyed one due in 5 s, one waiting 15 s for its second try and two due now;
    ``thumbnails`` is paused with five jobs waiting two minutes; ``webhooks`` is idle.
    Deterministic ids."""
    from backend.jobs.store import Claimed, Finish, FinishKind, JobStore, NewJob, QueueSpec

    clock = ManualClock("2026-03-02T07:50:00Z")
    ids = seeded_ids(clock, 53)
    store = open_store(url)
    await store.open()
    js = cast(JobStore, store)

    def at(text: str) -> datetime:
        clock.set(f"2026-03-02T{text}Z")
        return clock.now()

    def job(payload: object, *, key: str | None = None, attempts: int | None = None, delay: float = 0) -> NewJob:
        return NewJob(ids(), json.dumps(payload), clock.now() + timedelta(seconds=delay), attempts, key)

    async def fail(claimed: Claimed, message: str, retry_at: datetime | None) -> None:
        kind: FinishKind = "retry" if retry_at is not None else "dead"
        end = clock.now() + timedelta(milliseconds=230)
        await js.finish_jobs([Finish(claimed.id, claimed.queue, claimed.tries, kind, claimed.attempt, claimed.started_at,
                                     end, "web-1", "SMTPConnectError", message, retry_at)])

    await js.define_queues([QueueSpec("mailer", 4, 3, 900.0), QueueSpec("thumbnails", 2, 5, 120.0),
                            QueueSpec("webhooks", 8, 5, 30.0)], at("07:50:00"), update=True)
    refused = "smtp.example.internal:587 refused the connection"
    await js.send_jobs("mailer", [job({"order": 40, "to": "ana@example.com"}), job({"order": 41, "to": "bo@example.com"})],
                       clock.now())
    for wait in (10, 20, None):  # three attempts each, then dead
        claimed = (await js.cycle_jobs([], {"mailer": 4}, "web-1", ids(), clock.now())).claimed
        for c in claimed:
            await fail(c, refused, clock.now() + timedelta(seconds=wait) if wait else None)
        if wait:
            clock.advance(wait)
    at("07:58:00")
    await js.send_jobs("thumbnails", [job({"image": f"img-{n}.png", "size": 512}) for n in range(5)], clock.now())
    await js.pause_queue("thumbnails", True, "ops", clock.now())
    at("07:59:20")
    retrying = job({"order": 43, "to": "cy@example.com"})
    await js.send_jobs("mailer", [retrying], clock.now())
    (retried,) = (await js.cycle_jobs([], {"mailer": 4}, "web-1", ids(), clock.now())).claimed
    at("07:59:50")
    await fail(retried, "timed out after 30s waiting for the SMTP greeting",
               datetime.fromisoformat("2026-03-02T08:00:20+00:00"))
    await js.send_jobs("mailer", [job({"order": 44, "to": "di@example.com"})], clock.now())
    await js.cycle_jobs([], {"mailer": 1}, "web-2", ids(), clock.now())  # still running at 08:00:05
    at("07:59:59")
    await js.send_jobs("mailer", [job({"receipt": 42}, key="receipt:42", delay=11)], clock.now())
    at("08:00:01")
    await js.send_jobs("mailer", [job({"order": 45, "to": "ed@example.com"}), job({"order": 46, "to": "fa@example.com"})],
                       clock.now())
    await store.close()


FIRING_ALERTS: tuple[tuple[Condition, SubjectKind, str, str, str], ...] = (
    ("failing", "schedule", "flaky-export", "2026-03-02T07:59:40Z",
     "newest run failed: TimeoutError: export API answered 504 after 30s"),
    ("dead_jobs", "queue", "mailer", "2026-03-02T07:50:30Z", "2 jobs died in the last 15 minutes (2 dead in all)"),
    ("late", "schedule", "stuck-import", "2026-03-02T07:59:25Z",
     "no success for 45s (grace 5s): its runs time out"),
)
"""(condition, subject kind, subject, since, summary) of the alerts firing at the frozen instant."""


async def add_alerts(url: str) -> None:
    """The alerts of :data:`FIRING_ALERTS`, firing, as an evaluating ``serve`` would have
    written them (no sink: nothing to deliver), and one resolved since."""
    from backend.alerts.model import Alert, alert_key
    from backend.alerts.store import AlertStore, Transition

    store = open_store(url)
    await store.open()
    alerts = cast(AlertStore, store)
    rows: list[tuple[Condition, SubjectKind, str, str, str, AlertState]] = [
        (c, kind, subject, since, summary, "firing") for c, kind, subject, since, summary in FIRING_ALERTS
    ]
    rows.append(("failing", "schedule", "daily-digest", "2026-03-02T07:59:02Z", "newest run succeeded", "resolved"))
    transitions = []
    for n, (condition, kind, subject, since, summary, state) in enumerate(rows):
        at = datetime.fromisoformat(since.replace("Z", "+00:00"))
        alert = Alert(alert_key(condition, subject), condition, kind, subject, state, at, summary, at,
                      f"01KJPA0000000000000000000{n}")
        transitions.append(Transition(alert, "{}"))
    await alerts.write_transitions(transitions, sinks_after=datetime.fromisoformat(FROZEN.replace("Z", "+00:00")))
    await store.close()


def console_engine(url: str, clock: ManualClock | None = None, instance: str = "console") -> Engine:
    """An engine over the fixture's store at the frozen instant (instance ``console``)."""
    clock = clock or ManualClock(FROZEN)
    return Engine(
        console_schedules(clock), url, clock=clock, instance=instance, coordination="advisoryLock",
        ids=seeded_ids(clock, 23), shutdown_grace=0,
    )


def console_backend(url: str, clock: ManualClock | None = None, *, read_only: bool = False) -> EmbeddedBackend:
    """The embedded backend the console tests use: on the caller's loop (``own_thread``
    is off so the ManualClock's sleepers stay on one loop), timers not armed."""
    return EmbeddedBackend(console_engine(url, clock), read_only=read_only)


class FlakyBackend:
    """Wraps a backend; while ``down`` is set every call raises :class:`Unavailable`, as a
    remote backend does when its server has gone away."""

    URL = "http://10.0.0.7:8080"

    def __init__(self, inner: Any, message: str = f"cannot reach {URL}: connection refused") -> None:
        self.inner = inner
        self.down = False
        self.message = message
        self.read_only = inner.read_only

    def _check(self) -> None:
        if self.down:
            raise Unavailable(self.message)

    async def connect(self) -> ConnectionInfo:
        """Describes itself as the remote server it stands in for."""
        self._check()
        info: ConnectionInfo = await self.inner.connect()
        return dataclasses.replace(info, kind="remote", where=self.URL, store_kind="", fires=True)

    async def close(self) -> None:
        await self.inner.close()

    async def list_schedules(self) -> SchedulesSnapshot:
        self._check()
        result: SchedulesSnapshot = await self.inner.list_schedules()
        return result

    async def list_runs(self, name: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        self._check()
        result: RunsPage = await self.inner.list_runs(name, limit=limit, before=before)
        return result

    async def get_run(self, run_id: str) -> Run:
        self._check()
        result: Run = await self.inner.get_run(run_id)
        return result

    async def runs_between(self, names: list[str], start: datetime, end: datetime, *,
                           limit_per_name: int = 200) -> dict[str, list[Run]]:
        self._check()
        result: dict[str, list[Run]] = await self.inner.runs_between(names, start, end, limit_per_name=limit_per_name)
        return result

    async def instances(self) -> list[InstanceInfo]:
        self._check()
        result: list[InstanceInfo] = await self.inner.instances()
        return result

    async def upcoming(self, name: str, count: int = 5) -> list[datetime]:
        self._check()
        result: list[datetime] = await self.inner.upcoming(name, count)
        return result

    async def run_now(self, name: str) -> Run:
        self._check()
        result: Run = await self.inner.run_now(name)
        return result

    async def wait_run(self, run_id: str) -> Run:
        self._check()
        result: Run = await self.inner.wait_run(run_id)
        return result

    async def set_enabled(self, name: str, enabled: bool, *, note: str | None = None) -> ScheduleView:
        self._check()
        result: ScheduleView = await self.inner.set_enabled(name, enabled, note=note)
        return result

    async def plan_backfill(self, name: str, start: datetime, end: datetime, *, confirm: bool = False,
                            limit: int | None = None) -> BackfillPlan:
        self._check()
        result: BackfillPlan = await self.inner.plan_backfill(name, start, end, confirm=confirm, limit=limit)
        return result

    async def start_backfill(self, name: str, start: datetime, end: datetime, *, confirm: bool = False,
                             limit: int | None = None, skip_succeeded: bool = False) -> BackfillProgress:
        self._check()
        result: BackfillProgress = await self.inner.start_backfill(name, start, end, confirm=confirm, limit=limit,
                                                                   skip_succeeded=skip_succeeded)
        return result

    async def cancel_backfill(self, backfill_id: str) -> BackfillProgress:
        self._check()
        result: BackfillProgress = await self.inner.cancel_backfill(backfill_id)
        return result

    async def backfill_progress(self, backfill_id: str) -> BackfillProgress:
        self._check()
        result: BackfillProgress = await self.inner.backfill_progress(backfill_id)
        return result

    async def wait_backfill(self, backfill_id: str) -> BackfillProgress:
        self._check()
        result: BackfillProgress = await self.inner.wait_backfill(backfill_id)
        return result

    async def audit(self, *, limit: int = 50, before: str | None = None) -> AuditPage:
        self._check()
        result: AuditPage = await self.inner.audit(limit=limit, before=before)
        return result

    async def alerts(self, *, resolved: bool = False) -> Any:
        self._check()
        return await self.inner.alerts(resolved=resolved)

    async def activity(self, *, minutes: int = 60) -> Any:
        self._check()
        return await self.inner.activity(minutes=minutes)

    async def changes(self, *, since: str | None = None, idle: float | None = None) -> AsyncIterator[list[Signal]]:
        """The inner backend's stream, ended (as a broken connection ends it) once ``down``."""
        self._check()
        async for batch in self.inner.changes(since=since, idle=idle):
            self._check()
            yield batch
    # -- the job queue: the same, call for call
    async def list_queues(self) -> Any:
        self._check()
        return await self.inner.list_queues()

    async def list_jobs(self, queue: str, **kwargs: Any) -> Any:
        self._check()
        return await self.inner.list_jobs(queue, **kwargs)

    async def get_job(self, job_id: str) -> Any:
        self._check()
        return await self.inner.get_job(job_id)

    async def send_job(self, queue: str, payload: Any = None, **kwargs: Any) -> Any:
        self._check()
        return await self.inner.send_job(queue, payload, **kwargs)

    async def set_queue_paused(self, queue: str, paused: bool) -> Any:
        self._check()
        return await self.inner.set_queue_paused(queue, paused)

    async def cancel_job(self, queue: str, id: str | None = None, *, key: str | None = None) -> Any:
        self._check()
        return await self.inner.cancel_job(queue, id, key=key)

    async def retry_job(self, queue: str, job_id: str) -> Any:
        self._check()
        return await self.inner.retry_job(queue, job_id)

    async def delete_job(self, queue: str, job_id: str) -> Any:
        self._check()
        return await self.inner.delete_job(queue, job_id)


class Held:
    """The real backend, with the named calls held until :attr:`go` is set (in the order
    they were made) and recorded."""

    def __init__(self, inner: Any, *held: str) -> None:
        self.inner = inner
        self.read_only = inner.read_only
        self.held = held
        self.go = asyncio.Event()
        self.go.set()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name not in self.held:
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            await self.go.wait()
            self.calls.append((name, args))
            return await value(*args, **kwargs)

        return call
