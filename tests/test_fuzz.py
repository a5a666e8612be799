"""Schemathesis against a real ``schedtui serve``: every operation of ``/openapi.json`` is
fuzzed (bounded examples) on a SQLite and a PostgreSQL store, with the operator token.
No answer may be a 5xx, and every answer must be one the document declares, in its shape.

Two of schemathesis' checks are left out on purpose: ``positive_data_acceptance`` (a
backfill's ``from``/``to`` are free-form times, ``now``, ``-2d`` or ISO 8601, whose validity
no JSON schema can state, so a schema-valid string may rightly be refused with 422), and
``negative_data_rejection`` (unknown query parameters are ignored, as HTTP servers do).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tests.servers import start_server

OPERATE = "op-fuzz-token"
SCHEDULE = """
    from backend import define_schedule

    async def work(ctx):
        pass

    report = define_schedule(name="report", cron="0 * * * *", timezone="Europe/Berlin", handler=work)
    ext = define_schedule(name="ext", cron="* * * * *", timezone="UTC", handler=work, trigger="external")
"""
NAMES = ["report", "ext"]

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


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api_schema(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root: Path = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    (root / "schedules").mkdir()
    (root / "schedules" / "fuzz.cron.py").write_text(textwrap.dedent(SCHEDULE))
    if request.param == "sqlite":
        store = f"sqlite:///{root / 'state.db'}"
    else:
        store = request.getfixturevalue("pg_server").create_database("fuzz")
    server = start_server(root, "--schedules", "schedules", "--store", store, "--token", OPERATE)
    try:
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    finally:
        assert server.stop() == 0, server.log_text()
        assert "Traceback" not in server.log_text(), server.log_text()


# The event stream never ends by itself (a fuzzer would wait for its body forever): it
# has its own tests in tests/test_events.py.
schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/inspect/events")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_5xx_and_every_answer_as_documented(case: schemathesis.Case) -> None:
    # Half the cases name a real schedule: a random name stops at 404 before the body is read.
    if "name" in case.path_parameters and hash(case.id) % 2:
        case.path_parameters["name"] = NAMES[hash(case.id) // 2 % len(NAMES)]
    case.call_and_validate(headers={"Authorization": f"Bearer {OPERATE}"}, checks=CHECKS)
