"""Schedule definitions (``define_schedule``) and their discovery in ``*.cron.py`` files."""

from __future__ import annotations

import functools
import re
import textwrap
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from backend import (
    CronError,
    DefinitionError,
    DiscoveryError,
    Engine,
    ManualClock,
    RunContext,
    Schedule,
    define_schedule,
    discover,
)
from backend.schedules import DEFAULT_MAX_RUNTIME


async def ahandler(ctx: RunContext) -> None:
    pass


def shandler(ctx: RunContext) -> None:
    pass


def define(**overrides: Any) -> Schedule:
    kwargs: dict[str, Any] = {"name": "job", "cron": "*/5 * * * *", "timezone": "Europe/Berlin", "handler": ahandler}
    kwargs.update(overrides)
    return define_schedule(**kwargs)


# ---------------------------------------------------------------------------------------
# define_schedule: what is accepted
# ---------------------------------------------------------------------------------------
def test_a_full_definition_keeps_every_field() -> None:
    s = define(
        name="daily-digest",
        cron="0 9 * * 1-5",
        on_overlap="queue",
        backfill="latest",
        max_runtime=90,
        description="Morning digest",
        payload={"list": "all", "n": [1, 2]},
        enabled=False,
        trigger="external",
    )
    assert (s.name, s.cron.expr, s.timezone) == ("daily-digest", "0 9 * * 1-5", "Europe/Berlin")
    assert (s.on_overlap, s.backfill, s.max_runtime) == ("queue", "latest", 90.0)
    assert isinstance(s.max_runtime, float)
    assert (s.description, s.payload, s.enabled, s.trigger) == ("Morning digest", {"list": "all", "n": [1, 2]}, False, "external")
    assert s.effective_trigger("self") == "external"


def test_defaults() -> None:
    s = define()
    assert (s.on_overlap, s.backfill, s.max_runtime, s.description, s.payload, s.enabled, s.trigger) == (
        "skip",
        "skip",
        DEFAULT_MAX_RUNTIME,
        None,
        None,
        True,
        None,
    )
    assert DEFAULT_MAX_RUNTIME == 1800.0
    assert s.effective_trigger("external") == "external"
    assert s.effective_trigger() == "self"


def test_source_is_the_line_of_the_call() -> None:
    s = define_schedule(name="here", cron="* * * * *", timezone="UTC", handler=ahandler)
    line = test_source_is_the_line_of_the_call.__code__.co_firstlineno + 1
    assert s.source == f"{__file__}:{line}"


@pytest.mark.parametrize("name", ["a", "A_b.c-9", "x" * 128, "0"])
def test_valid_names(name: str) -> None:
    assert define(name=name).name == name


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(timedelta(minutes=5), 300.0), (timedelta(milliseconds=1500), 1.5), (0.25, 0.25), (7, 7.0)],
)
def test_max_runtime_accepts_numbers_and_timedeltas(value: Any, seconds: float) -> None:
    assert define(max_runtime=value).max_runtime == seconds


def test_six_fields_with_the_self_trigger_are_accepted() -> None:
    s = define(cron="*/10 * * * * *", trigger="self")
    assert s.cron.has_seconds and s.cron.expr == "*/10 * * * * *"


@pytest.mark.parametrize("payload", [None, 1, 2.5, "x", True, [1, "a", None], {"a": {"b": [1, 2.0, False]}}])
def test_json_payloads_are_accepted(payload: Any) -> None:
    assert define(payload=payload).payload == payload


# ---------------------------------------------------------------------------------------
# define_schedule: what is refused, and what the message says
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "x" * 129, "has space", "slash/name", "ümlaut", "tab\t", "new\nline", "a:b", "trailing\n"])
def test_bad_names(name: str) -> None:
    with pytest.raises(DefinitionError) as info:
        define(name=name)
    assert str(info.value) == (
        f"define_schedule({name!r}): invalid name {name!r} (1-128 characters of letters, digits, '_', '.', '-')"
    )


