"""Bad input to a real ``schedtui serve`` on SQLite and on PostgreSQL: each request a fuzzing
client once turned into a 500 is a 4xx naming the value, and loses nothing."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import Server, start_server

OPERATE = "op-input-token"
SCHEDULES = """
    from backend import define_schedule

    async def work(ctx):
        pass

    berlin = define_schedule(name="berlin", cron="0 * * * *", timezone="Europe/Berlin", handler=work)
"""
DEEP = 20_000  # 40 KB: under the body limit, far past any recursion limit

CASES: list[tuple[str, str, str, dict[str, Any], int, str | None, str]] = [
    ("deeply nested JSON", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": ' + b"[" * DEEP + b"]" * DEEP + b"}"}, 422, "body", "nested too deeply"),
    ("a NUL in a note", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": "on call\\u0000"}'}, 422, "note", "\\x00"),
    ("a lone surrogate in a note", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": "half \\ud800 a pair"}'}, 422, "note", "\\ud800"),
    ("an escape sequence in a note", "POST", "/inspect/schedules/berlin/disable",
     {"json": {"note": "\x1b[2J"}}, 422, "note", "\\x1b"),
    ("a NUL run id", "GET", "/inspect/runs/%00", {}, 404, None, 'no run with id "\\x00"'),
    ("a NUL backfill id", "GET", "/inspect/backfills/%00", {}, 404, None, 'no backfill with id "\\x00"'),
    ("a NUL before", "GET", "/inspect/schedules/runs", {"params": {"name": "berlin", "before": "\x00"}}, 422,
     "before", 'before "\\x00"'),
    ("a before that is no run id", "GET", "/inspect/schedules/runs", {"params": {"name": "berlin", "before": "zz"}},
     422, "before", 'before "zz"'),
    ("from a billion days ago", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "-999999999d", "to": "now"}}, 422, "from", '"-999999999d" is out of range'),
    ("from year 1 in Berlin", "POST", "/inspect/schedules/berlin/backfill",
     {"json": {"from": "0001-01-01", "to": "now"}}, 422, "from", '"0001-01-01" is out of range'),
    ("to year 9999", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "-1d", "to": "9999-12-31T23:00Z"}}, 422, "to", '"9999-12-31T23:00Z" is out of range'),
]  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp(f"input-{request.param}")
    (root / "schedules").mkdir()
    (root / "schedules" / "berlin.cron.py").write_text(textwrap.dedent(SCHEDULES))
    if request.param == "sqlite":
        store = f"sqlite:///{root / 'state.db'}"
    else:
        store = request.getfixturevalue("pg_server").create_database("input")
    srv = start_server(root, "--schedules", "schedules", "--store", store, "--token", OPERATE)
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()


@pytest.mark.parametrize(("what", "method", "path", "kwargs", "status", "field", "named"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_naming_the_value(
    server: Server, what: str, method: str, path: str, kwargs: dict[str, Any], status: int, field: str | None, named: str
) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}, timeout=30) as client:
        response = client.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert named in error["message"], error
        assert error.get("field") == field
        # Nothing changed: the schedule is still enabled, nothing was fired.
        schedule = client.get("/inspect/schedules").json()["schedules"][0]
        assert schedule["enabled"] and schedule["last_run"] is None
