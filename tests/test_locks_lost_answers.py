"""Locks on PostgreSQL when a statement's answer is lost after it committed.

The store sends a statement again on a fresh connection when its connection breaks with
it in flight (a network blip, a restart): the first sending may have committed. A relay
(:mod:`tests.tcp_relay`) drops the one answer, the commit having happened; what the
locks then do must be what they would have done had the answer arrived: the lock the
acquire took is the caller's, a release the holder made is not a lease lost, and a
forced release never frees a lease taken after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend import Engine, LeaseLost, ManualClock, Unavailable
from backend.locks import Lease
from backend.store import open_store
from backend.store.postgres.store import PostgresStore
from tests.tcp_relay import relay_to, via

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
RAN_AGAIN = "store connection lost"
#: A ttl whose expiry (on the injected lock clock: 08:00:37.123) marks the acquire's answer.
ODD_TTL, ODD_EXPIRY = 37.123, b":37.123"


async def test_an_acquire_whose_answer_was_lost_and_that_the_store_ran_again_is_the_callers_lease(
    pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the acquire found its own lock held and answered "held by another":
    ``with_lock`` ran nothing, and the lock stayed held by this instance, which did not
    know it, for the whole ttl (a locked schedule skipped its own slots as ``locked``)."""
    caplog.set_level(logging.INFO, "schedtui.store")
    ran: list[int] = []

    async def work(lease: Lease) -> str:
        ran.append(lease.token)
        return "done"

    with relay_to(pg_url) as relay:
        engine = make_engine([], store=via(pg_url, relay.port))
        await engine.open()
        await engine.start()
        relay.lose_reply(ODD_EXPIRY)
        result = await engine.locks.with_lock("rollup", work, ttl=ODD_TTL)
        assert relay.lost.is_set() and [r for r in caplog.records if RAN_AGAIN in r.getMessage()]
        assert (result.acquired, result.value, result.error) == (True, "done", None)
        assert ran == [result.token]
        [lock] = (await engine.locks.list()).locks
        assert (lock.holder, lock.token) == (None, result.token)  # released at the end: free now
        await engine.stop(grace=0)


async def test_a_release_whose_answer_was_lost_is_no_lease_lost_but_a_forced_one_still_is(
    pg_url: str, make_engine: Callable[..., Engine], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent again, the holder's own release found the lock free and took that for a release
    by force: work that succeeded was reported ``LeaseLost``. A lease released by force
    before the holder's release (whose answer is then lost too) is still reported lost."""
    caplog.set_level(logging.INFO, "schedtui.store")
    with relay_to(pg_url) as relay:
        engine = make_engine([], store=via(pg_url, relay.port))
        await engine.open()
        await engine.start()

        async def work(lease: Lease) -> str:
            relay.lose_reply(b"UPDATE 1")  # the release's answer
            return "done"

        result = await engine.locks.with_lock("rollup", work, ttl=30)
        assert relay.lost.is_set() and [r for r in caplog.records if RAN_AGAIN in r.getMessage()]
        assert (result.acquired, result.value, result.error) == (True, "done", None)

        async def released_by_force(lease: Lease) -> str:
            await engine.locks.release("rollup")
            relay.lose_reply(b"UPDATE 0")  # the holder's release finds it free
            return "done"

        result = await engine.locks.with_lock("rollup", released_by_force, ttl=30)
        assert relay.lost.is_set()
        assert result.acquired and result.value == "done" and isinstance(result.error, LeaseLost)
        await engine.stop(grace=0)


async def test_a_forced_release_whose_answer_was_lost_never_frees_the_next_holders_lease(pg_url: str) -> None:
    """Sent again, a forced release freed whoever had taken the lock after the first sending
    freed it: two holders at once; given the token, it answered that the lock had been
    taken since and nothing released, though the first sending had released it. Now the
    second sending is in doubt (``Unavailable``, saying to look first) unless it finds the
    lease of the token given still held, and the next holder keeps the lock."""
    with relay_to(pg_url) as relay:
        store: Any = open_store(via(pg_url, relay.port))
        other: Any = open_store(pg_url)
        await store.open()
        await other.open()
        try:
            assert isinstance(store, PostgresStore)
            first = await store.acquire_lock("rollup", "a", timedelta(seconds=30), T0, "claim-a")
            assert first is not None
            pool = store._require_pool()
            check = pool.check
            taken: list[Any] = []

            async def next_holder_between_the_sendings() -> None:
                taken.append(await other.acquire_lock("rollup", "b", timedelta(seconds=30), T0 + timedelta(seconds=1)))
                await check()

            pool.check = next_holder_between_the_sendings  # type: ignore[method-assign]
            relay.lose_reply(b"COMMIT")  # the forced release's transaction: committed, unanswered
            with pytest.raises(Unavailable, match="look before releasing it again"):
                await store.force_release_lock("rollup", T0 + timedelta(seconds=1))
            assert relay.lost.is_set()
            [second] = taken
            assert second is not None and second.token > first.token
            lock = await other.get_lock("rollup")
            assert lock is not None and (lock.holder, lock.token) == ("b", second.token)  # not freed

            # Given the token, the second sending frees only that lease, still held: the
            # first sending's doing is in doubt as soon as the lock is free or another's.
            relay.lose_reply(b"COMMIT")
            with pytest.raises(Unavailable, match="look before releasing it again"):
                await store.force_release_lock("rollup", T0 + timedelta(seconds=2), second.token)
            [_, third] = taken
            lock = await other.get_lock("rollup")
            assert lock is not None and (lock.holder, lock.token) == ("b", third.token) and third.token > second.token
            pool.check = check  # type: ignore[method-assign]
            relay.lose_reply(b"COMMIT")  # found free by the second sending: the first's doing, or not
            with pytest.raises(Unavailable, match="look before releasing it again"):
                await store.force_release_lock("rollup", T0 + timedelta(seconds=3), third.token)
            lock = await other.get_lock("rollup")
            assert lock is not None and (lock.holder, lock.token) == (None, third.token)
        finally:
            await store.close()
            await other.close()
