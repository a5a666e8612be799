"""Run ids: lexicographically sortable by creation time (ULID layout, Crockford base32).

Sortable ids make the run ledger pageable by keyset (``id < before``) on the primary key
index, and let retention delete by id range, without another timestamp index.
"""

from __future__ import annotations

import functools
import os
import random
import threading
from collections.abc import Callable
from datetime import datetime

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MASK = (1 << _RANDOM_BITS) - 1


# Two base32 digits per table lookup: ids are made on the firing hot path.
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]


def _encode(value: int, length: int) -> str:
    """Crockford base32 of ``value`` in exactly ``length`` (even) characters."""
    pairs = []
    for _ in range(length // 2):
        pairs.append(_PAIRS[value & 0x3FF])
        value >>= 10
    return "".join(reversed(pairs))


def _encode80(v: int, p: list[str] = _PAIRS) -> str:
    """``_encode(v, 16)`` unrolled: the 80 bits after an id's millisecond, once per id."""
    return "".join(
        (p[v >> 70 & 0x3FF], p[v >> 60 & 0x3FF], p[v >> 50 & 0x3FF], p[v >> 40 & 0x3FF],
         p[v >> 30 & 0x3FF], p[v >> 20 & 0x3FF], p[v >> 10 & 0x3FF], p[v & 0x3FF])
    )  # fmt: skip


def encode_id(ms: int, low: int) -> str:
    """An id from its two parts: milliseconds since the epoch and 80 more bits (ids derived
    from something else than the clock, such as a schedule's slot, keep the id's shape)."""
    return _encode(((ms & ((1 << 48) - 1)) << _RANDOM_BITS) | (low & _RANDOM_MASK), 26)


def id_floor(at: datetime) -> str:
    """The smallest id that can be created at ``at``: ``id < id_floor(t)`` means "before t"."""
    return _encode(max(0, int(at.timestamp() * 1000)) << _RANDOM_BITS, 26)  # (before 1970: no id is before it)


class IdFactory:
    """Makes strictly increasing ids from a time source, also within one millisecond."""

    def __init__(
        self, now: Callable[[], datetime], random_bits: Callable[[], int] | None = None
    ) -> None:
        self._now = now
        # Uniqueness, not secrecy: a PRNG seeded from the OS (os.urandom is a syscall per id).
        self._random = random_bits or functools.partial(random.Random(os.urandom(16)).getrandbits, _RANDOM_BITS)
        self._prefix_ms = -1
        self._prefix = ""
        self._last = 0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        ms = int(self._now().timestamp() * 1000)
        with self._lock:
            value = (ms << _RANDOM_BITS) | self._random()
            if value <= self._last:
                value = self._last + 1
            self._last = value
        # The first 10 digits are exactly the 48-bit millisecond: encode them once per ms.
        ms, low = value >> _RANDOM_BITS, value & _RANDOM_MASK
        if ms != self._prefix_ms:
            self._prefix, self._prefix_ms = _encode(ms, 10), ms
        return self._prefix + _encode80(low)

    def many(self, count: int) -> list[str]:
        """``count`` ids, exactly as ``count`` calls at this instant would make them (one
        clock read and one lock for all: a burst of firings takes its ids a slice at a time)."""
        base = int(self._now().timestamp() * 1000) << _RANDOM_BITS
        values = []
        with self._lock:
            last, random_bits = self._last, self._random
            for _ in range(count):
                value = base | random_bits()
                if value <= last:
                    value = last + 1
                values.append(value)
                last = value
            self._last = last
        ids = []
        for value in values:
            ms = value >> _RANDOM_BITS
            if ms != self._prefix_ms:
                self._prefix, self._prefix_ms = _encode(ms, 10), ms
            ids.append(self._prefix + _encode80(value & _RANDOM_MASK))
        return ids


def id_batches(new_id: Callable[[], str]) -> Callable[[int], list[str]]:
    """``new_id``'s :meth:`IdFactory.many`, or as many calls for any other id source."""
    if isinstance(new_id, IdFactory):
        return new_id.many
    return lambda count: [new_id() for _ in range(count)]
