"""The store's file on disk: the one name it is opened by, the mount that holds it, and what
the machine itself says when SQLite cannot open it.

SQLite keeps a file's write-ahead log and shared memory beside the name it is opened by,
and keeps apart the processes of one machine only: a second name for the file (a hard
link, a bind mount of the file alone) or a second machine (a network filesystem) would
corrupt it. These checks run before every open.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import stat
from pathlib import Path

from backend.errors import BadInput, NotFound, Unavailable

__all__ = [
    "MOUNTINFO",
    "NETWORK_FILESYSTEMS",
    "PRIVATE_FILE",
    "create_private",
    "explain",
    "make_folder",
    "mode_beside",
    "mount_of",
    "refuse_other_names",
    "require_file",
    "warn_if_shared",
]

log = logging.getLogger("schedtui.store")

#: The store files on a network filesystem this process has warned of.
_WARNED_SHARED: set[str] = set()


#: Where the kernel lists this process's mounts (Linux).
MOUNTINFO = "/proc/self/mountinfo"
#: Filesystems whose files other machines may open as well (by their type in MOUNTINFO).
#: SQLite's locks and its write-ahead log's shared memory keep apart the processes of one
#: machine only, and the firing lock too where the mount does not pass locks on (NFS's
#: ``nolock``): a process on another machine may fire beside this one, or checkpoint the
#: log while this one writes it (a corrupt store).
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "afs", "gpfs", "beegfs",
    "ocfs2", "gfs2", "fuse.sshfs", "fuse.rclone", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "fuse.goofys",
    "fuse.glusterfs", "fuse.ceph-fuse",
})  # fmt: skip


def mount_of(path: Path) -> tuple[str, str] | None:
    """The mount that holds ``path`` (its mount point and filesystem type: the longest
    mount point above the file it leads to, the last mounted there), or ``None`` where
    the kernel does not say (not Linux)."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as info:
            lines = info.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    found: tuple[str, str] | None = None
    for line in lines:
        fields = line.split(" ")
        if len(fields) < 5 or "-" not in fields[5:]:
            continue
        # the fifth field is the mount point, with space, tab, newline and backslash as \ooo;
        # the type follows the optional fields' end ("-")
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        kind = fields[fields.index("-", 5) + 1] if len(fields) > fields.index("-", 5) + 1 else "?"
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (found is None or len(point) >= len(found[0])):
            found = (point, kind)
    return found


def mounted_alone(path: Path) -> bool:
    """Whether the file ``path`` is a mount point (bind-mounted on its own); Linux only."""
    mount = mount_of(path)
    return mount is not None and mount[0] == os.path.realpath(path)


def disk_full(folder: Path) -> bool:
    """Whether the disk holding ``folder`` has no block left for this process (SQLite says
    "disk I/O error" when it cannot make its shared memory there)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) == 0


def short_of_descriptors() -> str | None:
    """What to say when this process is (nearly) out of file descriptors (SQLite says only
    "unable to open database file" when it cannot open the file, its WAL or its shared
    memory); ``None`` otherwise, or when it cannot be told."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return f"this process has no file descriptor left (its limit is {soft}: raise it, ulimit -n)"
        return None
    if soft - used > _DESCRIPTORS_NEEDED:
        return None
    return f"this process has {used} of its {soft} file descriptors open (raise the limit: ulimit -n)"


#: Descriptors a store's open may need at once (the file, its WAL and shared memory, for
#: the writer and the reader, and a few more for the folder and the reserve).
_DESCRIPTORS_NEEDED = 8


def explain(exc: BaseException, folder: Path) -> str:
    """A SQLite error in the operator's words: with the machine's own cause when SQLite's
    message hides it (a full disk; no file descriptor left; a folder it cannot write in)."""
    said = str(exc)
    if disk_full(folder):
        return f"{said}; its disk is full"
    if "unable to open" in said or "readonly" in said:
        short = short_of_descriptors()
        if short is not None:
            return f"{said}: {short}"
        unwritable = unwritable_folder(folder)
        if unwritable is not None:
            return f"{said}: {unwritable}"
    return said


