"""Discovering definitions in the definitions folder (``--schedules DIR``).

The folder is searched, recursively, for ``*.cron.py``, ``*.jobs.py`` and ``*.durable.py``
files, through its folders that are symlinks too, each file once (see
:func:`_definition_entries`). Each is imported by path, and every module-level object that
is an instance of a *registered definition type* is collected, and so is every definition
the file made while it was imported without binding it to a name (:mod:`backend.defined`),
whatever the file's suffix: the suffix tells readers what a file is mostly about, not what
it may define. :class:`~backend.schedules.Schedule` is registered here; the queue and
durable-function types register themselves with :func:`register_definition_type` when
their modules are imported (a file that defines one imports its module first, so the type
is always known before its instances appear).

Every problem is collected before anything is refused: an entry named like a definitions
file that is not a file it can read (a dangling link, a folder, a FIFO), a file that fails
to import (its path and the line that failed), and two definitions of one kind sharing a
name (both places). One :class:`DiscoveryError` then lists them all, so one bad file never
hides another's error.
"""

from __future__ import annotations

import errno
import fnmatch
import importlib.util
import logging
import os
import re
import stat
import sys
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from backend.defined import collecting
from backend.errors import DefinitionError, DiscoveryError, describe_exception
from backend.schedules import Schedule

__all__ = [
    "DEFINITION_PATTERNS",
    "Definitions",
    "discover",
    "discover_definitions",
    "load_file",
    "register_definition_type",
]

T = TypeVar("T")

log = logging.getLogger("schedtui.definitions")

#: Seconds a definitions file may take to import before the log says where it waits: code
#: at its top level that blocks (a network call, a lock, ``input()``) held a start with no
#: word at all.
SLOW_IMPORT = 5.0

#: The file names searched for below the definitions folder.
DEFINITION_PATTERNS = ("*.cron.py", "*.jobs.py", "*.durable.py")


@dataclass(frozen=True)
class _Kind:
    type: type
    label: str
    """How messages name one of them: ``schedule``, ``queue``, ``durable function``."""


_KINDS: list[_Kind] = []


def register_definition_type(cls: type, label: str) -> None:
    """Let discovery collect module-level instances of ``cls``. Instances must have a
    ``name`` (unique among their kind) and may have a ``source`` (``path:line``)."""
    if not any(kind.type is cls for kind in _KINDS):
        _KINDS.append(_Kind(cls, label))


register_definition_type(Schedule, "schedule")


@dataclass(frozen=True)
class Definitions:
    """Everything a definitions folder defines, each kind sorted by name."""

    items: tuple[Any, ...]
    files: tuple[Path, ...]
    """The files that were imported."""

    def of(self, cls: type[T]) -> list[T]:
        """The definitions of one type, by name."""
        return [item for item in self.items if isinstance(item, cls)]

    @property
    def schedules(self) -> list[Schedule]:
        return self.of(Schedule)


def discover(folder: str | Path) -> list[Schedule]:
    """The schedules a definitions folder defines, by name (see :func:`discover_definitions`)."""
    return discover_definitions(folder).schedules


def discover_definitions(folder: str | Path) -> Definitions:
    """Import every definitions file below ``folder`` and collect what it defines.

    Raises :class:`DiscoveryError` listing every problem (``path:line: problem``): each
    file that fails to import, and each name defined twice within one kind."""
    root = Path(folder)
    if not root.is_dir():
        raise DiscoveryError(f'schedules folder "{folder}" does not exist or is not a folder')
    entries = _definition_entries(root)
    files = [path for path, problem in entries if problem is None]
    problems: list[tuple[str, BaseException | None]] = []
    found: dict[tuple[int, str], tuple[Any, Path]] = {}
    for path, problem in entries:
        if problem is not None:
            problems.append((problem, None))
            continue
        try:
            loaded = _load_file(path)
        except _BadFile as bad:
            problems.append((bad.problem, bad.__cause__))
            continue
        for index, item in loaded:
            other = found.get((index, item.name))
            if other is not None:
                problems.append(
                    (
                        f'{_KINDS[index].label} name "{item.name}" is defined twice: in '
                        f"{_where(*other)} and in {_where(item, path)}",
                        None,
                    )
                )
                continue
            found[(index, item.name)] = (item, path)
    if problems:
        raise _discovery_error(problems)
    items = tuple(found[key][0] for key in sorted(found))
    return Definitions(items=items, files=tuple(files))


def _definition_entries(root: Path) -> list[tuple[Path, str | None]]:
    """Every entry below ``root`` named like a definitions file, by path, with what keeps it
    from being imported as one (``None``: a file to import). Folders that are symlinks are
    searched too (a release linked in), each folder once: a link back up is no loop, and a
    file found by two paths (a link to it, a second link to its folder) is one file, taken
    by the first of them."""
    entries: dict[Path, str | None] = {}
    files: dict[tuple[int, int], Path] = {}
    folders: set[tuple[int, int]] = set()
    for top, subfolders, names in os.walk(root, followlinks=True, onerror=_unsearchable):
        subfolders.sort()  # (searched in path order: the first of two paths is the one taken)
        try:
            st = os.stat(top)
        except OSError:
            subfolders.clear()
            continue
        if (st.st_dev, st.st_ino) in folders:
            subfolders.clear()
            continue
        folders.add((st.st_dev, st.st_ino))
        for name in sorted([*subfolders, *names]):
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in DEFINITION_PATTERNS):
                continue
            path = Path(top, name)
            problem, identity = _what_it_is(path)
            if identity is not None and identity in files:
                continue  # one file, found again
            if identity is not None:
                files[identity] = path
            entries[path] = problem
    return sorted(entries.items())


