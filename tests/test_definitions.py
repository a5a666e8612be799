"""Discovery of the definitions folder: the three file patterns, kinds registered by
their modules, and every problem reported at once."""

from __future__ import annotations

import errno
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend import DiscoveryError, definitions, discover, discover_definitions
from backend.definitions import register_definition_type
from backend.schedules import Schedule


@dataclass(frozen=True)
class FakeQueue:
    """Stands in for the coming queue definitions: any registered type is collected."""

    name: str
    source: str | None = None


register_definition_type(FakeQueue, "queue")


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


def schedule_file(name: str) -> str:
    return (
        "from backend import define_schedule\n"
        "async def handler(ctx):\n    pass\n"
        f'job = define_schedule(name="{name}", cron="0 * * * *", timezone="UTC", handler=handler)\n'
    )


def test_every_pattern_is_searched_and_each_may_define_any_kind(tmp_path: Path) -> None:
    write(tmp_path / "a.cron.py", schedule_file("from-cron"))
    write(tmp_path / "mail" / "b.jobs.py", schedule_file("from-jobs") + "from tests.test_definitions import FakeQueue\n"
          'mailer = FakeQueue("mailer")\n')
    write(tmp_path / "c.durable.py", schedule_file("from-durable"))
    write(tmp_path / "d.py", "raise RuntimeError('not a definitions file')\n")
    write(tmp_path / "e.queue.py", "raise RuntimeError('not a definitions file either')\n")

    found = discover_definitions(tmp_path)
    assert [s.name for s in found.schedules] == ["from-cron", "from-durable", "from-jobs"]
    assert [q.name for q in found.of(FakeQueue)] == ["mailer"]
    assert [p.relative_to(tmp_path).as_posix() for p in found.files] == ["a.cron.py", "c.durable.py", "mail/b.jobs.py"]
    assert all(isinstance(s, Schedule) for s in discover(tmp_path))


def test_a_definition_made_without_a_name_of_its_own_is_discovered_too(tmp_path: Path) -> None:
    """A bare call (as the README's own examples write some), a loop, a list: each
    definition made while its file is imported counts, as one bound to a name does."""
    write(tmp_path / "bare.cron.py", """
        from backend import define_durable, define_queue, define_schedule

        async def handler(ctx, *args):
            pass

        define_schedule(name="bare", cron="0 * * * *", timezone="UTC", handler=handler)
        define_queue(name="mailer", handler=handler)
        define_durable(name="sync", handler=handler)
        regions = [define_schedule(name=f"report-{r}", cron="0 6 * * *", timezone="UTC", handler=handler) for r in "ab"]
        named = define_schedule(name="named", cron="0 * * * *", timezone="UTC", handler=handler)
        also = named  # one definition, two names: found once
    """)
    found = discover_definitions(tmp_path)
    assert [s.name for s in found.schedules] == ["bare", "named", "report-a", "report-b"]
    assert sorted(type(d).__name__ for d in found.items if not isinstance(d, Schedule)) == ["DurableFunction", "Queue"]
    bare = next(s for s in found.schedules if s.name == "bare")
    assert bare.source == f"{tmp_path / 'bare.cron.py'}:6"
    # made twice under one name: refused as two files' would be
    write(tmp_path / "loop.cron.py", """
        from backend import define_schedule
        async def handler(ctx):
            pass
        for _ in range(2):
            define_schedule(name="again", cron="0 * * * *", timezone="UTC", handler=handler)
    """)
    with pytest.raises(DiscoveryError, match='schedule name "again" is defined twice: in .*loop.cron.py:5 and in'):
        discover_definitions(tmp_path)


