"""The one-line header: what the console is connected to and how fresh its data is."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from textual.content import Content
from textual.markup import escape
from textual.reactive import reactive
from textual.widget import Widget

from backend.client.interface import ConnectionInfo
from console import format as fmt
from console.fleet import Fleet

__all__ = ["ConnectionState", "ConsoleHeader", "Feed", "FleetBanner"]

ConnectionState = Literal["connecting", "live", "dropped", "lost", "error", "refused"]
Feed = Literal["events", "polling"]


#: Silence of the event stream after which the header stops saying live: the server pings
#: a quiet stream every 15 s (an embedded engine's says so as often), and a little more.
EVENTS_LATE = timedelta(seconds=20)


class ConsoleHeader(Widget):
    """Backend kind and where, coordination, instance, connection state with the age of the
    last good refresh, how many alerts fire, and a read-only badge. Everything is drawn from the reactives below;
    ages are computed from ``now`` (the injected clock), never from the wall clock."""

    DEFAULT_CSS = """
    ConsoleHeader {
        height: 1;
        background: $panel;
        color: $foreground;
    }
    """

    info: reactive[ConnectionInfo | None] = reactive(None)
    """What the backend said it is connected to (``None`` until the first connect)."""
    where: reactive[str] = reactive("")
    """Where the store or server is, as shown (short; see :func:`console.app.short_where`)."""
    state: reactive[ConnectionState] = reactive("connecting")
    """Connection state: connecting, live, dropped (the event stream broke: polling, and
    not live until it is back), lost (retrying by itself), error (gave up), refused (the
    server refused the token, or wants one: no retry can help)."""
    token_sent: reactive[bool] = reactive(True)
    """While refused: whether a token was sent (refused) or none was (missing)."""
    paused: reactive[bool] = reactive(False)
    """Auto-refresh paused by the operator."""
    read_only: reactive[bool] = reactive(False)
    """Actions are refused (flag or a read token)."""
    last_ok: reactive[datetime | None] = reactive(None)
    """When the last refresh succeeded (clock time)."""
    retry_at: reactive[datetime | None] = reactive(None)
    """When the next reconnect attempt is due (clock time), while lost."""
    now: reactive[datetime | None] = reactive(None)
    """The clock's time at the last tick; ages are measured against it."""
    fleet: reactive[Fleet | None] = reactive(None)
    """Who fires, from the heartbeats (``None`` until read, or when the backend cannot say)."""
    feed: reactive[Feed] = reactive("polling")
    """How the data stays fresh: change signals (``events``), or reading it again and again."""
    alerting: reactive[int | None] = reactive(None)
    """How many alerts fire now (``None``: not known; nothing is shown for 0)."""
    late_after: reactive[timedelta | None] = reactive(None)
    """While polling: a last good refresh older than this is not live (its polls go
    unanswered, as when the server died and no connection error came yet)."""
    last_signal: reactive[datetime | None] = reactive(None)
    """While change signals flow: when the last batch came (a ping counts). A stream
    silent for longer than :data:`EVENTS_LATE` is not live (a frozen server keeps its
    connections open and says nothing), until the stream is given up for broken."""

    #: What gives way, in this order, when the header does not fit (after the location,
    #: cut down to its last part: the file, the host and port), so that the instance at the
    #: end and the location stay in sight: the names of the firing engines (their count
    #: stays), the words "embedded" (a path says it), "instance" and "alerting" (the flag
    #: and count stay), the store's kind ("sqlite", "remote": the location stays), the
    #: coordination (every run's outcome says it), a lost connection's long words (its
    #: short ones say the same: ``✗ lost · stale 9s · retry 4s``), the feed's word
    #: ("(events)", "(polling)": live stays), the READ-ONLY badge (the footer's left end
    #: says it too) and last a lost connection's retry countdown (it retries by itself).
    #: At 80 columns the instance was never in sight, nor, lost, the server it watches.
    GIVES_WAY = (
        "names", "embedded", "instance", "alerting", "kind", "coordination", "connection words", "feed", "read-only",
        "retry",
    )  # fmt: skip

    def render(self) -> Content:
        width = self.size.width
        where = self.where or (self.info.where if self.info is not None else "")
        content = self._content(where)
        over = content.cell_length - width
        if over > 0:
            least = len(where.rstrip("/").rsplit("/", 1)[-1]) + 1
            keep = max(least, len(where) - over - 1)
            if keep < len(where):
                where = "…" + where[-keep:]
                content = self._content(where)
        for gives_way in range(1, len(self.GIVES_WAY) + 1):
            if content.cell_length <= width:
                break
            content = self._content(where, gone=frozenset(self.GIVES_WAY[:gives_way]))
        return content

    def _content(self, where: str, *, gone: frozenset[str] = frozenset()) -> Content:
        """The header with ``where`` as the location, without what ``gone`` names of
        :attr:`GIVES_WAY`."""
        # Most telling first: what is true now, then what it is connected to (cut at 80 columns).
        connection = self._connection(
            feed="feed" not in gone, short="connection words" in gone, retry="retry" not in gone
        )
        parts: list[str] = ["[b]schedtui[/b]", connection]
        if self.read_only and "read-only" not in gone:
            parts.append("[b reverse $text-warning] READ-ONLY [/]")
        if self.alerting:  # a flag, not the fleet's ▲: the two counts sit side by side
            word = "" if "alerting" in gone else " alerting"
            parts.append(f"[b reverse $text-error] ⚑ {self.alerting}{word} [/]")
        if self.fleet is not None:
            parts.append(self._fleet(self.fleet, names="names" not in gone))
        info = self.info
        if info is not None:
            kind = f"{info.kind} {info.store_kind}".strip() if info.kind == "embedded" else "remote"
            if "embedded" in gone and info.kind == "embedded":
                kind = info.store_kind
            if "kind" in gone:
                kind = ""
            parts.append(f"{escape(kind)} [b]{escape(where or info.where)}[/b]".strip())
            if not info.fires:
                # An embedded console that does not run timers: `serve` (or nothing) fires.
                parts.append("[$text-muted]timers off[/]")
            if "coordination" not in gone:
                parts.append(escape(info.coordination))
            parts.append(("" if "instance" in gone else "[$text-muted]instance[/] ") + escape(info.instance))
        elif where:
            parts.append(escape(where))
        return Content.from_markup(" [$text-muted]│[/] ".join(parts))

    @staticmethod
    def _fleet(fleet: Fleet, *, names: bool = True) -> str:
        # Members standing down for their clock: named while the names fit (7 Health lists them).
        down = ""
        if fleet.standing_down:
            named = ", ".join(i.name for i in fleet.standing_down[:2]) + (" …" if len(fleet.standing_down) > 2 else "")
            down = f" [b $text-error]✗ {len(fleet.standing_down)} clock off[/]" + (f" [$text-muted]{escape(named)}[/]" if names else "")
        if fleet.silent:
            return "[b reverse $text-error] ✗ NOTHING FIRES [/]" + down
        if not fleet.firing:
            return "[$text-muted]no engine firing[/]" + down
        owned = fleet.owned
        if owned is not None:  # cluster: who owns how many schedules
            shown = ", ".join(f"{i.name} ◈{owned.get(i.name, 0)}" for i in fleet.firing[:3])
            shown += " …" if len(fleet.firing) > 3 else ""
        else:
            shown = ", ".join(i.name for i in fleet.firing[:2]) + (" …" if len(fleet.firing) > 2 else "")
        count = f"[$text-success]▲ {len(fleet.firing)} firing[/]"
        return (f"{count} [$text-muted]{escape(shown)}[/]" if names else count) + down

    def _polls_late(self) -> bool:
        """Whether the last good refresh is older than a poll is given to answer."""
        if self.late_after is None or self.last_ok is None or self.now is None:
            return False
        return self.now - self.last_ok > self.late_after

    def _connection(self, *, feed: bool = True, short: bool = False, retry: bool = True) -> str:
        """The connection's state; ``feed``: whether a live one says how it stays fresh;
        ``short``: a lost one in its short words; ``retry``: whether a lost one says when it
        tries again."""
        since = age = ""  # (since the last good refresh)
        if self.last_ok is not None and self.now is not None:
            since = fmt.compact_delta(max(self.now - self.last_ok, self.now - self.now))
            age = since + " ago"
        if self.state == "connecting":
            return "[$text-warning]◌ connecting…[/]"
        if self.state == "lost":
            next_try = ""
            if retry and self.retry_at is not None and self.now is not None:
                next_try = fmt.countdown(self.retry_at, self.now)
            if short:
                stale = f" · [b]stale[/b] {since}" if since else ""
                next_try = f" · retry {next_try.removeprefix('in ')}" if next_try else ""
                return f"[b $text-error]✗ lost[/]{stale}{next_try}"
            stale = f" · [b]stale[/b], last good {age}" if age else ""
            next_try = f" · retry {next_try}" if next_try else ""
            return f"[b $text-error]✗ connection lost[/]{stale}{next_try}"
        if self.state == "error":
            return "[b $text-error]✗ not connected[/] [$text-muted](ctrl+r retries)[/]"
        if self.state == "refused":
            # How this console is given a token (console/cli/main.py); fits 80 columns.
            what = "token refused" if self.token_sent else "no token sent"
            return f"[b reverse $text-error] ✗ {what} [/] restart with --token-file PATH or $SCHEDTUI_TOKEN"
        if self.state == "dropped":
            if self._polls_late():  # the polls go unanswered too (a frozen server): not calm
                return f"[b $text-warning]◌ waiting for the server[/] [$text-muted](stream dropped) last answer {age}[/]"
            return f"[b $text-warning]◌ event stream dropped[/] [$text-muted](polling) {age or 'checking the server…'}[/]"
        if self.paused:
            return f"[b $text-warning]⏸ paused[/] [$text-muted]data {age}[/]"
        if self.feed == "events":
            if self.last_signal is not None and self.now is not None and self.now - self.last_signal > EVENTS_LATE:
                quiet = fmt.compact_delta(self.now - self.last_signal)
                return f"[b $text-warning]◌ waiting for the server[/] [$text-muted](events silent {quiet})[/]"
            # signals keep it current: no age
            return "[$text-success]● live[/]" + (" [$text-muted](events)[/]" if feed else "")
        if self._polls_late():  # polls go unanswered: not live, whatever it was
            return f"[b $text-warning]◌ waiting for the server[/] [$text-muted](polling) last answer {age}[/]"
        return f"[$text-success]● live[/] [$text-muted]{'(polling) ' if feed else ''}{age}[/]"


