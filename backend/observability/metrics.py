"""An engine's Prometheus metrics (``GET /metrics``), with ``prometheus_client``.

One :class:`EngineMetrics` per engine, on a registry of its own (several engines may live in
one process). What it reports:

* this instance's counts, told by the engine as things finish (the run ledger's and the
  job workers' ``meters``): ``schedtui_runs_total``, ``schedtui_run_duration_seconds``,
  ``schedtui_jobs_finished_total`` (:class:`Tallies`);
* the fleet's state, read from the store so that every instance answers alike:
  ``schedtui_schedule_last_success_timestamp_seconds``, ``schedtui_schedule_enabled``,
  ``schedtui_jobs``, ``schedtui_durable_executions``, ``schedtui_locks_held``,
  ``schedtui_instances``; with ``schedtui_schedule_next_fire_timestamp_seconds``, from the
  cron definitions this instance knows (:class:`FleetGauges`);
* the process, platform and garbage-collector collectors of ``prometheus_client``.

A scrape never blocks firing. The fleet's state comes from one
:class:`~backend.observability.fleet.FleetSnapshot` (a fixed number of statements, whatever
the number of schedules), read at most once per ``cache_for`` seconds of the injected clock
and awaited, never waited for on the event loop's thread; the scrapes in between answer
from it. A snapshot that cannot be read leaves the fleet's families out until the next
one (rather than repeating old values as if current).

Formatting costs prometheus_client some microseconds a series, which at a thousand
schedules is most of a scrape. So the exposition is rendered in three parts, each by
``generate_latest`` off the event loop's thread and each holding whole families: this
instance's counts (rendered again only when something finished since), the fleet's
(rendered once per snapshot), and the process's (every scrape).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from backend.clock import Clock
from backend.cron import Cron
from backend.durable.model import EXECUTION_STATUSES
from backend.errors import Unavailable
from backend.jobs.store import Finish
from backend.model import Run
from backend.observability.fleet import JOB_STATES, MEMBER_ROLES, FleetSnapshot, FleetStore

if TYPE_CHECKING:
    from backend.scheduler.engine import Engine

__all__ = ["CONTENT_TYPE", "DEFAULT_CACHE_FOR", "DURATION_BUCKETS", "REFRESH_WAIT", "EngineMetrics", "FleetGauges", "Tallies"]

log = logging.getLogger("schedtui.metrics")

#: Seconds a fleet snapshot answers scrapes for.
DEFAULT_CACHE_FOR = 5.0
#: Seconds a scrape waits for a snapshot being read before it answers from the one before
#: (well inside Prometheus's default scrape timeout of 10 s); the read goes on for the next.
REFRESH_WAIT = 3.0
#: Run durations span milliseconds to hours (a handler's ``max_runtime`` defaults to 30 min).
#: Ten buckets: each one is a series per schedule.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
#: What the scrape answers in: the Prometheus text format.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: How a job attempt's end reads as ``schedtui_jobs_finished_total``'s outcome.
_JOB_OUTCOMES = {"succeeded": "succeeded", "retry": "retried", "dead": "dead"}

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
    ) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        self.tallies = Tallies()
        self.fleet = FleetGauges(engine, cache_for=cache_for, clock=clock or engine.clock, wait=wait)
        process = [ProcessCollector(registry=self.registry), PlatformCollector(registry=self.registry),
                   GCCollector(registry=self.registry)]  # fmt: skip
        self.registry.register(self.tallies)
        self.registry.register(self.fleet)
        self._parts = (
            _Part([self.tallies], lambda: self.tallies.changes),
            _Part([self.fleet], lambda: self.fleet.built),
            _Part(process, None),
        )
        engine.ledger.meters.append(self.tallies.run_finished)
        engine.jobs.meters.append(self.tallies.job_finished)

    def close(self) -> None:
        """Stop counting (the engine keeps running)."""
        if self.tallies.run_finished in self.engine.ledger.meters:
            self.engine.ledger.meters.remove(self.tallies.run_finished)
        if self.tallies.job_finished in self.engine.jobs.meters:
            self.engine.jobs.meters.remove(self.tallies.job_finished)

    async def refresh(self) -> None:
        """Read the fleet's state if its window has passed, and take this instance's counts
        (on the loop that counts them: a renderer on another thread reads the copy). What
        every scrape does first."""
        await self.fleet.current()
        self.tallies.freeze()

    async def render(self) -> bytes:
        """One scrape, in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        await self.refresh()
        return b"".join([await part.text() for part in self._parts])