@pytest.mark.parametrize("name", [None, 7, b"bytes"])
def test_non_string_names(name: Any) -> None:
    with pytest.raises(DefinitionError, match=re.escape(f"define_schedule(): invalid name {name!r}")):
        define(name=name)


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("61 * * * *", "minute 61 out of range (0-59)"),
        ("* * * *", None),
        ("0 25 * * *", None),
        ("0 0 30 2 *", None),
        ("not cron", None),
        ("0 0 L * *", None),
        ("", None),
    ],
)
def test_bad_cron_names_schedule_expression_and_zone(cron: str, problem: str | None) -> None:
    with pytest.raises(CronError) as info:
        define(name="digest", cron=cron, timezone="Europe/Berlin")
    message = str(info.value)
    assert message.startswith(f'define_schedule(\'digest\'): invalid cron expression "{cron}" (tz="Europe/Berlin"): ')
    if problem is not None:
        assert message.endswith(problem)
    assert isinstance(info.value, DefinitionError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("zone", [None, "", "   "])
def test_missing_timezone(zone: Any) -> None:
    with pytest.raises(CronError) as info:
        define(name="digest", cron="0 9 * * *", timezone=zone)
    assert str(info.value) == (
        'define_schedule(\'digest\'): invalid cron expression "0 9 * * *" '
        f'(tz="{"" if zone is None else zone}"): timezone is required (an IANA name such as "Europe/Berlin")'
    )


def test_omitted_timezone_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="timezone"):
        define_schedule(name="x", cron="* * * * *", handler=ahandler)  # type: ignore[call-arg]  # the missing timezone is the point


@pytest.mark.parametrize("zone", ["Mars/Olympus", "Europe/Berlinn", "CEST+2"])
def test_unknown_timezone(zone: str) -> None:
    with pytest.raises(CronError) as info:
        define(name="digest", cron="0 9 * * *", timezone=zone)
    assert str(info.value) == (
        f'define_schedule(\'digest\'): invalid cron expression "0 9 * * *" (tz="{zone}"): unknown timezone "{zone}"'
    )


