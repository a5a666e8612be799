"""The lock object of the public contract, and the errors of the locks system."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, TypedDict

from backend.errors import BadInput, SchedtuiError
from backend.inputs import shown_number
from backend.model import Timestamp, iso, parse_iso
from backend.safetext import printable

__all__ = [
    "CLUSTER_LOCKS",
    "DEFAULT_TTL",
    "HOLDER_MAX_CHARS",
    "MIN_TTL",
    "TAG_LEASE_LOST",
    "TAG_LOCKED",
    "LeaseLost",
    "Lock",
    "LockNotAcquired",
    "LockRelease",
    "LockState",
    "LocksSnapshot",
    "StaleLease",
    "check_lock_name",
    "check_lock_to_take",
    "check_ttl",
]

LockState = Literal["held", "expired", "free"]

#: A lease's time to live unless the caller says otherwise (seconds).
DEFAULT_TTL: Final = 60.0
#: The longest lease one acquisition may ask for: a day (it is renewed while held).
MAX_TTL: Final = 86_400.0
#: The shortest ttl (seconds): renewed every third of it, a lease any shorter cannot be kept
#: across a round trip to a distant database (and one under a microsecond was zero, so
#: expired as it was taken, and ``with_lock`` said another holder had the free lock).
MIN_TTL: Final = 0.1
#: The longest holder name one may give (the default is the instance's name, or for a
#: locked schedule's run the instance's and the schedule's: at most 387 characters).
HOLDER_MAX_CHARS = 512
#: Error tag of a locked schedule's slot skipped because another holder had the lock.
TAG_LOCKED: Final = "locked"
#: Error tag of a run whose lease could not be renewed before it expired.
TAG_LEASE_LOST: Final = "lease_lost"
LOCK_NAME = re.compile(r"[A-Za-z0-9_.:/@-]{1,200}")
#: The names the ``cluster`` coordination keeps for its shards and members (see
#: :mod:`backend.scheduler.coordination.cluster`): taken by an application, such a lock
#: stopped every schedule of its shard from firing, or was given back by the coordinator.
CLUSTER_LOCKS: Final = "cluster:"


class LockNotAcquired(SchedtuiError):
    """``hold()`` found the lock held by someone else; the message names the holder."""

    title = "Lock held"
    code = "lock_not_acquired"


class LeaseLost(SchedtuiError):
    """The lease could not be renewed before it expired (taken over, released by force, or
    the store unreachable): the work it protected was cancelled, or ran on unprotected."""

    title = "Lease lost"
    code = "lease_lost"


class StaleLease(SchedtuiError):
    """A fenced write was refused: a newer token has been seen for the resource, or the
    lease is no longer the lock's current one."""

    title = "Stale lease"
    code = "stale_lease"


def check_lock_to_take(name: object) -> str:
    """A lock name an application may take: :func:`check_lock_name`, and none of the
    ``cluster:`` names (those are read and released like any other)."""
    name = check_lock_name(name)
    if name.startswith(CLUSTER_LOCKS):
        raise BadInput(
            f'lock name "{name}" is reserved: names beginning "{CLUSTER_LOCKS}" are the cluster '
            "coordination's shards and members",
            field="name",
        )
    return name


def check_lock_name(name: object) -> str:
    """``name`` if it is a lock's name; BadInput otherwise, quoting it on one line of bounded
    length (a name of 10,000 characters was echoed whole, in the API's answer and on the
    command line's one line), in ASCII: "é" said to be no letter, while "é" written as an e and
    a combining accent looked the same as it, and as the letter typed."""
    if not isinstance(name, str) or not LOCK_NAME.fullmatch(name):
        if isinstance(name, str):
            shown = printable(ascii(name), 80) + (f" ({len(name)} characters)" if len(name) > 200 else "")
        else:
            shown = shown_number(name, 80)
        raise BadInput(
            f"invalid lock name {shown} (1-200 characters of ASCII letters, digits and _ . : / @ -)", field="name"
        )
    return name


def check_ttl(ttl: object) -> timedelta:
    """A lease's time to live: seconds (a number) or a timedelta, from a tenth of a second to a day."""
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not MIN_TTL <= seconds <= MAX_TTL:
        raise BadInput(f"lock ttl {ttl!r} must be at least {MIN_TTL:g} and at most {MAX_TTL:g} seconds", field="ttl")
    return timedelta(seconds=seconds)


class LockJson(TypedDict):
    """A lock and its lease: ``holder`` is null once released (then ``expires_at`` is when);
    ``state`` is ``held``, ``expired`` (the lease ran out unreleased) or ``free``."""

    name: str
    holder: str | None
    token: int
    acquired_at: Timestamp
    expires_at: Timestamp
    renewed_at: Timestamp
    state: LockState


@dataclass(frozen=True, slots=True)
class Lock:
    """One row of the lock table. A lock that was released keeps its row, its last token
    and its times (``holder`` is then ``None``): the next holder's token is greater."""

    name: str
    holder: str | None
    token: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    """Until when the holder's lease runs; for a released lock, when it was released."""

    def state(self, now: datetime) -> LockState:
        if self.holder is None:
            return "free"
        return "held" if self.expires_at > now else "expired"

    def to_json(self, now: datetime) -> LockJson:
        return {
            "name": self.name,
            "holder": self.holder,
            "token": self.token,
            "acquired_at": iso(self.acquired_at),
            "expires_at": iso(self.expires_at),
            "renewed_at": iso(self.renewed_at),
            "state": self.state(now),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lock:
        return cls(
            name=data["name"],
            holder=data.get("holder"),
            token=int(data["token"]),
            acquired_at=parse_iso(data["acquired_at"]),
            renewed_at=parse_iso(data["renewed_at"]),
            expires_at=parse_iso(data["expires_at"]),
        )


class LockReleaseJson(TypedDict):
    """A forced release: the lock as it was just before, whether anyone held it, and the lock clock's ``now``."""

    released: bool
    lock: LockJson
    now: Timestamp


@dataclass(frozen=True, slots=True)
class LockRelease:
    """A forced release: the lock as it was just before, and the lock clock's ``now``."""

    lock: Lock
    now: datetime

    @property
    def released(self) -> bool:
        """False when nobody held it (it was free already)."""
        return self.lock.holder is not None

    def to_json(self) -> LockReleaseJson:
        return {"released": self.released, "lock": self.lock.to_json(self.now), "now": iso(self.now)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LockRelease:
        return cls(lock=Lock.from_json(data["lock"]), now=parse_iso(data["now"]))


class LocksJson(TypedDict):
    """Every lock, and the lock clock's ``now`` (the database's): a lease's time left is
    ``expires_at - now``, whatever the reader's own clock says."""

    now: Timestamp
    locks: list[LockJson]


@dataclass(frozen=True, slots=True)
class LocksSnapshot:
    """Every lock, and the lock clock's ``now`` (the database's, or the injected clock's):
    expiry countdowns are ``expires_at - now``, whatever the reader's own clock says."""

    now: datetime
    locks: list[Lock]

    def to_json(self) -> LocksJson:
        return {"now": iso(self.now), "locks": [lock.to_json(self.now) for lock in self.locks]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LocksSnapshot:
        return cls(now=parse_iso(data["now"]), locks=[Lock.from_json(item) for item in data["locks"]])
