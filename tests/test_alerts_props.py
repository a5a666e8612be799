"""Alerts' invariants under random sequences (Hypothesis, stateful), on the injected clock.

Three instances share one SQLite store: each has its evaluator and its notifier (as
``serve`` has), all delivering to two webhooks (mock transports; each webhook has a
delivery loop of its own). The machine records runs of two schedules (succeeded or
failed), moves the clock, lets any instance evaluate (also one whose round reads, then
writes later: a slow instance), deliver, claim and POST later (stalled, perhaps past the
claims' lease), die between its claim and its POST, or stop (and start again) while its
POSTs to one webhook or both are in flight (the other answering) or its claim's answer is
on its way, with or without a grace, and makes either webhook fail its next requests.
After every step:

* the transitions written alternate per alert, firing first;
* no transition is accepted by a webhook twice, and every accepted one was written;
* the store's state of each alert is its last transition's;
* a stop with a grace returns only once its POSTs in flight were answered;
* a stop leaves no row claimed by its instance that its claim cut short took: POSTed
  within the grace, or given back with its attempt not counted.

And at the end, once the clock has passed every lease and backoff and the instances have
delivered what is due: every transition was accepted exactly once by each webhook.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from backend import ManualClock, define_schedule
from backend.alerts.evaluator import Evaluator, Proposal
from backend.alerts.model import Alert
from backend.alerts.notifier import AlertSettings, Notifier, parse_sinks, sink_of
from backend.alerts.store import Delivery
from backend.events.audit import AuditLog
from backend.events.bus import EventBus
from backend.ids import IdFactory
from backend.model import InstanceInfo, Run
from backend.runtime.loops import Loops
from backend.store import open_store
from backend.store.sqlite.store import SQLiteStore

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
HOOK = "https://hooks.example.test/services/secret"
PAGER = "https://pager.example.test/v2/enqueue"
HOOKS = (HOOK, PAGER)
INSTANCES = ("i0", "i1", "i2")
SETTINGS = AlertSettings(sinks=HOOKS, lease=60, timeout=10, backoff=5, backoff_max=40, attempts=100)
PROFILE = settings(max_examples=int(os.environ.get("SCHEDTUI_HYPOTHESIS_EXAMPLES", "100")), stateful_step_count=50,
                   deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))  # fmt: skip


async def _noop(ctx: Any) -> None:
    pass


SCHEDULES = {name: define_schedule(name=name, cron="* * * * *", timezone="UTC", handler=_noop, alert={"late": False})
             for name in ("a",)}  # fmt: skip


class Webhook:
    def __init__(self) -> None:
        self.failures = 0
        self.accepted: list[str] = []
        """The transition ids accepted (answered 2xx), in order."""
        self.hold: asyncio.Event | None = None
        """While set up: each request waits for it before it is answered (POSTs in flight)."""
        self.holding = asyncio.Event()
        self.held: list[str] = []
        """The transitions of the requests that waited, and were answered (2xx or not)."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.hold is not None:
            self.holding.set()
            await self.hold.wait()  # (a cancellation here: the POST was cut short before any answer)
            self.held.append(json.loads(request.content)["transition"])
        return self.answer(request)

    def answer(self, request: httpx.Request) -> httpx.Response:
        if self.failures:
            self.failures -= 1
            return httpx.Response(500)
        body = json.loads(request.content)
        assert request.headers["idempotency-key"] == body["transition"]
        self.accepted.append(body["transition"])
        return httpx.Response(204)


class Webhooks:
    """The two webhooks behind one transport, each answering the requests to its host."""

    def __init__(self) -> None:
        self.by_url = {url: Webhook() for url in HOOKS}
        self._by_host = {httpx.URL(url).host: hook for url, hook in self.by_url.items()}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        return await self._by_host[request.url.host](request)

    def __iter__(self) -> Any:
        return iter(self.by_url.values())