def test_names_are_unique_per_kind_not_across_kinds(tmp_path: Path) -> None:
    write(tmp_path / "a.cron.py", schedule_file("mailer"))
    write(tmp_path / "b.jobs.py", 'from tests.test_definitions import FakeQueue\nq = FakeQueue("mailer")\n')
    found = discover_definitions(tmp_path)
    assert [type(d).__name__ for d in found.items] == ["Schedule", "FakeQueue"]

    twice = write(tmp_path / "c.jobs.py", 'from tests.test_definitions import FakeQueue\nq = FakeQueue("mailer")\n')
    with pytest.raises(DiscoveryError) as info:
        discover_definitions(tmp_path)
    assert str(info.value) == f'queue name "mailer" is defined twice: in {tmp_path / "b.jobs.py"} and in {twice}'


def test_every_bad_file_is_reported_at_once(tmp_path: Path) -> None:
    write(tmp_path / "a_good.cron.py", schedule_file("fine"))
    syntax = write(tmp_path / "b.cron.py", "def f(:\n    pass\n")
    raises = write(tmp_path / "sub" / "c.jobs.py", "x = 1\nraise RuntimeError('no config')\n")
    interrupt = write(tmp_path / "d.durable.py", "x = 1\ny = 2\nraise KeyboardInterrupt\n")
    exits = write(tmp_path / "e.cron.py", "import sys\nsys.exit(4)\n")
    dup_one = write(tmp_path / "f.cron.py", schedule_file("same"))
    dup_two = write(tmp_path / "g.cron.py", schedule_file("same"))

    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    problems = info.value.problems
    assert problems == [
        f"{syntax}:1: syntax error: invalid syntax",
        f"{interrupt}:3: KeyboardInterrupt",
        f"{exits}:2: SystemExit: 4",
        f'schedule name "same" is defined twice: in {dup_one}:4 and in {dup_two}:4',
        f"{raises}:2: RuntimeError: no config",
    ]
    assert str(info.value) == "5 problems in the definitions:\n" + "\n".join(f"  {p}" for p in problems)
    assert info.value.__cause__ is not None  # the first failing file's exception


def test_an_entry_named_like_a_definitions_file_that_is_no_file_to_import_is_a_problem(tmp_path: Path) -> None:
    """A dangling link (a release folder gone), a folder, a FIFO: each was skipped without a
    word (serve started without it, and its alerts resolved as "no longer defined")."""
    write(tmp_path / "a_good.cron.py", schedule_file("fine"))
    gone = tmp_path / "nightly.cron.py"
    gone.symlink_to("/srv/release-42/nightly.cron.py")
    relative = tmp_path / "sub" / "weekly.jobs.py"
    relative.parent.mkdir()
    relative.symlink_to("../../old/weekly.jobs.py")
    folder = tmp_path / "folder.durable.py"
    folder.mkdir()
    fifo = tmp_path / "pipe.cron.py"
    os.mkfifo(fifo)  # (imported, it would hold the start for good)
    loop = tmp_path / "loop.cron.py"
    loop.symlink_to(loop.name)
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert info.value.problems == [
        f"{folder} is a folder, not a definitions file",
        f"{loop} is a link that leads round in a loop (to loop.cron.py)",
        f"{gone} is a link to /srv/release-42/nightly.cron.py, which does not exist",
        f"{fifo} is a named pipe (FIFO), not a definitions file",
        f"{relative} is a link to ../../old/weekly.jobs.py, which leads to {tmp_path.parent / 'old/weekly.jobs.py'}, "
        "which does not exist",
    ]


