"""The README's examples, run as written: the first thing a Python developer copies.

The blocks are read from README.md at test time, so an edit of the README is what is
tested. What is not literal is said here, each in its own named list:

- the ``python`` blocks: the definition files (``# schedules/…``) are written under their
  own names and run by an engine on SQLite and a :class:`~backend.clock.ManualClock`; the
  ``connect(...)`` / ``Engine(...)`` blocks run inside an async function (they are written
  with a top-level ``await``), with the substitutions of :data:`SUBSTITUTIONS` and the names
  of :data:`GIVEN` defined; ``...`` stays as it is (it is Python); the ``connect`` blocks
  again in their synchronous form (``connect_sync``, :data:`SYNC_FORM`); the alert block's
  schedule, failing, posts the README's webhook JSON;
- the shell blocks: every ``schedtui`` command line, its ``[optional]``, ``(a | b)`` and
  ``a|b`` parts expanded, its placeholders (``RUN_ID``) filled in (:func:`_value`), is
  parsed by the real command line; every one but those of :data:`NOT_RUN` is run for real
  against a local SQLite store holding the README's own definitions (and each command's
  ``--help`` is shown); every other shell line is in :data:`NOT_COMMANDS`, with why; the
  prose's ``schedtui … --option`` spans are parsed too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import shlex
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import Client, Engine, ManualClock, connect, discover, discover_definitions
from backend.alerts.notifier import AlertSettings
from console.cli.output import UsageError
from console.cli.parsing import build_parser, parse_args
from tests.servers import cli_env, run_main

README = Path(__file__).resolve().parents[1] / "README.md"


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # of its first line of code, in README.md
    text: str


def readme_blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of the README, with its language."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    lang: str | None = None
    start, body = 0, list[str]()
    for number, line in enumerate(lines, start=1):
        if lang is None:
            opening = re.fullmatch(r"```(\w*)\s*", line)
            if opening:
                lang, start, body = opening.group(1), number + 1, []
        elif line.strip() == "```":
            blocks.append(Block(lang, start, "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(line)
    assert lang is None, "README.md: a code block is not closed"
    return blocks


# ---------------------------------------------------------------------------------------
# the Python blocks
# ---------------------------------------------------------------------------------------
#: Each Python block of the README, by what tells it: a block that none (or two) of these
#: tells is a new example, which needs its test here.
PYTHON_KINDS: dict[str, Callable[[str], bool]] = {
    "definition file": lambda code: code.startswith("# schedules/"),
    "alert settings": lambda code: code.startswith("define_schedule(") and "alert=" in code,
    "connect: schedules": lambda code: "connect(" in code and "st.schedules." in code,
    "engine in your process": lambda code: "Engine(" in code and "asyncio.run(main())" in code,
    "connect: jobs": lambda code: "connect(" in code and "st.jobs." in code,
    "connect: locks": lambda code: "connect(" in code and "st.locks." in code,
}

#: What is not literal in a block: (the README's text, what runs instead, why), each found
#: in the block (a README that no longer has it fails here: look again).
SUBSTITUTIONS: dict[str, list[tuple[str, str, str]]] = {
    "connect: schedules": [('"postgresql://…"', '"{store}"', "the server: a SQLite store (its comment: or sqlite:///…)")],
    "connect: jobs": [('"postgresql://…"', '"{store}"', "the server: a SQLite store")],
    "connect: locks": [('"postgresql://…"', '"{store}"', "the server: a SQLite store (locks live in either)")],
}

#: Names a block uses without defining them, as the README leaves them to the reader.
GIVEN: dict[str, dict[str, Any]] = {
    "connect: schedules": {"start": datetime(2026, 11, 1, tzinfo=UTC), "end": datetime(2026, 11, 8, tzinfo=UTC)},
    "engine in your process": {"start": datetime(2026, 11, 1, tzinfo=UTC), "end": datetime(2026, 11, 8, tzinfo=UTC)},
}

#: The alert block's handlers (it shows the calls alone) and its imports.
ALERT_PRELUDE = """\
from backend import define_durable, define_queue, define_schedule

