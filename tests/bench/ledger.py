"""A big, realistic run ledger for benchmarks: N schedules and M runs in a real SQLite store.

    from tests.bench.ledger import build_ledger

    ledger = build_ledger(tmp_path)                      # 1,000 schedules, 1,000,000 runs
    ledger.store_url, ledger.schedules_dir               # for Engine(...) or `schedtui serve`
    ledger.schedule_with_runs(1000)                      # a schedule with at least that many runs

    python -m tests.bench.ledger [--schedules N] [--runs M] [--folder DIR] [--no-cache]

What it writes into ``folder``:

* ``schedules/team_NN.cron.py``: the schedules, 100 explicit ``define_schedule`` calls per
  file (cheap to import). A deterministic mix (``seed``) of frequencies (every 30 s, every
  minute ... monthly), timezones (UTC, Berlin, New York, Tokyo, Kolkata's half hour ...),
  triggers (default, explicit self, external), overlap and backfill policies, payloads,
  descriptions, and a few schedules disabled in their definition. Handlers do nothing.
* ``state.db``: the store, with the schema of :data:`backend.store.sqlite.sql.MIGRATIONS`
  and of every component of the SQLite store (:mod:`backend.store.migrations`): tables
  first, the rows inserted with ``executemany`` in big transactions, then the indexes (the
  components' with them), so the result is the very schema the store creates, built in
  seconds, and opening a copy migrates nothing (a copy left to build the components'
  indexes over the runs at its first open would time that, seconds, not the store). Runs are
  spread over each schedule's last ~28 days and over the schedules roughly in proportion to
  how often each fires (frequent schedules have tens of thousands, hourly ones hundreds,
  monthly ones one). Ids come from :class:`backend.ids.IdFactory` at each run's creation
  time, so they sort by creation time as the engine's do. Statuses: mostly ``succeeded``,
  some ``failed`` (with an error tag and message), ``skipped`` (overlap) and ``missed``;
  about 1% of runs are manual. Two ``schedule_state`` rows: one schedule disabled by an
  operator with a note, one disabled and enabled again.

The built ledger is cached (``$SCHEDTUI_BENCH_CACHE``, else ``~/.cache/schedtui-bench``,
else the temp dir), keyed by the parameters, the seed, this file's source and the schema.
A cached one older than ``max_age`` is rebuilt, because the runs are dated relative to the
build and the engine prunes runs older than its retention (30 days by default).
``build_ledger`` copies the cached files into ``folder`` (the copy is the caller's to
write), then "tops it up": every self-triggered, enabled schedule gets a succeeded run at
its newest slot before now, as if the engine had been running until a moment ago, so an
engine started on the copy has nothing to catch up (no burst of ``missed`` rows at boot).
With ``writable=False`` nothing is copied: ``db_path`` is the cached file itself, to be
opened read-only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make backend/ importable
    sys.path.insert(0, str(REPO_ROOT))

from backend.cron import Cron  # noqa: E402
from backend.ids import IdFactory  # noqa: E402
from backend.store.migrations import components_of, migrate_sqlite  # noqa: E402
from backend.store.sqlite import sql as sqlite_store  # noqa: E402
from backend.store.sqlite.store import SQLiteStore  # noqa: E402

__all__ = ["BigLedger", "ScheduleSpec", "build_ledger", "cache_dir"]

#: Part of the cache key (with the schema and this file's source).
GENERATOR_VERSION = 1
#: Runs are spread over this much time before the build (inside the default 30-day retention).
SPAN = timedelta(days=28)
#: A cached ledger older than this is rebuilt (its runs would drift out of the retention).
DEFAULT_MAX_AGE = timedelta(hours=24)
PER_FILE = 100
INSTANCE = "bench-ledger"

_UTC = UTC
_EPOCH = datetime(1970, 1, 1, tzinfo=_UTC)
_US = 1_000_000

# (weight, kind, natural period in seconds): how often each kind of schedule occurs and fires.
_FREQUENCIES: list[tuple[float, str, int]] = [
    (0.004, "every30s", 30),
    (0.010, "minutely", 60),
    (0.040, "every5m", 300),
    (0.100, "every15m", 900),
    (0.300, "hourly", 3600),
    (0.100, "every6h", 6 * 3600),
    (0.296, "daily", 86400),
    (0.080, "weekdays", 86400 * 7 // 5),
    (0.050, "weekly", 7 * 86400),
    (0.020, "monthly", 30 * 86400),
]
_ZONES: list[tuple[float, str]] = [
    (0.40, "UTC"),
    (0.14, "Europe/Berlin"),
    (0.12, "America/New_York"),
    (0.07, "America/Los_Angeles"),
    (0.06, "Europe/London"),
    (0.06, "Asia/Tokyo"),
    (0.05, "Asia/Kolkata"),
    (0.05, "Australia/Sydney"),
    (0.05, "America/Sao_Paulo"),
]
_TEAMS = ["billing", "search", "growth", "infra", "payments", "ml", "support", "data", "mail", "ops"]
_VERBS = ["sync", "export", "import", "reindex", "cleanup", "report", "digest", "rollup", "refresh", "audit"]
_NOUNS = ["invoices", "users", "orders", "events", "metrics", "catalog", "tickets", "sessions", "ledger", "feeds"]
_FAILURES = [
    ("ConnectionRefusedError", "db-replica-2.internal:5432 refused the connection"),
    ("TimeoutError", "upstream did not answer within 30 s"),
    ("timeout", "the run exceeded its max_runtime and the watchdog gave up on it"),
    ("KeyError", "'customer_id'"),
    ("HTTPStatusError", "Server error '503 Service Unavailable' for url 'https://api.example.internal/v2/batch'"),
    ("abandoned", "instance web-2:4117 (pid 4117) is no longer running"),
]
_INSTANCES = ["web-1:2231", "web-2:4117", "web-1:9054", "worker-a:771", "worker-b:1290"]


def _pick(rng: random.Random, table: Sequence[tuple[float, *tuple[Any, ...]]]) -> Any:
    x, acc = rng.random() * sum(w for w, *_ in table), 0.0
    for row in table:
        acc += row[0]
        if x < acc:
            return row[1:] if len(row) > 2 else row[1]
    last = table[-1]
    return last[1:] if len(last) > 2 else last[1]


@dataclass(frozen=True)
class ScheduleSpec:
    """One generated schedule, as written to its ``*.cron.py`` file."""

    name: str
    cron: str
    timezone: str
    kind: str
    period_s: int
    trigger: str | None  # None: the app default ("self")
    on_overlap: str = "skip"
    backfill: str = "skip"
    max_runtime: float = 1800.0
    description: str | None = None
    payload: Any = None
    enabled: bool = True
    sync_handler: bool = False

    @property
    def effective_trigger(self) -> str:
        return self.trigger or "self"


@dataclass
class BigLedger:
    """A built ledger: where its files are and what is in them."""

    folder: Path
    schedules_dir: Path
    db_path: Path
    specs: list[ScheduleSpec]
    run_counts: dict[str, int]
    """Runs per schedule as built (before the top-up, which adds at most one per schedule)."""
    built_at: datetime
    cache_path: Path | None
    cached: bool
    """True when the build came from the cache."""
    build_s: float
    """Seconds the build took (0 when cached)."""
    prepare_s: float = 0.0
    """Seconds spent copying and topping up for this call."""
    topped_up: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def store_url(self) -> str:
        return f"sqlite:///{self.db_path}"  # absolute: sqlite:////tmp/...

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def total_runs(self) -> int:
        return sum(self.run_counts.values())

    def schedule_with_runs(self, at_least: int = 1000) -> str:
        """The schedule with the fewest runs that still has ``at_least`` (else the busiest)."""
        fits = [(n, name) for name, n in self.run_counts.items() if n >= at_least]
        if not fits:
            return self.busiest()
        return min(fits)[1]

    def busiest(self) -> str:
        return max(self.run_counts.items(), key=lambda kv: (kv[1], kv[0]))[0]

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for spec in self.specs:
            kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
        return {
            "schedules": len(self.specs),
            "runs": self.total_runs,
            "topped_up": self.topped_up,
            "db_mb": round(self.db_path.stat().st_size / 2**20, 1) if self.db_path.exists() else None,
            "built_at": self.built_at.isoformat(),
            "cached": self.cached,
            "build_s": round(self.build_s, 2),
            "prepare_s": round(self.prepare_s, 2),
            "kinds": kinds,
            "external": sum(1 for s in self.specs if s.effective_trigger == "external"),
            "max_runs_per_schedule": max(self.run_counts.values(), default=0),
        }


# ---------------------------------------------------------------------------------------
# schedules
# ---------------------------------------------------------------------------------------
def _cron_of(kind: str, rng: random.Random) -> str:
    m, h = rng.randrange(60), rng.randrange(24)
    if kind == "every30s":
        return f"{rng.randrange(30)}/30 * * * * *"
    if kind == "minutely":
        return "* * * * *"
    if kind == "every5m":
        return f"{m % 5}-59/5 * * * *" if rng.random() < 0.5 else "*/5 * * * *"
    if kind == "every15m":
        return f"{m % 15}-59/15 * * * *"
    if kind == "hourly":
        return f"{m} * * * *"
    if kind == "every6h":
        return f"{m} {h % 6}-23/6 * * *"
    if kind == "daily":
        return f"{m} {h} * * *"
    if kind == "weekdays":
        return f"{m} {h} * * 1-5"
    if kind == "weekly":
        return f"{m} {h} * * {rng.randrange(7)}"
    if kind == "monthly":
        return f"{m} {h} {rng.choice([1, 1, 15, 28])} * *"
    raise AssertionError(kind)


def make_specs(count: int, seed: int = 0) -> list[ScheduleSpec]:
    rng = random.Random(f"schedules-{seed}")
    specs: list[ScheduleSpec] = []
    for i in range(count):
        kind, period = _pick(rng, _FREQUENCIES)
        team, verb, noun = _TEAMS[i % len(_TEAMS)], rng.choice(_VERBS), rng.choice(_NOUNS)
        r = rng.random()
        trigger = None if r < 0.85 else ("self" if r < 0.90 else "external")
        if trigger == "external" and kind == "every30s":  # six fields cannot be external
            trigger = None
        r = rng.random()
        on_overlap = "skip" if r < 0.85 else ("queue" if r < 0.95 else "parallel")
        r = rng.random()
        backfill = "skip" if r < 0.80 else ("latest" if r < 0.95 else "all")
        payload: Any = None
        if rng.random() < 0.4:
            payload = {"batch": rng.choice([100, 500, 1000]), "region": rng.choice(["eu", "us", "ap"])}
            if rng.random() < 0.3:
                payload["targets"] = [f"{noun}-{j}" for j in range(rng.randrange(1, 6))]
        description = (
            f"{verb.capitalize()} {noun} for the {team} team" if rng.random() < 0.7 else None
        )
        specs.append(
            ScheduleSpec(
                name=f"{team}-{verb}-{noun}-{i:04d}",
                cron=_cron_of(kind, rng),
                timezone=_pick(rng, _ZONES),
                kind=kind,
                period_s=period,
                trigger=trigger,
                on_overlap=on_overlap,
                backfill=backfill,
                max_runtime=float(rng.choice([60, 300, 900, 1800, 3600])),
                description=description,
                payload=payload,
                enabled=rng.random() >= 0.02,
                sync_handler=rng.random() < 0.1,
            )
        )
    return specs


def write_schedules(folder: Path, specs: list[ScheduleSpec]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(0, len(specs), PER_FILE):
        lines = [
            f'"""Generated by tests/bench/ledger.py: schedules {f}-{min(f + PER_FILE, len(specs)) - 1}."""',
            "",
            "from backend import define_schedule",
            "",
            "",
            "async def noop(ctx):",
            "    pass",
            "",
            "",
            "def noop_sync(ctx):",
            "    pass",
            "",
            "",
        ]
        for i, spec in enumerate(specs[f : f + PER_FILE], start=f):
            args = [
                f"name={spec.name!r}",
                f"cron={spec.cron!r}",
                f"timezone={spec.timezone!r}",
                f"handler={'noop_sync' if spec.sync_handler else 'noop'}",
            ]
            if spec.on_overlap != "skip":
                args.append(f"on_overlap={spec.on_overlap!r}")
            if spec.backfill != "skip":
                args.append(f"backfill={spec.backfill!r}")
            if spec.max_runtime != 1800.0:
                args.append(f"max_runtime={spec.max_runtime!r}")
            if spec.description is not None:
                args.append(f"description={spec.description!r}")
            if spec.payload is not None:
                args.append(f"payload={spec.payload!r}")
            if not spec.enabled:
                args.append("enabled=False")
            if spec.trigger is not None:
                args.append(f"trigger={spec.trigger!r}")
            lines.append(f"s{i:05d} = define_schedule({', '.join(args)})")
        (folder / f"team_{f // PER_FILE:02d}.cron.py").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------
def _us(dt: datetime) -> int:
    return (dt - _EPOCH) // timedelta(microseconds=1)


def _allocate(specs: list[ScheduleSpec], runs: int, span_s: float) -> list[int]:
    """Runs per schedule, in proportion to how often each fires over the span, total ``runs``."""
    natural = [span_s / s.period_s for s in specs]
    total = sum(natural) or 1.0
    counts = [max(1, int(n * runs / total)) for n in natural]
    # Hand out (or take back) the rounding difference, busiest first.
    order = sorted(range(len(specs)), key=lambda i: -natural[i])
    diff, k = runs - sum(counts), 0
    while diff != 0 and order:
        i = order[k % len(order)]
        step = 1 if diff > 0 else -1
        if counts[i] + step >= 1:
            counts[i] += step
            diff -= step
        k += 1
    return counts


_DDL_DEFERRED = ("CREATE INDEX", "CREATE UNIQUE INDEX", "DROP INDEX")  # in migration order


def _schema_statements() -> tuple[list[str], list[str]]:
    """The store's migrations split into (tables, indexes): indexes are built after the rows."""
    tables: list[str] = []
    indexes: list[str] = []
    for script in sqlite_store.MIGRATIONS:
        for statement in script.split(";"):
            text = statement.strip()
            if text:
                (indexes if text.upper().startswith(_DDL_DEFERRED) else tables).append(text)
    return tables, indexes