class _Part(Collector):
    """Whole families rendered together, and kept until ``version()`` changes (``None``:
    rendered at every scrape)."""

    def __init__(self, collectors: list[Collector], version: Callable[[], int] | None) -> None:
        self.collectors = collectors
        self.version = version
        self.rendered: tuple[int, bytes] | None = None

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()

    async def text(self) -> bytes:
        version = self.version() if self.version is not None else None
        if version is not None and self.rendered is not None and self.rendered[0] == version:
            return self.rendered[1]
        body = await asyncio.to_thread(generate_latest, self)
        if version is not None:
            self.rendered = (version, body)
        return body


_Timed = tuple[tuple[int, ...], float]
"""A schedule's frozen durations: observations per bucket, and their sum."""
_Frozen = tuple[dict[tuple[str, str, str, str], int], dict[str, _Timed], dict[tuple[str, str], int]]


@dataclass
class _Durations:
    counts: list[int]
    """Observations per bucket (not cumulative; the last one is above every bound)."""
    total: float = 0.0


class Tallies(Collector):
    """This instance's counts, kept as plain numbers by the engine's loop (told once per
    finished run or job attempt) and handed to a renderer as a copy (:meth:`freeze`).

    A schedule's histogram is a dozen series: their samples are made again only for the
    schedules whose durations changed since the last render."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str, str, str], int] = {}
        self.durations: dict[str, _Durations] = {}
        self.jobs: dict[tuple[str, str], int] = {}
        self.changes = 0
        """How many times a count changed: a renderer's cue."""
        self._timed: set[str] = set()
        """Schedules whose durations changed since the last freeze."""
        self._frozen: _Frozen = ({}, {}, {})
        self._frozen_at = 0
        self._samples: dict[str, tuple[_Timed, list[Sample]]] = {}
        """Per schedule, the histogram samples made from its frozen durations."""

    def run_finished(self, run: Run) -> None:
        key = (run.name, run.status, run.coordination_outcome, run.trigger)
        self.runs[key] = self.runs.get(key, 0) + 1
        if run.status in ("succeeded", "failed") and run.fired_at is not None and run.finished_at is not None:
            seconds = max(0.0, (run.finished_at - run.fired_at).total_seconds())
            durations = self.durations.get(run.name)
            if durations is None:
                durations = self.durations[run.name] = _Durations([0] * len(_LE))
            durations.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
            durations.total += seconds
            self._timed.add(run.name)
        self.changes += 1

    def job_finished(self, finish: Finish) -> None:
        outcome = _JOB_OUTCOMES.get(finish.kind)
        if outcome is not None:
            key = (finish.queue, outcome)
            self.jobs[key] = self.jobs.get(key, 0) + 1
            self.changes += 1

    def freeze(self) -> None:
        """Copy the counts for :meth:`collect` (a renderer on another thread reads only that)."""
        if self._frozen_at == self.changes:
            return
        durations = dict(self._frozen[1])
        for name in self._timed:
            timed = self.durations[name]
            durations[name] = (tuple(timed.counts), timed.total)
        self._timed.clear()
        self._frozen = (dict(self.runs), durations, dict(self.jobs))
        self._frozen_at = self.changes

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        runs, durations, jobs = self._frozen
        counts, histogram, jobs_finished = families = self._families()
        for key, n in sorted(runs.items()):
            counts.add_metric(key, n)
        made = self._samples
        for name in sorted(durations):
            timed = durations[name]
            kept = made.get(name)
            if kept is None or kept[0] is not timed:
                one = self._families()[1]
                cumulative, buckets = 0, []
                for le, n in zip(_LE, timed[0], strict=True):
                    cumulative += n
                    buckets.append((le, float(cumulative)))
                one.add_metric([name], buckets, timed[1])
                kept = made[name] = (timed, one.samples)
            histogram.samples.extend(kept[1])
        for key2, n in sorted(jobs.items()):
            jobs_finished.add_metric(key2, n)
        return families

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, HistogramMetricFamily, CounterMetricFamily]:
        return (
            CounterMetricFamily(
                "schedtui_runs",
                "Runs this instance finished (skipped and missed included), by schedule, status, coordination outcome and trigger.",
                labels=["schedule", "status", "outcome", "trigger"],
            ),
            HistogramMetricFamily(
                "schedtui_run_duration_seconds",
                "How long this instance's succeeded and failed runs took, from firing to their end.",
                labels=["schedule"],
            ),
            CounterMetricFamily(
                "schedtui_jobs_finished",
                "Job attempts this instance ran to an end the store took: succeeded, retried (failed, attempts left) or dead.",
                labels=["queue", "outcome"],
            ),
        )