def _what_it_is(path: Path) -> tuple[str | None, tuple[int, int] | None]:
    """What keeps the entry ``path`` from being imported (``None``: a regular file it can
    read), and the file it leads to (device, inode)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if os.path.islink(path) and exc.errno == errno.ENOENT:
            target = os.readlink(path)
            # (where a relative target, or a link it leads to, ends: seen from the folder it is in)
            chain = not os.path.isabs(target) or os.path.islink(target)
            beyond = f", which leads to {os.path.realpath(path)}" if chain else ""
            return f"{path} is a link to {target}{beyond}, which does not exist", None
        if exc.errno == errno.ELOOP:
            return f"{path} is a link that leads round in a loop (to {os.readlink(path)})", None
        return f"{path}: cannot be read: {exc.strerror or exc}", None
    link = f" (a link to {os.readlink(path)})" if os.path.islink(path) else ""
    if not stat.S_ISREG(st.st_mode):
        what = (
            "a folder" if stat.S_ISDIR(st.st_mode)
            else "a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )  # fmt: skip
        return f"{path} is {what}{link}, not a definitions file", None
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return f"{path}: cannot be read{link}: {exc.strerror or exc}", None
    return None, (st.st_dev, st.st_ino)


def _unsearchable(exc: OSError) -> None:
    log.warning(
        "the definitions folder %s cannot be searched (%s): no definitions file in it is found",
        exc.filename, exc.strerror or exc,
    )  # fmt: skip


def _discovery_error(problems: list[tuple[str, BaseException | None]]) -> DiscoveryError:
    if len(problems) == 1:
        message = problems[0][0]
    else:
        message = f"{len(problems)} problems in the definitions:\n" + "\n".join(f"  {p}" for p, _ in problems)
    error = DiscoveryError(message, problems=[p for p, _ in problems])
    error.__cause__ = next((cause for _, cause in problems if cause is not None), None)
    return error


def _where(item: Any, fallback: Path) -> str:
    return getattr(item, "source", None) or str(fallback)


class _BadFile(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


_module_counter = 0


def load_file(path: Path) -> list[Any]:
    """The definitions one file makes (imported afresh); :class:`DiscoveryError` if it fails."""
    try:
        return [item for _, item in _load_file(path)]
    except _BadFile as bad:
        raise DiscoveryError(bad.problem) from bad.__cause__


def _load_file(path: Path) -> Iterable[tuple[int, Any]]:
    """Import one file; its definitions with their kind's index. Raises :class:`_BadFile`."""
    global _module_counter
    _module_counter += 1
    module_name = f"_schedtui_defs_{_module_counter}_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py paths
        raise _BadFile(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    watch = threading.Timer(SLOW_IMPORT, _still_importing, (path, threading.get_ident()))
    watch.daemon = True
    watch.start()
    try:
        with collecting() as made:
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise _BadFile(f"{path}:{exc.lineno or _nul_line(path)}: syntax error: {exc.msg}") from exc
    except BaseException as exc:  # noqa: BLE001 - sys.exit() or a KeyboardInterrupt in a file is its problem, not ours
        sys.modules.pop(module_name, None)
        line = _line_in(path, exc)
        raise _BadFile(f"{path}:{line}: {_what_went_wrong(exc)}") from exc
    finally:
        watch.cancel()
    seen: list[tuple[int, Any]] = []
    # What it binds at module level (made here or imported), and what it made while imported
    # without binding it: a bare define_schedule(...) call, a loop, a list.
    for value in [*vars(module).values(), *made]:
        index = next((i for i, kind in enumerate(_KINDS) if isinstance(value, kind.type)), None)
        if index is not None and all(value is not other for _, other in seen):
            seen.append((index, value))
    return seen


def _still_importing(path: Path, thread: int) -> None:
    """Say where the import of ``path`` waits (the line of the file the importing thread is
    at, and what it calls there), once it has taken :data:`SLOW_IMPORT` seconds."""
    target, where, calls = str(path.resolve()), "?", ""
    frame = sys._current_frames().get(thread)
    innermost = frame
    while frame is not None:  # out to the statement at the file's top level
        if frame.f_code.co_name == "<module>" and str(Path(frame.f_code.co_filename).resolve()) == target:
            where = str(frame.f_lineno)
            break
        frame = frame.f_back
    if innermost is not None and innermost is not frame:
        calls = f", in {innermost.f_code.co_name}() of {Path(innermost.f_code.co_filename).name}"
    log.warning(
        "still importing the definitions file %s after %gs, at line %s%s: code at a definitions file's top level that "
        "waits (a network call, a lock, input()) holds the start; do it in the handler instead",
        path, SLOW_IMPORT, where, calls,
    )  # fmt: skip


def _nul_line(path: Path) -> int | str:
    """The line of the file's first NUL byte (Python's refusal of one names no line)."""
    try:
        data = path.read_bytes()
    except OSError:
        return "?"
    at = data.find(b"\0")
    return "?" if at < 0 else data.count(b"\n", 0, at) + 1


def _what_went_wrong(exc: BaseException) -> str:
    """``ValueError: bad`` (our own refusals without their class), whatever the exception
    does: a ``__str__`` that raises must not end the discovery, and with it the report of
    the folder's other bad files (see :func:`~backend.errors.describe_exception`)."""
    tag, described, _ = describe_exception(exc)
    try:
        text = str.__str__(str(exc))
    except BaseException:  # noqa: BLE001 - what it raised is in the description
        text = described
    return text if isinstance(exc, DefinitionError) else ": ".join(filter(None, [tag, text]))


def _line_in(path: Path, exc: BaseException) -> int | str:
    """The deepest traceback line that lies in ``path`` (where the file went wrong)."""
    target = str(path.resolve())
    line: int | str = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename and str(Path(frame.filename).resolve()) == target and frame.lineno:
            line = frame.lineno
    return line