def test_localtime_is_refused() -> None:
    with pytest.raises(CronError, match=r'tz="localtime"\): timezone "localtime" follows the host'):
        define(timezone="localtime")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("on_overlap", "wait", "define_schedule('job'): on_overlap 'wait' is not one of skip, queue, parallel"),
        ("on_overlap", None, "define_schedule('job'): on_overlap None is not one of skip, queue, parallel"),
        ("backfill", "newest", "define_schedule('job'): backfill 'newest' is not one of skip, latest, all"),
        ("backfill", "", "define_schedule('job'): backfill '' is not one of skip, latest, all"),
        (
            "trigger",
            "manual",
            "define_schedule('job'): trigger 'manual' is not one of self, external (or None for the app default)",
        ),
        (
            "trigger",
            "cron",
            "define_schedule('job'): trigger 'cron' is not one of self, external (or None for the app default)",
        ),
        ("handler", "not callable", "define_schedule('job'): handler 'not callable' is not callable"),
        ("handler", None, "define_schedule('job'): handler None is not callable"),
        ("description", 5, "define_schedule('job'): description must be a string, not int"),
        ("enabled", "yes", "define_schedule('job'): enabled 'yes' is not a bool"),
        ("enabled", 1, "define_schedule('job'): enabled 1 is not a bool"),
    ],
)
def test_bad_fields(field: str, value: Any, message: str) -> None:
    with pytest.raises(DefinitionError) as info:
        define(**{field: value})
    assert str(info.value) == message
    assert type(info.value) is DefinitionError


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "max_runtime 0 must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (-5, "max_runtime -5 must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (-0.5, "max_runtime -0.5 must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (timedelta(0), "max_runtime 0.0 must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (timedelta(seconds=-1), "max_runtime -1.0 must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (True, "max_runtime True must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (False, "max_runtime False must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        ("60", "max_runtime '60' must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (None, "max_runtime None must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (float("nan"), "max_runtime nan must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (float("-inf"), "max_runtime -inf must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
        (float("inf"), "max_runtime inf must be a number of seconds or a timedelta, more than 0 and at most 604,800 (7 days)"),
    ],
)
def test_bad_max_runtime(value: Any, message: str) -> None:
    with pytest.raises(DefinitionError) as info:
        define(max_runtime=value)
    assert str(info.value) == f"define_schedule('job'): {message}"


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        (object(), "Object of type object is not JSON serializable"),
        ({1, 2}, "Object of type set is not JSON serializable"),
        (float("nan"), "Out of range float values are not JSON compliant"),
        ({"when": timedelta(1)}, "Object of type timedelta is not JSON serializable"),
        (b"raw", "Object of type bytes is not JSON serializable"),
    ],
)
def test_non_json_payload(payload: Any, detail: str) -> None:
    with pytest.raises(DefinitionError) as info:
        define(payload=payload)
    assert str(info.value).startswith("define_schedule('job'): payload is not JSON (")
    assert detail in str(info.value)


def test_a_payload_a_queue_or_a_durable_function_would_refuse_is_refused_at_import() -> None:
    """It imported fine, and every slot then failed: a send of over 256 KiB is TooLarge,
    and one nested past 64 levels went through to the queue, deeper than any other door
    lets a payload go. A handler's payload stays in the process: no bound."""
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    targets: list[dict[str, Any]] = [{"queue": "mail"}, {"durable": "report"}]
    for target in targets:
        with pytest.raises(DefinitionError, match="payload is 300,002 bytes of JSON; the limit is 262,144 bytes"):
            define_schedule(name="job", cron="* * * * *", timezone="UTC", payload="x" * 300_000, **target)
        with pytest.raises(DefinitionError, match="nest 64 levels deep at most"):
            define_schedule(name="job", cron="* * * * *", timezone="UTC", payload=deep, **target)
    handled = define_schedule(name="job", cron="* * * * *", timezone="UTC", handler=ahandler, payload=[deep, "x" * 300_000])
    assert handled.payload == [deep, "x" * 300_000]


def test_six_field_external_is_refused() -> None:
    with pytest.raises(DefinitionError) as info:
        define(cron="*/30 * * * * *", trigger="external")
    assert str(info.value) == (
        "define_schedule('job'): cron \"*/30 * * * * *\" has a seconds field; external schedulers fire at most "
        "once a minute, so a six-field schedule must use the self trigger"
    )


# ---------------------------------------------------------------------------------------
# sync and async handlers
# ---------------------------------------------------------------------------------------
class AsyncCallable:
    async def __call__(self, ctx: RunContext) -> None:
        pass


class SyncCallable:
    def __call__(self, ctx: RunContext) -> None:
        pass


class Jobs:
    async def amethod(self, ctx: RunContext) -> None:
        pass

    def smethod(self, ctx: RunContext) -> None:
        pass


@pytest.mark.parametrize(
    ("handler", "is_async"),
    [
        (ahandler, True),
        (shandler, False),
        (AsyncCallable(), True),
        (SyncCallable(), False),
        (Jobs().amethod, True),
        (Jobs().smethod, False),
        (functools.partial(ahandler), True),
        (functools.partial(shandler), False),
        (lambda ctx: None, False),
        (print, False),
    ],
)
def test_sync_and_async_handlers_are_told_apart(handler: Any, is_async: bool) -> None:
    assert define(handler=handler).is_async is is_async


async def test_a_sync_callable_returning_a_coroutine_is_awaited_or_fails(tmp_path: Path) -> None:
    ran: list[str] = []

    async def send(ctx: RunContext) -> None:
        ran.append(ctx.run_id)

    job = define(handler=lambda ctx: send(ctx))
    assert job.is_async is False  # cannot be told from the outside
    engine = Engine([job], f"sqlite:///{tmp_path / 'state.db'}", clock=ManualClock(), instance="t", shutdown_grace=0)
    await engine.open()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "coroutine 'send' was never awaited"
            run = await engine.run_now("job", wait=True)
        assert (run.status, ran) == ("succeeded", [run.id]) or run.status == "failed"
    finally:
        await engine.stop()


# ---------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------
def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


def schedule_file(name: str, cron: str = "0 * * * *", handler: str = "async def handler(ctx):\n    pass") -> str:
    return (
        "from backend import define_schedule\n"
        f"{handler}\n"
        f'job = define_schedule(name="{name}", cron="{cron}", timezone="UTC", handler=handler)\n'
    )


def test_discovers_nested_files_sorted_by_name_and_ignores_other_files(tmp_path: Path) -> None:
    write(tmp_path / "b.cron.py", schedule_file("bravo"))
    write(tmp_path / "team" / "deep" / "er" / "a.cron.py", schedule_file("alpha", "*/5 * * * *"))
    write(
        tmp_path / "team" / "two.cron.py",
        """
        from backend import define_schedule

        def sync_handler(ctx):
            pass

        async def async_handler(ctx):
            pass

        first = define_schedule(name="charlie", cron="0 1 * * *", timezone="Asia/Tokyo", handler=sync_handler)
        second = define_schedule(name="delta", cron="0 2 * * *", timezone="UTC", handler=async_handler)
        alias = first  # the same schedule under a second name counts once
        not_a_schedule = {"name": "echo"}
        """,
    )
    # None of these end in .cron.py: never imported (each would fail if it were).
    write(tmp_path / "helper.py", "raise RuntimeError('helper.py must not be imported')\n")
    write(tmp_path / "cron.py", "raise RuntimeError('cron.py must not be imported')\n")
    write(tmp_path / "old.cron.py.bak", "raise RuntimeError('a backup must not be imported')\n")
    write(tmp_path / "notes.cron.txt", "raise RuntimeError('not python')\n")
    write(tmp_path / "team" / "x_cron.py", "raise RuntimeError('x_cron.py must not be imported')\n")

    found = discover(tmp_path)
    assert [s.name for s in found] == ["alpha", "bravo", "charlie", "delta"]
    by_name = {s.name: s for s in found}
    assert by_name["alpha"].cron.expr == "*/5 * * * *"
    assert by_name["charlie"].timezone == "Asia/Tokyo"
    assert (by_name["charlie"].is_async, by_name["delta"].is_async, by_name["alpha"].is_async) == (False, True, True)
    assert by_name["charlie"].source == f"{tmp_path / 'team' / 'two.cron.py'}:9"
    assert by_name["bravo"].source == f"{tmp_path / 'b.cron.py'}:4"


def test_discovery_accepts_a_string_path_and_an_empty_folder(tmp_path: Path) -> None:
    assert discover(str(tmp_path)) == []


def test_discovering_twice_gives_fresh_schedules(tmp_path: Path) -> None:
    write(tmp_path / "a.cron.py", schedule_file("alpha"))
    first, second = discover(tmp_path), discover(tmp_path)
    assert [s.name for s in first] == [s.name for s in second] == ["alpha"]
    assert first[0] is not second[0]


def test_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DiscoveryError) as info:
        discover(missing)
    assert str(info.value) == f'schedules folder "{missing}" does not exist or is not a folder'


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    target = write(tmp_path / "a.cron.py", schedule_file("alpha"))
    with pytest.raises(DiscoveryError, match="does not exist or is not a folder"):
        discover(target)


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "sub" / "broken.cron.py",
        """
        from backend import define_schedule

        def handler(ctx)
            pass
        """,
    )
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value).startswith(f"{bad}:3: syntax error: ")