def test_a_definitions_file_that_cannot_be_read_is_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As another user meets a file of mode 0 (root, as the suite runs in CI, reads it): its
    opening is refused."""
    locked = write(tmp_path / "locked.cron.py", schedule_file("locked"))
    locked.chmod(0)
    real = open

    def refused(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path) == locked:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(definitions, "open", refused, raising=False)
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert info.value.problems == [f"{locked}: cannot be read: Permission denied"]


def test_a_linked_folder_is_searched_and_a_file_found_by_two_paths_is_one(tmp_path: Path) -> None:
    """A folder of definitions linked in (a release, a shared checkout) was not searched:
    Python's rglob does not enter a linked folder. It is now, each folder once (a link back
    up is no loop), and a file that two paths lead to is imported once, by the first."""
    root = tmp_path / "schedules"
    write(root / "a.cron.py", schedule_file("a"))
    write(tmp_path / "shared-defs" / "b.cron.py", schedule_file("b"))
    (root / "shared").symlink_to("../shared-defs")
    (root / "again").symlink_to(tmp_path / "shared-defs")  # the same folder by a second link
    (root / "alias.cron.py").symlink_to("a.cron.py")  # the same file by a second name
    (tmp_path / "shared-defs" / "up").symlink_to("..")  # back up: no loop
    found = discover_definitions(root)
    assert [s.name for s in found.schedules] == ["a", "b"]
    assert [p.relative_to(root).as_posix() for p in found.files] == ["a.cron.py", "again/b.cron.py"]
    assert next(s for s in found.schedules if s.name == "b").source == f"{root / 'again' / 'b.cron.py'}:4"


def test_an_exception_whose_text_cannot_be_read_is_reported_with_the_others(tmp_path: Path) -> None:
    """A file that raised an exception whose ``__str__`` raises ended the discovery with
    that error (a traceback of the CLI and serve, exit code 1), the folder's other bad
    file unsaid. A NUL byte in a file was reported at line None."""
    odd = write(tmp_path / "a.cron.py", "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n\nraise E()\n")
    other = write(tmp_path / "b.cron.py", "raise ValueError('boom at import')\n")
    nul = tmp_path / "c.cron.py"
    nul.write_bytes(b"x = 1\ny = 2\x00\n")
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert info.value.problems == [
        f"{odd}:5: E: E() (its str() raised RuntimeError)",
        f"{other}:1: ValueError: boom at import",
        f"{nul}:2: syntax error: source code string cannot contain null bytes",
    ]


def test_one_problem_is_the_whole_message(tmp_path: Path) -> None:
    bad = write(tmp_path / "stop.cron.py", "raise KeyboardInterrupt()\n")
    with pytest.raises(DiscoveryError) as info:
        discover(tmp_path)
    assert str(info.value) == f"{bad}:1: KeyboardInterrupt"
    assert info.value.problems == [str(info.value)]


def test_a_definitions_file_that_waits_at_import_is_said_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Code at a file's top level that blocks (a network call, a lock) held serve's start
    with no word at all; past SLOW_IMPORT seconds the log says which file, which line, and
    what it waits in. The import goes on (a slow one may just be slow)."""
    import threading

    from backend import definitions
    from tests.servers import poll

    monkeypatch.setattr(definitions, "SLOW_IMPORT", 0.05)
    release = tmp_path / "released"
    (tmp_path / "slow.cron.py").write_text(textwrap.dedent(f"""\
        import pathlib, time
        from backend import define_schedule

        async def handler(ctx):
            pass

        def wait_for_the_vendor():
            while not pathlib.Path({str(release)!r}).exists():
                time.sleep(0.01)

        wait_for_the_vendor()
        job = define_schedule(name="slow", cron="* * * * *", timezone="UTC", handler=handler)
    """))
    found: list[Schedule] = []
    importing = threading.Thread(target=lambda: found.extend(discover(tmp_path)))
    importing.start()
    try:
        said = poll(lambda: [r.getMessage() for r in caplog.records if "still importing" in r.getMessage()],
                    timeout=10, what="the slow import to be said")  # fmt: skip
    finally:
        release.touch()
        importing.join(10)
    assert said == [
        f"still importing the definitions file {tmp_path / 'slow.cron.py'} after 0.05s, at line 11, in "
        "wait_for_the_vendor() of slow.cron.py: code at a definitions file's top level that waits (a network call, "
        "a lock, input()) holds the start; do it in the handler instead"
    ]
    assert [s.name for s in found] == ["slow"]
