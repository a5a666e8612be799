"""The engine's options, as an embedding program gives them: lengths of time in seconds or
as timedeltas alike, and every value that makes no sense refused at once, naming the
option and the value, before anything is opened (it used to start, then fail with a
TypeError, spin, or hang)."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import Engine, ManualClock, define_schedule
from backend.errors import BadInput

BAD = [
    ("retention", 0), ("retention", timedelta(days=-1)), ("retention", timedelta(days=100_000)), ("retention", "30d"),
    ("claims_ttl", -1), ("claims_ttl", True),
    ("abandon_after", 0), ("abandon_after", -5), ("abandon_after", math.nan), ("abandon_after", math.inf),
    ("abandon_after", 10**400), ("abandon_after", 86_401),
    ("heartbeat_interval", 0), ("heartbeat_interval", -1.5),
    ("state_poll_interval", 0), ("state_poll_interval", timedelta(0)),
    ("shutdown_grace", -1), ("shutdown_grace", "soon"),
    ("external_tolerance", -0.5), ("external_early", timedelta(seconds=-5)),
    ("catch_up_limit", 0), ("catch_up_limit", 2.5), ("catch_up_limit", False),
    ("max_threads", 0), ("max_threads", -3),
    ("shard_ttl", 0), ("job_backoff", 0), ("job_backoff", 1.5),
]  # fmt: skip


@pytest.mark.parametrize(("option", "value"), BAD, ids=[f"{o}={v!r}"[:40] for o, v in BAD])
def test_a_value_that_makes_no_sense_is_refused_naming_the_option_before_anything_opens(
    tmp_path: Path, option: str, value: Any
) -> None:
    store = tmp_path / "state.db"
    with pytest.raises(BadInput) as refused:
        Engine([], f"sqlite:///{store}", **{option: value})
    message = str(refused.value)
    assert message.startswith(f"{option} ") and refused.value.field == option, message
    assert "must be" in message
    assert not store.exists(), "refused before the store was opened"


def _every_second(name: str) -> Any:
    async def handler(ctx: Any) -> None:
        pass

    return define_schedule(name=name, cron="* * * * * *", timezone="UTC", handler=handler)


async def test_lengths_of_time_are_seconds_or_timedeltas_alike(tmp_path: Path) -> None:
    """Each length given in seconds in one engine and as a timedelta in the other: the
    same engine. The retention given in seconds used to fail the first start's prune."""
    clock = ManualClock("2026-03-02T08:00:00Z")
    seconds = dict(retention=3600, claims_ttl=7200, abandon_after=60, heartbeat_interval=5, state_poll_interval=2,
                   shutdown_grace=0, external_tolerance=600, external_early=5, shard_ttl=10)  # fmt: skip
    spans = {option: timedelta(seconds=value) for option, value in seconds.items()}
    engines = []
    for number, options in enumerate((seconds, spans)):
        url = f"sqlite:///{tmp_path / f'{number}.db'}"
        engine = Engine([_every_second("tick")], url, clock=clock, instance=f"e{number}", **options)  # type: ignore[arg-type]
        engines.append(engine)
        await engine.start()  # (the prune of runs older than the retention runs at the start)
    clock.advance(3)
    for engine in engines:
        await engine.quiesce()
    given, spanned = engines
    for engine in engines:
        assert engine.registry.retention == timedelta(hours=1) and engine.registry.claims_ttl == timedelta(hours=2)
        assert engine.lease.window == timedelta(seconds=60)
        assert engine.state_poll_interval == timedelta(seconds=2)
        assert engine.shutdown_grace == 0.0
    assert len((await given.list_runs("tick"))[0]) == len((await spanned.list_runs("tick"))[0]) == 3
    with pytest.raises(BadInput, match="^grace -1 must be"):
        await given.stop(grace=-1)
    assert given.armed, "a stop refused stops nothing"
    await given.stop(grace=timedelta(seconds=1))
    await spanned.stop(grace=1)


NOT_DEFINITIONS = [
    ("schedules", "is not a list of definitions: for the files of a folder, give discover_definitions(folder)"),
    (Path("schedules"), "is not a list of definitions: for the files of a folder, give discover_definitions(folder)"),
    (None, "is not a list of definitions (define_schedule, define_queue, define_durable) nor discover_definitions"),
    (["daily-digest"], "item 0, 'daily-digest', is not a definition this engine runs"),
    ([_every_second("a"), print], "item 1, <built-in function print>, is not a definition this engine runs"),
]


@pytest.mark.parametrize(("definitions", "said"), NOT_DEFINITIONS, ids=["str", "path", "none", "a-name", "a-function"])
def test_what_is_not_definitions_is_refused_before_anything_opens(tmp_path: Path, definitions: Any, said: str) -> None:
    """A folder's name passed for its definitions used to be taken character by character,
    refused with the name's first letter."""
    store = tmp_path / "state.db"
    with pytest.raises(BadInput) as refused:
        Engine(definitions, f"sqlite:///{store}")
    assert said in str(refused.value) and refused.value.field == "definitions", str(refused.value)
    assert not store.exists()


def test_a_default_trigger_that_is_neither_self_nor_external_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="^default_trigger 'cron' must be \"self\" or \"external\"$"):
        Engine([], f"sqlite:///{tmp_path / 'state.db'}", default_trigger="cron")  # type: ignore[arg-type]


async def test_connect_refuses_what_is_not_definitions_as_the_engine_does(tmp_path: Path) -> None:
    from backend import connect

    with pytest.raises(BadInput, match="^definitions 5 is not a list of definitions"):
        async with connect(f"sqlite:///{tmp_path / 'state.db'}", definitions=5, create=True):  # type: ignore[arg-type]
            pass