async def export(ctx): raise ConnectionError("vendor API down")
async def send_mail(job): pass
async def nightly_sync(ctx, input): pass
async def poke(ctx): pass
"""


def python_blocks(kind: str) -> list[Block]:
    return [b for b in readme_blocks() if b.lang == "python" and PYTHON_KINDS[kind](b.text)]


def one_block(kind: str) -> Block:
    found = python_blocks(kind)
    assert len(found) == 1, f"the README has {len(found)} python blocks of kind {kind!r}, not one"
    return found[0]


def substituted(kind: str, code: str, **values: str) -> str:
    for readme_text, instead, why in SUBSTITUTIONS.get(kind, []):
        assert readme_text in code, f"{kind}: the README no longer writes {readme_text!r} ({why}): look again"
        code = code.replace(readme_text, instead.format(**values))
    return code


async def run_async_block(kind: str, block: Block, **values: str) -> dict[str, Any]:
    """The block's code inside an async function (it awaits at the top level), with the
    names of :data:`GIVEN`; returns its local names."""
    code = substituted(kind, block.text, **values)
    source = "async def _readme_block():\n" + textwrap.indent(code, "    ") + "    return locals()\n"
    namespace: dict[str, Any] = dict(GIVEN.get(kind, {}))
    exec(compile(source, f"README.md:{block.line}", "exec"), namespace)
    result: dict[str, Any] = await namespace["_readme_block"]()
    return result


def write_definition_files(folder: Path) -> list[Path]:
    """The README's definition files, each under the name its first line gives."""
    written = []
    for block in python_blocks("definition file"):
        name = block.text.splitlines()[0].removeprefix("# ").strip()
        path = folder.parent / name  # (the name begins with schedules/)
        assert path.parent == folder, f"README.md:{block.line}: {name} is not a file of schedules/"
        path.write_text(block.text, encoding="utf-8")
        written.append(path)
    return written


def test_every_python_block_is_of_one_known_kind() -> None:
    blocks = [b for b in readme_blocks() if b.lang == "python"]
    assert blocks
    for block in blocks:
        kinds = [kind for kind, tells in PYTHON_KINDS.items() if tells(block.text)]
        assert len(kinds) == 1, f"README.md:{block.line}: a python block of kinds {kinds}: give it a test here"
    assert len(python_blocks("definition file")) == 3


@dataclass
class Facts:
    """What the definitions' scenario left in the store, for the examples that follow."""

    run: str = ""
    job_done: str = ""
    job_queued: str = ""
    execution_done: str = ""
    execution_waiting: str = ""
    execution_failed: str = ""
    printed: dict[str, str] = field(default_factory=dict)


