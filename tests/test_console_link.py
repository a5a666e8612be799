"""The console's link to its backend (console/link.py), on a manual clock and without a
screen: when it reads again, how it backs off, and as of when the data is true."""

from __future__ import annotations

from datetime import timedelta

from backend.clock import ManualClock
from console.link import INSTANCES_EVERY, INSTANCES_LIVE_EVERY, KEEP_FRESH, Link

START = "2026-03-02T08:00:00Z"
POLL = timedelta(seconds=1)


def connected(clock: ManualClock) -> Link:
    link = Link(clock, POLL)
    link.snapshot(clock.now() - timedelta(seconds=3))  # the backend's clock is 3 s behind ours
    link.instances_read(clock.now())
    assert not link.refreshed()  # nothing was lost: nothing to say
    return link


def test_a_lost_connection_is_retried_after_1_2_then_5_s_and_said_once() -> None:
    clock = ManualClock(START)
    link = connected(clock)
    waits, said = [], []
    for _ in range(5):
        said.append(link.lost())
        assert link.retry_at is not None
        waits.append((link.retry_at - clock.now()).total_seconds())
        assert link.due(paused=True) is None  # not before its time, paused or not
        clock.set(link.retry_at)
        assert link.due(paused=True) == "refresh"  # a retry is due even while paused
    assert waits == [1, 2, 5, 5, 5]
    assert said == [True, False, False, False, False]
    assert link.refreshed()  # back: said once
    assert (link.retry_at, link.failures, link.lost_reported) == (None, 0, False)
    assert not link.refreshed()
    link.lost()
    assert link.retry_at == clock.now() + timedelta(seconds=1)  # the backoff starts over


def test_polling_reads_every_interval_and_signals_only_every_two_minutes_and_the_heartbeats_every_20_s() -> None:
    clock = ManualClock(START)
    link = connected(clock)
    assert link.next_refresh == clock.now() + POLL
    clock.advance(1)
    assert link.due(paused=False) == "refresh"
    assert link.due(paused=True) is None  # paused: no poll
    assert link.set_feed(True) and not link.set_feed(True)
    assert link.next_refresh == clock.now() + KEEP_FRESH  # signals keep the rest fresh
    assert link.due(paused=False) is None
    clock.advance(INSTANCES_LIVE_EVERY.total_seconds() - 1)
    assert link.due(paused=False) == "instances"  # no signal says an engine stopped beating
    link.instances_read(clock.now())
    assert link.due(paused=False) is None
    assert not link.instances_due(clock.now() + INSTANCES_EVERY / 2)
    assert link.instances_due(clock.now() + INSTANCES_EVERY)
    clock.advance(KEEP_FRESH.total_seconds())
    assert link.due(paused=False) == "refresh"
    assert not link.refreshed()
    assert link.next_refresh == clock.now() + KEEP_FRESH
    link.set_feed(False)  # back to polling: the next read within the interval
    assert link.next_refresh == clock.now() + POLL


def test_a_stream_that_was_flowing_is_tried_again_at_once_and_one_that_never_got_going_backs_off() -> None:
    clock = ManualClock(START)
    link = connected(clock)
    link.stream_opened()
    link.set_feed(True)
    assert link.stream_down() == (True, 0)  # news: tried again at once
    assert not link.events_live
    assert link.stream_due(connected=True) and not link.stream_due(connected=False)
    link.stream_opened()
    assert not link.stream_due(connected=True)
    delays = [link.stream_down()[1] for _ in range(4)]
    assert delays == [1, 2, 5, 5]
    assert not link.stream_due(connected=True)
    clock.advance(5)
    assert link.stream_due(connected=True)
    link.lost()
    assert not link.stream_due(connected=True)  # the backend first
    link.stream_ready()
    assert link.stream_down() == (False, 1)  # it got going once: its backoff starts over


def test_the_data_is_true_as_of_its_read_unless_signals_flow_and_nothing_is_paused() -> None:
    clock = ManualClock(START)
    link = connected(clock)
    read = clock.now() - timedelta(seconds=3)
    clock.advance(10)
    assert link.backend_now() == read + timedelta(seconds=10)  # the backend's clock, estimated
    assert link.data_now(paused=False) == read  # polling: as of the last read
    link.set_feed(True)
    assert link.data_now(paused=False) == read + timedelta(seconds=10)  # no signal: nothing changed
    assert link.data_now(paused=True) == read  # paused data accuses no one


def test_ctrl_r_retries_a_lost_connection_now_and_reads_the_heartbeats_with_the_rest() -> None:
    clock = ManualClock(START)
    link = connected(clock)
    link.lost()
    link.lost()
    assert link.due(paused=False) is None
    link.asked()
    assert link.due(paused=False) == "refresh"
    assert link.instances_due(clock.now())
    link.stopped()  # a token refused: nothing is read until asked
    assert link.due(paused=False) is None
    clock.advance(600)
    assert link.due(paused=False) is None
