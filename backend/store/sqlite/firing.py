"""The firing lock of a store file: one process at a time fires its schedules.

The lock is the kernel's (``flock``) on a file beside the store (and on Linux on the store
file too): held by an open file, let go of by the kernel when the process ends, however it
ends (SIGKILL too), and never inherited across ``exec``. The lock file holds one line of
JSON naming its holder, for the message that refuses a second firer. Within one process,
engines that claim share the lock; a second engine of ``single`` coordination is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from backend.errors import BadInput, InUse, Unavailable
from backend.store.sqlite.file import make_folder, mode_beside, refuse_other_names, require_file

__all__ = ["hold", "holder", "lock_path", "release"]


@dataclass
class _FiringLock:
    """A store file's firing lock, as this process holds it (see :data:`_FIRING_LOCKS`)."""

    fds: tuple[int, ...]
    users: int = 0
    single: bool = False
    """An engine of ``single`` coordination holds it: no second one in this process may."""


#: Per store file, the firing lock this process holds: taken from the OS once, shared by
#: the engines of this process that fire it (those that claim, as the demo's two and the
#: tests' fleets; and beside them one ``single`` engine, as in a rolling change of mode,
#: which waits for the other mode's instances to leave), refused to any other process.
_FIRING_LOCKS: dict[str, _FiringLock] = {}
_FIRING_GUARD = threading.Lock()


def _let_go_in_a_forked_child() -> None:
    """In a child forked from this process (a handler's ``os.fork``, a multiprocessing pool
    of the fork kind): the kernel lets go of a firing lock when the last descriptor of it
    closes, so the child's copies would hold it for as long as the child lives, after its
    parent has died (SIGKILL too), and a restarted serve would be refused meanwhile. They
    are closed here; the parent holds the lock alone. The child holds no firing lock: it
    may take one of its own (and is refused while the parent lives)."""
    global _FIRING_GUARD
    _FIRING_GUARD = threading.Lock()  # (another thread may have held it at the fork)
    for held in _FIRING_LOCKS.values():
        for fd in held.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    _FIRING_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_let_go_in_a_forked_child)


def lock_path(store: Path) -> Path:
    """The file whose lock marks the one process firing the store ``store``."""
    return store.with_name(store.name + ".firing-lock")


def hold(store: Path, instance: str, *, single: bool, create: bool) -> tuple[int, ...]:
    """Take the firing lock of ``store`` for ``instance`` (blocking: call it on a thread),
    or join this process's hold of it; :class:`InUse` when another process holds it, or
    (``single``) another engine of ``single`` coordination in this one. Its descriptors."""
    with _FIRING_GUARD:  # (engines of one process start together, on several threads)
        held = _FIRING_LOCKS.get(str(store))
        if held is None:
            held = _FIRING_LOCKS[str(store)] = _FiringLock(_take(store, instance, create=create))
        elif single and held.single:
            raise InUse(_in_use_message(store, here=True))
        held.users += 1
        held.single = held.single or single
        return held.fds


def release(store: Path, *, single: bool) -> None:
    """Let go of one :func:`hold` of ``store``'s firing lock; the last lets the kernel's go."""
    with _FIRING_GUARD:
        held = _FIRING_LOCKS.get(str(store))
        if held is None:
            return  # (a forked child's copy of a store: its descriptors were closed at the fork)
        held.users -= 1
        held.single = held.single and not single
        if held.users:
            return  # another engine of this process still fires it
        del _FIRING_LOCKS[str(store)]
    for fd in held.fds:
        os.close(fd)  # releases the lock


def holder(store: Path) -> str | None:
    """The instance another process fires ``store`` as (its kernel lock proves it alive,
    whatever its heartbeat says), or ``None``."""
    try:
        fd = os.open(lock_path(store), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            line = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return line.get("instance") if isinstance(line, dict) else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except ValueError:
        return None
    finally:
        os.close(fd)


def _take(store: Path, instance: str, *, create: bool) -> tuple[int, ...]:
    refuse_other_names(store)
    path = lock_path(store)
    if create:
        make_folder(store)
    fd = _flock(store, path, "the firing lock", create=True)
    fds: tuple[int, ...] = (fd,)
    if sys.platform == "linux":
        # The store file itself is locked too: the lock file is found by its name, so a
        # lock file deleted by a tidy-up, or a second name for the store that the checks
        # cannot see, would let a second firer in; the file's own lock is its inode's. flock
        # and SQLite's own fcntl locks never meet on Linux (they would on BSD and macOS).
        try:
            fds += (_flock(store, store, "the store file", create=create),)
        except BaseException:
            os.close(fd)
            raise
    line = {
        "instance": instance,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    text = (json.dumps(line) + "\n").encode()
    try:
        # Over the last holder's line, then cut: on a full disk, no block is let go of
        # and asked for again.
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
    except OSError as exc:
        for held in fds:
            os.close(held)
        raise Unavailable(f'cannot write the firing lock "{path}": {exc.strerror or exc}') from None
    return fds


def _flock(store: Path, path: Path, what: str, *, create: bool) -> int:
    """``path`` opened and locked alone (:class:`InUse` when another process holds it).
    Never through a symlink, nor anything but a regular file: the lock file is truncated
    and written, and a link planted there would have its target overwritten."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0), mode_beside(store))
    except FileNotFoundError:
        require_file(store)  # (deleted in between: says so plainly)
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f'{what} "{path}" is a symbolic link; it is schedtui\'s own file: remove the link', field="store") from None
        raise Unavailable(f'cannot open {what} "{path}": {exc.strerror or exc}') from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput(f'{what} "{path}" is not a regular file; it is schedtui\'s own file: remove it', field="store")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise Unavailable(f'cannot lock {what} "{path}": {exc.strerror or exc}') from None
        raise InUse(_in_use_message(store)) from None
    return fd


def _in_use_message(store: Path, *, here: bool = False) -> str:
    try:
        line = json.loads(lock_path(store).read_text() or "{}")
        who = f'instance "{line["instance"]}" (pid {line["pid"]} on {line["host"]}, since {line["since"]})'
    except (OSError, ValueError, KeyError, TypeError):
        who = "another process"
    if here:  # another engine of this very process, on its own timers
        who = who.split(" (", 1)[0] if who != "another process" else "an engine"
        return (
            f'refusing to fire: {who} of this same process already fires the schedules of the store "{store}" '
            "on its own timers; two such engines on one SQLite file would run every slot twice. Give both engines "
            'coordination="advisoryLock" (their claims then share the slots), or run one engine'
        )
    return (
        f'refusing to fire: {who} already fires the schedules of the store "{store}"; '
        "two firing processes on one SQLite file would run every slot twice. Stop that one first "
        "(the other verbs, and a console without --fire, work beside it; several firing instances need PostgreSQL)"
    )