async def run_definitions(folder: Path, store: str) -> Facts:
    """The README's definition files on a ManualClock: the digest fires at its slot, a job
    sent to the mailer runs, the durable function runs to its wait and ends once signalled.
    Leaves a store the other examples act on."""
    facts = Facts()
    assert [s.name for s in discover(folder)] == ["daily-digest"]  # backend.discover: the schedules
    # 09:00 in Berlin on 2 November 2026 (CET) is 08:00 UTC.
    clock = ManualClock("2026-11-02T07:59:30Z")
    engine = Engine(discover_definitions(folder), store, clock=clock)
    st = Client(engine)
    await engine.start()
    try:
        await engine.quiesce()
        assert (await st.schedules.runs("daily-digest"))[0] == []
        clock.advance(30)
        await engine.quiesce()
        runs, _ = await st.schedules.runs("daily-digest")
        assert [(r.scheduled_at, r.trigger, r.status) for r in runs] == [
            (datetime(2026, 11, 2, 8, tzinfo=UTC), "self", "succeeded")
        ]
        facts.run = runs[0].id
        facts.printed["digest"] = (await engine.run_logs.run_log(facts.run)).text
        assert facts.printed["digest"] == "digest for 2026-11-02 08:00:00+00:00 {'list': 'all'}\n"

        sent = await st.jobs.send("mailer", {"order": 42})
        await engine.quiesce()
        detail = await st.jobs.get(sent.id)
        assert [(a.number, a.status) for a in detail.attempts] == [(1, "succeeded")]
        facts.job_done = sent.id
        facts.printed["mailer"] = (await engine.run_logs.job_log(sent.id)).text
        assert facts.printed["mailer"].startswith(f"{sent.id} {{'order': 42}} 1 3 None None ")
        facts.job_queued = (await st.jobs.send("mailer", {"order": 43}, delay=86400)).id

        started = await st.durable.start("nightly-sync", {"pages": 3})
        await engine.quiesce()
        execution = await st.durable.get(started.id)
        assert (execution.status, execution.waiting_for) == ("waiting", "sleep:cool-down")
        clock.advance(60)
        await engine.quiesce()
        execution = await st.durable.get(started.id)
        assert (execution.status, execution.waiting_for) == ("waiting", "signal:approval")
        assert len(execution.steps or []) == 5  # (`schedtui durable show …  # 5 steps; waiting for signal:approval`)
        await st.durable.signal(started.id, "approval", {"by": "ops"})
        await engine.quiesce()
        execution = await st.durable.get(started.id)
        assert (execution.status, execution.output) == ("succeeded", {"rows": 60, "sent": True})
        assert [(s.name, s.kind) for s in execution.steps or []] == [
            ("fetch-1", "step"), ("fetch-2", "step"), ("fetch-3", "step"), ("cool-down", "sleep"),
            ("approval", "signal"), ("notify", "step"),
        ]  # fmt: skip
        facts.execution_done = started.id

        waiting = await st.durable.start("nightly-sync", {"pages": 1})
        clock.advance(60)
        await engine.quiesce()
        clock.advance(60)
        await engine.quiesce()
        assert (await st.durable.get(waiting.id)).waiting_for == "signal:approval"
        facts.execution_waiting = waiting.id
        # (a body that raises fails its execution: its input is not a number of pages)
        failed = await st.durable.start("nightly-sync", {"pages": "three"})
        await engine.quiesce()
        assert (await st.durable.get(failed.id)).status == "failed"
        facts.execution_failed = failed.id
    finally:
        await engine.stop()
    return facts


def folder_with_definitions(root: Path) -> Path:
    folder = root / "schedules"
    folder.mkdir()
    write_definition_files(folder)
    return folder


async def test_the_definition_files_run_as_the_readme_says(tmp_path: Path) -> None:
    folder = folder_with_definitions(tmp_path)
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".py") == [
        "digest.cron.py", "mail.jobs.py", "sync.durable.py"
    ]  # fmt: skip
    await run_definitions(folder, f"sqlite:///{tmp_path / 'state.db'}")


async def test_the_alert_settings_are_accepted(tmp_path: Path) -> None:
    block = one_block("alert settings")
    folder = tmp_path / "alerting"
    folder.mkdir()
    (folder / "alerts.cron.py").write_text(ALERT_PRELUDE + block.text, encoding="utf-8")
    found = discover_definitions(folder)
    assert sorted(s.name for s in found.schedules) == ["best-effort", "nightly-export"]
    assert sorted(item.name for item in found.items) == ["best-effort", "mailer", "nightly-export", "nightly-sync"]
    engine = Engine(found, f"sqlite:///{tmp_path / 'state.db'}", clock=ManualClock())
    await engine.open()
    try:
        views = {view.name: view for view in await engine.list_schedules()}
        assert views["best-effort"].alert is False
        assert views["nightly-export"].alert == {"failing": 2, "late": 3600, "disabled": False, "resolve_after": 900}
    finally:
        await engine.stop()


