"""Schemathesis against a real ``schedtui serve``: every operation of ``/openapi.json`` is
fuzzed (bounded examples) on a SQLite and a PostgreSQL store, with the operator token.
No answer may be a 5xx, and every answer must be one the document declares, in its shape.

Two cases in three name things that exist (a schedule, a queue, a durable function, a run,
a backfill, a job, an execution, a lock whose name holds "/"), so that the routes are
exercised past their 404s; half of those put text no store can keep into one field, query
or path parameter (a lone surrogate, a NUL, an escape sequence): it must be refused with a
4xx, never a 500, and never written (a row that held it would make the reads after it
fail).

Two of schemathesis' checks are left out on purpose: ``positive_data_acceptance`` (a
backfill's ``from``/``to`` are free-form times, ``now``, ``-2d`` or ISO 8601, whose validity
no JSON schema can state, so a schema-valid string may rightly be refused with 422; and
the bad text put in is refused whatever the schema says), and ``negative_data_rejection``
(unknown query parameters are ignored, as HTTP servers do).

Each operation gets schemathesis' examples and coverage cases (its boundaries, every
parameter missing or of the wrong type) and then ``SCHEDTUI_FUZZ_EXAMPLES`` random cases
(10 by default, down from 25: each is a call to a real server, and the 15 more cost the
suite about 17 s of its two workers' time; the coverage cases are the same either way).
Raise it for a deeper run::

    SCHEDTUI_FUZZ_EXAMPLES=200 python -m pytest tests/test_fuzz.py -q
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from backend import connect
from tests.servers import start_server, store_for

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase  # the library's name for an OpenAPI operation's case

OPERATE = "op-fuzz-token"
DEFINITIONS = """
    from backend import define_durable, define_queue, define_schedule

    async def work(ctx):
        pass

    async def deliver(job):
        pass

    async def flow(ctx, input):
        return await ctx.wait_for("go", timeout=3600)

    report = define_schedule(name="report", cron="0 * * * *", timezone="Europe/Berlin", handler=work)
    ext = define_schedule(name="ext", cron="* * * * *", timezone="UTC", handler=work, trigger="external")
    mail = define_queue(name="mail", handler=deliver)
    flow = define_durable(name="flow", handler=flow)
"""
NAMES = ["report", "ext"]
LOCK = "fuzz/lock"
#: Text no store can keep, as a JSON body carries it (escaped); a URL cannot carry a lone
#: surrogate, so its parameters get the others.
BAD_TEXT = ["half \ud800 a pair", "\udcff", "nul \x00 inside", "\x1b[2J"]
BAD_URL_TEXT = ["nul \x00 inside", "\x1b[2J", "\x7f"]
FUZZ_EXAMPLES = int(os.environ.get("SCHEDTUI_FUZZ_EXAMPLES") or 10)
#: The ids of things that exist in the store under test (set by the fixture).
REAL: dict[str, str] = {}

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.ignored_auth,
    checks.missing_required_header,
    checks.unsupported_method,
    checks.use_after_free,
    checks.ensure_resource_availability,
]


def make_real_things(url: str, store: str) -> dict[str, str]:
    """A run, a backfill, a job, an execution and a lock, made through the API (the lock
    through the store: it is taken by programs, not operators)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OPERATE}"}, timeout=30) as http:

        def made(path: str, body: dict[str, Any] | None, key: str) -> str:
            response = http.post(path, json=body)
            assert response.status_code in (200, 201, 202), (path, response.text)
            return str(response.json()[key])

        real = {
            "run_id": made("/inspect/schedules/report/fire", None, "run_id"),
            "backfill_id": made("/inspect/schedules/report/backfill", {"from": "-3h", "to": "now"}, "id"),
            "job_id": made("/inspect/queues/mail/jobs", {"delay": 86400, "key": "fuzz"}, "id"),
            "execution_id": made("/inspect/durable/flow/start", {"input": {"n": 1}}, "id"),
        }

    async def take_lock() -> None:
        async with connect(store, instance="fuzz:1") as client:
            result = await client.locks.with_lock(LOCK, lambda lease: None, ttl=60)
            assert result.acquired

    asyncio.run(take_lock())
    return real


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api_schema(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root: Path = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    (root / "schedules").mkdir()
    (root / "schedules" / "fuzz.cron.py").write_text(textwrap.dedent(DEFINITIONS))
    store = store_for(request, root, "fuzz")
    server = start_server(root, "--schedules", "schedules", "--store", store, "--token", OPERATE)
    try:
        REAL.clear()
        REAL.update(make_real_things(server.url, store))
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {OPERATE}"})
    finally:
        assert server.stop() == 0, server.log_text()
        assert "Traceback" not in server.log_text(), server.log_text()


# The event stream never ends by itself (a fuzzer would wait for its body forever): it
# has its own tests in tests/test_events.py.
schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/inspect/events")


def real_value(path: str, parameter: str) -> str:
    """What exists, for one path parameter of ``path`` (a route's template)."""
    if parameter == "name":
        if path.startswith("/inspect/locks/"):
            return LOCK
        if "/signal/" in path:
            return "go"
        return NAMES[len(path) % len(NAMES)]
    return {"queue": "mail", "function": "flow"}.get(parameter) or REAL[parameter]


def put_bad_text(case: OpenApiCase, choose: random.Random) -> None:
    """Text no store can keep in one place of ``case``: a field the body documents (itself,
    or nested in it), a query parameter or a path parameter."""
    content = case.operation.definition.raw.get("requestBody", {}).get("content", {})
    fields = list(content.get("application/json", {}).get("schema", {}).get("properties", {}))
    if fields and not isinstance(case.body, dict):
        case.body = {}
    places = [("query", key) for key in case.query or {}]
    places += [("path", key) for key in case.path_parameters or {}]
    if fields and (not places or choose.random() < 0.75):  # a body is where most text goes in
        places = [("body", key) for key in fields]
    if not places:
        return
    where, key = choose.choice(places)
    if where == "body":
        bad = choose.choice(BAD_TEXT)
        assert isinstance(case.body, dict)  # made one above when it was not
        body = {**case.body, key: choose.choice([bad, {"nested": [bad]}, {bad: 1}])}
        # As JSON text, a lone surrogate escaped: sent as it is (schemathesis' own schema
        # checks of a body cannot take such a string).
        case.body = json.dumps(body).encode()
    elif where == "query":
        case.query[key] = choose.choice(BAD_URL_TEXT)
    else:
        case.path_parameters[key] = choose.choice(BAD_URL_TEXT)


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_5xx_and_every_answer_as_documented(case: OpenApiCase) -> None:
    # A third of the cases as generated; a third naming what exists; a third naming what
    # exists, with bad text in one place. Chosen from the case's id: every phase of
    # schemathesis (examples, coverage, fuzzing) gets its share.
    choose = random.Random(case.id)
    kind = choose.randrange(3)
    if kind:
        for parameter in case.path_parameters or {}:
            case.path_parameters[parameter] = real_value(case.operation.path, parameter)
    if kind == 2:
        put_bad_text(case, choose)
    case.call_and_validate(headers={"Authorization": f"Bearer {OPERATE}"}, checks=CHECKS)