@dataclass(frozen=True)
class _FleetRows:
    """The fleet's families as plain values, made on the engine's loop when a read ends
    (the only place its schedules may be read); ``None`` where the store could not say."""

    next_fire: list[tuple[str, float]]
    last_success: list[tuple[str, float]] | None = None
    enabled: list[tuple[str, float]] | None = None
    jobs: list[tuple[str, str, int]] | None = None
    durable: list[tuple[str, str, int]] | None = None
    locks_held: int | None = None
    instances: list[tuple[str, int]] | None = None


class FleetGauges(Collector):
    """The families read from the store (and the next fire times), from the newest snapshot.

    Contract: :meth:`current` reads the store at most once per ``cache_for`` seconds of
    ``clock`` (a read under way is shared, not repeated) and waits for it at most ``wait``
    seconds; what the families show is taken when a read ends, so :meth:`collect` does no
    I/O, reads nothing of the engine's and may run on any thread."""

    def __init__(self, engine: Engine, *, cache_for: float, clock: Clock, wait: float) -> None:
        self.engine = engine
        self.cache_for = timedelta(seconds=cache_for)
        self.clock = clock
        self.wait = wait
        self.snapshot: FleetSnapshot | None = None
        """The newest snapshot, or ``None`` while the last read failed (or none was made)."""
        self.read_at: datetime | None = None
        """When the newest read was started, on ``clock`` (failed ones too)."""
        self.reads = 0
        """Snapshots asked of the store so far."""
        self.built = 0
        """Times the families' values were taken (once per read)."""
        self._reading: asyncio.Future[None] | None = None
        self._rows = _FleetRows([])
        self._next_fire: dict[str, tuple[Cron, datetime]] = {}

    def stale(self, now: datetime) -> bool:
        read_at = self.read_at
        return read_at is None or not timedelta(0) <= now - read_at < self.cache_for

    async def current(self) -> None:
        """Read the store again if the window has passed, waiting for it at most ``wait``
        seconds (past that, this scrape answers from the snapshot before)."""
        if self.stale(self.clock.now()) and (self._reading is None or self._reading.done()):
            self.read_at = self.clock.now()
            self._reading = asyncio.ensure_future(self._read())
        if self._reading is not None and not self._reading.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._reading), self.wait)
            except TimeoutError:
                log.warning("metrics: the store has not answered within %gs; this scrape has the fleet's state before", self.wait)

    async def _read(self) -> None:
        engine = self.engine
        now = engine.clock.now()
        self.reads += 1
        try:
            self.snapshot = await cast(FleetStore, engine.store).fleet_snapshot(
                list(engine.schedules),
                live_after=now - engine.registry.abandon_after,
                lock_now=engine.locks.lock_now(),
            )
        except Unavailable as exc:
            self.snapshot = None
            log.warning("metrics: the fleet's state is left out for %gs: %s", self.cache_for.total_seconds(), exc)
        except Exception:
            self.snapshot = None
            log.exception("metrics: reading the fleet's state failed")
        self._rows = self._take(self.snapshot)
        self.built += 1

    def _take(self, snapshot: FleetSnapshot | None) -> _FleetRows:
        stored = {facts.name: facts.enabled for facts in snapshot.schedules} if snapshot is not None else {}
        next_fire = [(name, _seconds(at)) for name, at in self._next_fires(stored)]
        if snapshot is None:
            return _FleetRows(next_fire)
        engine = self.engine
        enabled = []
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
            [(facts.name, _seconds(facts.last_success)) for facts in snapshot.schedules if facts.last_success is not None],
            enabled,
            [(queue, state, n) for (queue, state), n in sorted(snapshot.jobs.items()) if state in JOB_STATES],
            [(function, status, n) for (function, status), n in sorted(durable.items())],
            snapshot.locks_held,
            [(role, snapshot.instances.get(role, 0)) for role in MEMBER_ROLES],
        )

    def describe(self) -> Iterable[Metric]:
        return self._empty()

    def collect(self) -> Iterable[Metric]:
        rows = self._rows
        next_fire, last_success, enabled, jobs, durable, locks, instances = gauges = self._empty()
        for name, seconds in rows.next_fire:
            next_fire.add_metric([name], seconds)
        if rows.last_success is None or rows.enabled is None or rows.jobs is None or rows.durable is None:
            return [next_fire]
        for name, seconds in rows.last_success:
            last_success.add_metric([name], seconds)
        for name, on in rows.enabled:
            enabled.add_metric([name], on)
        for queue, state, n in rows.jobs:
            jobs.add_metric([queue, state], n)
        for function, status, n in rows.durable:
            durable.add_metric([function, status], n)
        locks.add_metric([], rows.locks_held or 0)
        for role, n in rows.instances or ():
            instances.add_metric([role], n)
        return [*gauges]

    # -- the families ----------------------------------------------------------------------
    @staticmethod
    def _empty() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "schedtui_schedule_next_fire_timestamp_seconds",
                "When a schedule fires next on its cron (Unix time): the enabled self-triggered schedules this instance knows.",
                labels=["schedule"],
            ),
            GaugeMetricFamily(
                "schedtui_schedule_last_success_timestamp_seconds",
                "When a schedule's newest succeeded run finished (Unix time), from the store; absent until one has.",
                labels=["schedule"],
            ),
            GaugeMetricFamily(
                "schedtui_schedule_enabled", "Whether a schedule is enabled (1) or disabled (0), from the store.", labels=["schedule"]
            ),
            GaugeMetricFamily(
                "schedtui_jobs", "Jobs in the store by queue and state (queued, running, dead).", labels=["queue", "state"]
            ),
            GaugeMetricFamily(
                "schedtui_durable_executions", "Durable executions kept in the store by function and status.", labels=["function", "status"]
            ),
            GaugeMetricFamily("schedtui_locks_held", "Locks held now (a holder whose lease has not expired)."),
            GaugeMetricFamily(
                "schedtui_instances",
                "Members with a fresh heartbeat, by role: firing, or waiting (another coordination mode fires). "
                "Consoles and CLI verbs never count.",
                labels=["role"],
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
                kept = known[name] = (schedule.cron, schedule.cron.next(now))
            yield name, kept[1]
        for gone in known.keys() - engine.schedules.keys():
            del known[gone]
