"""Bad input to a real ``schedtui serve`` on SQLite and on PostgreSQL: each request a fuzzing
client (or an attacker) once turned into a 500, or that was taken when it should not have
been, is a 4xx naming the value, and writes nothing. Text no store can keep (a NUL, a lone
surrogate, a control character) is refused in every text field of every route."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import Server, start_server, store_for

OPERATE = "op-input-token"
SCHEDULES = """
    from backend import define_schedule

    async def work(ctx):
        pass

    berlin = define_schedule(name="berlin", cron="0 * * * *", timezone="Europe/Berlin", handler=work)
"""
SYSTEMS = """
    from backend import define_durable, define_queue

    async def deliver(job):
        pass

    async def flow(ctx, input):
        pass

    mail = define_queue(name="mail", handler=deliver)
    flow = define_durable(name="flow", handler=flow)
"""
#: An id no execution has: a signal is checked before the execution is looked up.
SOME_ID = "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"
SCHEDULE = {"name": "made", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail"}
DEEP = 20_000  # 40 KB: under the body limit, far past any recursion limit

CASES: list[tuple[str, str, str, dict[str, Any], int, str | None, str]] = [
    ("deeply nested JSON", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": ' + b"[" * DEEP + b"]" * DEEP + b"}"}, 422, "body", "nested too deeply"),
    ("a body in UTF-16", "POST", "/inspect/schedules/berlin/disable",
     {"content": '{"note": "x"}'.encode("utf-16")}, 422, "body", "not valid JSON"),
    ("a NUL in a note", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": "on call\\u0000"}'}, 422, "note", "\\x00"),
    ("a lone surrogate in a note", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": "half \\ud800 a pair"}'}, 422, "note", "\\ud800"),
    ("an escape sequence in a note", "POST", "/inspect/schedules/berlin/disable",
     {"json": {"note": "\x1b[2J"}}, 422, "note", "\\x1b"),
    ("a NUL run id", "GET", "/inspect/runs/%00", {}, 404, None, 'no run with id "\\x00"'),
    ("a NaN token", "POST", "/inspect/locks/x/release", {"content": b'{"if_token": NaN}'}, 422, "if_token",
     "if_token NaN is not a number"),  # (it said "out of range")
    ("an external fire without its trigger", "POST", "/schedule/berlin/fire", {}, 422, "trigger",
     "trigger is required here (use trigger=external)"),  # (it said: trigger "None" is not supported here)
    ("a slash too many", "POST", "/inspect/schedules/berlin/disable/", {}, 404, None,
     "no route /inspect/schedules/berlin/disable/"),  # (it was a 307 to the route, before the token's check)
    # (a newline matches no route; the 404 named another lock's, "/inspect/locks/ab/release")
    ("a newline in a lock name", "POST", "/inspect/locks/a%0Ab/release", {}, 404, None,
     "no route /inspect/locks/a\\nb/release (a path holds no control character)"),
    ("a NUL backfill id", "GET", "/inspect/backfills/%00", {}, 404, None, 'no backfill with id "\\x00"'),
    ("a NUL before", "GET", "/inspect/schedules/runs", {"params": {"name": "berlin", "before": "\x00"}}, 422,
     "before", 'before "\\x00"'),
    ("a before that is no run id", "GET", "/inspect/schedules/runs", {"params": {"name": "berlin", "before": "zz"}},
     422, "before", 'before "zz"'),
    ("from a billion days ago", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "-999999999d", "to": "now"}}, 422, "from", '"-999999999d" is out of range'),
    # int() refuses past 4300 digits: such a number was a 500.
    ("from five thousand digits of days ago", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "-" + "9" * 5000 + "d", "to": "now"}}, 422, "from", "is out of range"),
    ("a cron minute of five thousand digits", "POST", "/inspect/schedules",
     {"json": {**SCHEDULE, "cron": "9" * 5000 + " * * * *"}}, 422, "cron", "out of range (0-59)"),
    ("a cron step of five thousand digits", "POST", "/inspect/schedules",
     {"json": {**SCHEDULE, "cron": "*/" + "9" * 5000 + " * * * *"}}, 422, "cron", "is too large"),
    ("an Arabic-Indic digit in an offset", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "-\u0663d", "to": "now"}}, 422, "from", "is not a time"),  # (Python's \d is any script's)
    ("from year 1 in Berlin", "POST", "/inspect/schedules/berlin/backfill",
     {"json": {"from": "0001-01-01", "to": "now"}}, 422, "from", '"0001-01-01" is out of range'),
    ("to year 9999", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "-1d", "to": "9999-12-31T23:00Z"}}, 422, "to", '"9999-12-31T23:00Z" is out of range'),
    # Text no store can keep, in every kind of field (as a JSON body carries it: escaped).
    ("a lone surrogate in a key to cancel by", "POST", "/inspect/queues/mail/cancel",
     {"content": b'{"key": "a\\ud800"}'}, 422, "key", "\\ud800"),
    ("a NUL in a key to cancel by", "POST", "/inspect/queues/mail/cancel", {"json": {"key": "a\x00"}}, 422, "key", "\\x00"),
    ("a lone surrogate in a job's key", "POST", "/inspect/queues/mail/jobs",
     {"content": b'{"key": "k\\udcff"}'}, 422, "key", "\\udcff"),
    ("a NUL in a job's payload", "POST", "/inspect/queues/mail/jobs",
     {"content": b'{"payload": {"to": "x\\u0000"}}'}, 422, "payload", "NUL"),
    ("a lone surrogate in a durable input", "POST", "/inspect/durable/flow/start",
     {"content": b'{"input": ["\\ud800"]}'}, 422, "input", "lone surrogate (\\ud800)"),
    ("a NUL in a durable input's key", "POST", "/inspect/durable/flow/start",
     {"content": b'{"input": {"k\\u0000": 1}}'}, 422, "input", "NUL"),
    ("a NUL in a signal's payload", "POST", f"/inspect/durable/executions/{SOME_ID}/signal/go",
     {"content": b'{"payload": "ok\\u0000"}'}, 422, "payload", "NUL"),
    ("a lone surrogate in a signal's payload", "POST", f"/inspect/durable/executions/{SOME_ID}/signal/go",
     {"content": b'{"payload": "\\udfff"}'}, 422, "payload", "lone surrogate (\\udfff)"),
    ("a lone surrogate in a schedule's payload", "POST", "/inspect/schedules",
     {"content": b'{"name": "made", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail", "payload": "\\ud800"}'},
     422, "payload", "lone surrogate (\\ud800)"),
    ("a NUL in a schedule's description", "POST", "/inspect/schedules",
     {"json": {**SCHEDULE, "description": "nightly\x00"}}, 422, "description", "\\x00"),
    ("an escape sequence in a schedule's description", "POST", "/inspect/schedules",
     {"json": {**SCHEDULE, "description": "\x1b[2J"}}, 422, "description", "\\x1b"),
    ("a lone surrogate in a schedule's timezone", "POST", "/inspect/schedules",
     {"content": b'{"name": "made", "cron": "0 * * * *", "timezone": "UTC\\ud800", "queue": "mail"}'},
     422, "timezone", "\\ud800"),
    ("a NUL in a schedule's cron", "POST", "/inspect/schedules", {"json": {**SCHEDULE, "cron": "0 * * * *\x00"}},
     422, "cron", "\\x00"),
    ("a NUL inside a backfill's time", "POST", "/inspect/schedules/berlin/backfill/plan",
     {"json": {"from": "2026-01-01T00:00\x00Z", "to": "now"}}, 422, "from", "\\x00"),
    ("a NUL inside a window's time", "GET", "/inspect/runs",
     {"params": {"name": "berlin", "from": "2026-01-01T00:00\x00Z", "to": "2026-01-02T00:00Z"}}, 422, "from", "\\x00"),
    # A window's times within 1970 … 8999, as every other time (year 1 and 9999 were taken).
    ("a window from year 1", "GET", "/inspect/runs",
     {"params": {"name": "berlin", "from": "0001-01-01T00:00:00Z", "to": "2026-01-02T00:00Z"}}, 422, "from",
     'from "0001-01-01T00:00:00Z" is out of range (1970 to 8999)'),
    ("a window to year 9999", "GET", "/inspect/runs",
     {"params": {"name": "berlin", "from": "2026-01-01T00:00Z", "to": "9999-12-31T23:59:59Z"}}, 422, "to",
     "is out of range (1970 to 8999)"),
    ("a window from an instant before year 1", "GET", "/inspect/runs",
     {"params": {"name": "berlin", "from": "0001-01-01T00:00:00+00:01", "to": "2026-01-02T00:00Z"}}, 422, "from",
     "is out of range (1970 to 8999)"),
    # Fields a route does not know are refused, not ignored.
    ("a misspelt durable input", "POST", "/inspect/durable/flow/start", {"json": {"inpt": 1}}, 422, "inpt", '"inpt"'),
    ("a misspelt signal payload", "POST", f"/inspect/durable/executions/{SOME_ID}/signal/go",
     {"json": {"payloadx": True}}, 422, "payloadx", '"payloadx"'),
    ("a misspelt note", "POST", "/inspect/schedules/berlin/disable", {"json": {"notes": "x"}}, 422, "notes", '"notes"'),
    ("a misspelt backfill field", "POST", "/inspect/schedules/berlin/backfill",
     {"json": {"from": "-1h", "to": "now", "confrim": True}}, 422, "confrim", '"confrim"'),
    # So are query parameters: a misspelt filter ignored listed everything as if filtered.
    ("a misspelt status filter", "GET", "/inspect/queues/mail/jobs", {"params": {"stauts": "dead"}}, 422, "stauts",
     'unknown query parameter(s) "stauts" (known: '),
    ("a query parameter given twice", "GET", "/inspect/queues/mail/jobs",
     {"params": [("status", "queued"), ("status", "dead")]}, 422, "status", "status is given 2 times"),
    ("a query parameter on a route that takes none", "POST", "/inspect/schedules/berlin/disable",
     {"params": {"note": "x"}, "json": {}}, 422, "note", "(it takes none)"),
    # Numbers in ASCII digits only: int() would read other scripts' digits, and 1_0.
    ("an Arabic-Indic digit as a limit", "GET", "/inspect/audit", {"params": {"limit": "\u0663"}}, 422, "limit",
     "is not a whole number"),
    ("a digit separator in a limit", "GET", "/inspect/queues/mail/jobs", {"params": {"limit": "1_0"}}, 422, "limit",
     '"1_0" is not a whole number'),
    # A route that takes no body refuses one (a field, bad JSON): it acted as if none was sent.
    ("a field sent to fire", "POST", "/inspect/schedules/berlin/fire", {"json": {"dry_run": True}}, 422, "dry_run",
     'unknown field(s) "dry_run" (it takes none)'),
    ("bad JSON sent to fire", "POST", "/inspect/schedules/berlin/fire", {"content": b"{this is not json"}, 422, "body",
     "not valid JSON"),
    ("a field sent to pause a queue", "POST", "/inspect/queues/mail/pause", {"json": {"dry_run": True}}, 422, "dry_run",
     '"dry_run"'),
    ("a field sent to delete a schedule", "DELETE", "/inspect/schedules/berlin", {"json": {"dry_run": True}}, 422,
     "dry_run", '"dry_run"'),
    # A key given twice: the last was kept, the first lost unsaid.
    ("a note given twice", "POST", "/inspect/schedules/berlin/disable",
     {"content": b'{"note": "INC-412 vendor outage", "note": ""}'}, 422, "note", 'gives the key "note" twice'),
    ("a key given twice in a job's payload", "POST", "/inspect/queues/mail/jobs",
     {"content": b'{"payload": {"order": 1, "order": 2}}'}, 422, "order", 'gives the key "order" twice'),
    ("a schedule's name given twice", "POST", "/inspect/schedules",
     {"content": b'{"name": "a", "cron": "0 * * * *", "timezone": "UTC", "queue": "mail", "name": "b"}'}, 422, "name",
     'gives the key "name" twice'),
    # A number of thousands of digits is out of range, as any other (int() refuses past 4,300).
    ("a limit of five thousand digits", "GET", "/inspect/audit", {"params": {"limit": "9" * 5000}}, 422, "limit",
     "is out of range (1-"),
    ("a limit of minus five thousand digits", "GET", "/inspect/queues/mail/jobs", {"params": {"limit": "-" + "9" * 5000}},
     422, "limit", "is out of range (1-"),
    # An empty before is no id (the schema's pattern says so), not "no before".
    *((f"an empty before of {path}", "GET", path, {"params": {**params, "before": ""}}, 422, "before", 'before ""')
      for path, params in (("/inspect/schedules/runs", {"name": "berlin"}), ("/inspect/queues/mail/jobs", {}),
                           ("/inspect/durable/executions", {}), ("/inspect/audit", {}))),
]  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp(f"input-{request.param}")
    (root / "schedules").mkdir()
    (root / "schedules" / "berlin.cron.py").write_text(textwrap.dedent(SCHEDULES))
    (root / "schedules" / "systems.jobs.py").write_text(textwrap.dedent(SYSTEMS))
    store = store_for(request, root, "input")
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
        assert_nothing_written(client)


def assert_nothing_written(client: httpx.Client) -> None:
    """Every case is refused: the schedule is still enabled and has not fired, and no
    schedule, job, execution or audit entry was made."""
    [schedule] = client.get("/inspect/schedules").json()["schedules"]
    assert (schedule["name"], schedule["enabled"], schedule["last_run"]) == ("berlin", True, None)
    assert client.get("/inspect/queues/mail/jobs").json()["jobs"] == []
    assert client.get("/inspect/durable/executions").json()["executions"] == []
    assert client.get("/inspect/audit").json()["entries"] == []


@pytest.mark.parametrize(("start", "end"), [("02:00", "03:00"), ("02:30", "04:00"), ("01:59", "03:00")])
def test_a_backfill_from_a_time_of_the_skipped_hour_holds_its_slot(server: Server, start: str, end: str) -> None:
    """The night spring skips 02:00-03:00 in Berlin, the skipped 02:00 slot of an hourly
    schedule fires as the gap ends; a range (from, to] starting in the gap was "empty
    range: from equals to", or held no slot, where the same range any other night holds one."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}, timeout=30) as op:
        plan = op.post("/inspect/schedules/berlin/backfill/plan",
                       json={"from": f"2026-03-29T{start}", "to": f"2026-03-29T{end}"})  # fmt: skip
        assert plan.status_code == 200, plan.text
        assert (plan.json()["count"], plan.json()["first"]) == (1 + (end == "04:00"), "2026-03-29T01:00:00Z")


def test_every_method_of_a_path_is_allowed(server: Server) -> None:
    """A method a URL is not served with is 405 with every method it is served with, also
    where several routes serve it (POST and GET /inspect/schedules; PATCH of a schedule
    named "runs" and GET /inspect/schedules/runs)."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {OPERATE}"}, timeout=30) as client:
        paths = client.get("/openapi.json").json()["paths"]
        for path in paths:
            url = re.sub(r"{\w+}", "x", path)
            response = client.request("OPTIONS", url)
            assert response.status_code == 405, (path, response.text)
            allowed = {
                method.upper()
                for other, operations in paths.items()
                if re.fullmatch(re.sub(r"{\w+}", "[^/]+", other), url)
                for method in [*operations, *(["head"] if "get" in operations else [])]
            }
            assert set(response.headers["allow"].split(", ")) == allowed, (path, response.headers["allow"])
        assert_nothing_written(client)
