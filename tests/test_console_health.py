"""The console's Health view (key 7) under Pilot, on the fixture ledger at the frozen time:
the alerts firing, a row of sparklines per schedule and per queue with their totals and the
lateness, embedded and over the API, and a server that does not offer it."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from backend.alerts.model import CONDITIONS, Alert, Condition
from backend.api.app import create_app
from backend.client.interface import ConnectionInfo
from backend.client.remote import RemoteBackend
from backend.model import InstanceInfo
from console.views.health import HealthView, alert_text, instance_text
from console.widgets import ConsoleHeader
from console.widgets.health import HealthRow, levels
from console.widgets.line import Line
from console.widgets.tabs import ViewTabs
from tests.console_fixtures import FIRING_ALERTS, add_alerts, add_jobs, add_timeline_history, console_backend
from tests.console_scenes import add_clock_off
from tests.test_console import console, ledger, settle, store_url  # noqa: F401 - fixtures

TOKEN = "health-token"


def alert_lines(app: Any) -> list[str]:
    return [line.content.plain for line in app.query(".alert").results(Line) if line.display]


def rows(app: Any, where: str) -> dict[str, tuple[list[int], str, list[int], str, str]]:
    """name -> (first series, its total, second series, its total, last column)."""
    found = {}
    for row in app.query_one(where).query_children(HealthRow):
        name, first, first_total, second, second_total, last = row.cells
        assert isinstance(first, list) and isinstance(second, list)
        found[name.plain] = (first, first_total.plain, second, second_total.plain, last.plain)
    return found


async def filled(url: str) -> None:
    await add_timeline_history(url)
    await add_jobs(url)
    await add_alerts(url)


async def test_seven_shows_what_is_alerting_and_a_row_of_sparklines_per_schedule_and_queue(store_url: str) -> None:  # noqa: F811
    await filled(store_url)
    async with console(store_url, size=(120, 40)) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        assert app.active_view_id == "health" and isinstance(app.active_view, HealthView)
        assert app.query_one("#alerts-title", Line).content.plain == "ALERTS · 3 firing"
        shown = alert_lines(app)
        assert len(shown) == len(FIRING_ALERTS) == 3  # the resolved one is not listed
        failing = next(line for line in shown if "flaky-export" in line)
        assert failing.startswith("▲ failing       flaky-export")
        assert "since 08:59, 25s" in failing  # 07:59:40 UTC, in the operator's zone (CET)
        assert failing.endswith("newest run failed: TimeoutError: export API answered 504 after 30s")
        schedules = rows(app, "#schedule-rows")
        assert list(schedules)[:2] == ["flaky-export", "stuck-import"]  # the most failures first
        runs, total, failures, failed, late = schedules["flaky-export"]
        assert len(runs) == len(failures) == 60
        assert (int(total), int(failed)) == (sum(runs), sum(failures)) and sum(failures) > 0
        # The window's first minute is 07:01; 07:20-07:25 the export API failed every 20 s.
        assert failures[18:25] == [0, 3, 3, 3, 3, 3, 0]
        assert schedules["legacy-cleanup"][4] == "off"
        assert schedules["stuck-import"][4] == "⚠ 1m 5s"
        queues = rows(app, "#queue-rows")
        assert list(queues) == ["mailer", "thumbnails", "webhooks"]
        ended, ended_total, failed_jobs, failed_total, dead = queues["mailer"]
        # 2 jobs failed 3 attempts each at 07:50 (and died), one failed once at 07:59 (to retry)
        assert [(i, n) for i, n in enumerate(ended) if n] == [(49, 6), (58, 1)] and failed_jobs == ended
        assert (ended_total, failed_total, dead) == ("7", "7", "+2 → 2")
        assert queues["webhooks"] == ([0] * 60, "0", [0] * 60, "0", "0")
        clock.advance(60)
        app.tick()  # the lateness and the alerts' ages count on between reads
        assert rows(app, "#schedule-rows")["stuck-import"][4] == "⚠ 2m 5s"
        assert "since 08:59, 1m  newest run failed" in next(line for line in alert_lines(app) if "flaky-export" in line)
        assert notes.seen == []


async def test_seven_lists_the_instances_and_flags_a_member_that_stands_down_for_its_clock(store_url: str) -> None:  # noqa: F811
    await add_clock_off(store_url)  # web-2 agrees with the database's clock; web-3 is a minute behind it
    async with console(store_url, size=(80, 24)) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        assert app.query_one("#instances-title", Line).content.plain == "INSTANCES 3 · 1 standing down: clock off"
        lines = [line.content for line in app.query(".instance").results(Line) if line.display]
        assert [columns(line.plain) for line in lines] == [
            ["web-3", "firing", "2s ago", "-", "-61.2s ✗ off", "takes no work"],  # trouble first
            ["web-2", "firing", "0s ago", "1s ago", "+4ms"],
            ["console", "observer", "0s ago", "-", "-"],  # this console: not measured (SQLite)
        ]
        off = lines[0]
        flagged = off.plain.index("-61.2s")
        assert any(span.start <= flagged < span.end and "text-error" in str(span.style) for span in off.spans), off.spans
        assert all(line.cell_length <= 78 for line in lines)  # 80 columns, less the padding
        # Who fires: web-3 beats but takes no work, and the header says so.
        assert app.fleet is not None and [i.name for i in app.fleet.firing] == ["web-2"]
        assert [i.name for i in app.fleet.standing_down] == ["web-3"]
        assert "✗ 1 clock off" in app.query_one(ConsoleHeader).render().plain
        clock.advance(5)
        app.tick()  # the ages count on between reads
        assert columns(next(app.query(".instance").results(Line)).content.plain)[2] == "7s ago"
        assert notes.seen == []


def columns(text: str) -> list[str]:
    return re.split(r"\s{2,}", text.strip())


def test_sparkline_levels_start_from_zero() -> None:
    assert levels([3, 3, 3, 3], 4) == [7, 7, 7, 7]  # steady: full bars, not the bottom line
    assert levels([0, 1, 0, 8], 4) == [0, 2, 0, 7]  # one failure stands out from none
    assert levels([0, 0, 0], 3) == [0, 0, 0]
    assert levels([1, 0, 0, 0, 0, 2], 3) == [4, 0, 7]  # a cell shows its busiest minute
    assert levels([5], 3) == [7, 7, 7] and levels([], 2) == [0, 0] and levels([1], 0) == []


async def test_a_remote_console_gets_the_view_over_the_api(store_url: str) -> None:  # noqa: F811
    await filled(store_url)
    async with console(store_url, size=(120, 40)) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        embedded = rows(app, "#schedule-rows"), rows(app, "#queue-rows"), alert_lines(app)
    server = console_backend(store_url)
    await server.connect()
    remote = RemoteBackend("http://schedtui.test", TOKEN, transport=httpx.ASGITransport(app=create_app(server, token=TOKEN)))
    try:
        async with console(store_url, backend=remote, size=(120, 40), live_events=False) as (app, pilot, clock, notes):
            await pilot.press("7")
            await settle(pilot)
            assert app.info is not None and app.info.kind == "remote" and app.active_view_id == "health"
            assert (rows(app, "#schedule-rows"), rows(app, "#queue-rows"), alert_lines(app)) == embedded
            assert notes.seen == []
    finally:
        await server.close()


class OlderServer:
    """A backend that offers only ``systems`` (a server of an older version)."""

    def __init__(self, inner: Any, systems: tuple[str, ...]) -> None:
        self.inner = inner
        self.systems = systems
        self.read_only = inner.read_only

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def connect(self) -> ConnectionInfo:
        info: ConnectionInfo = await self.inner.connect()
        return dataclasses.replace(info, systems=self.systems)


async def test_a_server_without_the_health_system_is_not_asked(store_url: str) -> None:  # noqa: F811
    older = OlderServer(console_backend(store_url), ("schedules", "jobs", "durable", "locks", "audit"))
    async with console(store_url, backend=older) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        assert app.active_view_id == "schedules"
        assert notes.titled("Not available") == ["Health: this backend does not offer health."]
        assert ("health", "7", "Health", False) in app.query_one("#tabs", ViewTabs).tabs


async def test_health_without_alerts_says_the_server_keeps_none(store_url: str) -> None:  # noqa: F811
    await add_alerts(store_url)
    older = OlderServer(console_backend(store_url), ("schedules", "jobs", "durable", "locks", "audit", "health"))
    async with console(store_url, backend=older) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        assert app.active_view_id == "health"
        assert app.query_one("#alerts-title", Line).content.plain == "ALERTS · this server keeps none (an older schedtui)"
        assert alert_lines(app) == [] and notes.seen == []


async def test_rows_are_kept_between_refreshes_and_capped(store_url: str, monkeypatch: Any) -> None:  # noqa: F811
    from console.views import health

    monkeypatch.setattr(health, "MAX_ROWS", 3)
    await filled(store_url)
    async with console(store_url) as (app, pilot, clock, notes):
        await pilot.press("7")
        await settle(pilot)
        drawn = list(app.query_one("#schedule-rows").query_children(HealthRow))
        assert [row.cells[0].plain for row in drawn] == ["flaky-export", "stuck-import", "daily-digest"]
        more = app.query_one("#schedules-more", Line)
        assert more.display and more.content.plain == "… and 4 more schedules, none with more failures or later than these"
        assert not app.query_one("#queues-more", Line).display  # three queues: all drawn
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert list(app.query_one("#schedule-rows").query_children(HealthRow)) == drawn  # redrawn, not made again


def test_an_instance_line_shows_every_age_whole_and_fits_80_columns() -> None:
    """A silent member is when an operator looks: its heartbeat's age must read whole."""
    now = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    beat = now - timedelta(minutes=59, seconds=59) - timedelta(seconds=61.2)  # (stamped by its clock, a minute behind)
    silent = InstanceInfo("ip-10-0-1-23:4821", "h", 1, beat, now - timedelta(minutes=12, seconds=57),
                          role="firing", clock_offset_s=-61.2, clock_off=True)  # fmt: skip
    line = instance_text(silent, now).plain
    assert "59m 59s ago" in line and "12m 57s ago" in line and "-61.2s ✗ off" in line and "takes no work" in line
    assert len(line) <= 77  # (with the view's left padding and its scroll bar: 80)