def test_an_exception_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "a_good.cron.py", schedule_file("alpha"))
    bad = write(
        tmp_path / "b_raises.cron.py",
        """
        import os

        def helper():
            return os.environ["SCHEDTUI_SURELY_UNSET_VARIABLE"]

        VALUE = 1
        TOKEN = helper()
        """,
    )
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    # The deepest line inside the file (inside helper), not the stdlib's.
    assert str(info.value) == f"{bad}:4: KeyError: 'SCHEDTUI_SURELY_UNSET_VARIABLE'"
    assert isinstance(info.value.__cause__, KeyError)


def test_a_raise_at_module_level_names_its_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "boom.cron.py", "x = 1\ny = 2\nraise RuntimeError('no config')\n")
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == f"{bad}:3: RuntimeError: no config"


def test_sys_exit_in_a_file_is_a_discovery_error(tmp_path: Path) -> None:
    bad = write(tmp_path / "exits.cron.py", "import sys\n\nsys.exit(3)\n")
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == f"{bad}:3: SystemExit: 3"


def test_a_bad_definition_names_file_line_and_the_definition_problem(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "bad.cron.py",
        """
        from backend import define_schedule

        async def handler(ctx):
            pass

        job = define_schedule(
            name="digest",
            cron="0 9 * * *",
            timezone="Europe/Berlni",
            handler=handler,
        )
        """,
    )
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == (
        f"{bad}:6: define_schedule('digest'): invalid cron expression \"0 9 * * *\" "
        '(tz="Europe/Berlni"): unknown timezone "Europe/Berlni"'
    )


def test_a_bad_policy_inside_a_file(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "policy.cron.py",
        'from backend import define_schedule\njob = define_schedule(name="j", cron="* * * * *", timezone="UTC", '
        'handler=print, on_overlap="wait")\n',
    )
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == f"{bad}:2: define_schedule('j'): on_overlap 'wait' is not one of skip, queue, parallel"


def test_the_same_name_in_two_files_names_both(tmp_path: Path) -> None:
    one = write(tmp_path / "a" / "one.cron.py", schedule_file("digest"))
    two = write(tmp_path / "b" / "two.cron.py", "# two lines\n# of comments\n" + schedule_file("digest", "0 9 * * *"))
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == f'schedule name "digest" is defined twice: in {one}:4 and in {two}:6'


def test_the_same_name_twice_in_one_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "dup.cron.py",
        """
        from backend import define_schedule
        a = define_schedule(name="dup", cron="0 1 * * *", timezone="UTC", handler=print)
        b = define_schedule(name="dup", cron="0 2 * * *", timezone="UTC", handler=print)
        """,
    )
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == f'schedule name "dup" is defined twice: in {path}:2 and in {path}:3'
