"""Alerts exactly once across a fleet: three real ``schedtui serve`` processes on a real
PostgreSQL and the real clock, all evaluating the same schedule every half second and all
delivering to one real HTTP webhook that this test runs.

A schedule fails while a flag file exists. Each transition of its ``failing`` alert must be
accepted by the webhook exactly once, and the transitions must alternate firing, resolved:

* when the webhook answers 500 twice before accepting (the sender retries, with backoff);
* when the webhook holds the first request of a transition, the test SIGKILLs the instance
  that sent it (named by its ``schedtui-instance`` header) before answering, and drops the
  connection: after the claim's lease, a surviving instance must deliver it.

The windows are short (``--alert-interval 0.5``, a 4 s claim lease, a 2 s POST timeout),
so the test takes some twenty seconds.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Server, poll, start_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LEASE = 4.0

SCHEDULE = """
    from pathlib import Path

    from backend import define_schedule

    FLAG = Path(__file__).resolve().parent.parent / "fail.flag"


    def check(ctx):
        if FLAG.exists():
            raise RuntimeError("the flag says fail")


    flaky = define_schedule(name="flaky", cron="*/2 * * * * *", timezone="UTC", handler=check,
                            alert={"late": False, "resolve_after": 0})
"""


@dataclass
class Request:
    key: str
    sender: str
    body: dict[str, Any]
    answer: int | None = None
    """The status answered; ``None``: dropped unanswered."""


@dataclass
class Webhook:
    """The receiver. ``plan`` maps a transition's state to what its requests get, in order:
    a status, or ``"hold"`` (the request is kept unanswered until :meth:`drop`)."""

    requests: list[Request] = field(default_factory=list)
    plan: dict[str, list[int | str]] = field(default_factory=dict)
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer_for(self, request: Request) -> int | str:
        with self.lock:
            self.requests.append(request)
            seen = [r for r in self.requests if r.key == request.key]
            steps = self.plan.get(request.body["state"], [])
            return steps[len(seen) - 1] if len(seen) <= len(steps) else 200

    def accepted(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.answer is not None and 200 <= r.answer < 300]


def serve_webhook(hook: Webhook) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            request = Request(self.headers["idempotency-key"], self.headers["schedtui-instance"], body)
            what = hook.answer_for(request)
            if what == "hold":
                hook.held.set()
                hook.release.wait(30)
                self.close_connection = True  # dropped: no answer at all
                return
            assert isinstance(what, int)
            self.send_response(what)
            self.send_header("content-length", "0")
            self.end_headers()
            request.answer = what

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="webhook", daemon=True).start()
    return server


@pytest.fixture
def webhook() -> Iterator[tuple[Webhook, str]]:
    hook = Webhook()
    server = serve_webhook(hook)
    yield hook, f"http://127.0.0.1:{server.server_address[1]}/hooks/T1/B2/secret"
    hook.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, webhook: tuple[Webhook, str]) -> Iterator[dict[str, Server]]:
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "flaky.cron.py").write_text(textwrap.dedent(SCHEDULE))
    (tmp_path / "sinks.txt").write_text(f"# the test's webhook\n{webhook[1]}\n")
    servers: dict[str, Server] = {}
    for name in ("a", "b", "c"):
        servers[name] = start_server(
            tmp_path, "--schedules", "schedules", "--store", pg_url, "--instance", name, "--abandon-after", "6",
            "--notify-file", "sinks.txt", "--alert-interval", "0.5", "--notify-lease", str(LEASE),
            "--notify-timeout", "2", "--notify-backoff", "0.3", "--notify-poll", "0.2",
        )  # fmt: skip
    yield servers
    for server in servers.values():
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(10)


def transitions(hook: Webhook, key: str) -> list[tuple[str, str]]:
    """The accepted transitions of the alert ``key``, by transition id: (state, id), in the
    order they were made."""
    return sorted(((r.body["state"], r.key) for r in hook.accepted() if r.body["key"] == key), key=lambda t: t[1])


def test_each_transition_is_accepted_once_across_three_instances(
    tmp_path: Path, fleet: dict[str, Server], webhook: tuple[Webhook, str]
) -> None:
    hook, _ = webhook
    flag = tmp_path / "fail.flag"

    def flaky() -> list[Any]:  # (the killed instance's own alert comes in between)
        return [r for r in hook.accepted() if r.body["key"] == "failing:flaky"]
    # 1. It fails; the webhook answers the firing notification 500 twice, then accepts it.
    hook.plan = {"firing": [500, 500], "resolved": ["hold"]}
    flag.touch()
    poll(lambda: hook.accepted(), timeout=30, what="the firing notification to be accepted")
    (firing,) = hook.accepted()
    assert firing.body["state"] == "firing" and firing.body["key"] == "failing:flaky"
    tries = [r for r in hook.requests if r.key == firing.key]
    assert [r.answer for r in tries] == [500, 500, 200]
    assert firing.body["text"].startswith("▲ FIRING failing: schedule flaky: the newest run failed")
    # 2. It succeeds again; the first request of the resolved notification is held, its
    #    sender killed before any answer, the connection dropped.
    flag.unlink()
    assert hook.held.wait(30), "the resolved notification never came"
    held = next(r for r in hook.requests if r.body["state"] == "resolved")
    killed = fleet[held.sender]
    killed.process.kill()  # SIGKILL: between its claim and any record of the outcome
    killed.process.wait(10)
    hook.release.set()
    dropped = time.monotonic()
    poll(lambda: len(flaky()) == 2, timeout=LEASE + 20, what="a survivor to deliver the resolved notification")
    assert time.monotonic() - dropped >= LEASE - 1.5  # not before the dead sender's lease ran out (less the hold)
    resolved = flaky()[1]
    assert resolved.key == held.key and resolved.sender != held.sender and resolved.body == held.body
    # 3. Once more, with two instances left: fails, then recovers.
    hook.plan = {}
    flag.touch()
    poll(lambda: len(flaky()) == 3, timeout=30, what="the second firing notification")
    flag.unlink()
    poll(lambda: len(flaky()) == 4, timeout=30, what="the second resolved notification")
    time.sleep(LEASE + 1)  # a window in which a duplicate would show (nothing to wait for: it must not come)
    accepted = transitions(hook, "failing:flaky")
    assert [state for state, _ in accepted] == ["firing", "resolved", "firing", "resolved"]
    assert len({key for _, key in accepted}) == 4  # each transition accepted exactly once
    # The killed instance pages once, from a survivor (killed, it left its row: no clean stop).
    lost = [r for r in hook.accepted() if r.body["key"].startswith("instance_lost:")]
    assert [(r.body["key"], r.body["state"]) for r in lost] == [(f"instance_lost:{held.sender}", "firing")], lost
    assert "did not stop cleanly" in lost[0].body["text"] and lost[0].sender != held.sender
    # Every instance saw the same facts; the transitions were made by whoever got there first.
    assert {r.body["instance"] for r in hook.accepted()} <= {"a", "b", "c"}
    for server in fleet.values():
        if server.process.poll() is None:
            assert server.stop() == 0
    logs = "".join(s.log_text() for s in fleet.values() if s is not killed)
    assert "alert evaluation crashed" not in logs and "alert delivery crashed" not in logs
