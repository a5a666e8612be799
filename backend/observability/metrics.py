"""An engine's Prometheus metrics (``GET /metrics``), with ``prometheus_client``.

One :class:`EngineMetrics` per engine, on a registry of its own (several engines may live in
one process). What it reports:

* this instance's counts, told by the engine as things finish (the run ledger's and the
  job workers' ``meters``): ``schedtui_runs_total``, ``schedtui_run_duration_seconds``,
  ``schedtui_jobs_finished_total`` (:class:`Tallies`); its lease's
  ``schedtui_lease_lapses_total`` and ``schedtui_clock_offset_seconds``;
* the fleet's state, read from the store so that every instance answers alike:
  ``schedtui_schedule_last_success_timestamp_seconds``, ``schedtui_schedule_enabled``,
  ``schedtui_jobs``, ``schedtui_durable_executions``, ``schedtui_locks_held``,
  ``schedtui_instances``; with ``schedtui_schedule_next_fire_timestamp_seconds``, from the
  cron definitions this instance knows (:class:`FleetGauges`);
* the process, platform and garbage-collector collectors of ``prometheus_client``.

A scrape never waits for the store. The fleet's state comes from one
:class:`~backend.observability.fleet.FleetSnapshot` (a fixed number of statements, whatever
the number of schedules), read in the background every ``cache_for`` seconds of the
injected clock while scrapes keep coming (within ``idle_after``); a scrape answers from the
newest one, and only the first scrape (or the first after a pause) waits for a read, at
most ``wait`` seconds. A snapshot that cannot be read leaves the fleet's families out until
the next one (rather than repeating old values as if current).

Formatting costs prometheus_client some microseconds a series, and a thousand schedules
make thousands. So each family's text is kept per group of series (a schedule's, a
queue's) and ``generate_latest`` renders again, off the event loop's thread, only the
groups whose values changed (:class:`~backend.observability.exposition.FamilyText`): the
fleet's when a snapshot is read (in the background), this instance's counts at a scrape
that follows finished runs (the schedules that finished one), the process's at every scrape.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from backend.clock import Clock
from backend.cron import Cron
from backend.durable.model import EXECUTION_STATUSES
from backend.errors import Unavailable
from backend.jobs.store import Finish
from backend.model import TAG_ABANDONED, Run
from backend.observability.exposition import FamilyText
from backend.observability.fleet import JOB_STATES, MEMBER_ROLES, FleetSnapshot, FleetStore
from backend.runtime.ownthread import in_own_thread

if TYPE_CHECKING:
    from backend.scheduler.engine import Engine

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_CACHE_FOR",
    "DURATION_BUCKETS",
    "IDLE_AFTER",
    "INLINE_SCHEDULES",
    "REFRESH_WAIT",
    "RENDER_EVERY",
    "EngineMetrics",
    "FleetGauges",
    "Tallies",
]

log = logging.getLogger("schedtui.metrics")

#: Seconds between two reads of the fleet's state (while scrapes come).
DEFAULT_CACHE_FOR = 5.0
#: Seconds the first scrape (or the first after a pause) waits for a snapshot being read
#: before it answers without it, or with the one before (well inside Prometheus's default
#: scrape timeout of 10 s); the read goes on for the next.
REFRESH_WAIT = 3.0
#: Seconds without a scrape after which the fleet's state is no longer read in the
#: background (longer than any usual scrape interval: Prometheus's default is 1 min).
IDLE_AFTER = 300.0
#: A scrape renders the counts of up to this many schedules that finished a run since the
#: last one on the event loop (about a millisecond): on a loaded machine, handing them to a
#: thread and waiting for it costs several times that in latency.
INLINE_SCHEDULES = 8
#: Seconds between two renders of this instance's counts between scrapes (of the schedules
#: that finished a run since the one before), so that a scrape has only the last ones left.
RENDER_EVERY = timedelta(seconds=1)
#: Run durations span milliseconds to hours (a handler's ``max_runtime`` defaults to 30 min).
#: Ten buckets: each one is a series per schedule.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
#: What the scrape answers in: the Prometheus text format.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: How a job attempt's end reads as ``schedtui_jobs_finished_total``'s outcome.
_JOB_OUTCOMES = {"succeeded": "succeeded", "retry": "retried", "dead": "dead"}

#: The run statuses every schedule's counts show from the start (at 0), for rules on them.
_EXPECTED_STATUSES = ("succeeded", "failed")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LE = [cast(Callable[[float], str], floatToGoString)(bound) for bound in DURATION_BUCKETS] + ["+Inf"]
"""The buckets' ``le`` labels, as prometheus_client writes them."""