def _schema_digest() -> str:
    """The schema (the core's and every component's) and this generator's own source: a
    change to either rebuilds the cache."""
    digest = hashlib.sha256("\n".join(sqlite_store.MIGRATIONS).encode())
    for component in components_of(SQLiteStore):
        digest.update("\n".join((component.name, *component.migrations)).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:10]


def _write_db(path: Path, specs: list[ScheduleSpec], counts: list[int], built_at: datetime, seed: int) -> None:
    rng = random.Random(f"runs-{seed}")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")  # 256 MiB while building
    conn.execute("PRAGMA temp_store = MEMORY")
    tables, indexes = _schema_statements()
    conn.execute("BEGIN")
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    for statement in tables:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (len(sqlite_store.MIGRATIONS),))
    conn.execute("COMMIT")

    # Each run: (created_us, schedule index, scheduled_at_us, manual?). Slots are evenly spread
    # back from the schedule's real newest slot before the build; created = slot + firing lag.
    built_us = _us(built_at)
    span_us = int(SPAN.total_seconds() * _US)
    floor_us = built_us - span_us
    events: list[tuple[int, int, int]] = []
    for index, (spec, count) in enumerate(zip(specs, counts, strict=False)):
        newest = _us(Cron(spec.cron, spec.timezone).latest(built_at))
        if newest < floor_us + span_us // 2 and count > 1:
            newest = built_us - 60 * _US
        if newest < floor_us:
            newest = floor_us + span_us // 2
        grain = _US if spec.kind == "every30s" else 60 * _US
        step = max(grain, (newest - floor_us) // count)
        rand = rng.random
        for k in range(count):
            slot = newest - k * step
            slot -= slot % grain
            if rand() < 0.01:  # Run now: its slot is the moment it was asked for
                at = slot - int(rand() * step)
                events.append((at + 300, index, -at))
            else:
                events.append((slot + 200 + int(rand() * rand() * 2_000_000), index, slot))
    events.sort()

    clock = [built_at]
    ids = IdFactory(lambda: clock[0], random_bits=lambda: rng.getrandbits(80))
    names = [s.name for s in specs]
    triggers = [s.effective_trigger for s in specs]
    bases = [rng.choice([40, 120, 800, 2_500, 15_000, 60_000, 240_000]) * 1000 for _ in specs]
    fromtimestamp = datetime.fromtimestamp

    def rows() -> Any:
        rand = rng.random
        instance = _INSTANCES[0]
        for n, (created, index, slot) in enumerate(events):
            if n % 50_000 == 0:
                instance = _INSTANCES[(n // 50_000) % len(_INSTANCES)]  # restarts, deploys
            clock[0] = fromtimestamp(created / _US, _UTC)
            run_id = ids()
            if slot < 0:  # manual
                fired = -slot
                duration = int(bases[index] * (0.3 + rand() * 1.4))
                yield (run_id, names[index], fired, fired, fired + duration, "succeeded",
                       "manual", "manual", instance, None, None)
                continue
            trigger = triggers[index]
            outcome = "external" if trigger == "external" else "single"
            r = rand()
            if r < 0.91:
                duration = int(bases[index] * (0.3 + rand() * 1.4))
                yield (run_id, names[index], slot, created, created + duration, "succeeded",
                       trigger, outcome, instance, None, None)
            elif r < 0.96:
                tag, message = _FAILURES[int(rand() * len(_FAILURES))]
                duration = int(bases[index] * rand() * 2)
                yield (run_id, names[index], slot, created, created + duration, "failed",
                       trigger, outcome, instance, tag, message)
            elif r < 0.98:
                yield (run_id, names[index], slot, created, created, "skipped", trigger, outcome,
                       instance, "overlap", f"run {run_id[:10]}... was still in flight")
            else:
                yield (run_id, names[index], slot, None, None, "missed", trigger, outcome, instance,
                       None, "missed while the engine was not running (backfill=skip)")

    it = rows()
    batch = 200_000
    pad = _run_padding(11)
    while True:
        chunk = [row + pad for _, row in zip(range(batch), it, strict=False)]
        if not chunk:
            break
        conn.execute("BEGIN")
        conn.executemany(sqlite_store.UPSERT_RUN, chunk)
        conn.execute("COMMIT")

    # Two operator actions: one schedule paused with a note, one paused and resumed.
    enabled_self = [s for s in specs if s.enabled and s.effective_trigger == "self"]
    if enabled_self:
        paused = enabled_self[len(enabled_self) // 3]
        resumed = enabled_self[(2 * len(enabled_self)) // 3]
        states = [
            (paused.name, 0, "alice@ops-laptop", built_us - 3 * 86400 * _US,
             "paused during the warehouse migration (OPS-1234)"),
            (resumed.name, 1, "bob@bastion", built_us - 10 * 86400 * _US, "upstream fixed; resuming"),
        ]
        conn.execute("BEGIN")
        conn.executemany(sqlite_store.SET_STATE, list(dict.fromkeys(states)))
        conn.execute("COMMIT")

    conn.execute("BEGIN")
    for statement in indexes:
        conn.execute(statement)
    # The components' tables, and their indexes over the runs, built here once: left to the
    # store, every copy would build them again at its first open (seconds at a million runs).
    migrate_sqlite(conn, components_of(SQLiteStore))
    conn.execute("COMMIT")
    conn.execute("PRAGMA journal_mode = WAL")  # what the store uses; the file says so
    conn.close()


# ---------------------------------------------------------------------------------------
# cache, copy, top-up
# ---------------------------------------------------------------------------------------
def cache_dir() -> Path:
    env = os.environ.get("SCHEDTUI_BENCH_CACHE")
    if env:
        return Path(env)
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    try:
        target = home / "schedtui-bench"
        target.mkdir(parents=True, exist_ok=True)
        return target
    except OSError:
        return Path(tempfile.gettempdir()) / "schedtui-bench"


def _key(schedules: int, runs: int, seed: int) -> str:
    return f"ledger-g{GENERATOR_VERSION}-{_schema_digest()}-s{schedules}-r{runs}-seed{seed}"


def _build_into(target: Path, schedules: int, runs: int, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    built_at = datetime.now(_UTC).replace(microsecond=0)
    specs = make_specs(schedules, seed)
    write_schedules(target / "schedules", specs)
    counts = _allocate(specs, runs, SPAN.total_seconds())
    _write_db(target / "state.db", specs, counts, built_at, seed)
    meta = {
        "built_at": built_at.isoformat(),
        "build_s": time.perf_counter() - t0,
        "specs": [dataclasses.asdict(s) for s in specs],
        "run_counts": dict(zip((s.name for s in specs), counts, strict=False)),
    }
    (target / "meta.json").write_text(json.dumps(meta))
    return meta


def _copy_db(src: Path, dst: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(str(dst) + suffix).unlink(missing_ok=True)
    shutil.copyfile(src, dst)


def _run_padding(generated: int) -> tuple[Any, ...]:
    """What follows ``generated`` columns of a run row in ``UPSERT_RUN``: the columns after
    them (the traceback) empty, and the last, ``held``, 0 (no run here holds its
    schedule's place)."""
    placeholders = sqlite_store.UPSERT_RUN.split("VALUES", 1)[1].split(")", 1)[0].count("?")
    return (None,) * (placeholders - generated - 1) + (0,)


def top_up(db_path: Path, specs: list[ScheduleSpec], now: datetime | None = None) -> int:
    """Give every enabled self-triggered schedule a succeeded run at its newest slot up to
    ``now`` when the ledger has none that recent; returns how many rows were added."""
    now = now or datetime.now(_UTC)
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        disabled = {
            row[0] for row in conn.execute("SELECT name FROM schedule_state WHERE enabled = 0")
        }
        rows = []
        ids = IdFactory(lambda: now)
        for spec in specs:
            if not spec.enabled or spec.effective_trigger != "self" or spec.name in disabled:
                continue
            slot = _us(Cron(spec.cron, spec.timezone).latest(now))
            last = conn.execute(sqlite_store.LAST_SLOT, (spec.name, _us(now))).fetchone()[0]
            if last is None or slot > last:
                fired = slot + 1500
                rows.append((ids(), spec.name, slot, fired, fired + 40_000, "succeeded", "self", "single",
                             INSTANCE, None, None))
        conn.execute("BEGIN IMMEDIATE")
        pad = _run_padding(11)
        conn.executemany(sqlite_store.UPSERT_RUN, [row + pad for row in rows])
        conn.execute("COMMIT")
        return len(rows)
    finally:
        conn.close()


def build_ledger(
    folder: Path,
    schedules: int = 1000,
    runs: int = 1_000_000,
    *,
    seed: int = 0,
    cache: bool = True,
    writable: bool = True,
    max_age: timedelta = DEFAULT_MAX_AGE,
) -> BigLedger:
    """Build (or reuse from the cache) a ledger of ``schedules`` schedules and ``runs`` runs.

    ``folder`` receives ``schedules/`` and, with ``writable`` (the default), a topped-up copy
    ``state.db`` that the caller may write to. See the module docstring."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cached = False
    cache_path: Path | None = None
    if cache:
        root = cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        cache_path = root / _key(schedules, runs, seed)
        meta_file = cache_path / "meta.json"
        meta: dict[str, Any] | None = None
        if meta_file.exists():
            try:
                meta = json.loads(meta_file.read_text())
                age = datetime.now(_UTC) - datetime.fromisoformat(meta["built_at"])
                if age > max_age or not (cache_path / "state.db").exists():
                    meta = None
            except (ValueError, KeyError, OSError):
                meta = None
        if meta is not None:
            cached = True
        else:
            staging = root / f"{cache_path.name}.tmp-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            meta = _build_into(staging, schedules, runs, seed)
            old = root / f"{cache_path.name}.old-{os.getpid()}"
            if cache_path.exists():
                cache_path.rename(old)
            try:
                staging.rename(cache_path)
            except OSError:  # another process built it at the same time: use ours from staging
                cache_path = staging
            shutil.rmtree(old, ignore_errors=True)
            # Builds of the same load by an older generator or schema: 250 MB each, unused.
            suffix = f"-s{schedules}-r{runs}-seed{seed}"
            for stale in root.glob(f"ledger-*{suffix}"):
                if stale.is_dir() and stale.name != cache_path.name and stale.name.endswith(suffix):
                    shutil.rmtree(stale, ignore_errors=True)
        source = cache_path
    else:
        source = folder / ".ledger-build"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir()
        meta = _build_into(source, schedules, runs, seed)

    t0 = time.perf_counter()
    specs = [ScheduleSpec(**s) for s in meta["specs"]]
    schedules_dir = folder / "schedules"
    shutil.rmtree(schedules_dir, ignore_errors=True)
    shutil.copytree(source / "schedules", schedules_dir)
    topped = 0
    if writable:
        db_path = folder / "state.db"
        if source != folder:
            _copy_db(source / "state.db", db_path)
        topped = top_up(db_path, specs)
    else:
        db_path = source / "state.db"
    if not cache:
        if writable:
            shutil.rmtree(source, ignore_errors=True)
        cache_path = None
    return BigLedger(
        folder=folder,
        schedules_dir=schedules_dir,
        db_path=db_path,
        specs=specs,
        run_counts=meta["run_counts"],
        built_at=datetime.fromisoformat(meta["built_at"]),
        cache_path=cache_path,
        cached=cached,
        build_s=0.0 if cached else float(meta["build_s"]),
        prepare_s=time.perf_counter() - t0,
        topped_up=topped,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or reuse) a big benchmark ledger.")
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder", type=Path, help="where to put the copy (default: a temp dir, removed)")
    parser.add_argument("--no-cache", action="store_true", help="build afresh, do not use or fill the cache")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="schedtui-ledger-") as tmp:
        folder = args.folder or Path(tmp)
        ledger = build_ledger(folder, args.schedules, args.runs, seed=args.seed, cache=not args.no_cache)
        out = ledger.summary()
        out["folder"] = str(ledger.folder)
        out["cache_path"] = str(ledger.cache_path) if ledger.cache_path else None
        out["deep_schedule"] = ledger.schedule_with_runs(1000)
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
