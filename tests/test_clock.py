"""Clocks, ids and the operator's time syntax."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend import BadInput, ManualClock, SystemClock
from backend.cron import Cron
from backend.ids import IdFactory, encode_id, id_floor
from backend.timeparse import parse_when

UTC = UTC


class SteppedSystemClock(SystemClock):
    """The real SystemClock's waiting logic, over a time we move ourselves."""

    def __init__(self, start: datetime, max_chunk: float) -> None:
        super().__init__(max_chunk=max_chunk)
        self.current = start

    def now(self) -> datetime:
        return self.current


async def test_system_clock_chunks_long_waits_and_rechecks_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedSystemClock(datetime(2026, 1, 1, tzinfo=UTC), max_chunk=60)
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        assert len(sleeps) < 100_000, "sleep_until never returned"
        # asyncio may come back a little early: the clock only moves 90% of the way (and a
        # zero-length yield still lets a little time pass).
        clock.current += timedelta(seconds=max(delay * 0.9, 0.0001))

    monkeypatch.setattr("backend.clock.asyncio.sleep", fake_sleep)  # the asyncio the clock sleeps with
    deadline = clock.current + timedelta(hours=2)
    await clock.sleep_until(deadline)
    assert clock.now() >= deadline
    assert max(sleeps) == 60 and len(sleeps) > 120  # chunked, and re-checked after each wake
    # The last stretch ends just short of the deadline and yields until it passes, rather
    # than overshooting by the selector's rounding.
    assert 0 in sleeps


async def test_system_clock_notices_a_wall_clock_jump(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedSystemClock(datetime(2026, 1, 1, tzinfo=UTC), max_chunk=60)
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        assert len(sleeps) < 100_000, "sleep_until never returned"
        clock.current += timedelta(hours=1) if len(sleeps) == 1 else timedelta(seconds=max(delay, 0.0001))

    monkeypatch.setattr("backend.clock.asyncio.sleep", fake_sleep)  # the asyncio the clock sleeps with
    await clock.sleep_until(clock.current + timedelta(minutes=30))
    assert sleeps == [60]  # a suspended VM woke past the deadline: one chunk, not thirty


async def test_manual_clock_wakes_sleepers_in_order() -> None:
    clock = ManualClock("2026-01-01T00:00:00Z")
    woke: list[str] = []

    async def sleeper(name: str, seconds: int) -> None:
        await clock.sleep_until(clock.now() + timedelta(seconds=seconds))
        woke.append(name)

    tasks = [asyncio.ensure_future(sleeper("b", 20)), asyncio.ensure_future(sleeper("a", 10))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2 and clock.next_deadline() == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    clock.advance(10)
    await asyncio.sleep(0)
    assert woke == ["a"]
    clock.advance(10)
    await asyncio.gather(*tasks)
    assert woke == ["a", "b"]
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set("2025-12-31T00:00:00Z")


def test_ids_sort_by_creation_even_within_a_millisecond() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ids = IdFactory(lambda: now, random_bits=lambda: 2**80 - 1)
    made = [ids() for _ in range(100)]
    assert made == sorted(made) and len(set(made)) == 100 and all(len(i) == 26 for i in made)
    assert id_floor(now) <= made[0] < id_floor(now + timedelta(milliseconds=2))


@settings(max_examples=200, deadline=None)
@given(ms=st.integers(1, 253_402_300_799_999), low=st.integers(0, 2**80 - 1))  # up to 9999-12-31
def test_an_id_is_the_crockford_base32_of_its_millisecond_and_random_bits(ms: int, low: int) -> None:
    # The reference: 26 digits of 5 bits, most significant first (the encoding is unrolled
    # for speed; this is what it must equal).
    value, digits = (ms << 80) | low, []
    for _ in range(26):
        value, digit = divmod(value, 32)
        digits.append("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[digit])
    expected = "".join(reversed(digits))
    at = datetime.fromtimestamp(ms / 1000, UTC)
    made = IdFactory(lambda: at, random_bits=lambda: low)()
    assert int(at.timestamp() * 1000) != ms or made == expected
    assert encode_id(ms, low) == expected
    assert encode_id(2**48 - 1, 2**80 - 1) == "7" + "Z" * 25


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), min_size=1, max_size=12), seed=st.integers(0, 2**32))
def test_ids_made_many_at_a_time_are_the_ids_made_one_by_one(steps: list[tuple[int, int]], seed: int) -> None:
    """many(n) is n calls at one instant: the same ids, from the same random bits (the
    seeded ids of the console's fixtures stay what they were), whatever came before."""
    import random

    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    # Few distinct random values: ids within a millisecond often need the +1 bump.
    one = IdFactory(lambda: now[0], random_bits=functools.partial(random.Random(seed).randrange, 4))
    batched = IdFactory(lambda: now[0], random_bits=functools.partial(random.Random(seed).randrange, 4))
    for count, advance_ms in steps:
        assert batched.many(count) == [one() for _ in range(count)]
        assert batched() == one()
        now[0] += timedelta(milliseconds=advance_ms)


