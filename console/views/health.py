"""View 7: health. What is alerting now (:meth:`~backend.client.interface.Backend.alerts`:
condition, subject, since when, why), the instances as their heartbeats say (role, heartbeat
age, last start, clock offset: a member whose clock is off stands down; ``x`` forgets one
that is lost, once confirmed), then per schedule and per queue the last hour by the minute
(:meth:`~backend.client.interface.Backend.activity`).

A schedule's row: its runs a minute and its failures a minute as sparklines, each with its
total for the hour beside it, and how late it is now (see
:class:`~backend.activity.ScheduleActivity`). A queue's row: attempts that ended and those
that failed a minute, and its dead jobs (gained in the hour → held now). The rows in trouble
come first: the most failures, then the latest (by the minute, so that rows do not trade
places every second), then the backend's order. Every figure is written out beside its
sparkline, so the view reads the same without colour.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import ClassVar, Final

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.content import Content

from backend.activity import Activity, QueueActivity, ScheduleActivity
from backend.alerts.model import CONDITIONS, Alert, AlertsPage
from backend.model import InstanceInfo
from backend.safetext import in_line
from console import format as fmt
from console.fleet import LIVE_WITHIN, is_gone
from console.keys import action_key, bindings
from console.screens.confirm import Confirm
from console.views.base import View
from console.widgets.health import HealthRow
from console.widgets.line import Line
from console.workers import work

__all__ = [
    "MAX_ALERTS", "MAX_INSTANCES", "MAX_ROWS", "HealthView", "alert_text", "dead_text", "instance_text", "late_text",
]  # fmt: skip

MAX_ROWS: Final = 60
"""Rows drawn per section at most (the most troubled first); the rest are counted. Each row
is a handful of widgets: at 1,000 schedules, drawing every one would take seconds."""
LATE: Final = timedelta(minutes=1)
"""From how late on a schedule is marked late (``⚠``) and counted in the title; below it,
the lateness of a slot whose run is still in flight, or has just failed, is shown plainly."""
MAX_ALERTS: Final = 5
"""Alerts listed at most (the newest first); the rest are counted."""
MAX_INSTANCES: Final = 8
"""Instances listed at most (those standing down first, then members); the rest are counted."""
INSTANCE_COLUMNS: Final = (("NAME", 15), ("ROLE", 10), ("HEARTBEAT", 12), ("LAST START", 12), ("CLOCK", 14))
"""Each column's title and width (63 cells, "59m 59s ago" whole: the note after them fits 80 columns beside the scroll bar)."""


def _cell(text: str, width: int) -> str:
    return (text if len(text) < width else text[: width - 2] + "…").ljust(width)


def instance_text(instance: InstanceInfo, now: datetime) -> Content:
    """One instance on one line: name, role (``✗ gone``: a member silent past the take-over
    window), heartbeat age, last start, clock offset against the database server's
    (``+61.0s ✗ off`` in the error style when its own verdict is off; ``-`` when not
    measured), and for a member standing down for it, ``takes no work``."""
    (_, name), (_, role), (_, beat), (_, last), (_, clock) = INSTANCE_COLUMNS
    silent = now - instance.heard_at > LIVE_WITHIN
    offset = fmt.clock_offset(instance.clock_offset_s)
    if instance.clock_off:
        clock_cell = (_cell(f"{offset} ✗ off", clock), "bold $text-error")
    else:
        clock_cell = (_cell(offset, clock), "$text-muted" if instance.clock_offset_s is None else "")
    return Content.assemble(
        (_cell(in_line(instance.name), name), "bold"),
        # Silent past the take-over window: killed or crashed (a clean stop removes its row).
        (_cell("✗ gone", role), "bold $text-error") if is_gone(instance, now)
        else (_cell(instance.role or "-", role), "$text-muted" if instance.role == "observer" else ""),
        (_cell(fmt.ago(instance.heard_at, now), beat), "$text-warning" if silent else ""),
        (_cell(fmt.ago(instance.last_fired_at, now), last), "$text-muted" if instance.last_fired_at is None else ""),
        clock_cell,
        ("takes no work" if instance.stands_down else "", "$text-error"),
    )


def _instances_first(instances: list[InstanceInfo]) -> list[InstanceInfo]:
    """Those standing down for their clock first, then the members, then the observers."""
    return sorted(instances, key=lambda i: (not i.stands_down, i.role == "observer", i.name))


#: The condition's column: the longest name and a space (``instance_lost`` ran into its subject).
CONDITION_WIDTH: Final = max(map(len, CONDITIONS)) + 1


