"""The HTTP API of a real ``schedtui serve``: statuses, tokens, limits, the external trigger,
and the CLI's remote mode against it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.api.app import MAX_BODY_BYTES
from backend.client.interface import SYSTEMS
from tests.servers import Server, cli_env, start_server

OPERATE, READ = "op-token-123", "read-token-456"

SCHEDULES = {
    "report.cron.py": """
        from backend import define_schedule

        async def work(ctx):
            pass

        report = define_schedule(name="report", cron="0 * * * *", timezone="UTC", handler=work)
    """,
    # Every minute, external: a call is always within a minute of its slot.
    "ext.cron.py": """
        from backend import define_schedule
        from pathlib import Path

        def mark(ctx):
            with open("external-calls.txt", "a") as f:
                f.write(ctx.scheduled_at.isoformat() + " " + ctx.trigger + "\\n")

        ext = define_schedule(name="ext", cron="* * * * *", timezone="UTC", handler=mark, trigger="external")
    """,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("api")
    (root / "schedules").mkdir()
    for name, text in SCHEDULES.items():
        (root / "schedules" / name).write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    srv = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{root / 'state.db'}",
                       "--token", OPERATE, "--read-token", READ)
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert OPERATE not in srv.log_text() and READ not in srv.log_text()


def client(server: Server, token: str | None = OPERATE) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=10)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body["error"]) >= {"code", "message"}, body
    error: dict[str, Any] = body["error"]
    return error


def test_healthz_needs_no_token_and_shows_no_secret(server: Server, root: Path) -> None:
    response = client(server, None).get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"
    body = response.json()
    assert body["store"] == {"kind": "sqlite", "state": "ok", "error": None, "waiting": body["store"]["waiting"], "since": None}
    (me,) = [i for i in body["instances"] if i["name"] == body["instance"]]
    assert me["pid"] == server.process.pid and 0 <= me["heartbeat_age_s"] < 60
    assert str(root) not in response.text and OPERATE not in response.text and READ not in response.text


@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_no_or_wrong_token_is_401(server: Server, token: str | None) -> None:
    response = client(server, token).get("/inspect/schedules")
    assert response.status_code == 401 and error_of(response)["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"


def test_read_token_reads_but_may_not_act(server: Server) -> None:
    reader = client(server, READ)
    assert reader.get("/inspect/schedules").status_code == 200
    assert reader.get("/inspect/info").json()["access"] == "read"
    for path in ("/inspect/schedules/report/fire", "/inspect/schedules/report/disable", "/schedule/ext/fire?trigger=external"):
        response = reader.post(path)
        assert response.status_code == 403, path
        assert error_of(response)["code"] == "forbidden"


def test_a_server_with_tokens_refuses_what_a_web_page_sent_and_takes_any_host(server: Server) -> None:
    """A proxy that adds the token for a browser's user would make it ambient: a page's
    request is refused even with one. Any Host is fine: the token is what is checked."""
    op = client(server)
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        response = op.post("/inspect/schedules/report/disable", headers=headers)
        assert response.status_code == 403 and error_of(response)["code"] == "forbidden", response.text
    [report] = [s for s in op.get("/inspect/schedules").json()["schedules"] if s["name"] == "report"]
    assert report["enabled"]
    assert op.get("/inspect/info", headers={"Host": "schedtui.example.com"}).status_code == 200


def test_schedules_and_runs(server: Server) -> None:
    op = client(server)
    body = op.get("/inspect/schedules").json()
    assert set(body) == {"coordination", "instance", "now", "schedules"}
    names = [s["name"] for s in body["schedules"]]
    assert names == ["ext", "report"]
    fired = op.post("/inspect/schedules/report/fire")
    assert fired.status_code == 202
    run_id = fired.json()["run_id"]
    page = op.get("/inspect/schedules/runs", params={"name": "report", "limit": 10}).json()
    assert set(page) == {"runs", "next_before"} and page["runs"][0]["id"] == run_id
    assert set(page["runs"][0]) == {
        "id", "name", "scheduled_at", "fired_at", "finished_at", "status", "trigger",
        "coordination_outcome", "instance", "error_tag", "error_message", "duration_ms", "traceback",
    }
    assert op.get(f"/inspect/runs/{run_id}").json()["trigger"] == "manual"


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "field"),
    [
        ("GET", "/inspect/schedules/runs", {"params": {"name": "nope"}}, 404, None),
        ("GET", "/inspect/schedules/runs", {}, 422, "name"),
        ("GET", "/inspect/schedules/runs", {"params": {"name": "report", "limit": "abc"}}, 422, "limit"),
        ("GET", "/inspect/schedules/runs", {"params": {"name": "report", "limit": "0"}}, 422, "limit"),
        ("POST", "/inspect/schedules/nope/fire", {}, 404, None),
        ("GET", "/inspect/runs/nope", {}, 404, None),
        ("GET", "/inspect/backfills/nope", {}, 404, None),
        ("GET", "/no/such/route", {}, 404, None),
        ("DELETE", "/inspect/schedules", {}, 405, None),
        ("POST", "/inspect/schedules/report/backfill", {"content": b"{not json"}, 422, "body"),
        ("POST", "/inspect/schedules/report/backfill", {"json": [1, 2]}, 422, "body"),
        ("POST", "/inspect/schedules/report/backfill", {"json": {"to": "now"}}, 422, "from"),
        ("POST", "/inspect/schedules/report/backfill", {"json": {"from": "yesterday", "to": "now"}}, 422, "from"),
        ("POST", "/inspect/schedules/report/backfill", {"json": {"from": "-2h", "to": "now", "confirm": "yes"}}, 422, "confirm"),
        ("POST", "/inspect/schedules/report/backfill", {"json": {"from": "-2h", "to": "now", "limit": 20000}}, 422, "limit"),
        ("POST", "/inspect/schedules/report/disable", {"json": {"note": 5}}, 422, "note"),
        ("POST", "/schedule/ext/fire", {"params": {"trigger": "self"}}, 422, "trigger"),
    ],
)
def test_bad_requests_get_the_right_status(
    server: Server, method: str, path: str, kwargs: dict[str, Any], status: int, field: str | None
) -> None:
    response = client(server).request(method, path, **kwargs)
    assert response.status_code == status, response.text
    error = error_of(response)
    if field:
        assert error["field"] == field
    assert "Traceback" not in response.text


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"from": 1764547200, "to": "now"}, '"from" 1764547200 is not a time: give a string, an ISO 8601 time'),
        ({"from": "-2h", "to": {"at": "now"}}, '"to" {"at": "now"} is not a time'),
        ({"from": "-2h", "to": "now", "limit": 5.0}, "limit 5.0 is not a whole number (1-10,000)"),
        ({"from": "-2h", "to": "now", "limit": True}, "limit True is not a whole number (1-10,000)"),
    ],
)
def test_a_value_of_the_wrong_kind_is_named_as_such_not_as_missing_or_out_of_range(
    server: Server, body: dict[str, Any], said: str
) -> None:
    """A time given as a number was told it was "required"; 5.0 and true, that they were out
    of a range they are inside."""
    response = client(server).post("/inspect/schedules/report/backfill", json=body)
    assert response.status_code == 422, response.text
    assert said in error_of(response)["message"], error_of(response)


def test_a_body_over_the_limit_is_413(server: Server) -> None:
    big = b'{"note": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}'
    response = client(server).post("/inspect/schedules/report/disable", content=big)
    assert response.status_code == 413 and error_of(response)["code"] == "too_large"

    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"x" * 8192

    chunked = client(server).post("/inspect/schedules/report/disable", content=chunks())
    assert chunked.status_code == 413


def test_a_refused_backfill_is_409_with_count_and_reason(server: Server) -> None:
    response = client(server).post("/inspect/schedules/report/backfill", json={"from": "-3d", "to": "-1d"})
    assert response.status_code == 409
    body = response.json()
    assert (body["count"], body["reason"]) == (48, "needs confirmation")
    assert error_of(response)["code"] == "refused"


def test_backfill_runs_in_the_background(server: Server) -> None:
    op = client(server)
    plan = op.post("/inspect/schedules/report/backfill/plan", json={"from": "-5h", "to": "-1h"}).json()
    assert plan["ok"] and plan["count"] == 4
    started = op.post("/inspect/schedules/report/backfill", json={"from": "-5h", "to": "-1h"})
    assert started.status_code == 202
    body = started.json()
    assert body["plan"]["count"] == 4 and body["progress"]["total"] == 4
    progress = op.get(f"/inspect/backfills/{body['id']}").json()
    assert progress["id"] == body["id"] and progress["fired"] + progress["remaining"] == 4


def test_openapi_document(server: Server) -> None:
    assert client(server, None).get("/openapi.json").status_code == 401  # a read, as every route but /healthz
    doc = client(server, READ).get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in ("/inspect/schedules", "/inspect/schedules/runs", "/inspect/schedules/{name}/backfill", "/schedule/{name}/fire",
                 "/inspect/runs", "/inspect/instances", "/inspect/backfills/{backfill_id}/cancel"):
        assert path in doc["paths"], path
    assert "409" in str(doc["paths"]["/inspect/schedules/{name}/backfill"]["post"]["responses"])
    # Every path parameter is declared (schemathesis and code generators rely on it).
    for path, operations in doc["paths"].items():
        for operation in operations.values():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", path)), path


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/inspect/info", "/openapi.json", "/inspect/events"])
def test_a_route_without_query_parameters_refuses_one(server: Server, path: str) -> None:
    """As every action's route: ``?stauts=x`` ignored would answer as if understood."""
    response = client(server, READ).get(path, params={"stauts": "x"})
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == "stauts" and '"stauts" (it takes none)' in error_of(response)["message"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "2026-01-01T00:00Z", "to": "2026-01-02T00:00Z"}, "name"),
        ({"name": "report", "to": "2026-01-02T00:00Z"}, "from"),
        ({"name": "report", "from": "yesterday", "to": "2026-01-02T00:00Z"}, "from"),
        ({"name": "report", "from": "2026-01-01T00:00", "to": "2026-01-02T00:00Z"}, "from"),  # no offset
        ({"name": "report", "from": "0001-01-01T00:00+05:00", "to": "2026-01-02T00:00Z"}, "from"),
        ({"name": "report", "from": "2026-01-02T00:00Z", "to": "2026-01-01T00:00Z"}, "from"),
        ({"name": "report", "from": "2026-01-01T00:00Z", "to": "2026-01-02T00:00Z", "limit_per_name": "0"}, "limit_per_name"),
    ],
)
def test_runs_in_a_window_refuse_bad_parameters_by_name(server: Server, params: dict[str, str], field: str) -> None:
    response = client(server, READ).get("/inspect/runs", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_runs_in_a_window_instances_and_cancel_with_each_token(server: Server) -> None:
    window = {"name": ["report", "ext"], "from": "2026-01-01T00:00Z", "to": "2999-01-01T00:00Z"}
    read = client(server, READ)
    runs = read.get("/inspect/runs", params=window)
    assert runs.status_code == 200 and set(runs.json()) == {"from", "to", "runs"}
    assert read.get("/inspect/runs", params={**window, "name": "nope"}).status_code == 404
    beats = read.get("/inspect/instances").json()
    assert beats["instances"]
    fields = {"name", "host", "pid", "heartbeat_at", "heartbeat_age_s", "last_fired_at", "role", "coordination",
              "clock_offset_s", "clock_off", "stands_down"}  # fmt: skip
    assert set(beats["instances"][0]) == fields
    assert read.post("/inspect/backfills/nope/cancel").status_code == 403
    assert client(server).post("/inspect/backfills/nope/cancel").status_code == 404
    assert read.get("/inspect/info").json()["systems"] == list(SYSTEMS)


def test_external_fire_dedupes_retries(server: Server, root: Path) -> None:
    op = client(server)
    first = op.post("/schedule/ext/fire", params={"trigger": "external"})
    assert first.status_code in (200, 202), first.text
    retry = op.post("/schedule/ext/fire", params={"trigger": "external"})
    if retry.json()["run"]["scheduled_at"] == first.json()["run"]["scheduled_at"]:
        assert retry.status_code == 200 and retry.json()["run_id"] == first.json()["run_id"]
        assert retry.json()["created"] is False
    run = first.json()["run"]
    assert (run["trigger"], run["coordination_outcome"]) == ("external", "external")
    refused = op.post("/schedule/report/fire", params={"trigger": "external"})
    assert refused.status_code == 409 and refused.json()["reason"] == "not an external schedule"


def run_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], cwd=cwd, env=cli_env(**env),
                          capture_output=True, text=True, timeout=60)


