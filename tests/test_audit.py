"""The audit log: the stores' part (both kinds), the engine's records of every operator
action and their actor, retention, entries the store cannot take yet, the API's token
names, and the CLI's ``--as``, OS user and ``schedtui audit`` (embedded and remote)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import BadInput, Engine, EngineStopped, ManualClock, RunContext, Unavailable, define_schedule
from backend.api.app import create_app
from backend.api.tokens import ANONYMOUS, Tokens, parse_token
from backend.client.embedded import EmbeddedBackend
from backend.events.audit import ACTIONS, AuditEntry, AuditLog, acting_as, os_user
from backend.events.bus import EventBus
from backend.ids import IdFactory
from backend.store import Store, open_store
from tests import pg
from tests.servers import cli_env, start_server

UTC = UTC
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[1]


async def noop(ctx: RunContext) -> None:
    pass


HOURLY = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=noop)


# ---------------------------------------------------------------------------------------
# the stores
# ---------------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        url = pg.database_for(tmp_path)
    else:
        url = f"sqlite:///{tmp_path / 'state.db'}"
    s = open_store(url)
    await s.open()
    yield s
    await s.close()


def entry(ids: IdFactory, at: datetime, n: int, **detail: Any) -> AuditEntry:
    return AuditEntry(ids(), at, f"user{n}", "schedule.fire", f"job{n}", detail or None)


async def test_entries_page_newest_first_by_keyset_and_keep_their_detail(store: Any) -> None:
    now = [T0]
    ids = IdFactory(lambda: now[0])
    written = []
    for n in range(7):
        now[0] = T0 + timedelta(seconds=n)
        written.append(entry(ids, now[0], n, seq=n, text="naïve ☃", nested={"a": [1, None]}))
    for e in written:
        await store.append_audit(e)
    await store.append_audit(written[3])  # a retry after a lost reply: written once

    first = await store.list_audit(limit=3)
    assert [e.id for e in first] == [e.id for e in reversed(written[4:])]
    second = await store.list_audit(limit=3, before=first[-1].id)
    assert [e.id for e in second] == [e.id for e in reversed(written[1:4])]
    rest = await store.list_audit(limit=3, before=second[-1].id)
    assert [e.id for e in rest] == [written[0].id]
    assert first[0] == written[6]  # every field as written, times aware UTC
    assert first[0].at.tzinfo is not None and first[0].at.utcoffset() == timedelta(0)


async def test_detail_that_a_text_column_refuses_is_kept(store: Any) -> None:
    ids = IdFactory(lambda: T0)
    odd = AuditEntry(ids(), T0, "bob", "schedule.disable", "job", {"note": "nul \x00 and \ud800 lone"})
    await store.append_audit(odd)
    (back,) = await store.list_audit(limit=5)
    assert back.detail == {"note": "nul \\x00 and \\ud800 lone"}  # kept; read back escaped, fit to show


async def test_prune_removes_entries_older_than_the_cut(store: Any) -> None:
    now = [T0]
    ids = IdFactory(lambda: now[0])
    for days in (120, 91, 89, 50, 0):  # oldest first: ids grow with time
        now[0] = T0 - timedelta(days=days)
        await store.append_audit(entry(ids, now[0], days))
    assert await store.prune_audit(T0 - timedelta(days=90)) == 2
    assert sorted(e.actor for e in await store.list_audit(limit=10)) == ["user0", "user50", "user89"]


# ---------------------------------------------------------------------------------------
# the engine: every operator action, and who did it
# ---------------------------------------------------------------------------------------
async def test_every_schedule_action_is_recorded_with_its_actor(make_engine: Any, clock: ManualClock) -> None:
    engine: Engine = make_engine([HOURLY], actor="ops-bob")
    await engine.open()
    run = await engine.run_now("hourly", wait=True)
    view = await engine.set_enabled("hourly", False, note="vendor outage")
    assert view.state_note is not None and view.state_note.by == "ops-bob"  # the same actor
    with acting_as("alice"):  # what the API does for each request
        await engine.set_enabled("hourly", True)
        progress = await engine.start_backfill("hourly", T0 - timedelta(hours=3), T0 - timedelta(minutes=30))
    await engine.wait_backfill(progress.id)
    note = (await engine.get_schedule("hourly")).state_note
    assert note is not None and note.by == "alice"

    page = await engine.audit.list(limit=10)
    assert [(e.actor, e.action, e.target) for e in reversed(page.entries)] == [
        ("ops-bob", "schedule.fire", "hourly"),
        ("ops-bob", "schedule.disable", "hourly"),
        ("alice", "schedule.enable", "hourly"),
        ("alice", "schedule.backfill", "hourly"),
        ("alice", "schedule.backfill_end", "hourly"),
    ]
    fire, disable, enable, backfill, end = reversed(page.entries)
    assert end.detail == {"backfill_id": progress.id, "state": "done", "total": 2, "fired": 2, "succeeded": 2,
                          "failed": 0, "not_fired": 0}  # fmt: skip
    assert fire.detail == {"run_id": run.id}
    assert disable.detail == {"note": "vendor outage", "was_enabled": True}
    assert enable.detail == {"note": None, "was_enabled": False}
    assert backfill.detail == {
        "backfill_id": progress.id, "from": "2026-03-02T05:00:00Z", "to": "2026-03-02T07:30:00Z", "count": 2,
    }  # fmt: skip
    assert all(e.at == clock.now() for e in page.entries)
    # Enabling it again changes nothing (the state keeps who enabled it), but is recorded.
    clock.advance(60)
    with acting_as("carol"):
        await engine.set_enabled("hourly", True)
    again = (await engine.get_schedule("hourly")).state_note
    assert again is not None and (again.by, again.at) == ("alice", note.at)
    (latest,) = (await engine.audit.list(limit=1)).entries
    assert (latest.actor, latest.action, latest.detail) == ("carol", "schedule.enable", {"note": None, "was_enabled": True})


async def test_every_job_queue_action_is_recorded_and_signalled(make_engine: Any) -> None:
    from backend import define_queue

    async def failing(ctx: Any) -> None:
        raise RuntimeError("boom")

    engine: Engine = make_engine([define_queue(name="mail", handler=failing, attempts=1)], actor="ops-bob")
    await engine.open()
    backend = EmbeddedBackend(engine)
    subscription = engine.events.subscribe()
    with acting_as("alice"):
        sent = await backend.send_job("mail", {"to": "x"}, key="k1")
        await backend.set_queue_paused("mail", True)
        await backend.set_queue_paused("mail", False)
        assert await backend.cancel_job("mail", key="k1")
    await engine.jobs.send("mail", {"by": "the app"})  # the application's sends are not audited
    page = await engine.audit.list(limit=10)
    assert [(e.actor, e.action, e.target) for e in reversed(page.entries)] == [
        ("alice", "job.send", sent.id),
        ("alice", "queue.pause", "mail"),
        ("alice", "queue.resume", "mail"),
        ("alice", "job.cancel", "k1"),
    ]
    assert page.entries[-1].detail == {"queue": "mail", "key": "k1", "duplicate": False}
    signals = await subscription.get(0)
    assert ("jobs", "mail") in [(s.topic, s.name) for s in signals]
    subscription.close()


async def test_cancelling_a_backfill_is_recorded_once(make_engine: Any) -> None:
    gate = asyncio.Event()

    async def slow(ctx: RunContext) -> None:
        await gate.wait()

    engine: Engine = make_engine([define_schedule(name="slow", cron="0 * * * *", timezone="UTC", handler=slow)])
    await engine.open()
    progress = await engine.start_backfill("slow", T0 - timedelta(hours=3), T0 - timedelta(minutes=30))
    with acting_as("carol"):
        cancelled = await engine.cancel_backfill(progress.id)
        assert cancelled.state == "cancelled"
        await engine.cancel_backfill(progress.id)  # already over: nothing to record
    gate.set()
    await engine.backfills.ended(progress.id)
    entries = (await engine.audit.list()).entries
    assert [(e.actor, e.action, e.target) for e in entries] == [
        (os_user(), "schedule.backfill_end", "slow"),  # the starter's backfill ended
        ("carol", "schedule.backfill_cancel", "slow"),
        (os_user(), "schedule.backfill", "slow"),
    ]  # fmt: skip
    assert entries[1].detail == {"backfill_id": progress.id, "finished": 0, "in_flight": None, "not_fired": 2}
    assert entries[0].detail == {"backfill_id": progress.id, "state": "cancelled", "total": 2, "fired": 0,
                                 "succeeded": 0, "failed": 0, "not_fired": 2}  # fmt: skip


async def test_the_default_actor_is_the_os_user_and_external_fires_are_not_operator_actions(
    make_engine: Any,
) -> None:
    ext = define_schedule(name="ext", cron="0 * * * *", timezone="UTC", handler=noop, trigger="external")
    engine: Engine = make_engine([HOURLY, ext])
    await engine.open()
    assert engine.audit.default_actor == os_user() != engine.instance
    await engine.fire_external("ext")
    await engine.run_now("hourly", wait=True)
    entries = (await engine.audit.list()).entries
    assert [(e.actor, e.action, e.target) for e in entries] == [(os_user(), "schedule.fire", "hourly")]


async def test_a_refused_action_is_not_recorded(make_engine: Any) -> None:
    engine: Engine = make_engine([HOURLY])
    await engine.open()
    with pytest.raises(Exception, match="needs confirmation|need confirmation"):
        await engine.start_backfill("hourly", T0 - timedelta(days=3), T0 - timedelta(hours=1))
    assert (await engine.audit.list()).entries == []


async def test_entries_are_kept_90_days(make_engine: Any, clock: ManualClock) -> None:
    engine: Engine = make_engine([HOURLY])
    await engine.start()
    await engine.set_enabled("hourly", False)
    clock.advance(timedelta(days=60))
    await engine.set_enabled("hourly", True)
    clock.advance(timedelta(days=31))  # the first entry is 91 days old, the second 31
    # The housekeeping loop's own round may be pruning now: an explicit round beside it
    # would find the prune done for the hour and return before the loop's has committed.
    await engine.quiesce()
    await engine.maintain()
    assert [e.action for e in (await engine.audit.list()).entries] == ["schedule.enable"]


def test_every_action_name_is_system_dot_verb() -> None:
    assert all(len(name.split(".")) == 2 and name.islower() for name in ACTIONS)


async def test_an_unknown_action_is_a_bug_not_an_entry(make_engine: Any) -> None:
    engine: Engine = make_engine([HOURLY])
    await engine.open()
    with pytest.raises(ValueError, match="unknown audit action 'schedule.explode'"):
        await engine.audit.record("schedule.explode", "hourly")


class FlakyAuditStore:
    """An audit store that is down until told otherwise."""

    def __init__(self) -> None:
        self.down = True
        self.entries: list[AuditEntry] = []

    async def append_audit(self, entry: AuditEntry) -> None:
        if self.down:
            raise Unavailable("the store is down (test)")
        self.entries.append(entry)

    async def list_audit(self, *, limit: int, before: str | None = None) -> list[AuditEntry]:
        return sorted(self.entries, key=lambda e: e.id, reverse=True)[:limit]

    async def prune_audit(self, before: datetime) -> int:
        return 0


async def test_entries_the_store_cannot_take_are_kept_in_order_and_written_later(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyAuditStore()
    log = AuditLog(store=store, clock=clock, new_id=IdFactory(clock.now), events=EventBus(), actor="carol")
    first = await log.record("schedule.disable", "a")  # no exception: the action stands
    second = await log.record("schedule.enable", "a")
    assert store.entries == [] and log.pending == [first, second]
    await log.maintain(clock.now())
    assert log.pending == [first, second]  # still down
    store.down = False
    third = await log.record("schedule.fire", "a")  # behind the older ones
    assert store.entries == [first, second, third] and log.pending == []

    store.down = True
    lost = await log.record("schedule.fire", "b")
    await log.stop(0)  # the last resort: each one in the log
    assert json.dumps(lost.to_json(), ensure_ascii=False) in caplog.text


async def test_an_entry_the_store_cannot_take_after_the_log_closed_is_logged_not_kept(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the engine has closed the log (its stop's last word, before the store closes),
    nothing retries a pending entry: one recorded then was kept in memory with a "will
    retry" warning and never written anywhere. It is logged whole, as the stop does."""
    store = FlakyAuditStore()
    log = AuditLog(store=store, clock=clock, new_id=IdFactory(clock.now), events=EventBus(), actor="carol")
    await log.close()
    late = await log.record("schedule.fire", "a")
    assert log.pending == [] and "will retry" not in caplog.text
    assert json.dumps(late.to_json(), ensure_ascii=False) in caplog.text