def alert_text(alert: Alert, now: datetime, zone: str) -> Content:
    """One firing alert on one line: ``▲ failing   flaky-export   since 07:20, 40m  why``
    (the time in ``zone``, with the date when it is not today's)."""
    since = alert.since.astimezone(fmt.zone_of(zone))
    today = now.astimezone(fmt.zone_of(zone)).date() == since.date()
    when = since.strftime("%H:%M" if today else "%m-%d %H:%M")
    subject = in_line(alert.subject)
    subject = subject if len(subject) <= 16 else subject[:15] + "…"
    return Content.assemble(
        ("▲ ", "bold $text-error"),
        (alert.condition.ljust(CONDITION_WIDTH), "bold"),
        (f"{subject:<17}", ""),
        (f"since {when}, {fmt.age(alert.since, now)}  ", "$text-muted"),
        in_line(" ".join(alert.summary.split())),
    )


def late_text(schedule: ScheduleActivity, now: datetime) -> Content:
    """A schedule's last column: ``⚠ 1h 2m`` late (``12s`` below :data:`LATE`), ``on time``,
    ``off`` (disabled) or ``no runs``."""
    if not schedule.enabled:
        return Content.styled("off", "$text-muted")
    lateness = schedule.lateness(now)
    if lateness is None or lateness < timedelta(seconds=1):
        if schedule.late_since is None and schedule.last_success_at is None:
            return Content.styled("no runs", "$text-muted")
        return Content.styled("on time", "$text-muted")
    if lateness < LATE:
        return Content(fmt.compact_delta(lateness))  # a slot not done yet, or a run in flight
    return Content.styled(f"⚠ {fmt.compact_delta(lateness)}", "bold $text-warning")


def dead_text(queue: QueueActivity) -> Content:
    """A queue's last column: the dead jobs gained in the window and held now (``+2 → 5``)."""
    if not queue.dead_growth and not queue.dead_now:
        return Content.styled("0", "$text-muted")
    text = f"+{queue.dead_growth} → {queue.dead_now}"
    return Content.styled(text, "bold $text-error") if queue.dead_growth else Content(text)


def _total(count: int, *, bad: bool = False) -> Content:
    text = _counted(count)
    if bad and count:
        return Content.styled(text, "bold $text-error")
    return Content.styled(text, "$text-muted") if not count else Content(text)


def _counted(count: int) -> str:
    """A total in at most five characters (its column is six, one a space): 525,902 ran into
    its sparkline as ``█▄525902``; shown ``526k``."""
    if count < 100_000:
        return str(count)
    if count < 10_000_000:
        return f"{count / 1000:.0f}k" if count < 999_500 else f"{count / 1_000_000:.1f}M"
    return f"{count / 1_000_000:.0f}M"



