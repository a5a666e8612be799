"""Per-run logs as kept and as read: the stored row, the store's protocol, the answer.

A schedule run's log is kept under its run id, a job attempt's under the job's id and its
claim number (``seq``: one log per attempt, even when a retried dead job numbers its
attempts from 1 again). A row holds the log's head and tail (see
:mod:`backend.observability.capture`), how many bytes were written in all and how many
were left out between the two, and whether it is final (its handler has returned).

:class:`RunLog` is what the ``run_log``, ``job_log`` and ``execution_log`` actions answer:
the text after ``after`` bytes (all of it from 0), with one marker line where bytes were
left out, and ``size``, the ``after`` of the next read, so that a follower prints only
what is new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple, Protocol, TypedDict

__all__ = ["LogKind", "LogStore", "LogTarget", "RunLog", "RunLogJson", "StoredLog", "compose", "marker"]

LogKind = Literal["run", "job", "durable"]

#: What a reader is told the log keeps, in the marker line.
KEPT: Final = "a log keeps its first and last 32 KiB"


class LogTarget(NamedTuple):
    """Whose log: a run (``id`` is its id), or a job's attempt (``id`` is the job's, ``seq``
    its claim number, ``attempt`` the attempt number operators see). (Tuples: one is made
    and hashed per call that writes, on the handler's time.)"""

    kind: Literal["run", "job"]
    id: str
    seq: int = 0
    attempt: int = 0


class StoredLog(NamedTuple):
    """One log as a store keeps it (a row: a batch makes one per log written)."""

    target: LogTarget
    head: str
    tail: str
    size: int
    omitted_bytes: int
    omitted_lines: int
    final: bool
    updated_at: datetime


class LogStore(Protocol):
    """The per-run logs' part of a store.

    Contract: :meth:`save_logs` upserts each row by its target in one transaction, and never
    replaces a row by an older one (a smaller ``size``); logs are deleted with what they
    belong to: a run's by ``prune_runs``, a job attempt's by ``prune_jobs`` (when it was last
    written before the attempts' cut-off)."""

    async def save_logs(self, logs: Sequence[StoredLog]) -> None: ...

    async def get_run_log(self, run_id: str) -> StoredLog | None: ...

    async def get_job_log(self, job_id: str, seq: int | None = None) -> StoredLog | None:
        """The log of the job's claim ``seq`` (its attempt's :attr:`~backend.jobs.model.Attempt.seq`),
        or of its newest claim."""


def marker(omitted_bytes: int, omitted_lines: int | None) -> str:
    lines = f" ({omitted_lines:,} line{'s' if omitted_lines != 1 else ''})" if omitted_lines is not None else ""
    return f"[… {omitted_bytes:,} byte{'s' if omitted_bytes != 1 else ''}{lines} left out: {KEPT} …]\n"


def compose(head: str, tail: str, size: int, omitted_bytes: int, omitted_lines: int, after: int = 0) -> str:
    """The log's text past its first ``after`` bytes: what of the head remains, a marker
    line where bytes were left out that this reader has not seen, and what of the tail
    remains. (Offsets are in bytes of UTF-8; ``size`` of an earlier answer is one.)"""
    head_bytes, tail_bytes = head.encode(), tail.encode()
    tail_start = size - len(tail_bytes)
    parts: list[bytes] = []
    if after < len(head_bytes):
        parts.append(head_bytes[after:])
    if omitted_bytes and after < tail_start:
        if parts and not parts[-1].endswith(b"\n"):
            parts.append(b"\n")
        whole = after <= len(head_bytes)
        gap = omitted_bytes if whole else tail_start - after
        parts.append(marker(gap, omitted_lines if whole else None).encode())
    parts.append(tail_bytes[max(0, after - tail_start) :])
    return b"".join(parts).decode("utf-8", "replace")


class RunLogJson(TypedDict):
    """A run's, a job attempt's or a durable execution's log, from the ``after`` asked for on:
    ``size`` is the ``after`` of the next read; while ``running``, more may come."""

    kind: LogKind
    id: str
    name: str
    attempt: int | None
    status: str
    running: bool
    text: str
    size: int
    omitted_bytes: int
    omitted_lines: int


@dataclass(frozen=True, slots=True)
class RunLog:
    """A run's, a job attempt's or a durable execution's log, as read.

    ``text`` is the log past the ``after`` asked for; ``size`` is how many bytes it holds
    in all (left-out ones included): the ``after`` of the next read. ``running`` says more
    may come (the run is in flight, or its last lines are still being written): a follower
    reads again until it is false."""

    kind: LogKind
    id: str
    status: str
    running: bool
    text: str
    size: int
    omitted_bytes: int = 0
    omitted_lines: int = 0
    attempt: int | None = None
    name: str = ""
    """The schedule, the queue or the durable function."""

    def to_json(self) -> RunLogJson:
        return {
            "kind": self.kind,
            "id": self.id,
            "name": self.name,
            "attempt": self.attempt,
            "status": self.status,
            "running": self.running,
            "text": self.text,
            "size": self.size,
            "omitted_bytes": self.omitted_bytes,
            "omitted_lines": self.omitted_lines,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunLog:
        attempt = data.get("attempt")
        return cls(
            kind=data["kind"],
            id=data["id"],
            status=data["status"],
            running=bool(data["running"]),
            text=data["text"],
            size=int(data["size"]),
            omitted_bytes=int(data.get("omitted_bytes", 0)),
            omitted_lines=int(data.get("omitted_lines", 0)),
            attempt=None if attempt is None else int(attempt),
            name=data.get("name", ""),
        )

