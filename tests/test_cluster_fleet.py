"""``cluster`` coordination with real ``schedtui serve`` processes on a real PostgreSQL, on
the real clock: three instances divide the schedules; a member joining takes its share
without a duplicate; a SIGKILLed owner's schedules are taken over within 15 s; an owner
frozen (SIGSTOP) past its leases and woken (SIGCONT) fires and writes nothing for the
shards it lost. Every check reads the ledger: each slot of each schedule has exactly one
row (fired, or recorded ``missed`` in a hand-over window), none missing in between.

Two tests, each of some twenty seconds: they wait for leases to run out, so a shard lease
lasts 5 s here (``--shard-lease``, a test seam; 10 s otherwise).
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend.scheduler.coordination.cluster import SHARDS, shard_of
from tests.servers import poll
from tests.test_fleet import Fleet, assert_once_and_contiguous, by_name, fleets, sql  # noqa: F401 - fixture

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

UTC = UTC
LEASE = 5  # seconds, half the default: every take-over below waits for leases to lapse
CLUSTER = ["--coordination", "cluster", "--shard-lease", str(LEASE)]
TICKS = 12


def shard_holders(url: str) -> dict[int, str]:
    """Shard -> the instance holding its lease now."""
    rows = sql(
        url,
        "SELECT name, holder FROM schedtui_locks WHERE name LIKE 'cluster:shard:%%' AND holder IS NOT NULL "
        "AND expires_at > statement_timestamp()",
    )
    return {int(name.rsplit(":", 1)[1]): holder for name, holder in rows}


def owner_of(holders: dict[int, str], schedule: str) -> str | None:
    return holders.get(shard_of(schedule))


def check_ledger(
    fleet: Fleet, killed: str | None = None, frozen: tuple[datetime, datetime] | None = None
) -> dict[str, list[Any]]:
    """One run per slot, all ``cluster``; each succeeded or missed, except a run the
    ``killed`` instance had in flight, which is closed ``failed``/``abandoned``, and the
    slots skipped while a ``frozen`` owner (from, to) had a run in flight: the owner may
    have been stopped in the middle of one, which then still runs for all another member
    can tell, so under the overlap policy (skip) the member that takes the schedule over
    skips its slots until that run ends."""
    runs = by_name(fleet.runs())
    for name, mine in runs.items():
        if name == "daily":
            continue
        assert_once_and_contiguous(mine)
        assert {r.coordination_outcome for r in mine} == {"cluster"}, name
        died = [r for r in mine if r.status == "failed"]
        assert all(r.instance == killed and r.error_tag == "abandoned" for r in died), (name, died)
        skipped = [r for r in mine if r.status == "skipped"]
        if frozen is not None:
            assert all(
                r.error_tag == "overlap" and "on another instance" in (r.error_message or "")
                and frozen[0] - timedelta(seconds=1) <= r.scheduled_at <= frozen[1] + timedelta(seconds=1)
                for r in skipped
            ), (name, [(r.instance, r.scheduled_at, r.error_message) for r in skipped])  # fmt: skip
        else:
            skipped = []  # no owner was frozen: a skipped run is a failure below
        odd = [(r.instance, r.scheduled_at, r.status, r.error_tag, r.error_message) for r in mine if r.status != "succeeded"]
        assert {r.status for r in mine if r not in died and r not in skipped} <= {"succeeded", "missed"}, (name, odd)
    return runs


def test_three_members_divide_the_schedules_a_joiner_takes_its_share_and_a_killed_owner_is_replaced_within_15s(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(ticks=TICKS, args=CLUSTER)
    fleet.wait_ready(fleet.start("a", wait=False), fleet.start("b", wait=False))
    poll(lambda: len(shard_holders(fleet.url)) == SHARDS and len(set(shard_holders(fleet.url).values())) == 2,
         timeout=30, what="two members to hold every shard")  # fmt: skip
    poll(lambda: fleet.slots("tick00") >= 3, timeout=20, what="3 s of slots")

    joined = fleet.start("c")
    def shares() -> list[int]:
        holders = shard_holders(fleet.url)
        return sorted(Counter(holders.values())[name] for name in ("a", "b", "c"))

    # Bounded loads: 64 shards over 3 members are 21, 21 and 22, once the hand-overs are done.
    poll(lambda: shares() == [SHARDS // 3, SHARDS // 3, SHARDS // 3 + 1], timeout=30, what="the joiner to take its share")
    holders = shard_holders(fleet.url)
    after_join = datetime.now(UTC)
    poll(lambda: fleet.slots("tick00", since=after_join) >= 3, timeout=20, what="3 s of slots after the join")

    # Kill the member that owns the most tick schedules.
    ticks = [f"tick{i:02d}" for i in range(TICKS)]
    owned = {name: [t for t in ticks if owner_of(holders, t) == name] for name in ("a", "b", "c")}
    victim_name = max(owned, key=lambda name: len(owned[name]))
    assert owned[victim_name]
    victim = next(i for i in fleet.instances if i.name == victim_name)
    victim.proc.send_signal(signal.SIGKILL)
    assert victim.proc.wait(10) == -signal.SIGKILL
    killed_at = datetime.now(UTC)

    def taken_over() -> bool:
        rows = sql(
            fleet.url,
            "SELECT DISTINCT name FROM schedtui_runs WHERE name = ANY(%s) AND status = 'succeeded' AND scheduled_at > %s "
            "AND instance <> %s",
            (owned[victim_name], killed_at, victim_name),
        )
        return len(rows) == len(owned[victim_name])

    poll(taken_over, timeout=15, what="the killed member's schedules to fire elsewhere within 15 s")
    assert datetime.now(UTC) - killed_at < timedelta(seconds=15)
    assert joined.proc.poll() is None or victim is joined
    fleet.stop_all()
    fleet.assert_healthy_logs()

    runs = check_ledger(fleet, killed=victim_name)
    # Each slot had one owner: before the kill the victim, after it a survivor; the slots of
    # the hand-over window (its leases running out) are recorded missed, never dropped.
    for name in owned[victim_name]:
        late = [r for r in runs[name] if r.scheduled_at > killed_at]
        assert {r.instance for r in late} <= {"a", "b", "c"} - {victim_name}
        window = [r for r in late if r.status == "missed"]
        assert all(r.scheduled_at < killed_at + timedelta(seconds=15) for r in window)
    # Only the owner fires: no schedule was fired by two members at once.
    for name in ticks:
        by_second: dict[datetime, set[str]] = {}
        for r in runs[name]:
            by_second.setdefault(r.scheduled_at, set()).add(r.instance)
        assert all(len(who) == 1 for who in by_second.values())


def test_an_owner_frozen_past_its_leases_fires_and_writes_nothing_for_the_shards_it_lost(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(ticks=TICKS, args=CLUSTER)
    a, b = fleet.start("a", wait=False), fleet.start("b", wait=False)
    fleet.wait_ready(a, b)
    poll(lambda: set(shard_holders(fleet.url).values()) == {"a", "b"} and len(shard_holders(fleet.url)) == SHARDS,
         timeout=30, what="both members to hold shards")  # fmt: skip
    poll(lambda: fleet.slots("tick00") >= 3, timeout=20, what="3 s of slots")
    lost = {shard for shard, holder in shard_holders(fleet.url).items() if holder == "a"}
    a.proc.send_signal(signal.SIGSTOP)
    stopped_at = datetime.now(UTC)
    try:
        # b takes every shard once a's leases have run out (LEASE), and fires them.
        poll(lambda: set(shard_holders(fleet.url).values()) == {"b"} and len(shard_holders(fleet.url)) == SHARDS,
             timeout=30, what="b to take a's shards")  # fmt: skip
        taken_at = datetime.now(UTC)
        poll(lambda: fleet.slots("tick00", since=taken_at) >= 2, timeout=20, what="b to fire a's schedules")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    continued_at = datetime.now(UTC)
    poll(lambda: "standing down" in a.log(), timeout=20, what="a to find itself fenced")
    # It rejoins: its heartbeat brings it back, and shards move back to it.
    poll(lambda: "a" in set(shard_holders(fleet.url).values()), timeout=30, what="a to rejoin")
    rejoined_at = datetime.now(UTC)
    poll(lambda: fleet.slots("tick00", since=rejoined_at) >= 2, timeout=20, what="2 s of slots after the rejoin")
    fleet.stop_all()
    fleet.assert_healthy_logs()

    runs = check_ledger(fleet, frozen=(stopped_at, continued_at))
    lost_names = {name for name in runs if shard_of(name) in lost}
    assert lost_names
    # Nothing a wrote for a slot from its freeze until it woke: b fired (or recorded) them all.
    during = [
        r for name in lost_names for r in runs[name]
        if r.instance == "a" and stopped_at + timedelta(seconds=1) < r.scheduled_at <= continued_at
    ]  # fmt: skip
    assert during == []
    frozen_window = [r for name in lost_names for r in runs[name] if stopped_at + timedelta(seconds=1) < r.scheduled_at <= continued_at]
    assert frozen_window and {r.instance for r in frozen_window} == {"b"}