async def test_a_run_now_that_a_stop_overtakes_is_refused_and_runs_nothing(make_engine: Any) -> None:
    """A Run now on an engine only opened (an embedded console, a ``connect()`` client)
    takes this instance's lease first, a store write. A stop that began meanwhile (and
    closed the store) used to find it launched all the same, on the stopped launcher: its
    handler ran, and its audit entry stayed in memory ("will retry") with nothing left to
    retry it. It is refused: nothing ran, nothing is owed to the log."""
    ran: list[str] = []

    async def handler(ctx: RunContext) -> None:
        ran.append(ctx.run_id)

    engine: Engine = make_engine([define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    took_lease, go_on = asyncio.Event(), asyncio.Event()
    hold_lease_here = engine.hold_lease_here

    async def held(action: str) -> None:
        await hold_lease_here(action)
        took_lease.set()
        await go_on.wait()  # (the stop runs to its end meanwhile)

    engine.hold_lease_here = held  # type: ignore[method-assign]
    fire = asyncio.ensure_future(engine.run_now("hourly"))
    await took_lease.wait()
    await engine.stop(grace=0)
    go_on.set()
    with pytest.raises(EngineStopped, match='cannot fire "hourly": this engine is not open'):
        await fire
    assert ran == [] and engine.audit.pending == []


# ---------------------------------------------------------------------------------------
# tokens: names
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "access", "name", "secret"),
    [
        ("alice=s3cret", "operate", "alice", "s3cret"),
        ("  ci.bot@ops=a=b  ", "operate", "ci.bot@ops", "a=b"),
        ("s3cret", "operate", "operator", "s3cret"),
        ("s3cret", "read", "reader", "s3cret"),
        ("dGVzdA==", "operate", "operator", "dGVzdA=="),  # base64 padding is not a name
        ("YWI=", "operate", "operator", "YWI="),
        ("two words=x", "read", "reader", "two words=x"),  # not a name: a bare secret
    ],
)
def test_a_token_is_named_or_bare(text: str, access: Any, name: str, secret: str) -> None:
    token = parse_token(text, access)
    assert (token.name, token.secret, token.access) == (name, secret, access)
    assert secret not in repr(token)


