"""The bounds against a real ``schedtui serve`` (SQLite) and the CLI, as an outside tester
met them: every out-of-range number and every null where none may be is a 422 naming the
field, nothing is written, and the server, its housekeeping and every CLI verb go on;
creates and deletes of one name at once answer 2xx or 4xx, never 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import Server, start_server
from tests.test_cli import Cli, create_store, write_tree
from tests.test_runtime_surfaces import DEFINITIONS, OPERATE

AUTH = {"Authorization": f"Bearer {OPERATE}", "content-type": "application/json"}
SPEC = '{"name": "big", "cron": "* * * * *", "timezone": "UTC", "queue": "mail"'


@pytest.fixture(scope="module")
def bounds_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    write_tree(root, DEFINITIONS)
    create_store(root / "state.db")
    return root


@pytest.fixture(scope="module")
def bounds_server(bounds_root: Path) -> Iterator[Server]:
    srv = start_server(bounds_root, "--schedules", "schedules", "--store", f"sqlite:///{bounds_root / 'state.db'}",
                       "--token", f"alice={OPERATE}")  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert "Traceback" not in srv.log_text(), srv.log_text()


# Written out as JSON text: 10**400 and 2**63 are integers no float can hold.
REFUSED_CREATES = [
    (SPEC + ', "max_runtime": 1e15}', "max_runtime"),
    (SPEC + ', "max_runtime": 3e11}', "max_runtime"),
    (SPEC + ', "max_runtime": 9223372036854775808}', "max_runtime"),
    (SPEC + ', "max_runtime": ' + "1" + "0" * 400 + "}", "max_runtime"),
    (SPEC + ', "alert": {"late": 99999999999999999}}', "alert"),
    (SPEC + ', "alert": {"disabled": 99999999999999999}}', "alert"),
    (SPEC + ', "enabled": null}', "enabled"),
    (SPEC + ', "on_overlap": null}', "on_overlap"),
]


async def test_out_of_range_and_null_fields_are_a_422_and_write_nothing(bounds_server: Server, bounds_root: Path) -> None:
    async with httpx.AsyncClient(base_url=bounds_server.url, headers=AUTH) as http:
        for body, field in REFUSED_CREATES:
            answer = await http.post("/inspect/schedules", content=body)
            assert answer.status_code == 422, (body[:80], answer.text)
            assert answer.json()["error"]["field"] == field, (body[:80], answer.text)
            assert len(answer.json()["error"]["message"]) < 300
        names = {s["name"] for s in (await http.get("/inspect/schedules")).json()["schedules"]}
        assert "big" not in names
        made = await http.post("/inspect/schedules", content=SPEC + "}")
        assert made.status_code == 201, made.text
        off = await http.post("/inspect/schedules/big/disable", json={"note": "incident 42"})
        assert off.status_code == 200, off.text
        for changes, field in [('{"enabled": null}', "enabled"), ('{"max_runtime": 1e15}', "max_runtime"),
                               ('{"backfill": null}', "backfill"), ('{"max_runtime": null}', "max_runtime"),
                               ('{"alert": {"late": 99999999999999999}}', "alert")]:  # fmt: skip
            answer = await http.patch("/inspect/schedules/big", content=changes)
            assert answer.status_code == 422 and answer.json()["error"]["field"] == field, (changes, answer.text)
        view = next(v for v in (await http.get("/inspect/schedules")).json()["schedules"] if v["name"] == "big")
        assert (view["enabled"], view["state_note"]["note"], view["max_runtime_s"]) == (False, "incident 42", 1800.0)
        for body, field in [('{"delay": ' + "1" + "0" * 400 + "}", "delay"), ('{"key": ""}', "key")]:
            answer = await http.post("/inspect/queues/mail/jobs", content=body)
            assert answer.status_code == 422 and answer.json()["error"]["field"] == field, (body[:40], answer.text)
        assert (await http.delete("/inspect/schedules/big")).status_code == 200
    cli = Cli(bounds_root)
    s = ("--schedules", "schedules")
    big = cli("schedules", "create", "big", "--cron", "* * * * *", "--timezone", "UTC", "--queue", "mail",
              "--max-runtime", "9223372036854775808", *s)  # fmt: skip
    assert big.returncode == 2 and big.stderr.count("\n") == 1, big
    assert "max_runtime 9.223372036854776e+18 " in big.stderr and "at most 604,800 (7 days)" in big.stderr  # (a float to the CLI)
    empty = cli("jobs", "send", "mail", "--key", "", *s)
    assert empty.returncode == 2 and empty.stderr == "schedtui: key is empty\n", empty
    assert cli("list", *s).returncode == 0  # every verb still works


async def test_creates_and_deletes_of_one_name_at_once_are_never_a_500(bounds_server: Server) -> None:
    body = json.dumps({"name": "race", "cron": "* * * * *", "timezone": "UTC", "queue": "mail"})
    statuses: set[int] = set()
    async with httpx.AsyncClient(base_url=bounds_server.url, headers=AUTH, timeout=30) as http:
        for _ in range(15):
            answers = await asyncio.gather(
                *(http.post("/inspect/schedules", content=body) for _ in range(3)),
                *(http.delete("/inspect/schedules/race") for _ in range(3)),
            )
            for answer in answers:
                assert answer.status_code < 500, answer.text
                statuses.add(answer.status_code)
        await http.delete("/inspect/schedules/race")
    assert statuses <= {200, 201, 404, 409}
