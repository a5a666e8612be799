"""The embedded store's reserve: a file beside it (``state.db.reserve``), preallocated while
the disk has room, where a firing process that stops while the disk is full keeps the runs
it could not write to the ledger; the next process to fire the store writes them there
before it catches up.

Without it those runs lived on only as lines in the stopped process's log, and the next
start, finding their slots missing from the ledger, fired them again (``backfill="all"``)
or recorded them ``missed`` (``skip``). Why a file written in place rather than a ballast
deleted to make room for SQLite: writing into blocks the file already owns needs no free
space (on filesystems that overwrite in place: ext4, XFS, tmpfs; not on copy-on-write ones,
btrfs or ZFS), whereas space freed on a full disk goes to whichever process writes next
(often the one that filled it), and SQLite needs several times the rows' size in log
frames and pages to write them.

Layout: a header of :data:`_HEADER` bytes (``schedtui-reserve 1 LENGTH CRC32``, or zeros:
empty), then the runs as JSON lines, each the row the ledger would hold (times in
microseconds, exactly as written), and a last line ``{"marks": {instance: slot}}``: the
burst marks of the process that stopped (see :meth:`Store.mark_starting`) that its kept
runs account for, to be cleared once they are in the ledger (else the next start would
record every schedule due at that slot abandoned, a run it did not start among them). The payload is written and synced before the header
that describes it, so a process killed while writing leaves a header whose checksum fails
(the reserve is then read as empty) rather than half a run.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from backend.model import Run
from backend.store.sqlite.sql import _run, _run_params

__all__ = ["RESERVE_BYTES", "Kept", "Reserve"]

log = logging.getLogger("schedtui.store")

#: The reserve's size: about 10,000 runs (a line is ~170 bytes; more with an error message
#: or a traceback). When more wait, each schedule's newest slot is kept first (where the
#: next start's catch-up begins); the rest of them go to the log.
RESERVE_BYTES = 2 * 1024 * 1024
_HEADER = 64
_MAGIC = b"schedtui-reserve 1 "
_WITHOUT = "runs a stop cannot write to the ledger go to the log only"


class Kept(NamedTuple):
    """What a stopped process kept in the reserve."""

    runs: list[Run]
    marks: dict[str, int]
    """Its burst marks (instance -> slot, in microseconds), cleared after the runs land."""


class Reserve:
    """The reserve file of one firing process (the holder of the store's firing lock: no
    other process touches it meanwhile). Blocking calls: run them off the event loop."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        """The mode it is made with (its store file's: it holds runs)."""
        self.size = size
        self._fd: int | None = None
        self.capacity = 0
        """Bytes that can be written without asking the disk for more."""

    def open(self) -> Kept:
        """Open the file (creating it), make it :attr:`size` bytes while the disk has room,
        and return what an earlier process kept in it. Trouble with the file is logged,
        never raised: without a reserve, a stop on a full disk logs its runs (as before)."""
        try:
            # Never through a symlink, nor into anything but a regular file: it is grown and
            # written, and a link planted there would have its target overwritten.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, self.mode)
        except OSError as exc:
            why = "a symbolic link: not followed" if exc.errno == errno.ELOOP else exc.strerror
            log.warning('cannot open the reserve "%s" (%s): %s', self.path, why, _WITHOUT)
            return Kept([], {})
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            log.warning('cannot open the reserve "%s" (not a regular file): %s', self.path, _WITHOUT)
            return Kept([], {})
        self._fd = fd
        try:
            kept = self._read()
            had = os.fstat(fd).st_size
            try:
                os.posix_fallocate(fd, 0, self.size)
            except OSError as exc:
                os.ftruncate(fd, had)  # whatever a failed allocation took: the disk needs it more
                log.warning(
                    'no room for the reserve "%s" (%d KiB, %s): if the disk fills, a stop keeps the runs it cannot '
                    "write in its log only",
                    self.path, self.size // 1024, exc.strerror,
                )  # fmt: skip
            self.capacity = os.fstat(fd).st_size
        except OSError as exc:
            log.warning('cannot use the reserve "%s" (%s): %s', self.path, exc.strerror, _WITHOUT)
            self.close()
            return Kept([], {})
        return kept

    def _read(self) -> Kept:
        assert self._fd is not None
        header = os.pread(self._fd, _HEADER, 0)
        if not header.startswith(_MAGIC):
            return Kept([], {})
        try:
            length_text, crc_text = header[len(_MAGIC) :].split()[:2]
            length, crc = int(length_text), int(crc_text, 16)
            payload = os.pread(self._fd, length, _HEADER)
            if len(payload) != length or zlib.crc32(payload) != crc:
                raise ValueError("its checksum does not match (a write cut short)")
            *rows, last = payload.splitlines()
            marks = json.loads(last)["marks"]
            return Kept([_run(tuple(json.loads(row))) for row in rows], {str(k): int(v) for k, v in marks.items()})
        except (ValueError, IndexError, KeyError, TypeError, AttributeError, AssertionError) as exc:
            log.warning('the reserve "%s" cannot be read (%s); ignored', self.path, exc)
            return Kept([], {})

    def keep(self, runs: Sequence[Run], marks: Mapping[str, int]) -> list[Run]:
        """Write ``runs`` (latest versions, in hand-in order) over whatever the reserve held,
        as many as fit: first each schedule's newest timed run, then the others oldest
        first; and ``marks``, the stopping process's burst marks, when every run fits.
        Returns the runs that did not fit (all of them when it cannot be written)."""
        if self._fd is None:
            return list(runs)
        newest: dict[str, Run] = {}
        for run in runs:
            if run.trigger != "manual" and (run.name not in newest or run.scheduled_at > newest[run.name].scheduled_at):
                newest[run.name] = run
        first = {run.id for run in newest.values()}
        lines: list[bytes] = []
        left: list[Run] = []
        ending = json.dumps({"marks": dict(marks)}).encode() + b"\n"
        room = max(0, self.capacity - _HEADER - len(ending))
        for run in [*newest.values(), *(r for r in runs if r.id not in first)]:
            line = json.dumps(_run_params(run), ensure_ascii=False).encode() + b"\n"
            if len(line) <= room:
                lines.append(line)
                room -= len(line)
            else:
                left.append(run)
        if not lines:
            return left
        payload = b"".join(lines) + (ending if not left else b'{"marks": {}}\n')
        header = _MAGIC + f"{len(payload)} {zlib.crc32(payload):08x}".encode()
        try:
            os.pwrite(self._fd, payload, _HEADER)
            os.fsync(self._fd)
            os.pwrite(self._fd, header.ljust(_HEADER - 1) + b"\n", 0)
            os.fsync(self._fd)
        except OSError as exc:
            log.error('cannot write the reserve "%s": %s', self.path, exc.strerror or exc)
            return list(runs)
        return left

    def clear(self) -> None:
        """Mark the reserve empty (its runs are in the ledger); it keeps its room."""
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, bytes(_HEADER), 0)
            os.fsync(self._fd)
        except OSError as exc:  # read again by the next start: writing its runs twice changes nothing
            log.warning('cannot mark the reserve "%s" empty: %s', self.path, exc.strerror or exc)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