def _seconds(at: datetime) -> float:
    return (at - _EPOCH).total_seconds()


class EngineMetrics:
    """The metrics of one engine. Made before the engine starts (``serve`` makes it with
    the API), it counts from then on; :meth:`render` is one scrape. ``registry`` holds every
    collector (``generate_latest(metrics.registry)`` renders what a scrape would, once
    :meth:`refresh` has read the fleet's state)."""

    content_type = CONTENT_TYPE

    def __init__(
        self,
        engine: Engine,
        *,
        cache_for: float = DEFAULT_CACHE_FOR,
        clock: Clock | None = None,
        wait: float = REFRESH_WAIT,
        idle_after: float = IDLE_AFTER,
    ) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        self.tallies = Tallies()
        self.fleet = FleetGauges(engine, cache_for=cache_for, clock=clock or engine.clock, wait=wait, idle_after=idle_after)
        liveness = _Liveness(engine)
        self.registry.register(liveness)
        self.process = _Process([ProcessCollector(registry=self.registry), PlatformCollector(registry=self.registry),
                                 GCCollector(registry=self.registry), liveness])  # fmt: skip
        """The process, platform and garbage-collector collectors (rendered at every scrape)."""
        self.registry.register(self.tallies)
        self.registry.register(self.fleet)
        self._counts: tuple[int, bytes] | None = None
        self._expected: tuple[set[str], set[str], str] = (set(), set(), "")
        """The schedules and queues given zero counts, and the outcome they were given them under."""
        self._gone: set[str] = set()
        """Schedules deleted since this instance knew them whose runs may still end here (in
        flight when it was deleted): their ends are not counted (see :meth:`_expect`)."""
        self._rendering = asyncio.Lock()
        self._between: asyncio.Task[None] | None = None
        self._rendered: asyncio.Future[None] | None = None
        engine.ledger.meters.append(self._run_finished)
        engine.jobs.meters.append(self.tallies.job_finished)

    def _run_finished(self, run: Run) -> None:
        if run.name not in self._gone:  # (a deleted schedule's run that was in flight: its series went)
            self.tallies.run_finished(run)

    def close(self) -> None:
        """Stop counting and reading the fleet's state (the engine keeps running)."""
        self.fleet.stop()
        if self._between is not None:
            self._between.cancel()
        if self._run_finished in self.engine.ledger.meters:
            self.engine.ledger.meters.remove(self._run_finished)
        if self.tallies.job_finished in self.engine.jobs.meters:
            self.engine.jobs.meters.remove(self.tallies.job_finished)

    async def refresh(self) -> None:
        """Keep the fleet's state read in the background (waiting for the first snapshot
        only), and take this instance's counts (on the loop that counts them: a renderer on
        another thread reads the copy). What every scrape does first."""
        await self.fleet.current()
        self._expect()
        self.tallies.freeze()

    async def render(self) -> bytes:
        """One scrape, in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        await self.refresh()
        if self._between is None or self._between.done():
            self._between = self.engine.loops.keep(self._render_between_scrapes, "metrics counts")
        counts = await self._counts_text()
        # A few dozen series read from /proc: a fraction of a millisecond, not worth a thread.
        return b"".join([counts, self.fleet.text, generate_latest(self.process)])

    def _expect(self) -> None:
        """Zero counts for the schedules and queues this instance knows, as it would count
        their runs (see :meth:`Tallies.expect`): the definitions' and the stored schedules'
        (created since, too). Only the new ones cost more than a set's difference.

        A stored schedule deleted since (here, or on another instance: this one learns of it
        at its catalog's refresh) has its counts forgotten, so that its series go: they
        stayed until a restart, and a fleet that creates and deletes schedules grew its
        series without bound. A run of it that was in flight and ends later is not counted
        (see :meth:`_run_finished`); created again, it counts from 0 (a counter reset to
        Prometheus)."""
        engine = self.engine
        outcome = engine.coordinator.outcome
        known, seen = (engine.schedules.keys(), engine.jobs.queues.keys(), outcome), self._expected
        if self._gone:
            # Back (created again), or none of its runs left here to end: no longer watched for.
            active = {scheduled.schedule.name for scheduled in engine.launcher.active.values()}
            self._gone = {name for name in self._gone if name in active and name not in known[0]}
        if outcome == seen[2] and not known[0] - seen[0] and not known[1] - seen[1] and not seen[0] - known[0]:
            return
        gone = set(seen[0] - known[0])
        if gone:
            self.tallies.forget(gone)
            self._gone |= gone
        schedules = []
        for name, schedule in engine.schedules.items():
            trigger = engine.trigger_of(schedule)
            schedules.append((name, "external" if trigger == "external" else outcome, trigger))
        self.tallies.expect(schedules, engine.jobs.queues)
        self._expected = (set(known[0]), set(known[1]), outcome)

    async def _counts_text(self) -> bytes:
        """This instance's counts as of the last freeze, rendered again where they changed."""
        tallies = self.tallies
        async with self._rendering:  # one renderer at a time updates the kept texts
            kept, counts = self._counts, tallies.frozen
            if kept is None or kept[0] != counts.version:
                pending, tallies.pending = tallies.pending, set()  # taken before a freeze meanwhile adds to it
                if kept is not None and len(pending) <= INLINE_SCHEDULES:
                    text = tallies.text(counts)
                else:
                    text = await in_own_thread(tallies.text, counts, name="schedtui metrics")
                kept = self._counts = (counts.version, text)
        return kept[1]

    async def _render_between_scrapes(self) -> None:
        # Runs finish all the time; rendering the schedules that finished one every second
        # (off the loop when many did) leaves a scrape only those of the last second to do.
        fleet, clock = self.fleet, self.fleet.clock
        while True:
            await clock.sleep_until(clock.now() + RENDER_EVERY)
            scraped = fleet.scraped_at
            if scraped is None or clock.now() - scraped >= fleet.idle_after:
                return  # nobody scrapes: the next scrape starts this again
            if self._counts is None or self._counts[0] != self.tallies.changes:
                self.tallies.freeze()
                await self._counts_text()
                if self._rendered is not None and not self._rendered.done():
                    self._rendered.set_result(None)

    def next_render(self) -> asyncio.Future[None]:
        """Done once the counts are next rendered between scrapes (for tests)."""
        if self._rendered is None or self._rendered.done():
            self._rendered = asyncio.get_running_loop().create_future()
        return asyncio.shield(self._rendered)


class _Process(Collector):
    def __init__(self, collectors: list[Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


class _Liveness(Collector):
    """This instance's lease: how often it lapsed, and its clock against the store server's
    (absent where they are not compared: SQLite, an injected clock); and what became of its
    alert notifications (a paging path that fails is itself worth an alert). Read at every
    scrape."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        lapses = CounterMetricFamily(
            "schedtui_lease_lapses",
            "Times this instance's lease on its work lapsed (it stopped its work: the store could not be reached "
            "in time, or its clock was off the store's).",
        )
        lapses.add_metric([], self.engine.lease.lapses)
        yield lapses
        check = self.engine.registry.clock_check
        if check is not None and check.offset is not None:
            offset = GaugeMetricFamily(
                "schedtui_clock_offset_seconds",
                "This instance's clock minus the database server's, at its last heartbeat; beyond a twelfth of the "
                "take-over window its lease lapses until they agree.",
            )
            offset.add_metric([], check.offset)
            yield offset
        notifier = self.engine.alerts.notifier
        if notifier is not None:  # (an instance with webhooks: serve --notify)
            posts = CounterMetricFamily(
                "schedtui_alert_notifications",
                "This instance's POSTs of alert transitions to its webhooks, by webhook (scheme, host and a hash) and "
                "outcome: delivered, retried (failed, tried again later), given_up (its last attempt failed), "
                "unrecorded (its claim ran out before the outcome was written).",
                labels=["webhook", "outcome"],
            )
            for (webhook, outcome), count in sorted(notifier.outcomes.items()):
                posts.add_metric([webhook, outcome], count)
            yield posts


# -- this instance's counts --------------------------------------------------------------
_Outcomes = tuple[tuple[tuple[str, str, str], int], ...]
"""A schedule's run counts: ``((status, outcome, trigger), n)``, sorted."""
_Timed = tuple[tuple[int, ...], float]
"""A schedule's durations: observations per bucket (not cumulative), and their sum."""


@dataclass(frozen=True)
class _Counts:
    """This instance's counts as a renderer reads them (a copy, never changed)."""

    runs: dict[str, _Outcomes] = field(default_factory=dict)
    """In the schedules' order, as :attr:`durations`."""
    durations: dict[str, _Timed] = field(default_factory=dict)
    jobs: tuple[tuple[tuple[str, str], int], ...] = ()
    version: int = 0


@dataclass
class _Durations:
    counts: list[int]
    """Observations per bucket (not cumulative; the last one is above every bound)."""
    total: float = 0.0


def _add_runs(family: CounterMetricFamily, name: str, outcomes: _Outcomes) -> None:
    for (status, outcome, trigger), n in outcomes:
        family.add_metric([name, status, outcome, trigger], n)


def _add_durations(family: HistogramMetricFamily, name: str, timed: _Timed) -> None:
    cumulative, buckets = 0, []
    for le, n in zip(_LE, timed[0], strict=True):
        cumulative += n
        buckets.append((le, float(cumulative)))
    family.add_metric([name], buckets, timed[1])


def _add_jobs(family: CounterMetricFamily, key: tuple[str, str], n: int) -> None:
    family.add_metric(list(key), n)


class Tallies(Collector):
    """This instance's counts, kept as plain numbers by the engine's loop (told once per
    finished run or job attempt) and handed to a renderer as a copy (:meth:`freeze`).

    A schedule's counts and histogram are a dozen series or more: :meth:`text` renders
    again only those of the schedules that finished a run since the last render."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[tuple[str, str, str], int]] = {}
        """Per schedule: ``(status, outcome, trigger)`` -> runs."""
        self.durations: dict[str, _Durations] = {}
        self.jobs: dict[tuple[str, str], int] = {}
        self.changes = 0
        """How many times a count changed: a renderer's cue."""
        self.frozen = _Counts()
        """The counts as of the last :meth:`freeze`."""
        self._changed: set[str] = set()
        """Schedules whose counts changed since the last freeze."""
        self._forgotten: set[str] = set()
        """Schedules whose counts were dropped since the last freeze (see :meth:`forget`)."""
        self.pending: set[str] = set()
        """Schedules whose frozen counts changed since a renderer last cleared this."""
        self.texts = (
            FamilyText(self._runs_family, _add_runs),
            FamilyText(self._durations_family, _add_durations),
            FamilyText(self._jobs_family, _add_jobs),
        )

    def run_finished(self, run: Run) -> None:
        counts = self.runs.get(run.name)
        if counts is None:
            counts = self.runs[run.name] = {}
        key = (run.status, run.coordination_outcome, run.trigger)
        counts[key] = counts.get(key, 0) + 1
        # An abandoned run's end is when a survivor noticed its instance gone, not a duration.
        timed = run.status in ("succeeded", "failed") and run.error_tag != TAG_ABANDONED
        if timed and run.fired_at is not None and run.finished_at is not None:
            seconds = max(0.0, (run.finished_at - run.fired_at).total_seconds())
            durations = self.durations.get(run.name)
            if durations is None:
                durations = self.durations[run.name] = _Durations([0] * len(_LE))
            durations.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
            durations.total += seconds
        self._changed.add(run.name)
        self.changes += 1

    def expect(self, schedules: Iterable[tuple[str, str, str]], queues: Iterable[str]) -> None:
        """Zero counts, where none is kept yet, of the succeeded and failed runs of each
        ``(schedule, outcome, trigger)`` and of the finished jobs of each queue, in every
        outcome. Prometheus's ``increase()`` sees no increase in a series that first appears
        at 1: without a zero before it, a schedule's first failure after a start (or after
        it was created) would page nobody through a rule on ``schedtui_runs_total``."""
        for name, outcome, trigger in schedules:
            counts = self.runs.get(name)
            if counts is None:
                counts = self.runs[name] = {}
            added = False
            for status in _EXPECTED_STATUSES:
                key = (status, outcome, trigger)
                if key not in counts:
                    counts[key] = 0
                    added = True
            if added:
                self._changed.add(name)
                self.changes += 1
        for queue in queues:
            for outcome in _JOB_OUTCOMES.values():
                if (queue, outcome) not in self.jobs:
                    self.jobs[(queue, outcome)] = 0
                    self.changes += 1

    def forget(self, names: Iterable[str]) -> None:
        """Drop the counts of schedules no longer known (deleted): their series go from the
        next render."""
        gone = [name for name in names if name in self.runs or name in self.durations]
        if not gone:
            return
        for name in gone:
            self.runs.pop(name, None)
            self.durations.pop(name, None)
            self._changed.discard(name)
        self._forgotten.update(gone)
        self.changes += 1

    def job_finished(self, finish: Finish) -> None:
        outcome = _JOB_OUTCOMES.get(finish.kind)
        if outcome is not None:
            key = (finish.queue, outcome)
            self.jobs[key] = self.jobs.get(key, 0) + 1
            self.changes += 1

    def freeze(self) -> None:
        """Copy the counts into :attr:`frozen` (a renderer on another thread reads only
        that); only the schedules that changed are copied again."""
        frozen = self.frozen
        if frozen.version == self.changes:
            return
        runs, durations = frozen.runs, frozen.durations
        forgotten, self._forgotten = self._forgotten, set()
        if forgotten:  # (the order is kept: what is left stays sorted)
            runs = {name: n for name, n in runs.items() if name not in forgotten}
            durations = {name: timed for name, timed in durations.items() if name not in forgotten}
            self.pending -= forgotten
        if self._changed:
            new = [name for name in self._changed if name not in runs]
            runs, durations = dict(runs), dict(durations)
            for name in self._changed:
                runs[name] = tuple(sorted(self.runs[name].items()))
                timed = self.durations.get(name)
                if timed is not None:
                    if name not in durations:
                        new.append(name)
                    durations[name] = (tuple(timed.counts), timed.total)
            # Kept in the schedules' order (as shown): sorted again only when one is new.
            if new:
                runs = dict(sorted(runs.items()))
                durations = dict(sorted(durations.items()))
            self.pending |= self._changed
            self._changed.clear()
        self.frozen = _Counts(runs, durations, tuple(sorted(self.jobs.items())), self.changes)

    def text(self, counts: _Counts) -> bytes:
        """The three families' text for ``counts`` (one caller at a time)."""
        runs, durations, jobs = self.texts
        return b"".join([runs.update(list(counts.runs.items())), durations.update(list(counts.durations.items())),
                         jobs.update(counts.jobs)])  # fmt: skip

    def describe(self) -> Iterable[Metric]:
        return [self._runs_family(), self._durations_family(), self._jobs_family()]

    def collect(self) -> Iterable[Metric]:
        counts = self.frozen
        runs, durations, jobs = self.texts
        return [runs.family(counts.runs.items()), durations.family(counts.durations.items()), jobs.family(counts.jobs)]

    @staticmethod
    def _runs_family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "schedtui_runs",
            "Runs this instance finished (skipped and missed included), by schedule, status, coordination outcome and trigger.",
            labels=["schedule", "status", "outcome", "trigger"],
        )

    @staticmethod
    def _durations_family() -> HistogramMetricFamily:
        return HistogramMetricFamily(
            "schedtui_run_duration_seconds",
            "How long this instance's succeeded and failed runs took, from firing to their end.",
            labels=["schedule"],
        )

    @staticmethod
    def _jobs_family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "schedtui_jobs_finished",
            "Job attempts this instance ran to an end the store took: succeeded, retried (failed, attempts left) or dead.",
            labels=["queue", "outcome"],
        )


# -- the fleet's state -------------------------------------------------------------------
_Key = str | tuple[str, ...]
"""A gauge's labels: its one label's value, or all of them (``()``: none)."""
_Gauges = list[tuple[_Key, float]]


def _add_gauge(family: GaugeMetricFamily, key: _Key, value: float) -> None:
    family.add_metric([key] if isinstance(key, str) else list(key), value)


@dataclass(frozen=True)
class _FleetRows:
    """The fleet's families as plain values, made on the engine's loop when a read ends
    (the only place its schedules may be read); ``None`` where the store could not say.
    In the order of :meth:`FleetGauges._families`."""

    next_fire: _Gauges
    read: list[_Gauges] | None = None
    """The store's families (last success, enabled, jobs, durable executions, locks held,
    instances, the snapshot's time)."""


class FleetGauges(Collector):
    """The families read from the store (and the next fire times), from the newest snapshot.

    Contract: once :meth:`current` was first called, the store is read in a task of the
    engine's every ``cache_for`` seconds of ``clock`` (and at once when ``clock`` went back
    before the last read) for as long as :meth:`current` was called within ``idle_after``;
    each read's families are taken on the loop and rendered off it into :attr:`text`.
    :meth:`current` waits (at most ``wait`` seconds) only while the task has not finished
    its first read. :meth:`collect` does no I/O, reads nothing of the engine's and may run
    on any thread."""

    def __init__(self, engine: Engine, *, cache_for: float, clock: Clock, wait: float, idle_after: float = IDLE_AFTER) -> None:
        self.engine = engine
        self.cache_for = timedelta(seconds=cache_for)
        self.clock = clock
        self.wait = wait
        self.idle_after = timedelta(seconds=idle_after)
        self.snapshot: FleetSnapshot | None = None
        """The newest snapshot, or ``None`` while the last read failed (or none was made)."""
        self.read_at: datetime | None = None
        """When the newest read was started, on ``clock`` (failed ones too)."""
        self.scraped_at: datetime | None = None
        """When :meth:`current` was last called, on ``clock``."""
        self.reads = 0
        """Snapshots asked of the store so far."""
        self.built = 0
        """Reads whose families were rendered."""
        self.texts = [FamilyText(make, _add_gauge) for make in self._families()]
        self._rows = _FleetRows([])
        self.text = self._render(self._rows)
        """The families of the newest read, as a scrape shows them."""
        self._next_fire: dict[str, tuple[Cron, datetime]] = {}
        self._task: asyncio.Task[None] | None = None
        self._first = False
        """The task has not finished its first read yet."""
        self._reading = False
        self._wake = asyncio.Event()
        self._built: asyncio.Future[None] | None = None

    def stale(self, now: datetime) -> bool:
        read_at = self.read_at
        return read_at is None or not timedelta(0) <= now - read_at < self.cache_for

    async def current(self) -> None:
        """What a scrape does first: keep the reads going (started again after a pause:
        then this scrape waits for the first, at most ``wait`` seconds)."""
        now = self.scraped_at = self.clock.now()
        if self._task is None or self._task.done():
            self._first = True
            self._wake, self._built = asyncio.Event(), None  # of this event loop (an engine may be opened on another)
            self._task = self.engine.loops.keep(self._refresh, "metrics refresh")
        elif self.stale(now) and not self._reading:
            self._wake.set()  # the clock went back: the read's age is unknown
        if self._first:
            try:
                await asyncio.wait_for(self.next_read(), self.wait)
            except TimeoutError:
                log.warning("metrics: the store has not answered within %gs; this scrape has the fleet's state before", self.wait)

    async def settled(self) -> None:
        """Return once the families show a read made within the current window of ``clock``
        (for tests and benchmarks; at once when no scrape keeps the reads going)."""
        while self._task is not None and not self._task.done() and (self._reading or self.stale(self.clock.now())):
            if not self._reading:
                self._wake.set()
            await self.next_read()

    async def renew(self) -> None:
        """Read the store now, whatever the window, and return once its families are
        rendered (for benchmarks)."""
        if self._task is None or self._task.done():
            await self.current()
            return
        while self._reading:
            await self.next_read()
        built = self.next_read()
        self._wake.set()
        await built

    def stop(self) -> None:
        """Stop the background reads (a scrape starts them again)."""
        if self._task is not None:
            self._task.cancel()

    def next_read(self) -> asyncio.Future[None]:
        """Done once the next read's families are rendered (a failed read's too)."""
        if self._built is None or self._built.done():
            self._built = asyncio.get_running_loop().create_future()
        return asyncio.shield(self._built)

    async def _refresh(self) -> None:
        while True:
            await self._read()
            if self.scraped_at is None or self.clock.now() - self.scraped_at >= self.idle_after:
                return  # nobody scrapes: stop reading (the next scrape starts again)
            self._wake.clear()
            sleep = asyncio.ensure_future(self.clock.sleep_until(cast(datetime, self.read_at) + self.cache_for))
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait([sleep, woken], return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleep.cancel()
                woken.cancel()

    async def _read(self) -> None:
        engine = self.engine
        now = engine.clock.now()
        self.read_at = self.clock.now()
        self.reads += 1
        self._reading = True
        try:
            try:
                self.snapshot = await cast(FleetStore, engine.store).fleet_snapshot(
                    list(engine.schedules),
                    now=now,
                    live_after=now - engine.registry.abandon_after,
                    lock_now=engine.locks.lock_now(),
                )
            except Unavailable as exc:
                self.snapshot = None
                log.warning("metrics: the fleet's state is left out for %gs: %s", self.cache_for.total_seconds(), exc)
            except Exception:
                self.snapshot = None
                log.exception("metrics: reading the fleet's state failed")
            rows = self._take(self.snapshot, now)
            self.text = await in_own_thread(self._render, rows, name="schedtui metrics")
            self._rows = rows
            self.built += 1
        finally:
            self._reading = self._first = False
            if self._built is not None and not self._built.done():
                self._built.set_result(None)

    def _render(self, rows: _FleetRows) -> bytes:
        texts = self.texts
        parts = [texts[0].update(rows.next_fire)]
        if rows.read is not None:
            parts += [text.update(groups) for text, groups in zip(texts[1:], rows.read, strict=True)]
        return b"".join(parts)

    def _take(self, snapshot: FleetSnapshot | None, now: datetime) -> _FleetRows:
        stored = {facts.name: facts.enabled for facts in snapshot.schedules} if snapshot is not None else {}
        next_fire: _Gauges = [(name, _seconds(at)) for name, at in self._next_fires(stored)]
        if snapshot is None:
            return _FleetRows(next_fire)
        engine = self.engine
        enabled: _Gauges = []
        for facts in snapshot.schedules:
            on = facts.enabled
            if on is None:  # never changed by an operator: its definition holds
                schedule = engine.schedules.get(facts.name)
                on = schedule.enabled if schedule is not None else True
            enabled.append((facts.name, 1.0 if on else 0.0))
        durable = dict.fromkeys(((f, s) for f in engine.durable.functions for s in EXECUTION_STATUSES), 0)
        durable.update(snapshot.durable)
        return _FleetRows(
            next_fire,
            [
                [(facts.name, _seconds(facts.last_success)) for facts in snapshot.schedules if facts.last_success is not None],
                enabled,
                [(key, float(n)) for key, n in sorted(snapshot.jobs.items()) if key[1] in JOB_STATES],
                [(key, float(n)) for key, n in sorted(durable.items())],
                [((), float(snapshot.locks_held))],
                [(role, float(snapshot.instances.get(role, 0))) for role in MEMBER_ROLES],
                [((), _seconds(now))],
            ],
        )

    def describe(self) -> Iterable[Metric]:
        return [make() for make in self._families()]

    def collect(self) -> Iterable[Metric]:
        rows, texts = self._rows, self.texts
        families = [texts[0].family(rows.next_fire)]
        if rows.read is not None:
            families += [text.family(groups) for text, groups in zip(texts[1:], rows.read, strict=True)]
        return families

    # -- the families ----------------------------------------------------------------------
    @staticmethod
    def _families() -> list[Callable[[], GaugeMetricFamily]]:
        def gauge(name: str, documentation: str, *labels: str) -> Callable[[], GaugeMetricFamily]:
            return lambda: GaugeMetricFamily(name, documentation, labels=list(labels))

        return [
            gauge(
                "schedtui_schedule_next_fire_timestamp_seconds",
                "When a schedule fires next on its cron (Unix time): the enabled self-triggered schedules this instance knows.",
                "schedule",
            ),
            gauge(
                "schedtui_schedule_last_success_timestamp_seconds",
                "When a schedule's newest succeeded run finished (Unix time), from the store; absent until one has.",
                "schedule",
            ),
            gauge("schedtui_schedule_enabled", "Whether a schedule is enabled (1) or disabled (0), from the store.", "schedule"),
            gauge("schedtui_jobs", "Jobs in the store by queue and state (queued, running, dead).", "queue", "state"),
            gauge("schedtui_durable_executions", "Durable executions kept in the store by function and status.", "function", "status"),
            gauge("schedtui_locks_held", "Locks held now (a holder whose lease has not expired)."),
            gauge(
                "schedtui_instances",
                "Members with a fresh heartbeat, by role: firing, waiting (another coordination mode fires), or "
                "standing_down (its clock is off the database's: it takes no work). Consoles and CLI verbs never count.",
                "role",
            ),
            gauge(
                "schedtui_fleet_snapshot_timestamp_seconds",
                "When the store's families shown here were read (Unix time): they are refreshed every few seconds.",
            ),
        ]

    def _next_fires(self, stored: dict[str, bool | None]) -> Iterator[tuple[str, datetime]]:
        """Each enabled self-triggered schedule's next slot: the armed one, else the next on
        its cron after now (kept until it passes)."""
        engine = self.engine
        now = engine.clock.now()
        known = self._next_fire
        for name, schedule in list(engine.schedules.items()):
            on = stored.get(name)
            if on is None:  # never changed by an operator (or not read): as this instance knows it
                on = engine.states.is_enabled(name)
            if not on or schedule.effective_trigger(engine.default_trigger) != "self":
                continue
            armed = engine.timers.next_slot(name)
            if armed is not None:
                yield name, armed
                continue
            kept = known.get(name)
            if kept is None or kept[0] is not schedule.cron or kept[1] <= now:
                nxt = schedule.cron.next_or_none(now)
                if nxt is None:  # no slot left before year 10000
                    continue
                kept = known[name] = (schedule.cron, nxt)
            yield name, kept[1]
        for gone in known.keys() - engine.schedules.keys():
            del known[gone]