async def test_a_failing_alert_is_posted_as_the_readme_shows(tmp_path: Path) -> None:
    """The alert block's nightly-export, failing two nights running, posts the README's
    JSON: field for field, but for the transition's id (new each time) and the time the
    transition was seen (the README's is 15 s after the slot; within the minute here)."""
    (readme_json,) = [b for b in readme_blocks() if b.lang == "json" and '"alert": "failing"' in b.text]
    shown = json.loads(readme_json.text)
    folder = tmp_path / "alerting"
    folder.mkdir()
    (folder / "alerts.cron.py").write_text(ALERT_PRELUDE + one_block("alert settings").text, encoding="utf-8")
    bodies: list[dict[str, Any]] = []

    def webhook(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200)

    clock = ManualClock("2026-11-29T02:59:00Z")
    engine = Engine(
        discover_definitions(folder), f"sqlite:///{tmp_path / 'state.db'}", clock=clock, instance=shown["instance"],
        alerting=AlertSettings(sinks=("https://hooks.example.test/T000/secret",)),
        alert_transport=httpx.MockTransport(webhook),
    )  # fmt: skip
    await engine.start()
    try:
        for slot in ("2026-11-29T03:00:00Z", "2026-11-30T03:00:00Z"):
            clock.set(slot)
            await engine.quiesce()
        while not [b for b in bodies if b["alert"] == "failing"] and clock.now() < datetime(2026, 11, 30, 3, 1, tzinfo=UTC):
            clock.advance(5)
            await engine.quiesce()
    finally:
        await engine.stop()
    (posted,) = [b for b in bodies if b["alert"] == "failing"]
    assert re.fullmatch(r"2026-11-30T03:00:[0-5]\dZ", posted["since"]), posted["since"]
    expected = dict(shown, transition=posted["transition"], since=posted["since"],
                    text=shown["text"].replace(shown["since"], posted["since"]))  # fmt: skip
    assert posted == expected


async def test_connect_acts_on_schedules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = folder_with_definitions(tmp_path)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    await run_definitions(folder, store)
    monkeypatch.chdir(tmp_path)  # definitions="schedules", as the README runs from the project's root
    names = await run_async_block("connect: schedules", one_block("connect: schedules"), store=store)
    assert "daily-digest" in [view.name for view in names["views"]]
    assert (names["run"].name, names["run"].trigger, names["run"].status) == ("daily-digest", "manual", "succeeded")
    assert (names["plan"].count, names["plan"].first) == (7, datetime(2026, 11, 1, 8, tzinfo=UTC))
    async with connect(store, definitions="schedules") as st:
        view = await st.schedules.get("daily-digest")
    assert (view.enabled, view.state_note and view.state_note.note) == (False, "vendor outage, INC-412")


def test_an_engine_in_your_own_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder_with_definitions(tmp_path)
    monkeypatch.chdir(tmp_path)
    block = one_block("engine in your process")
    namespace: dict[str, Any] = dict(GIVEN["engine in your process"])
    exec(compile(block.text, f"README.md:{block.line}", "exec"), namespace)  # its own asyncio.run(main())

    async def after() -> None:
        # It stands in for `schedtui serve`: the folder's queue was run too (recorded by the
        # engine that runs it), not its schedules alone. (Before a connect with the folder,
        # which would record it; one without records nothing.)
        async with connect("sqlite:///.schedtui/state.db") as st:
            assert [queue.name for queue in await st.jobs.queues()] == ["mailer"]
            runs, _ = await st.schedules.runs("daily-digest")
            # (its Run now; on the real clock, a start at 09:00 in Berlin could fire the slot too)
            assert [r.status for r in runs if r.trigger == "manual"] == ["succeeded"]

    asyncio.run(after())


