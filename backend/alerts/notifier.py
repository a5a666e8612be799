"""Delivering notifications: the sinks (webhook URLs), and the outbox worker.

A transition's outbox rows (one per sink the fleet knows) are written with it. Any
instance that has the sink configured claims a due row through the store with a lease
(:meth:`AlertStore.claim_deliveries`), POSTs the transition's JSON body to the sink with
``Idempotency-Key: <transition id>``, and records the outcome under its claim:

* a 2xx answer: delivered (audit ``alert.notified``);
* anything else, or no answer within the timeout (shorter than the lease): due again after
  a backoff that doubles, or after the wait a 429 or 503 answer's ``Retry-After`` asks for
  if that is longer (up to :data:`RETRY_AFTER_MAX`: it is written as the outbox row's due
  time, so no instance claims it sooner); after the last attempt, given up (audit
  ``alert.notify_failed``).

Exactly one delivery per transition and sink, except when an instance dies (or stalls past
its lease) after the sink accepted the POST and before the outcome was recorded: once the
lease runs out another instance sends it again, with the same body and Idempotency-Key, so
a receiver that keeps the keys it has seen can drop it.

A sink is known to the store by a hash of its URL (its ``id``) and a form fit to show
(scheme, host and port: webhook URLs carry their secret in the path); the URL itself is
never written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from backend.alerts import pagerduty
from backend.alerts.store import AlertStore, Delivery
from backend.clock import Clock
from backend.errors import BadInput, Unavailable
from backend.events.audit import AuditLog
from backend.inputs import check_seconds
from backend.runtime.loops import Loops
from backend.runtime.subsystems import answers_of, keep_for_the_stop
from backend.safetext import printable

__all__ = ["RETRY_AFTER_MAX", "AlertSettings", "Notifier", "Sink", "parse_sinks", "retry_after", "sink_of"]

log = logging.getLogger("schedtui.alerts")

#: How many outbox rows one claim takes.
CLAIM_BATCH: Final = 20
#: How often an instance says again which sinks it delivers to (they are kept a day).
REGISTER_EVERY: Final = timedelta(minutes=10)
#: What may come of a POST, as ``schedtui_alert_notifications_total`` counts them.
OUTCOMES: Final = ("delivered", "retried", "given_up", "unrecorded")
#: The longest error text kept with an outbox row or an audit entry.
ERROR_MAX: Final = 300
#: The longest any of the settings' lengths of time may be (seconds: some 115 days).
_MOST: Final = 10_000_000
#: The longest wait a receiver's ``Retry-After`` is honoured up to (an hour: PagerDuty's
#: rate limits ask for seconds to a minute; a receiver asking for days is taken as asking
#: for an hour, and the attempts still run out in the end).
RETRY_AFTER_MAX: Final = timedelta(hours=1)
#: The answers whose ``Retry-After`` is honoured: rate-limited, unavailable (RFC 9110, 6585).
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503})
_DELAY_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class AlertSettings:
    """How an engine evaluates and delivers alerts (``serve``'s options).

    ``interval``: seconds between evaluation rounds; ``lease``: how long a claimed
    delivery is this instance's (another instance may send it once it runs out);
    ``timeout``: the POST's bound (shorter than the lease); ``backoff``: the wait after a
    failed attempt, doubling up to ``backoff_max``; ``attempts``: how many before giving
    up; ``poll``: how often the outbox is looked at for others' transitions and retries;
    ``sink_ttl``: how long a sink no instance names any more is still sent to."""

    sinks: tuple[str, ...] = ()
    interval: float = 15.0
    lease: float = 60.0
    timeout: float = 10.0
    backoff: float = 5.0
    backoff_max: float = 300.0
    attempts: int = 10
    poll: float = 5.0
    sink_ttl: float = 86_400.0

    def __post_init__(self) -> None:
        for name in ("interval", "lease", "timeout", "backoff", "backoff_max", "poll", "sink_ttl"):
            # (A timedelta is taken as the seconds it holds.)
            object.__setattr__(self, name, check_seconds(getattr(self, name), name, label=f"alert {name}", high=_MOST))
        if self.timeout >= self.lease:
            raise BadInput(
                f"the notification timeout ({self.timeout:g}s) must be shorter than the claim lease ({self.lease:g}s): "
                "a POST still waiting when the lease runs out would be sent twice",
                field="timeout",
            )
        if isinstance(self.attempts, bool) or not 1 <= self.attempts <= 100:
            raise BadInput(f"alert attempts {self.attempts!r} must be from 1 to 100", field="attempts")

    def retry_delay(self, attempts: int) -> timedelta:
        """The wait after failed attempt number ``attempts`` (1-based)."""
        return timedelta(seconds=min(self.backoff * 2 ** min(attempts - 1, 30), self.backoff_max))


@dataclass(frozen=True)
class Sink:
    """A webhook: its URL (kept in memory only), its id and its shown form; or PagerDuty
    (``routing_key`` set: the events are PagerDuty's, see :mod:`backend.alerts.pagerduty`)."""

    url: str = field(repr=False)  # (a webhook's path is its secret)
    id: str
    shown: str
    routing_key: str | None = field(default=None, repr=False)


#: A URL scheme that may be shown (a short word; anything else may be part of a secret).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}")

#: Each sink's URL as httpx writes it (``str(request.url)``) -> its shown form.
_SHOWN: dict[str, str] = {}


class _RedactedRequests(logging.Filter):
    """httpx logs every request's URL at INFO (``HTTP Request: POST <url> "HTTP/1.1 200
    OK"``), and a webhook's URL is its secret: a sink's is replaced by its shown form in the
    record itself, whatever handler or formatter the application logs with."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1:
            shown = _SHOWN.get(str(args[1]))
            if shown is not None:
                record.args = (args[0], shown, *args[2:])
        return True


logging.getLogger("httpx").addFilter(_RedactedRequests())


def sink_of(url: str) -> Sink:
    """A sink from its URL; :class:`BadInput` naming it (without its path) if it is none.
    httpx's log line of a request to it shows it as its shown form (see _RedactedRequests)."""
    text = url.strip()
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # (a byte of an argument that is not UTF-8, kept as a lone surrogate)
            given = text.partition("://")[0]
            where = f"{given}://…" if "://" in text and _SCHEME.fullmatch(given) else f"of {len(text)} characters"
            raise BadInput(f"notify URL {where} holds a byte that is not UTF-8 text (character {exc.start + 1}): "
                           "give it as UTF-8", field="notify") from None  # fmt: skip
    if text.startswith(f"{pagerduty.SCHEME}://"):
        if any(char.isspace() for char in text):
            raise BadInput(f"notify URL {pagerduty.SCHEME}://… holds a space", field="notify")
        target = pagerduty.target_of(text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        return Sink(target.url, digest, f"{pagerduty.SCHEME}://{target.host} #{digest[:6]}", target.routing_key)
    # Never quoted whole, not even its start: its user part or its path may be its secret.
    scheme = text.partition("://")[0] if _SCHEME.fullmatch(text.partition("://")[0]) and "://" in text else None
    try:
        parts = urlsplit(text)
        parts.hostname  # noqa: B018  (a bracketed host that is no address raises here)
    except ValueError as exc:  # "Invalid IPv6 URL", a bracketed host that is no address
        raise BadInput(f"notify URL {scheme or ''}://… is not a URL ({exc})", field="notify") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        if scheme is not None and parts.hostname:
            shown = f"{scheme}://{printable(parts.hostname, 100)}"
        else:
            shown = f"of {len(text)} characters (not shown: it may hold its secret)"
        raise BadInput(f"notify URL {shown} is not an http:// or https:// URL with a host", field="notify")
    try:
        port = parts.port
    except ValueError:
        raise BadInput(f"notify URL {parts.scheme}://{parts.hostname} has a bad port", field="notify") from None
    if any(char.isspace() for char in text):  # (a comment left after it, or two URLs on one line)
        raise BadInput(f"notify URL {parts.scheme}://{parts.hostname}/… holds a space", field="notify")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    where = f"{parts.scheme}://{parts.hostname}{f':{port}' if port else ''}"
    sink = Sink(text, digest, f"{where}/… #{digest[:6]}" if parts.path.strip("/") or parts.query else f"{where} #{digest[:6]}")
    try:
        _SHOWN[str(httpx.URL(text))] = sink.shown
    except httpx.InvalidURL as exc:  # (a control character, an invisible one in the host)
        # Taken, it failed at its first delivery, outside the errors a delivery expects: the
        # delivery loop ended, and no webhook got another alert.
        raise BadInput(f"notify URL {printable(sink.shown)} is refused by the HTTP client: {exc}", field="notify") from None
    return sink


def parse_sinks(urls: Sequence[str]) -> tuple[Sink, ...]:
    """Sinks from URLs (``--notify`` and the lines of ``--notify-file``), each once; a
    refusal of one of several says which it is."""
    sinks: dict[str, Sink] = {}
    for number, url in enumerate(urls, start=1):
        try:
            sink = sink_of(url)
        except BadInput as exc:
            if len(urls) == 1:
                raise
            raise BadInput(f"{exc.message} (notify URL {number} of {len(urls)})", field="notify") from None
        sinks.setdefault(sink.id, sink)
    return tuple(sinks.values())


def retry_after(value: str | None, now: datetime) -> timedelta | None:
    """The wait an answer's ``Retry-After`` asks for from ``now`` (seconds, or an HTTP date),
    at most :data:`RETRY_AFTER_MAX`; ``None`` for none, a past date, or anything that is
    neither (a negative number, a word): the sender's own backoff applies."""
    text = (value or "").strip()
    if not text:
        return None
    if _DELAY_SECONDS.fullmatch(text):
        seconds = float(text)  # (inf for a thousand digits: capped below, never a timedelta)
        wait = RETRY_AFTER_MAX if seconds >= RETRY_AFTER_MAX.total_seconds() else timedelta(seconds=seconds)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        wait = (when if when.tzinfo is not None else when.replace(tzinfo=UTC)) - now
    if wait <= timedelta(0):
        return None
    return min(wait, RETRY_AFTER_MAX)


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:ERROR_MAX]


@dataclass(frozen=True)
class _Outcome:
    """What came of one POST, to be written under its claim."""

    delivery: Delivery
    at: datetime
    retry_at: datetime | None
    error: str | None


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Notifier:
    """Delivers the outbox rows of this instance's sinks (see the module docstring)."""

    def __init__(
        self,
        *,
        store: AlertStore,
        clock: Clock,
        loops: Loops,
        instance: str,
        sinks: Sequence[Sink],
        settings: AlertSettings,
        audit: AuditLog,
        transport: httpx.AsyncBaseTransport | None = None,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.now = now or clock.now
        """The time a delivery's lease is taken and judged by (see :meth:`Alerts.now`)."""
        self.loops = loops
        self.instance = instance
        self.sinks = {sink.id: sink for sink in sinks}
        self.settings = settings
        self.audit = audit
        self.transport = transport
        """A test's transport (``None``: the network)."""
        self.wakes = {sink_id: asyncio.Event() for sink_id in self.sinks}
        """Per sink, set when this instance wrote a transition: deliver now, not at the next
        poll (see :meth:`wake_up`)."""
        self.loop_names = {sink_id: f"alert delivery {n}" for n, sink_id in enumerate(self.sinks, start=1)}
        """Each sink's delivery loop's name (one loop a sink: see :meth:`run`)."""
        self._registering = asyncio.Lock()
        self._registered: datetime | None = None
        self._client: httpx.AsyncClient | None = None
        self._sending: set[asyncio.Task[None]] = set()
        """Deliveries in flight: a stop lets them end within its grace (see :meth:`stop`)."""
        self._unrecorded: dict[str, list[_Outcome]] = {}
        """Per sink, the outcomes of POSTs made that the store could not take then."""
        self._cut_claims: list[asyncio.Future[list[Delivery]]] = []
        """Claims on their way when a stop cancelled the delivery loop (see :meth:`stop`)."""
        self.outcomes: Counter[tuple[str, str]] = Counter(
            {(sink.shown, outcome): 0 for sink in self.sinks.values() for outcome in OUTCOMES}
        )
        """The outcomes of this instance's POSTs, by webhook (as shown) and outcome:
        ``delivered``, ``retried`` (failed, tried again later), ``given_up`` (failed, its
        last attempt), ``unrecorded`` (its claim ran out before the outcome was written).
        Each from 0: Prometheus's ``increase()`` sees no increase in a series that first
        appears at 1, so a rule on ``given_up`` missed a webhook's first give-up."""

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.settings.timeout), transport=self.transport, follow_redirects=False
            )
        return self._client

    async def stop(self, grace: float) -> None:
        """Let the POSTs in flight end and their outcomes be recorded, for up to ``grace``
        seconds (the delivery loop was cancelled before: nothing more is claimed); cut the
        rest short (sent again once their lease runs out); record the outcomes the store
        could not take when their POSTs ended; close the client.

        A claim the loop's cancellation found on its way may commit all the same: once it
        answers, what it took is POSTed within the grace like the rest, or with none given
        back (due again at once for another instance, not after the claim's lease: a
        rolling restart must not hold a page back a minute)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        cut, self._cut_claims = self._cut_claims, []
        await answers_of(cut)
        for claiming in cut:
            if not claiming.done() or claiming.cancelled() or claiming.exception() is not None:
                continue  # (no answer: what it took waits out its lease)
            claimed = claiming.result()
            if grace > 0 and loop.time() < until:
                self._send(claimed)
            elif claimed:
                with contextlib.suppress(Exception):  # (else it waits out its lease)
                    await self.store.give_back_deliveries(claimed)
        if self._sending and grace > 0:
            await self.loops.within_grace(set(self._sending), until - loop.time())
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        for sink_id in list(self._unrecorded):
            left = until - loop.time()
            with contextlib.suppress(Exception):  # (else sent again once its lease runs out)
                async with asyncio.timeout(left if left > 0 else 0.1):
                    await self.record_unrecorded(sink_id)
        await self.close()

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None

    def wake_up(self) -> None:
        """This instance wrote a transition: every sink's loop delivers now."""
        for wake in self.wakes.values():
            wake.set()

    async def register(self, now: datetime) -> None:
        """Tell the store which sinks this instance delivers to (every :data:`REGISTER_EVERY`)."""
        async with self._registering:  # (every sink's loop asks: one of them tells)
            if self._registered is not None and now - self._registered < REGISTER_EVERY:
                return
            await self.store.register_sinks([(sink.id, sink.shown) for sink in self.sinks.values()], now)
            self._registered = now

    async def deliver_due(self) -> int:
        """Claim and deliver every due row of this instance's sinks, each sink's apart (a
        sink that hangs holds back only its own pages); how many were handled."""
        return sum(await asyncio.gather(*(self.deliver_due_to(sink_id) for sink_id in self.sinks)))

    async def deliver_due_to(self, sink_id: str) -> int:
        """Claim and deliver every due row of one sink, a batch at a time; how many were handled."""
        handled = 0
        await self.record_unrecorded(sink_id)  # (before a claim: one of them may be due again)
        while True:
            now = self.now()
            until = now + timedelta(seconds=self.settings.lease)
            claiming = asyncio.ensure_future(self.store.claim_deliveries([sink_id], self.instance, now, until, CLAIM_BATCH))
            try:
                claimed = await asyncio.shield(claiming)
            except asyncio.CancelledError:
                keep_for_the_stop(claiming, self._cut_claims)  # the stop sends what it took, or gives it back
                raise
            if not claimed:
                break
            # Shielded: a stop cancels this loop at once, and gives the POSTs its grace.
            together = asyncio.gather(*self._send(claimed))
            together.add_done_callback(_retrieved)  # (read here, unless this loop was cancelled)
            await asyncio.shield(together)
            handled += len(claimed)
        return handled

    def _send(self, claimed: Sequence[Delivery]) -> list[asyncio.Task[None]]:
        """Start POSTing claimed rows, each a task a stop waits for within its grace."""
        sending = [asyncio.ensure_future(self.deliver(delivery)) for delivery in claimed]
        self._sending.update(sending)
        for task in sending:
            task.add_done_callback(self._sending.discard)
        return sending

    async def deliver(self, delivery: Delivery) -> None:
        """POST one claimed row and record what came of it."""
        sink = self.sinks[delivery.sink]
        if self.now() >= delivery.until:
            # Stalled past the lease since the claim: another instance may be sending it.
            log.warning("alert %s to %s: not sent, its claim ran out first", delivery.alert_key, sink.shown)
            return
        timeout = self.settings.timeout
        asked: str | None = None  # (a 429's or 503's Retry-After)
        try:
            # The timeout bounds the whole POST (httpx's bounds each read: a receiver that
            # answers a byte at a time held it past the lease, when another instance sends
            # it again), and the answer's body is never read: its status is the outcome (a
            # receiver's gigabyte stays on the wire, not in this process).
            content = delivery.payload.encode("utf-8")
            if sink.routing_key is not None:  # PagerDuty: the alert's state now (see its module)
                firing = next((a for a in await self.store.list_alerts() if a.key == delivery.alert_key), None)
                content = pagerduty.event(sink.routing_key, delivery.payload, firing)
            if not await self._time_to_post(delivery):
                return
            async with asyncio.timeout(timeout), self.client().stream(
                "POST",
                sink.url,
                content=content,
                headers={
                    "content-type": "application/json",
                    "idempotency-key": delivery.transition,
                    "user-agent": "schedtui-alerts",
                    # Who sends it (the body names who saw the transition); a header is ASCII.
                    "schedtui-instance": self.instance.encode("ascii", "backslashreplace").decode("ascii"),
                },
            ) as answer:
                error = None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
                if answer.status_code in _RETRY_AFTER_STATUSES:
                    asked = answer.headers.get("retry-after")
        except Unavailable as exc:  # (PagerDuty's: the alert's state could not be read)
            error = f"the alert's state could not be read: {exc}"
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # (InvalidURL is no HTTPError)
            error = _error(exc).replace(sink.url, sink.shown)  # the URL's path is its secret
        except TimeoutError:
            error = f"no answer within {timeout:g}s"
        except Exception as exc:  # anything else one sink's request raises fails its delivery, not every sink's
            log.warning("alert %s to %s: the request failed unexpectedly", delivery.alert_key, sink.shown, exc_info=exc)
            error = _error(exc).replace(sink.url, sink.shown)
        now = self.now()
        retry_at = None
        if error is not None and delivery.attempts < self.settings.attempts:
            # Never sooner than the backoff, nor than the receiver asked (up to the cap).
            wait = self.settings.retry_delay(delivery.attempts)
            asked_for = retry_after(asked, now)
            if asked_for is not None and asked_for > wait:
                wait = asked_for
                error = f"{error} (Retry-After {printable(asked or '', 40)})"
            retry_at = now + wait
        outcome = _Outcome(delivery, now, retry_at, error)
        try:
            await self._record(outcome)
        except Unavailable as exc:
            # The POST was made (perhaps accepted): forgetting its outcome would have the
            # row sent again once its lease runs out, a second page for a store's blip. It
            # is recorded again before this sink's next claim (see deliver_due_to).
            self._unrecorded.setdefault(delivery.sink, []).append(outcome)
            log.warning("alert %s to %s: its outcome (%s) cannot be recorded now (%s); recorded again when the store "
                        "answers", delivery.alert_key, sink.shown, error or "delivered", exc)  # fmt: skip

    async def _time_to_post(self, delivery: Delivery) -> bool:
        """Whether the claim's lease outlasts a POST of the whole timeout. A claim that
        answered late (a store back from a failover, a pool short of connections), or the
        alert's state read slowly, may leave less: a slow receiver was still being sent to
        when the lease ran out, another instance sent it too, and the webhook took the page
        twice. Such a claim is given back instead (due at once, its attempt not counted),
        to be claimed again with a whole lease; one that ran out is left to whoever has it."""
        left = (delivery.until - self.now()).total_seconds()
        if left >= self.settings.timeout:
            return True
        shown = self.sinks[delivery.sink].shown
        if left <= 0:
            log.warning("alert %s to %s: not sent, its claim ran out first", delivery.alert_key, shown)
            return False
        log.warning("alert %s to %s: not sent now, its claim has %.1fs of its lease left, less than the POST's timeout "
                    "(%gs); given back to be claimed again", delivery.alert_key, shown, left, self.settings.timeout)  # fmt: skip
        with contextlib.suppress(Unavailable):  # (else it waits out its lease)
            await self.store.give_back_deliveries([delivery])
        return False

    async def record_unrecorded(self, sink_id: str) -> None:
        """Record the outcomes of this sink's POSTs that the store could not take when they
        were made (:class:`Unavailable` if it still cannot: the rest are kept)."""
        kept = self._unrecorded.pop(sink_id, [])
        try:
            while kept:
                await self._record(kept[0])
                kept.pop(0)
        finally:
            if kept:
                self._unrecorded.setdefault(sink_id, [])[:0] = kept

    async def _record(self, outcome: _Outcome) -> None:
        """Write a POST's outcome under its claim, and count, log and audit it."""
        delivery, now, retry_at, error = outcome.delivery, outcome.at, outcome.retry_at, outcome.error
        sink = self.sinks[delivery.sink]
        recorded = await self.store.finish_delivery(delivery, now, retry_at=retry_at, error=error)
        detail: dict[str, Any] = {
            "transition": delivery.transition, "sink": sink.shown, "attempt": delivery.attempts, "error": error,
        }  # fmt: skip
        self.outcomes[sink.shown, "unrecorded" if not recorded else "delivered" if error is None
                      else "retried" if retry_at is not None else "given_up"] += 1  # fmt: skip
        if not recorded:
            # The lease ran out first: another instance has it, and may send it again.
            log.warning("alert %s to %s: the claim ran out before its outcome (%s) was recorded; "
                        "another instance may send it again", delivery.alert_key, sink.shown, error or "delivered")  # fmt: skip
            return
        if error is None:
            log.info("alert %s delivered to %s (attempt %d)", delivery.alert_key, sink.shown, delivery.attempts)
            await self.audit.record("alert.notified", delivery.alert_key, detail, actor=self.instance)
        elif retry_at is not None:
            log.warning("alert %s to %s failed (attempt %d of %d: %s); again at %s", delivery.alert_key, sink.shown,
                        delivery.attempts, self.settings.attempts, error, retry_at.isoformat())  # fmt: skip
        else:
            log.error("alert %s to %s: giving up after %d attempts (%s)", delivery.alert_key, sink.shown,
                      delivery.attempts, error)  # fmt: skip
            await self.audit.record("alert.notify_failed", delivery.alert_key, detail, actor=self.instance)

    async def run(self, sink_id: str) -> None:
        """One sink's delivery loop (each sink has its own: a webhook that hangs or fails
        delays no other's pages): deliver what is due, then wait for a transition of this
        instance or the next poll."""
        name, wake = self.loop_names[sink_id], self.wakes[sink_id]
        while True:
            try:
                await self.register(self.now())
                await self.deliver_due_to(sink_id)
            except Unavailable as exc:
                log.warning("alerts: cannot deliver to %s now: %s", self.sinks[sink_id].shown, exc)
            poll = self.clock.now() + timedelta(seconds=self.settings.poll)
            await self.loops.park(name, poll, wake)