def test_an_instance_silent_past_the_take_over_window_is_shown_gone_not_firing() -> None:
    # A killed or crashed instance stays registered (only a clean stop removes its row): it
    # was listed "firing" for as long as its row stayed.
    now = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    killed = InstanceInfo("web-1:4242", "h", 1, now - timedelta(minutes=33), role="firing")
    alive = InstanceInfo("web-2:77", "h", 2, now - timedelta(seconds=5), role="firing")
    assert instance_text(killed, now).plain.split()[:3] == ["web-1:4242", "✗", "gone"]
    assert instance_text(alive, now).plain.split()[:2] == ["web-2:77", "firing"]
    # An observer (this console, a verb) registers once and never beats: its age says nothing.
    watching = InstanceInfo("ops:9633", "h", 3, now - timedelta(minutes=33), role="observer")
    assert instance_text(watching, now).plain.split()[:2] == ["ops:9633", "observer"]


@pytest.mark.parametrize(
    ("count", "shown"),
    [(0, "0"), (99_999, "99999"), (100_000, "100k"), (525_902, "526k"), (999_500, "1.0M"), (12_345_678, "12M")],
)
def test_an_hours_total_fits_its_column_with_a_space_before_it(count: int, shown: str) -> None:
    """A total of 525,902 ran into its sparkline (``█▄525902``): the column is six cells."""
    from console.views.health import _counted

    assert _counted(count) == shown and len(shown) < HealthRow.TOTAL


@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_every_conditions_name_stands_apart_from_its_subject(condition: Condition) -> None:
    """``instance_lost`` is longer than the column was: ``▲ instance_lostbeta``."""
    now = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    alert = Alert(f"{condition}:beta", condition, "instance", "beta", "firing", now, "why", now, "01KJPS22WGWA546BHC0B9HDTBJ")
    text = alert_text(alert, now, "UTC").plain
    assert re.match(rf"▲ {condition} +beta +since 08:00", text), text