@pytest.mark.parametrize(
    ("operate", "read", "message"),
    [
        (["a=x", "a=y"], [], 'two tokens are named "a"'),
        (["x", "y"], [], 'two tokens are named "operator"'),
        (["a=x"], ["b=x"], 'the token "b" has the same secret'),
        (["   "], [], "empty"),
        (["alice="], [], 'the token "alice" has no secret after "=": give NAME=SECRET'),
        ([], ["bob=="], 'the read token "bob" has no secret after "="'),
    ],
)
def test_tokens_that_cannot_be_told_apart_are_refused(operate: list[str], read: list[str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        Tokens.from_options(operate, read)


# ---------------------------------------------------------------------------------------
# the API: the token's name is the actor
# ---------------------------------------------------------------------------------------
@pytest.fixture
async def api(make_engine: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Engine]]:
    engine: Engine = make_engine([HOURLY], actor="not-a-request")
    backend = EmbeddedBackend(engine)
    await backend.connect()
    app = create_app(backend, token=["alice=op-alice", "bob=op-bob"], read_token=["ro-viewer", "carol=ro-carol"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        yield client, engine


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_the_api_records_the_name_of_each_request_token(api: tuple[httpx.AsyncClient, Engine]) -> None:
    client, engine = api
    assert (await client.post("/inspect/schedules/hourly/fire", headers=bearer("op-alice"))).status_code == 202
    r = await client.post("/inspect/schedules/hourly/disable", headers=bearer("op-bob"), json={"note": "why"})
    assert r.status_code == 200 and r.json()["state_note"]["by"] == "bob"
    refused = await client.post("/inspect/schedules/hourly/enable", headers=bearer("ro-carol"))
    assert refused.status_code == 403  # reading is all a read token does: nothing recorded

    for reader in ("ro-viewer", "ro-carol", "op-alice"):
        page = await client.get("/inspect/audit", headers=bearer(reader))
        assert page.status_code == 200
        assert [(e["actor"], e["action"]) for e in page.json()["entries"]] == [
            ("bob", "schedule.disable"), ("alice", "schedule.fire"),
        ]  # fmt: skip
    info = await client.get("/inspect/info", headers=bearer("ro-viewer"))
    assert (info.json()["actor"], info.json()["access"]) == ("reader", "read")
    assert (await engine.audit.list()).entries[0].actor == "bob"


async def test_the_audit_route_pages_and_refuses_bad_parameters(api: tuple[httpx.AsyncClient, Engine]) -> None:
    client, _ = api
    for _ in range(5):
        await client.post("/inspect/schedules/hourly/fire", headers=bearer("op-alice"))
    seen: list[str] = []
    before = None
    while True:
        params = {"limit": "2", **({"before": before} if before else {})}
        body = (await client.get("/inspect/audit", params=params, headers=bearer("ro-viewer"))).json()
        seen += [e["id"] for e in body["entries"]]
        before = body["next_before"]
        if before is None:
            break
    assert len(seen) == 5 and seen == sorted(seen, reverse=True)
    for params, field in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"), ({"before": "nope"}, "before")):
        r = await client.get("/inspect/audit", params=params, headers=bearer("ro-viewer"))
        assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
    assert "an entry id" in (await client.get("/inspect/audit?before=zz", headers=bearer("op-bob"))).text
    assert (await client.get("/inspect/audit")).status_code == 401


async def test_a_server_without_tokens_records_anonymous(make_engine: Any) -> None:
    backend = EmbeddedBackend(make_engine([HOURLY]))
    await backend.connect()
    transport = httpx.ASGITransport(app=create_app(backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        assert (await client.post("/inspect/schedules/hourly/fire")).status_code == 202
        assert (await client.get("/inspect/info")).json()["actor"] == ANONYMOUS
    assert [e.actor for e in (await backend.audit()).entries] == [ANONYMOUS]


# ---------------------------------------------------------------------------------------
# the CLI: --as, the OS user, and `schedtui audit` embedded and remote
# ---------------------------------------------------------------------------------------
SCHEDULE_FILE = """
from backend import define_schedule

async def work(ctx):
    pass

hourly = define_schedule(name="hourly", cron="0 * * * *", timezone="UTC", handler=work)
"""


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args], cwd=root, env=cli_env(), capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "hourly.cron.py").write_text(SCHEDULE_FILE)
    return tmp_path


def create_store(url: str) -> None:
    """What `schedtui serve` does first: the other verbs refuse a store that does not exist."""

    async def create() -> None:
        store = open_store(url)
        await store.open()
        await store.close()

    asyncio.run(create())


def test_the_cli_records_as_or_the_os_user_and_lists_the_log(folder: Path) -> None:
    store = f"sqlite:///{folder / 'state.db'}"
    create_store(store)
    assert cli(folder, "fire", "hourly", "--store", store).returncode == 0
    assert cli(folder, "disable", "hourly", "--note", "db move", "--as", "ops-alice", "--store", store).returncode == 0

    done = cli(folder, "audit", "--store", store, "--json")
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert [(e["actor"], e["action"], e["target"]) for e in entries] == [
        ("ops-alice", "schedule.disable", "hourly"), (os_user(), "schedule.fire", "hourly"),
    ]  # fmt: skip
    assert set(entries[0]) == {"id", "at", "actor", "action", "target", "detail"}
    assert entries[0]["detail"] == {"note": "db move", "was_enabled": True}

    table = cli(folder, "audit", "--store", store, "--limit", "1").stdout.splitlines()
    assert table[0].split() == ["AT", "ACTOR", "ACTION", "TARGET", "DETAIL"]
    assert "ops-alice  schedule.disable  hourly  note=db move was_enabled=true" in table[1]
    assert table[-1] == f"older: schedtui audit --before {entries[0]['id']}"
    older = json.loads(cli(folder, "audit", "--store", store, "--json", "--before", entries[0]["id"]).stdout)
    assert [e["id"] for e in older] == [entries[1]["id"]]


def test_as_names_a_person_and_is_refused_where_a_token_names_one(folder: Path) -> None:
    bad = cli(folder, "disable", "hourly", "--as", "two words")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and '--as "two words" is not a name' in bad.stderr
    remote = cli(folder, "disable", "hourly", "--url", "http://127.0.0.1:9", "--as", "bob")
    assert remote.returncode == 2 and "records the name of your token" in remote.stderr
    limit = cli(folder, "audit", "--limit", "5000")
    assert limit.returncode == 2 and "5000 is more than 1000" in limit.stderr


def test_a_server_with_named_tokens_records_each_one(folder: Path) -> None:
    (folder / "tokens").write_text("# operators\nalice=op-alice\n\nbob=op-bob\n")
    (folder / "read-tokens").write_text("ro-secret\n")
    store = f"sqlite:///{folder / 'state.db'}"
    server = start_server(folder, "--schedules", "schedules", "--store", store,
                          "--token-file", "tokens", "--read-token-file", "read-tokens")  # fmt: skip
    try:
        url = server.url
        assert cli(folder, "fire", "hourly", "--url", url, "--token", "op-bob").returncode == 0
        # A client given the NAME=SECRET form sends the secret.
        assert cli(folder, "disable", "hourly", "--url", url, "--token", "alice=op-alice").returncode == 0
        refused = cli(folder, "enable", "hourly", "--url", url, "--token", "ro-secret")
        assert refused.returncode == 1 and "read-only: enable is not allowed" in refused.stderr
        done = cli(folder, "audit", "--url", url, "--token", "ro-secret", "--json")
        assert done.returncode == 0, done.stderr
        assert [(e["actor"], e["action"]) for e in json.loads(done.stdout)] == [
            ("alice", "schedule.disable"), ("bob", "schedule.fire"),
        ]  # fmt: skip
    finally:
        assert server.stop() == 0, server.log_text()
    assert "op-alice" not in server.log_text() and "op-bob" not in server.log_text()


def test_serve_refuses_tokens_it_cannot_tell_apart(folder: Path) -> None:
    done = cli(folder, "serve", "--port", "0", "--token", "a=x", "--read-token", "b=x")
    assert done.returncode == 2 and 'the token "b" has the same secret' in done.stderr
    env = {**cli_env(), "SCHEDTUI_TOKEN": "ops=1\nops=2"}
    twice = subprocess.run([sys.executable, "-m", "console.cli", "serve", "--port", "0"], cwd=folder, env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert twice.returncode == 2 and 'two tokens are named "ops"' in twice.stderr
    client = subprocess.run([sys.executable, "-m", "console.cli", "list", "--url", "http://127.0.0.1:9"], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert client.returncode == 2 and "gives 2 tokens; a client sends one" in client.stderr