@pytest.mark.parametrize(
    ("text", "zone", "expected"),
    [
        ("now", "UTC", "2026-03-02T08:00:00+00:00"),
        ("-2d", "UTC", "2026-02-28T08:00:00+00:00"),
        ("-6h", "UTC", "2026-03-02T02:00:00+00:00"),
        ("-1d12h", "UTC", "2026-02-28T20:00:00+00:00"),
        ("+30m", "UTC", "2026-03-02T08:30:00+00:00"),
        ("2026-03-01T09:00:00Z", "Europe/Berlin", "2026-03-01T09:00:00+00:00"),
        ("2026-03-01T09:00:00", "Europe/Berlin", "2026-03-01T08:00:00+00:00"),  # read in the zone
        ("2026-03-01", "America/New_York", "2026-03-01T05:00:00+00:00"),
        ("2026-03-01 09:00+02:00", "UTC", "2026-03-01T07:00:00+00:00"),
    ],
)
def test_parse_when(text: str, zone: str, expected: str) -> None:
    now = datetime(2026, 3, 2, 8, tzinfo=UTC)
    assert parse_when(text, now=now, zone=zone).isoformat() == expected


@pytest.mark.parametrize("text", ["", "yesterday", "-2x", "2026-13-01", "-٣d", "-１d"])  # (ASCII digits only)
def test_parse_when_rejects_naming_the_value(text: str) -> None:
    with pytest.raises(BadInput) as info:
        parse_when(text, now=datetime(2026, 3, 2, tzinfo=UTC), field="--from")
    assert "--from" in info.value.message and (text in info.value.message)


@pytest.mark.parametrize("text", ["-" + "9" * 5000 + "d", "+" + "9" * 13 + "s", "-1d" + "9" * 5000 + "h"])
def test_an_offset_of_thousands_of_digits_is_out_of_range_not_a_crash(text: str) -> None:
    # int() refuses past 4300 digits (ValueError): the API answered such a --from with a 500.
    with pytest.raises(BadInput, match=r'^--from ".{60}…" is out of range \(1970 to 8999\)$|^--from "[^"]+" is out'):
        parse_when(text, now=datetime(2026, 3, 2, tzinfo=UTC), field="--from")


def test_an_offset_with_leading_zeros_is_its_value() -> None:
    now = datetime(2026, 3, 2, 8, tzinfo=UTC)
    assert parse_when("-" + "0" * 40 + "2d", now=now) == now - timedelta(days=2)


def test_finishing_a_run_keeps_every_other_field() -> None:
    from backend.model import Run

    at = datetime(2026, 1, 1, tzinfo=UTC)
    run = Run(id="id-1", name="job", scheduled_at=at, status="running", trigger="external",
              coordination_outcome="wonLock", instance="web-3", fired_at=at + timedelta(seconds=1))
    done = run.finish("failed", at + timedelta(seconds=5), error_tag="ValueError", error_message="bad row")
    assert done == Run(id="id-1", name="job", scheduled_at=at, status="failed", trigger="external",
                       coordination_outcome="wonLock", instance="web-3", fired_at=at + timedelta(seconds=1),
                       finished_at=at + timedelta(seconds=5), error_tag="ValueError", error_message="bad row")