def unwritable_folder(folder: Path) -> str | None:
    """What to say when this process cannot write in the store's folder (a read-only mount:
    a backup's snapshot, a read-only volume; or another user's folder), where SQLite must
    make the write-ahead log's shared memory to open the store at all, even to read it;
    ``None`` when it can, or it cannot be told."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    if read_only:
        return (
            "its folder is on a read-only filesystem, and SQLite must make the shared memory of its write-ahead log "
            "beside it even to read it: copy the store (with its -wal file) to a writable folder to read it there"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        return (
            f'this user cannot write in its folder "{folder}", and SQLite must make the shared memory of its '
            "write-ahead log there even to read it: run as the store's owner, or give this user write access"
        )
    return None


def require_file(path: Path) -> None:
    """Refuse a store that is not there (:class:`NotFound`, naming it)."""
    if path.exists() and not path.is_file():
        refuse_other_names(path)  # says what it is
    if not path.is_file():
        raise NotFound(
            f'no store at "{path}" (no such file); check --store and the working '
            "directory (only `schedtui serve` and `schedtui demo` create a store)"
        )


#: The mode of a store's files when schedtui makes them: its owner's alone, as a
#: PostgreSQL data folder's are (they hold what handlers printed, job payloads, durable
#: inputs and the audit log). A store file given another mode (``chmod g+rw``, to share it
#: with a group) lends it to the files made beside it, as SQLite does to its log's.
PRIVATE_FILE = 0o600
#: The mode of the folder schedtui makes for a store (``.schedtui/``).
PRIVATE_FOLDER = 0o700


def make_folder(path: Path) -> None:
    """Create the folder of the store file ``path`` (its owner's alone), and the folders above it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
    except OSError as exc:
        raise Unavailable(f'cannot create the folder for the store "{path}": {exc.strerror or exc}') from None


def mode_beside(path: Path) -> int:
    """The mode to make a file beside the store file ``path`` with: the store's, or
    :data:`PRIVATE_FILE` while there is none."""
    try:
        return os.stat(path).st_mode & 0o666
    except OSError:
        return PRIVATE_FILE


def create_private(path: Path) -> None:
    """Make the store file ``path``, empty and its owner's alone, unless it is there (SQLite
    would make it with the umask's mode, readable by every local user, and its log and
    shared memory after it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    except FileExistsError:
        return
    except OSError as exc:
        raise Unavailable(f'cannot create the store "{path}": {exc.strerror or exc}') from None
    os.close(fd)


def refuse_other_names(path: Path) -> None:
    """Refuse a store file that has more than one name (hard links). SQLite keeps its
    write-ahead log and shared memory beside the name a file is opened by: a second
    name gets a log of its own, each process sees only its own name's recent writes,
    a firing lock beside each name lets a firer in through each, and a checkpoint
    through one name overwrites what the other's log holds (a corrupt store)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # created by the writer (one name), in a folder made first (or refused then)
    except OSError as exc:
        raise Unavailable(f'cannot look at the store file "{path}": {exc.strerror or exc}') from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise BadInput(f'the store "{path}" is {what}; --store names the database file itself', field="store")
    if mounted_alone(path):
        raise BadInput(
            f'the store file "{path}" is mounted on its own (a bind mount of the file, as '
            "`docker run -v state.db:…` makes); SQLite keeps its write-ahead log beside the name it opens, so "
            "the log would be outside the mount, apart from the file: mount the folder that holds it instead",
            field="store",
        )
    names = st.st_nlink
    if names > 1:
        raise BadInput(
            f'the store file "{path}" has {names} names (hard links); SQLite would keep a write-ahead log '
            "beside each name and the store would be corrupted: remove the other names (find them with "
            f"`find / -xdev -samefile {path}`) and use one, or a symlink",
            field="store",
        )


def warn_if_shared(path: Path) -> None:
    """Say so (once a process) when the store is on a network filesystem (see
    NETWORK_FILESYSTEMS): nothing here can tell whether another machine opens it too."""
    mount = mount_of(path)
    if mount is None or mount[1] not in NETWORK_FILESYSTEMS or str(path) in _WARNED_SHARED:
        return
    _WARNED_SHARED.add(str(path))
    log.warning(
        'the store "%s" is on a network filesystem (%s, mounted at %s): SQLite keeps apart the processes of one '
        "machine only; a process on another machine that opens this file (a second serve, a console, a CLI "
        "verb) may fire beside this one or corrupt the store. Keep the file on a local disk and use it from "
        "this machine only, or share the work between machines through PostgreSQL",
        path, mount[1], mount[0],
    )  # fmt: skip