async def test_connect_sends_jobs(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    await run_definitions(folder_with_definitions(tmp_path), store)  # (a queue is recorded by its engine)
    names = await run_async_block("connect: jobs", one_block("connect: jobs"), store=store)
    assert names["sent"].duplicate is False
    async with connect(store) as st:
        queued = await st.jobs.list("mailer", status="queued")
    payloads = sorted(json.dumps(job.payload) for job in queued.jobs)
    assert payloads == ['1', '2', '{"order": 43}']  # receipt:42 cancelled; the scenario's delayed one


async def test_connect_takes_locks(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    await run_definitions(folder_with_definitions(tmp_path), store)
    names = await run_async_block("connect: locks", one_block("connect: locks"), store=store)
    assert names["res"].acquired and names["res"].error is None
    assert names["lease"].token


#: The README's synchronous form of the connect blocks ("`with connect_sync(...) as st:`
#: with the same methods, blocking"; for locks "the same calls, blocking; the work runs in
#: your thread"): each replacement, in order.
SYNC_FORM = [
    ("async with connect(", "with connect_sync("), ("from backend import connect", "from backend import connect_sync"),
    ("await ", ""), ("async def ", "def "), ("async with ", "with "),
]  # fmt: skip


@pytest.mark.parametrize("kind", ["connect: schedules", "connect: jobs", "connect: locks"])
def test_the_connect_blocks_run_with_connect_sync(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    asyncio.run(run_definitions(folder_with_definitions(tmp_path), store))
    monkeypatch.chdir(tmp_path)
    block = one_block(kind)
    code = substituted(kind, block.text, store=store)
    for async_form, sync_form in SYNC_FORM:
        code = code.replace(async_form, sync_form)
    assert "await" not in code and "async" not in code
    names: dict[str, Any] = dict(GIVEN.get(kind, {}))
    exec(compile(code, f"README.md:{block.line}", "exec"), names)
    if kind == "connect: schedules":
        assert (names["run"].status, names["plan"].count) == ("succeeded", 7)
    elif kind == "connect: jobs":
        assert names["sent"].duplicate is False
    else:
        assert names["res"].acquired and names["res"].error is None


# ---------------------------------------------------------------------------------------
# the shell blocks
# ---------------------------------------------------------------------------------------
SHELL_LANGS = {"sh", "bash", "console", "shell"}

#: Shell lines that are not ``schedtui`` commands, by how they begin: why none runs here.
NOT_COMMANDS = {
    "python3 -m venv": "makes a virtual environment (the package is installed in this one)",
    ". .venv/bin/activate": "enters that environment",
    "pip install": "installs the package: network and minutes",
    "ruff check": "the project's own checks: run by its CI, not from its README",
    "mypy": "the project's own checks: run by its CI, not from its README",
    "python -m pytest": "the whole suite, of which this file is part",
    "python -m tests.bench.": "benchmarks: minutes each, on PostgreSQL beside other libraries",
}

#: Commands parsed but not run: why.
NOT_RUN = {
    "console": "the full-screen console: tests/test_console*.py drive it",
    "demo": "the full-screen demo on a clock of its own",
    "serve": "runs until stopped, on the real clock: test_cli.py runs it",
    "instances forget": "needs an instance that died holding its registration (a killed process): test_cli.py",
    "jobs retry": "needs a dead job, and the README's send_mail never fails",
}

#: What in a command line is written for a reader, not for the shell: (text, instead, why).
SHELL_SUBSTITUTIONS = [
    ('"$(hostname)"', "host-1", "a command substitution: the value it gives"),
    ("--port …", "--port 8787", "the README's ellipsis for a port"),
    (" …", "", "the README's ellipsis: the options shown elsewhere"),
    (" &", "", "the shell's background operator"),
    (" | head", "", "the shell's pipe"),
    ("[the same options; --enabled]",
     "[--cron EXPR] [--timezone TZ] [--queue Q | --durable F] [--payload JSON] [--description D] "
     "[--disabled | --enabled] [--on-overlap P] [--backfill P] [--max-runtime S] [--alert JSON]",
     "the options of `schedules create` the README points to"),
    ("ID_OR_KEY | --key K", "(ID_OR_KEY | --key K)", "the alternative, bracketed"),
]  # fmt: skip


@dataclass(frozen=True)
class CommandLine:
    line: int
    text: str


def command_lines() -> list[CommandLine]:
    """Every ``schedtui`` command of the README's shell blocks, continuations joined; a
    shell line that is neither a command, a comment nor one of :data:`NOT_COMMANDS` fails."""
    found = []
    for block in readme_blocks():
        if block.lang not in SHELL_LANGS:
            continue
        logical: list[tuple[int, str]] = []
        for offset, raw in enumerate(block.text.splitlines()):
            if logical and (logical[-1][1].endswith("\\") or (raw[:1].isspace() and raw.strip())):
                number, previous = logical[-1]
                logical[-1] = (number, previous.removesuffix("\\").rstrip() + " " + raw.strip())
            else:
                logical.append((block.line + offset, raw.strip()))
        for number, text in logical:
            if not text or text.startswith("#"):
                continue  # (what a command printed, or a comment)
            for segment in text.split(" && "):
                if segment == "schedtui" or segment.startswith("schedtui "):
                    found.append(CommandLine(number, segment))
                else:
                    assert any(segment.startswith(prefix) for prefix in NOT_COMMANDS), (
                        f"README.md:{number}: {segment!r} is no schedtui command: run it here, or say in "
                        "NOT_COMMANDS why not"
                    )
    return found


def inline_command_lines() -> list[CommandLine]:
    """The ``schedtui …`` spans of the README's prose that give an option (parsed, not run:
    they show a command in passing; one without is a verb's name, as ``schedtui fire``)."""
    found, fenced = [], False
    for number, text in enumerate(README.read_text(encoding="utf-8").splitlines(), start=1):
        if text.startswith("```"):
            fenced = not fenced
        elif not fenced:
            found += [CommandLine(number, span) for span in re.findall(r"`(schedtui [^`]*)`", text) if " -" in span]
    return found


@dataclass(eq=False)
class Choice:
    optional: bool
    alternatives: list[list[Any]]


def _tokens(text: str) -> list[str]:
    for readme_text, instead, _why in SHELL_SUBSTITUTIONS:
        text = text.replace(readme_text, instead)
    tokens = []
    for token in shlex.split(text, comments=True)[1:]:  # (after "schedtui")
        opening = re.match(r"^[\[(]+", token)
        closing = re.search(r"[\])]+$", token) if not token.startswith("{") else None
        middle = token[opening.end() if opening else 0 : closing.start() if closing else len(token)]
        tokens += list(opening.group(0) if opening else "") + ([middle] if middle else [])
        tokens += list(closing.group(0) if closing else "")
    return tokens


def _grammar(tokens: list[str]) -> list[Any]:
    """``[optional]``, ``(required | alternatives)`` and ``a|b`` words, as a tree."""
    position = 0

    def sequence(stops: set[str]) -> list[Any]:
        nonlocal position
        items: list[Any] = []
        while position < len(tokens) and tokens[position] not in stops:
            token = tokens[position]
            position += 1
            if token in ("[", "("):
                close = "]" if token == "[" else ")"
                alternatives = [sequence({"|", close})]
                while tokens[position] == "|":
                    position += 1
                    alternatives.append(sequence({"|", close}))
                assert tokens[position] == close, f"unbalanced {token} in {tokens}"
                position += 1
                items.append(Choice(token == "[", alternatives))
            elif "|" in token and not token.startswith(("{", "'", '"')):
                items.append(Choice(False, [[word] for word in token.split("|")]))
            else:
                items.append(token)
        return items

    tree = sequence(set())
    assert position == len(tokens)
    return tree


def _choices(items: list[Any]) -> Iterator[Choice]:
    for item in items:
        if isinstance(item, Choice):
            yield item
            for alternative in item.alternatives:
                yield from _choices(alternative)


def _render(items: list[Any], full: bool, picks: dict[int, int]) -> list[str]:
    words: list[str] = []
    for item in items:
        if isinstance(item, str):
            words.append(item)
        elif not item.optional or full or id(item) in picks:
            words += _render(item.alternatives[picks.get(id(item), 0)], full, picks)
    return words


def variants(text: str) -> list[list[str]]:
    """The command lines a synopsis stands for: every optional part given (the first, run
    for real), each alternative once, and no optional part."""
    tree = _grammar(_tokens(text))
    found = [_render(tree, True, {})]
    for choice in _choices(tree):
        for index in range(1, len(choice.alternatives)):
            found.append(_render(tree, True, {id(choice): index}))
    found.append(_render(tree, False, {}))
    unique: list[list[str]] = []
    for argv in found:
        if argv not in unique:
            unique.append(argv)
    return unique


_COMMANDS = set(build_parser()[1])


def command_of(argv: list[str]) -> str:
    words = [w for w in argv if not w.startswith("-")]
    if len(words) >= 2 and f"{words[0]} {words[1]}" in _COMMANDS and argv[:2] == words[:2]:
        return f"{words[0]} {words[1]}"
    if words and argv[0] == words[0] and words[0] in _COMMANDS:
        return words[0]
    return "console" if not argv or argv[0].startswith("-") else argv[0]


#: A placeholder's value by the option before it (or the command), then by itself.
_BY_OPTION = {
    ("--payload", "JSON"): '{"order": 42}', ("--alert", "JSON"): '{"failing": 3}', ("--input", "JSON"): '{"pages": 3}',
    ("--attempt", "N"): "1", ("--out", "FILE"): "rules.yml",
}  # fmt: skip
_PLAIN = {
    "EXPR": "0 8 * * 1", "TZ": "UTC", "Q": "mailer", "F": "nightly-sync", "FUNCTION": "nightly-sync", "D": "Weekly",
    "P": "skip", "S": "60", "N": "10", "K": "receipt:42", "ID_OR_KEY": "receipt:42", "DIR": "schedules",
}  # fmt: skip
#: Words in capitals that are values, not placeholders.
LITERAL_CAPITALS = {"UTC"}
#: The README's own example of an execution id (a walk-through): the waiting execution's.
EXAMPLE_EXECUTION = "01M8PW9BXZMMJ3DS7YY4E3N5SX"


def _value(command: str, option: str, placeholder: str, facts: Facts, audit: str) -> str:
    by_command = {
        ("logs", "RUN_ID"): facts.run, ("runs", "RUN_ID"): facts.run, ("audit", "ID"): audit,
        ("jobs list", "ID"): facts.job_done, ("jobs show", "ID"): facts.job_done, ("jobs logs", "ID"): facts.job_done,
        ("jobs logs", "JOB_ID"): facts.job_done, ("jobs retry", "ID"): facts.job_done,
        ("jobs delete", "ID"): facts.job_queued, ("durable list", "ID"): facts.execution_done,
        ("durable show", "ID"): facts.execution_done, ("durable logs", "ID"): facts.execution_done,
        ("durable signal", "ID"): facts.execution_waiting, ("durable cancel", "ID"): facts.execution_waiting,
        ("durable retry", "ID"): facts.execution_failed, ("durable signal", "NAME"): "approval",
        ("schedules create", "NAME"): "weekly-digest", ("schedules update", "NAME"): "weekly-digest",
        ("schedules delete", "NAME"): "weekly-digest", ("instances forget", "NAME"): "vm:1",
        ("locks release", "NAME"): "nightly-rollup",
    }  # fmt: skip
    for key, table in (((option, placeholder), _BY_OPTION), ((command, placeholder), by_command)):
        if key in table:
            return table[key]
    assert placeholder in _PLAIN, f"{command}: no value for the README's {placeholder}: give it one here"
    return _PLAIN[placeholder]


def concrete(argv: list[str], facts: Facts, audit: str) -> list[str]:
    command = command_of(argv)
    filled = []
    for index, word in enumerate(argv):
        if re.fullmatch(r"[A-Z][A-Z_]*", word) and word not in LITERAL_CAPITALS:
            word = _value(command, argv[index - 1] if index else "", word, facts, audit)
        elif word == EXAMPLE_EXECUTION:
            word = facts.execution_waiting
        filled.append(word)
    return filled


#: Files the command line reads, by option: what it reads instead, in the test's folder.
READ_FILES = {"--store-file": "store.url", "--token-file": "token", "--read-token-file": "read-token"}


def with_files(argv: list[str], root: Path) -> list[str]:
    out = list(argv)
    for index, word in enumerate(argv[:-1]):
        if word in READ_FILES:
            out[index + 1] = str(root / READ_FILES[word])
    return out


#: The environment's settings the README's lines do without (its defaults are what they use).
UNSET = ("SCHEDTUI_STORE", "SCHEDTUI_SCHEDULES", "SCHEDTUI_URL", "SCHEDTUI_TOKEN", "SCHEDTUI_READ_TOKEN",
         "SCHEDTUI_LOG_FILE", "SCHEDTUI_LOG_LEVEL")  # fmt: skip


def _environment() -> dict[str, str]:
    env = cli_env()
    for name in UNSET:
        env.pop(name, None)
    return env


def _project(root: Path) -> None:
    folder_with_definitions(root)
    (root / "store.url").write_text("sqlite:///.schedtui/state.db\n", encoding="utf-8")
    (root / "token").write_text("s3cret-token-for-the-readme\n", encoding="utf-8")
    (root / "read-token").write_text("an0ther-token-to-read-with\n", encoding="utf-8")


def test_every_command_line_is_one_the_parser_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each variant of each README command line, as the real parser reads it (the
    placeholders filled in with values of their kind; no store is opened)."""
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    some_id = "01M99JXKS6RX4EZ75T65W3EG4Y"  # (ids of the right shape: nothing is opened)
    facts = Facts(some_id, some_id, some_id, some_id, some_id, some_id)
    lines = command_lines() + inline_command_lines()
    assert len(lines) > 60
    refused = []
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    for line in lines:
        for argv in variants(line.text):
            full = with_files(concrete(argv, facts, facts.run), tmp_path)
            try:
                parse_args(full)
            except UsageError as exc:
                refused.append(f"README.md:{line.line}: schedtui {shlex.join(full)}: {exc}")
            except SystemExit as exc:  # (argparse's own exit: --help, --version)
                if exc.code == 0 and {"--help", "--version"} & set(full):
                    continue
                refused.append(f"README.md:{line.line}: schedtui {shlex.join(full)}: exit {exc.code}")
    assert not refused, "\n".join(refused)


def _run(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``schedtui ARGV`` in ``root``, in this process; a command that does not end (a
    --follow of something still running) fails the test rather than hanging it."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        future = thread.submit(run_main, root, *argv, env=_environment())
        try:
            return future.result(timeout=30)
        except concurrent.futures.TimeoutError:
            pytest.fail(f"schedtui {shlex.join(argv)} did not end")


def test_every_command_line_runs_on_a_local_store(tmp_path: Path) -> None:
    """The first variant of each README command line (every optional part given), in the
    README's order, on a SQLite store holding the README's definitions; and each command's
    --help."""
    _project(tmp_path)
    facts = asyncio.run(run_definitions(tmp_path / "schedules", f"sqlite:///{tmp_path / '.schedtui' / 'state.db'}"))
    audit = json.loads(_run(tmp_path, ["audit", "--json", "--limit", "1"]).stdout)[0]["id"]
    failures, commands = [], set()
    for line in command_lines():
        argv = with_files(concrete(variants(line.text)[0], facts, audit), tmp_path)
        command = command_of(argv)
        commands.add(command)
        if command in NOT_RUN:
            continue
        done = _run(tmp_path, argv)
        if done.returncode != 0:
            failures.append(f"README.md:{line.line}: schedtui {shlex.join(argv)}: exit {done.returncode}: {done.stderr}")
    for command in sorted(commands):
        helped = _run(tmp_path, [*command.split(), "--help"])
        if helped.returncode != 0 or f"usage: schedtui {command}" not in helped.stdout:
            failures.append(f"schedtui {command} --help: exit {helped.returncode}: {helped.stderr}")
    assert not failures, "\n".join(failures)
    assert set(NOT_RUN) <= commands, "NOT_RUN names a command the README no longer shows"


def test_the_walkers_see_what_the_readme_writes() -> None:
    """The expansion of a synopsis, on the README's own kinds of line."""
    assert variants("schedtui runs daily-digest [--limit 20] [--json]") == [
        ["runs", "daily-digest", "--limit", "20", "--json"], ["runs", "daily-digest"]
    ]  # fmt: skip
    assert variants("schedtui logs RUN_ID [--follow | --json]") == [
        ["logs", "RUN_ID", "--follow"], ["logs", "RUN_ID", "--json"], ["logs", "RUN_ID"]
    ]  # fmt: skip
    assert variants("schedtui queues pause|resume mailer") == [["queues", "pause", "mailer"], ["queues", "resume", "mailer"]]
    assert variants("schedtui jobs send mailer --payload '{\"order\": 42}'") == [
        ["jobs", "send", "mailer", "--payload", '{"order": 42}']
    ]
    assert command_of(["jobs", "send", "mailer"]) == "jobs send" and command_of([]) == "console"