class HeldClaims:
    """A store whose claims answer through ``claim`` (the test's), the rest as it is."""

    def __init__(self, inner: Any, claim: Any) -> None:
        self.inner, self.claim_deliveries = inner, claim

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AlertsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="alerts-props-")
        store = open_store(f"sqlite:///{Path(self.tmp.name) / 'state.db'}")
        assert isinstance(store, SQLiteStore)
        self.store = store
        self.run(self.store.open())
        self.clock = ManualClock(T0)
        self.ids = IdFactory(self.clock.now)
        self.webhooks = Webhooks()
        self.slots = {name: T0 for name in SCHEDULES}
        self.written: list[Alert] = []
        """Every transition written, by any instance."""
        self.in_flight: dict[str, list[Delivery]] = {}
        self.pending: dict[str, Proposal] = {}
        """Rounds that read their facts and have not written yet (a slow instance)."""
        self.events = EventBus()
        self.evaluators: dict[str, Evaluator] = {}
        self.notifiers: dict[str, Notifier] = {}
        for name in INSTANCES:
            self.evaluators[name] = Evaluator(
                store=self.store, instance=name, new_id=self.ids, schedules=SCHEDULES, queues={}, functions={},
                state_of=lambda n: None, is_enabled=lambda n: True, fleet=self.fleet, fresh=timedelta(seconds=30),
            )  # fmt: skip
            self.notifiers[name] = self.notifier(name)

    def notifier(self, name: str) -> Notifier:
        """The notifier of instance ``name``, as a (re)started ``serve`` makes it."""
        audit = AuditLog(store=self.store, clock=self.clock, new_id=self.ids, events=self.events, actor="props")
        notifier = Notifier(
            store=self.store, clock=self.clock, loops=Loops(self.clock), instance=name, sinks=parse_sinks(HOOKS),
            settings=SETTINGS, audit=audit, transport=httpx.MockTransport(self.webhooks),
        )  # fmt: skip
        self.run(notifier.register(self.clock.now()))
        return notifier

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def fleet(self) -> list[InstanceInfo]:
        return [InstanceInfo(name, "h", 1, self.clock.now(), role="firing") for name in INSTANCES]

    def teardown(self) -> None:
        try:
            for notifier in self.notifiers.values():
                self.run(notifier.close())
            self.run(self.store.close())
        finally:
            self.loop.close()
            self.tmp.cleanup()

    # -- facts and time ----------------------------------------------------------------------
    @initialize(ok=st.booleans())
    def the_first_run_ends(self, ok: bool) -> None:
        """Every sequence starts from a run (a failed one calls for a transition at once)."""
        self.a_run_ends("a", ok)

    @rule(name=st.sampled_from(sorted(SCHEDULES)), ok=st.booleans())
    def a_run_ends(self, name: str, ok: bool) -> None:
        slot = self.slots[name] = max(self.slots[name] + timedelta(minutes=1), self.clock.now().replace(second=0))
        run = Run(self.ids(), name, slot, "succeeded" if ok else "failed", "self", "single", "i0", slot, self.clock.now(),
                  None if ok else "ValueError", None if ok else "boom")  # fmt: skip
        self.store.save_runs([run])
        self.run(self.store.flush())

    @rule(seconds=st.sampled_from([1, 5, 15, 40, 61, 300]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- instances -----------------------------------------------------------------------------
    @rule(instance=st.sampled_from(INSTANCES))
    def evaluate(self, instance: str) -> None:
        done = self.run(self.evaluators[instance].evaluate(self.clock.now(), sinks_after=T0))
        self.written.extend(done.won)

    @rule(instance=st.sampled_from(INSTANCES))
    def a_round_reads(self, instance: str) -> None:
        """A round reads, and its writes wait (others may evaluate, time may pass)."""
        self.pending[instance] = self.run(self.evaluators[instance].propose(self.clock.now()))

    @rule(first=st.sampled_from(INSTANCES), second=st.sampled_from(INSTANCES), gap=st.sampled_from([0, 1, 5]),
          second_writes_first=st.booleans())  # fmt: skip
    def two_rounds_overlap(self, first: str, second: str, gap: int, second_writes_first: bool) -> None:
        """Two instances' rounds overlap: both read before either writes (``gap`` seconds apart)."""
        one = self.run(self.evaluators[first].propose(self.clock.now()))
        self.clock.advance(gap)
        two = self.run(self.evaluators[second].propose(self.clock.now()))
        order = [(second, two), (first, one)] if second_writes_first else [(first, one), (second, two)]
        for instance, proposal in order:
            self.written.extend(self.run(self.evaluators[instance].commit(proposal, sinks_after=T0)).won)

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def a_round_writes(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(sorted(self.pending)))
        done = self.run(self.evaluators[instance].commit(self.pending.pop(instance), sinks_after=T0))
        self.written.extend(done.won)

    def undelivered(self) -> bool:
        return any(len(webhook.accepted) < len(self.written) for webhook in self.webhooks)

    @precondition(undelivered)
    @rule(instance=st.sampled_from(INSTANCES))
    def deliver(self, instance: str) -> None:
        self.run(self.notifiers[instance].deliver_due())

    @precondition(undelivered)
    @rule(instance=st.sampled_from(INSTANCES))
    def claims(self, instance: str) -> None:
        """An instance claims what is due, and has not POSTed yet."""
        now = self.clock.now()
        claimed = self.run(self.store.claim_deliveries(list(self.notifiers[instance].sinks), instance, now,
                                                       now + timedelta(seconds=SETTINGS.lease), 5))  # fmt: skip
        self.in_flight.setdefault(instance, []).extend(claimed)

    def claiming(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(name for name, claimed in self.in_flight.items() if claimed)))

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data())
    def posts(self, data: st.DataObject) -> None:
        """An instance POSTs what it claimed (unless it stalled past the claims' lease)."""
        instance = self.claiming(data)
        for delivery in self.in_flight.pop(instance, []):
            self.run(self.notifiers[instance].deliver(delivery))

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data())
    def dies(self, data: st.DataObject) -> None:
        """An instance dies between its claims and its POSTs."""
        self.in_flight.pop(self.claiming(data), None)

    @precondition(undelivered)
    @rule(instance=st.sampled_from(INSTANCES), grace=st.sampled_from([0.0, 5.0]),
          hanging=st.sampled_from([HOOKS, HOOKS[:1], HOOKS[1:]]))  # fmt: skip
    def stops_mid_post(self, instance: str, grace: float, hanging: tuple[str, ...]) -> None:
        """A rolling restart's SIGTERM lands while the instance POSTs what is due to the
        ``hanging`` webhooks (the other, if any, answers at once): its delivery loops are
        cancelled, its notifier's stop gives the POSTs in flight ``grace`` (real seconds),
        and the webhooks answer once the stop has begun. The instance then starts again."""
        held = [self.webhooks.by_url[url] for url in hanging]
        for webhook in held:
            webhook.hold, webhook.holding, webhook.held = asyncio.Event(), asyncio.Event(), []
        notifier = self.notifiers[instance]
        # Each webhook's delivery loop: a hanging one's until it POSTs (or had nothing due),
        # the other's to its end, which must come while the first hangs.
        loops = {url: self.loop.create_task(notifier.deliver_due_to(sink_of(url).id)) for url in HOOKS}
        for url, delivering in loops.items():
            webhook = self.webhooks.by_url[url]
            holding = self.loop.create_task(webhook.holding.wait()) if url in hanging else None
            self.run(asyncio.wait({delivering, holding} - {None}, timeout=30, return_when=asyncio.FIRST_COMPLETED))
            if holding is not None:
                holding.cancel()
            assert delivering.done() or webhook.holding.is_set(), f"{url}: its delivery waited for another webhook's"
        posting = [webhook for webhook in held if webhook.holding.is_set()]
        for delivering in loops.values():
            delivering.cancel()  # the stop cancels the delivery loops first
        self.run(asyncio.wait(set(loops.values())))
        stopping = self.loop.create_task(notifier.stop(grace))
        self.run(asyncio.sleep(0))  # the stop begins
        for webhook in held:
            assert webhook.hold is not None
            webhook.hold.set()
        self.run(stopping)
        for webhook in held:
            webhook.hold = None
        event(f"a stop mid-POST to {len(posting)} of {len(HOOKS)} webhooks, grace {grace:g}" if posting
              else "a stop with nothing being POSTed")  # fmt: skip
        if grace:
            # A graceful stop lets the POSTs in flight end: each was answered before it
            # returned (and its outcome recorded: another instance sending it again once
            # the claim's lease ran out would make the webhook accept it twice).
            for webhook in posting:
                assert webhook.held, "a stop with a grace cut the POSTs in flight short"
        self.notifiers[instance] = self.notifier(instance)

    @precondition(undelivered)
    @rule(instance=st.sampled_from(INSTANCES), grace=st.sampled_from([0.0, 5.0]))
    def stops_mid_claim(self, instance: str, grace: float) -> None:
        """A rolling restart's SIGTERM lands while the instance's claims of what is due (one
        per webhook) have committed and their answers are on their way. With a grace what
        they took is POSTed before the stop returns; with none it is given back: claimed by
        nobody, due at once."""
        notifier = self.notifiers[instance]
        committed, answer = asyncio.Event(), asyncio.Event()
        taken: list[Delivery] = []
        claims = 0
        claim = self.store.claim_deliveries

        async def answers_late(*args: Any) -> list[Delivery]:
            nonlocal claims
            claimed = await claim(*args)
            taken.extend(claimed)
            claims += 1
            if claims == len(HOOKS):  # (every webhook's loop: what each took does not depend on timing)
                committed.set()
            await answer.wait()
            return claimed

        notifier.store = HeldClaims(self.store, answers_late)
        delivering = self.loop.create_task(notifier.deliver_due())
        self.run(asyncio.wait({delivering, self.loop.create_task(committed.wait())}, return_when=asyncio.FIRST_COMPLETED))
        delivering.cancel()  # the stop cancels the delivery loop first
        self.run(asyncio.wait({delivering}))
        stopping = self.loop.create_task(notifier.stop(grace))
        self.run(asyncio.sleep(0))  # the stop begins
        answer.set()
        self.run(stopping)
        event(f"a stop mid-claim, grace {grace:g}" if taken else "a stop mid-claim that took nothing")
        for delivery in taken:
            claimed_by, attempts = self.outbox(delivery)
            assert claimed_by is None, f"{delivery.transition}: still claimed by {claimed_by} after the stop"
            if grace:  # POSTed (the webhook answered, 2xx or not): its attempt counted
                assert attempts == delivery.attempts, (delivery, attempts)
            else:  # given back: its attempt not counted
                assert attempts == delivery.attempts - 1, (delivery, attempts)
        self.notifiers[instance] = self.notifier(instance)

    def outbox(self, delivery: Delivery) -> tuple[str | None, int]:
        """Who holds a delivery's outbox row now, and its attempts."""
        self.run(self.store.flush())
        with contextlib.closing(sqlite3.connect(Path(self.tmp.name) / "state.db")) as conn:
            row = conn.execute(
                "SELECT claimed_by, attempts FROM alert_outbox WHERE transition = ? AND sink = ?",
                (delivery.transition, delivery.sink),
            ).fetchone()
        return row[0], int(row[1])

    @precondition(undelivered)
    @rule(url=st.sampled_from(HOOKS), count=st.integers(1, 3))
    def a_webhook_fails(self, url: str, count: int) -> None:
        self.webhooks.by_url[url].failures = count

    # -- invariants -------------------------------------------------------------------------------
    @invariant()
    def transitions_alternate_firing_first(self) -> None:
        by_key: dict[str, list[str]] = {}
        for alert in sorted(self.written, key=lambda a: a.transition):
            by_key.setdefault(alert.key, []).append(alert.state)
        for key, states in by_key.items():
            assert states == ["firing", "resolved"] * (len(states) // 2) + ["firing"] * (len(states) % 2), (key, states)

    @invariant()
    def nothing_is_accepted_twice_or_unwritten(self) -> None:
        for url, webhook in self.webhooks.by_url.items():
            counts = Counter(webhook.accepted)
            assert all(n == 1 for n in counts.values()), (url, counts)
            assert set(counts) <= {a.transition for a in self.written}, url

    @invariant()
    def the_store_holds_the_last_transition(self) -> None:
        stored = {a.key: a for a in self.run(self.store.list_alerts(resolved_after=T0 - timedelta(days=1)))}
        last: dict[str, Alert] = {}
        for alert in sorted(self.written, key=lambda a: a.transition):
            last[alert.key] = alert
        assert {k: (a.state, a.transition) for k, a in stored.items()} == {
            k: (a.state, a.transition) for k, a in last.items()
        }

    def check_all_delivered(self) -> None:
        """Past every lease and backoff, with healthy webhooks: each transition once to each."""
        for webhook in self.webhooks:
            webhook.failures = 0
        for _ in range(3):
            self.clock.advance(SETTINGS.lease + SETTINGS.backoff_max)
            for notifier in self.notifiers.values():
                self.run(notifier.deliver_due())
        for url, webhook in self.webhooks.by_url.items():
            assert sorted(webhook.accepted) == sorted(a.transition for a in self.written), url


def test_each_transition_is_notified_exactly_once() -> None:
    class Checked(AlertsMachine):
        def teardown(self) -> None:
            try:
                self.check_all_delivered()
            finally:
                super().teardown()

    run_state_machine_as_test(Checked, settings=PROFILE)