def test_cli_remote_mode(server: Server, root: Path) -> None:
    listed = run_cli("list", "--url", server.url, cwd=root, SCHEDTUI_TOKEN=READ)
    assert listed.returncode == 0 and "report" in listed.stdout
    denied = run_cli("fire", "report", "--url", server.url, cwd=root, SCHEDTUI_TOKEN=READ)
    assert denied.returncode == 1 and len(denied.stderr.strip().splitlines()) == 1 and "read" in denied.stderr
    fired = run_cli("fire", "report", "--json", "--url", server.url, cwd=root, SCHEDTUI_TOKEN=OPERATE)
    assert fired.returncode == 0, fired.stderr
    assert '"coordination_outcome": "manual"' in fired.stdout
    refused = run_cli("backfill", "report", "--from", "-3d", "--to", "-1d", "--url", server.url, cwd=root,
                      SCHEDTUI_TOKEN=OPERATE)  # fmt: skip
    assert refused.returncode == 3 and "48" in refused.stderr
    # The fleet's instances, read from the server (a read token is enough).
    table = run_cli("instances", "--url", server.url, cwd=root, SCHEDTUI_TOKEN=READ)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["NAME", "ROLE", "HEARTBEAT", "LAST", "START", "CLOCK"] and rows, table.stdout
    listed = json.loads(run_cli("instances", "--json", "--url", server.url, cwd=root, SCHEDTUI_TOKEN=READ).stdout)
    assert listed and all(i["clock_offset_s"] is None and i["stands_down"] is None for i in listed)  # (SQLite: unmeasured)
    assert {row.split()[0] for row in rows} == {i["name"] for i in listed}


def test_cli_unreachable_server_is_one_line(tmp_path: Path) -> None:
    result = run_cli("list", "--url", "http://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach http://127.0.0.1:9" in lines[0] and "Traceback" not in result.stderr


def test_serve_takes_an_ipv6_address_as_a_url_writes_it(root: Path) -> None:
    """``--host [::1]``, copied from a URL: it was taken for a name, judged not loopback,
    and refused (``refusing to listen on [::1] without a token``)."""
    from backend.api.server import is_loopback, listen_on
    from backend.errors import ListenError

    assert is_loopback("[::1]") and is_loopback("::1") and not is_loopback("[::]")
    try:
        sock = listen_on("[::1]", 0)
    except ListenError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    sock.close()
    server = start_server(root, "--schedules", "schedules", "--store", f"sqlite:///{root / 'v6.db'}", "--host", "[::1]")
    try:
        assert server.url.startswith("http://[::1]:")
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    finally:
        assert server.stop() == 0, server.log_text()


def test_serve_refuses_a_public_address_without_a_token(root: Path) -> None:
    result = run_cli(
        "serve", "--schedules", "schedules", "--store", f"sqlite:///{root / 'other.db'}", "--host", "0.0.0.0", "--port", "0", cwd=root
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in result.stderr