@pytest.mark.parametrize("cls", ["Run", "RunContext"])
def test_the_quickly_made_rows_behave_as_their_dataclass_would(cls: str) -> None:
    """Run and RunContext get a faster __init__ (quick_init); everything else a dataclass
    gives them is unchanged, and what it builds equals what the generated one built."""
    import dataclasses
    import inspect

    import backend

    quick = getattr(backend, cls)  # backend.model.Run, backend.schedules.RunContext
    # The same fields, with the generated __init__.
    fields = [(f.name, f.type, dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING else None)
              for f in dataclasses.fields(quick)]
    plain = dataclasses.make_dataclass("Plain", [(n, t, d) if d is not None else (n, t) for n, t, d in fields],
                                       frozen=True, slots=True)
    assert str(inspect.signature(quick)) == str(inspect.signature(plain))
    required = [f for f in dataclasses.fields(quick) if f.default is dataclasses.MISSING]
    values = {f.name: f"{f.name}-value" for f in dataclasses.fields(quick)}
    for kwargs in ({f.name: values[f.name] for f in required}, values):
        made = quick(**kwargs)
        expected = plain(**kwargs)
        assert dataclasses.astuple(made) == dataclasses.astuple(expected)
        positional = quick(*[kwargs[f.name] for f in dataclasses.fields(quick) if f.name in kwargs])
        assert positional == made and hash(positional) == hash(made) and repr(made).startswith(f"{cls}(")
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, required[0].name, "changed")
        assert dataclasses.replace(made, **{required[0].name: "other"}) != made
    with pytest.raises(TypeError, match="missing"):
        quick(*[values[f.name] for f in required[:-1]])


def test_quick_init_refuses_what_it_cannot_make_alike() -> None:
    import dataclasses

    from backend.model import quick_init

    @dataclasses.dataclass(frozen=True, slots=True)
    class Listed:
        items: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(slots=True)
    class Mutable:
        value: int

    for cls in (Listed, Mutable):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


@pytest.mark.parametrize(
    ("zone", "typed", "instant"),
    [
        # spring's skipped hour: the moment it ends, where the cron fires a slot of it
        ("Europe/Berlin", "2026-03-29T02:59", "2026-03-29T01:00:00Z"),
        ("Europe/Berlin", "2026-03-29T02:00", "2026-03-29T01:00:00Z"),
        ("Europe/Berlin", "2026-03-29T03:01", "2026-03-29T01:01:00Z"),
        ("America/Santiago", "2026-09-06", "2026-09-06T04:00:00Z"),  # a bare date whose midnight is skipped
        ("Australia/Lord_Howe", "2026-10-04T02:15", "2026-10-03T15:30:00Z"),  # a half-hour gap
        # autumn's repeated hour: its first pass; and an ordinary time
        ("Europe/Berlin", "2026-10-25T02:30", "2026-10-25T00:30:00Z"),
        ("Europe/Berlin", "2026-07-01T12:00", "2026-07-01T10:00:00Z"),
    ],
)
def test_a_wall_time_is_read_as_the_cron_reads_it(zone: str, typed: str, instant: str) -> None:
    """A backfill's --from 02:59 --to 03:01 on the spring day was refused as reversed: the
    skipped 02:59 was read an hour past the gap (03:59)."""
    now = datetime(2026, 12, 5, tzinfo=UTC)
    assert parse_when(typed, now=now, zone=zone) == datetime.fromisoformat(instant)
    if typed.endswith(("02:59", "02:15")):
        cron = Cron(f"{typed[-2:]} {typed[-5:-3]} * * *", zone)  # the slot of the skipped wall time fires there
        assert cron.next(datetime.fromisoformat(instant) - timedelta(hours=2)) == datetime.fromisoformat(instant)



def test_the_start_of_a_range_in_the_skipped_hour_is_just_before_the_gap_ends() -> None:
    """A range ``(from, to]`` whose start is a wall time of spring's skipped hour: the
    skipped hour's slots fire as the gap ends, where such a start was read, so the range
    never held them. Read as the start of a range, it is a microsecond before the gap ends
    (outside the gap, a start is read as any time is). The surfaces: tests/test_api_input.py."""
    now = datetime(2026, 12, 5, tzinfo=UTC)
    assert parse_when("2026-03-29T02:30", now=now, zone="Europe/Berlin", lower=True) == datetime.fromisoformat(
        "2026-03-29T00:59:59.999999Z"
    )
    assert parse_when("2026-03-29T03:30", now=now, zone="Europe/Berlin", lower=True) == datetime.fromisoformat(
        "2026-03-29T01:30:00Z"
    )