class FleetBanner(Widget):
    """A full-width line, shown only while no engine fires the schedules that need a timer:
    with ``serve`` dead the countdowns still roll, and this says they are empty promises."""

    DEFAULT_CSS = """
    FleetBanner {
        height: auto;
        background: $error;
        color: $background;
        text-style: bold;
        padding: 0 1;
        display: none;
    }
    FleetBanner.-silent {
        display: block;
    }
    """

    fleet: reactive[Fleet | None] = reactive(None)
    now: reactive[datetime | None] = reactive(None)

    def watch_fleet(self, fleet: Fleet | None) -> None:
        self.set_class(fleet is not None and fleet.silent, "-silent")

    def render(self) -> Content:
        fleet = self.fleet
        if fleet is None or not fleet.silent:
            return Content("")
        plural = "s need" if fleet.self_triggered != 1 else " needs"
        if fleet.standing_down:
            first = fleet.standing_down[0]
            others = f" (and {len(fleet.standing_down) - 1} more)" if len(fleet.standing_down) > 1 else ""
            return Content(
                f"✗ NOTHING IS FIRING: {first.name}'s clock is {fmt.clock_offset(first.clock_offset_s)} off the "
                f"database server's{others}: it takes no work until they agree; fix its time sync (NTP). "
                f"{fleet.self_triggered} enabled schedule{plural} an engine's timer."
            )
        if fleet.last_beat is not None and self.now is not None:
            since = (
                f"the last heartbeat was {fmt.compact_delta(max(self.now - fleet.last_beat.heartbeat_at, self.now - self.now))}"
                f" ago ({fleet.last_beat.name})"
            )
        elif fleet.last_run is not None and (fired := fleet.last_run.fired_at) is not None and self.now is not None:
            since = (
                f"none is registered (one that stops takes its registration with it); the newest run was fired "
                f"{fmt.compact_delta(max(self.now - fired, self.now - self.now))} ago by {fleet.last_run.instance}"
            )
        else:
            since = "none is registered, and no schedule has run yet"
        return Content(
            f"✗ NOTHING IS FIRING: no engine is sending heartbeats; {since}. "
            f"{fleet.self_triggered} enabled schedule{plural} an engine's timer: start `schedtui serve`."
        )