class HealthRows(VerticalScroll):
    """The rows of the Health view, scrolled with the keys every table moves with."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "scroll_down", "Down", show=False),
        Binding("k", "scroll_up", "Up", show=False),
        Binding("g", "scroll_home", "Top", show=False),
        Binding("G", "scroll_end", "Bottom", show=False),
    ]

    def watch_has_focus(self, has_focus: bool) -> None:
        """Restyle itself, not its rows: no rule styles a row by the focus of what holds it,
        and Textual's way (the node and every node under it) restyled some 800 widgets each
        time the view was left or shown again (~100 ms at 1,000 schedules)."""
        self.app.stylesheet.update_nodes([self], animate=True)


class HealthView(View):
    """See the module."""

    view_id = "health"
    topics: ClassVar[tuple[str, ...]] = ("jobs", "alerts")
    # Its activity read counts the hour's runs and job attempts: re-read back to back under
    # steady work (a signal always arrived meanwhile), one console kept the serve busy,
    # more so as the hour filled (40-50% of a core at 150 jobs/s, 92% with a full hour).
    signalled_every: ClassVar[float] = 5.0

    KEYS = (
        action_key("forget_instance", "x", "Forget lost",
                   help="forget a lost instance (a member silent past its take-over window), once confirmed"),
    )  # fmt: skip
    BINDINGS = bindings(KEYS)

    DEFAULT_CSS = """
    HealthView #health-rows {
        height: 1fr;
        scrollbar-size-vertical: 1;
    }
    HealthView #alerts, HealthView #schedule-rows, HealthView #queue-rows {
        height: auto;
    }
    HealthView .alert, HealthView .instance {
        padding: 0 1;
    }
    HealthView #instances-header {
        padding: 0 1;
        color: $text-muted;
        text-style: bold;
    }
    HealthView #instances {
        height: auto;
    }
    HealthView .more {
        padding: 0 1;
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.activity: Activity | None = None
        self.alerts: AlertsPage | None = None
        """The firing alerts; ``None`` when the backend keeps none (an older server)."""
        self._read_at: datetime | None = None
        self._shown: list[ScheduleActivity] = []
        """The schedules in the order of their rows."""

    def compose(self) -> ComposeResult:
        yield Line("ALERTS", id="alerts-title", classes="section")
        with Vertical(id="alerts"):
            for _ in range(MAX_ALERTS):
                yield Line(classes="alert")
            yield Line("", id="alerts-more", classes="more")
        with HealthRows(id="health-rows"):
            yield Line("INSTANCES", id="instances-title", classes="section")
            yield Line("".join(title.ljust(width) for title, width in INSTANCE_COLUMNS), id="instances-header")
            with Vertical(id="instances"):
                for _ in range(MAX_INSTANCES):
                    yield Line(classes="instance")
            yield Line("", id="instances-more", classes="more")
            yield Line("SCHEDULES", id="schedules-title", classes="section")
            yield HealthRow(header=True, id="schedules-header")
            yield Vertical(id="schedule-rows")
            yield Line("", id="schedules-more", classes="more")
            yield Line("QUEUES", id="queues-title", classes="section")
            yield HealthRow(header=True, id="queues-header")
            yield Vertical(id="queue-rows")
            yield Line("", id="queues-more", classes="more")

    def on_mount(self) -> None:
        self.query_one("#schedules-header", HealthRow).show("NAME", "RUNS/MIN", "RUNS", "FAILURES/MIN", "FAILS", "LATE")
        self.query_one("#queues-header", HealthRow).show("QUEUE", "ATTEMPTS/MIN", "ENDED", "FAILED/MIN", "FAILED", "DEAD +/NOW")
        for line in self.query(".more, .alert, .instance"):
            line.display = False

    def focus_main(self) -> None:
        self.query_one("#health-rows", HealthRows).focus()

    def backend_now(self, now: datetime) -> datetime:
        """The engine's clock now: its time at the last read plus what has passed since."""
        if self.activity is None or self._read_at is None:
            return now
        return self.activity.now + (now - self._read_at)

    # -- data ---------------------------------------------------------------------------
    async def load(self) -> None:
        console = self.console
        offered = console.info is not None and "alerts" in console.info.systems
        self.alerts = await console.backend.alerts() if offered else None
        self.activity = await console.backend.activity()
        self._read_at = console.clock.now()

    # -- drawing ------------------------------------------------------------------------
    def show(self) -> None:
        activity = self.activity
        if activity is None:
            return
        now = self.backend_now(self.console.clock.now())
        self._show_alerts(now)
        self._show_instances(now)
        minutes = activity.minutes
        schedules = self._in_trouble_first(activity.schedules, now)
        late = sum(1 for s in activity.schedules if s.enabled and (s.lateness(now) or timedelta(0)) >= LATE)
        failing = sum(1 for s in activity.schedules if s.total_failures)
        title = f"SCHEDULES {len(schedules)} · last {minutes} min"
        if failing:
            title += f" · {failing} failing"
        if late:
            title += f" · {late} late"
        self.query_one("#schedules-title", Line).update(title)
        rows = self._rows("#schedule-rows", "#schedules-more", len(schedules),
                          "schedules, none with more failures or later than these")
        for row, schedule in zip(rows, schedules, strict=False):
            row.show(Content.styled(schedule.name, "bold"), schedule.runs, _total(schedule.total_runs), schedule.failures,
                     _total(schedule.total_failures, bad=True), late_text(schedule, now))  # fmt: skip
        queues = sorted(activity.queues, key=lambda q: (-q.dead_growth, -q.total_failed))
        title = f"QUEUES {len(queues)} · last {minutes} min"
        gained = sum(q.dead_growth for q in queues)
        if gained:
            title += f" · {gained} jobs died"
        if not queues:
            title += " · none yet"
        self.query_one("#queues-title", Line).update(title)
        self.query_one("#queues-header", HealthRow).display = bool(queues)
        rows = self._rows("#queue-rows", "#queues-more", len(queues), "queues, none with more dead or failed jobs")
        for row, queue in zip(rows, queues, strict=False):
            row.show(Content.styled(queue.name, "bold"), queue.finished, _total(queue.total_finished), queue.failed,
                     _total(queue.total_failed, bad=True), dead_text(queue))  # fmt: skip
        self._shown = schedules

    def _show_alerts(self, now: datetime) -> None:
        title = self.query_one("#alerts-title", Line)
        lines = list(self.query_one("#alerts", Vertical).query_children(".alert").results(Line))
        firing = [a for a in self.alerts.alerts if a.state == "firing"] if self.alerts is not None else []
        if self.alerts is None:
            title.update("ALERTS · this server keeps none (an older schedtui)")
        elif not firing:
            title.update("ALERTS · nothing is firing")
        else:
            title.update(Content.assemble("ALERTS · ", (f"{len(firing)} firing", "$text-error")))
        for line, alert in zip(lines, [*firing, *[None] * len(lines)], strict=False):
            line.display = alert is not None
            if alert is not None:
                line.update(alert_text(alert, now, self.console.display_zone))
        more = self.query_one("#alerts-more", Line)
        more.display = len(firing) > len(lines)
        more.update(f"… and {len(firing) - len(lines)} more (schedtui alerts lists them all)")

    def _show_instances(self, now: datetime) -> None:
        """The instances the console last read (with the heartbeats, every few seconds)."""
        title = self.query_one("#instances-title", Line)
        lines = list(self.query_one("#instances", Vertical).query_children(".instance").results(Line))
        read = self.console.instances
        instances = _instances_first(read) if read is not None else []
        self.query_one("#instances-header", Line).display = bool(instances)
        if read is None:
            title.update("INSTANCES · not known (the server cannot list them)")
        else:
            down = sum(1 for i in instances if i.stands_down)
            lost = sum(1 for i in instances if is_gone(i, now))
            text = Content(f"INSTANCES {len(instances)}")
            if down:
                text = Content.assemble(text, " · ", (f"{down} standing down: clock off", "$text-error"))
            if lost:
                text = Content.assemble(text, " · ", (f"{lost} lost", "$text-error"))
                if self.console.refusal("forget_instance") is None:  # (no key offered that is refused)
                    text = Content.assemble(text, f" ({self.shown_key('forget_instance')} forgets one)")
            title.update(text)
        for line, instance in zip(lines, [*instances, *[None] * len(lines)], strict=False):
            line.display = instance is not None
            if instance is not None:
                line.update(instance_text(instance, now))
        more = self.query_one("#instances-more", Line)
        more.display = len(instances) > len(lines)
        more.update(f"… and {len(instances) - len(lines)} more (schedtui instances lists them all)")

    # -- actions --------------------------------------------------------------------------
    def action_forget_instance(self) -> None:
        """``x``: forget the lost instance silent longest, once confirmed (one at a time)."""
        console = self.console
        now = self.backend_now(console.clock.now())
        lost = sorted((i for i in console.instances or [] if is_gone(i, now)), key=lambda i: i.heard_at)
        if not lost:
            console.notify("No lost instance: every member beat within its take-over window.", title="Forget",
                           markup=False)  # fmt: skip
            return
        instance = lost[0]
        fact = (f"{in_line(instance.name)}: pid {instance.pid} on {in_line(instance.hostname)}, "
                f"{instance.role or 'member'}, last heartbeat {fmt.ago(instance.heard_at, now)}.")  # fmt: skip
        facts = [fact] if len(lost) == 1 else [fact, f"{len(lost) - 1} more lost: {self.shown_key('forget_instance')} again."]

        def answer(yes: bool | None) -> None:
            if yes:
                self._forget(instance.name)

        console.push_screen(Confirm.of("forget_instance", {"name": instance.name}, facts=facts), answer)

    @work(group="action")
    async def _forget(self, name: str) -> None:
        console = self.console
        done, _ = await self.attempt(console.backend.forget_instance(name))
        if not done:
            return
        console.notify(f'Instance "{name}" forgotten: its instance_lost alert resolves at the next evaluation.',
                       title="Instance forgotten", markup=False)  # fmt: skip
        console.refresh_instances()  # (the heartbeats alone: the list loses it now, not at their next read)

    def _rows(self, where: str, more: str, count: int, what: str) -> list[HealthRow]:
        """The rows of a section, as many as there is data for (up to :data:`MAX_ROWS`):
        kept from one refresh to the next, added or removed at the end."""
        container = self.query_one(where, Vertical)
        rows = list(container.query_children(HealthRow))
        wanted = min(count, MAX_ROWS)
        if len(rows) > wanted:
            for row in rows[wanted:]:
                row.remove()
            rows = rows[:wanted]
        elif len(rows) < wanted:
            added = [HealthRow() for _ in range(wanted - len(rows))]
            container.mount_all(added)
            rows += added
        line = self.query_one(more, Line)
        line.display = count > wanted
        if count > wanted:
            line.update(f"… and {count - wanted} more {what}")
        return rows

    @staticmethod
    def _in_trouble_first(schedules: list[ScheduleActivity], now: datetime) -> list[ScheduleActivity]:
        def trouble(schedule: ScheduleActivity) -> tuple[int, int]:
            lateness = schedule.lateness(now) if schedule.enabled else None
            return -schedule.total_failures, -int(lateness.total_seconds() // 60) if lateness else 0

        return sorted(schedules, key=trouble)

    def tick(self, now: datetime) -> None:
        """The lateness and the alerts' ages count on between reads."""
        if self.activity is None:
            return
        backend_now = self.backend_now(now)
        self._show_alerts(backend_now)
        self._show_instances(backend_now)  # (the heartbeats are read again every few seconds)
        rows = self.query_one("#schedule-rows", Vertical).query_children(HealthRow)
        for row, schedule in zip(rows, self._shown, strict=False):
            row.show_last(late_text(schedule, backend_now))
