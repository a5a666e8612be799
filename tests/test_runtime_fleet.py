"""Schedules created at run time across two real ``schedtui serve`` processes on one real
PostgreSQL database, on the real clock: a create, an update and a delete made on one
instance take effect on the other within 2 s, no slot fires twice or goes missing across
the changes, and the audit log names the token that acted. Tests wait by polling."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.servers import Server, poll, start_server
from tests.test_cli import write_tree

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SECRET = "fleet-secret"
DEFINITIONS = {
    "schedules/work.jobs.py": """
        from backend import define_queue

        async def work(job):
            pass

        work = define_queue(name="work", handler=work)
    """,
    "schedules/tick.cron.py": """
        from backend import define_schedule

        async def tick(ctx):
            pass

        tick = define_schedule(name="tick", cron="* * * * * *", timezone="UTC", handler=tick)
    """,
}


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[tuple[Server, Server]]:
    write_tree(tmp_path, DEFINITIONS)
    servers = [
        start_server(tmp_path, "--schedules", "schedules", "--store", pg_url, "--instance", name, "--token", f"{name}-op={SECRET}")
        for name in ("a", "b")
    ]
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


def views(server: Server) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{server.url}/inspect/schedules", headers={"Authorization": f"Bearer {SECRET}"}, timeout=5)
    return {s["name"]: s for s in answer.json()["schedules"]}


def slots(url: str, name: str) -> list[datetime]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT scheduled_at, status FROM schedtui_runs WHERE name = %s AND trigger = 'self' ORDER BY scheduled_at", (name,)
        ).fetchall()
    assert {status for _, status in rows} <= {"succeeded", "running"}, rows
    return [row[0] for row in rows]


def test_create_update_delete_reach_both_instances_within_two_seconds(pair: tuple[Server, Server], pg_url: str) -> None:
    a, b = pair
    auth = {"Authorization": f"Bearer {SECRET}"}
    with httpx.Client(headers=auth, timeout=10) as http:
        made = http.post(f"{a.url}/inspect/schedules",
                         json={"name": "rt", "cron": "*/2 * * * * *", "timezone": "UTC", "queue": "work"})
        assert made.status_code == 201, made.text
        poll(lambda: "rt" in views(b), timeout=2.0, what="b arms the created schedule")
        poll(lambda: len(slots(pg_url, "rt")) >= 2, timeout=15, what="two slots of the created schedule")

        changed = http.patch(f"{b.url}/inspect/schedules/rt", json={"cron": "*/3 * * * * *"})
        assert changed.status_code == 200, changed.text
        updated = time.time()
        poll(lambda: views(a)["rt"]["cron"] == "*/3 * * * * *", timeout=2.0, what="a re-arms the updated schedule")
        poll(lambda: sum(s.timestamp() > updated + 2 for s in slots(pg_url, "rt")) >= 2, timeout=20,
             what="two slots of the new definition")

        assert http.delete(f"{a.url}/inspect/schedules/rt").status_code == 200
        poll(lambda: "rt" not in views(b), timeout=2.0, what="b stops the deleted schedule")
        stopped = datetime.now().astimezone()
        # Time passes by the code schedule's own runs (one a second), not a sleep.
        poll(lambda: sum(s > stopped + timedelta(seconds=1) for s in slots(pg_url, "tick")) >= 3, timeout=20,
             what="three more ticks after the delete")

        fired = slots(pg_url, "rt")
        assert [s for s, n in Counter(fired).items() if n > 1] == [], "a slot fired twice"
        assert all(s <= stopped for s in fired), "a run after the delete"
        gaps = [(later - earlier).total_seconds() for earlier, later in zip(fired, fired[1:], strict=False)]
        assert all(gap in (1, 2, 3) for gap in gaps), fired  # none lost under either definition
        before = [s for s in fired if s.timestamp() <= updated - 1]
        assert all(s.second % 2 == 0 for s in before)
        after = [s for s in fired if s.timestamp() > updated + 2]
        assert after and all(s.second % 3 == 0 for s in after)

        entries = http.get(f"{a.url}/inspect/audit", params={"limit": 20}).json()["entries"]
        mine = [(e["action"], e["actor"]) for e in entries if e["target"] == "rt"]
        assert mine == [("schedule.delete", "a-op"), ("schedule.update", "b-op"), ("schedule.create", "a-op")]
    for server in pair:
        text = server.log_text()
        assert "Traceback" not in text, text
