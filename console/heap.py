"""Keeping the cycle collector off the keys' path.

At 1,000 schedules a full collection (the oldest generation) scanned some 130,000 objects:
80-150 ms with the UI loop stopped. Python starts one whenever the objects that lived
through two young collections since the last grow by a quarter, and every refresh brings
thousands of them (the schedules' new rows and lines drawn): one every 3-5 s, so that a
key pressed then waited for it. Three things keep that from happening:

* :func:`freeze_heap`: what lives once the first screen is drawn is moved out of the
  collector's sight (a full collection scans only what came after);
* :func:`lines_without_cycles`: a line Textual draws (a ``Strip``) cached itself in its own
  caches when cut into one piece or cropped to its own length, a reference cycle of it and
  its eight caches for every line drawn: most of the garbage only the collector frees;
* :class:`Collector`: Python's own trigger for full collections is off; one runs when the
  keys have been quiet for a moment (:data:`QUIET`), at most every :data:`EVERY` seconds,
  and at the latest :data:`LATEST` seconds after the previous one however busy the keys.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Sequence

from rich.style import Style
from textual.strip import Strip

__all__ = ["EVERY", "LATEST", "QUIET", "Collector", "freeze_heap", "lines_without_cycles"]

QUIET = 1.0
"""Seconds without a key before a full collection may run."""
EVERY = 20.0
"""Seconds at least between two full collections (what waits is little: the garbage that
only the collector frees, once lines drawn make none)."""
LATEST = 120.0
"""Seconds at most between two full collections, quiet keys or not."""
_NEVER = 1 << 30
"""A threshold for the oldest generation that Python never reaches."""


def freeze_heap() -> None:
    """What lives once the first screen is drawn (modules, widgets, the schedules' rows) lives
    as long as the console: move it out of the garbage collector's sight, so that a full
    collection scans only what came after. At 1,000 schedules a full pass over it took
    110-370 ms, and a key pressed then waited for it."""
    gc.collect()
    gc.freeze()


_divide = Strip.divide
_crop_extend = Strip.crop_extend


def _divide_acyclic(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
    strips = _divide(self, cuts)
    if any(strip is self for strip in strips):
        self._divide_cache.clear()  # [itself]: as cheap to answer again as to look up
    return strips


def _crop_extend_acyclic(self: Strip, start: int, end: int, style: Style | None) -> Strip:
    strip = _crop_extend(self, start, end, style)
    if strip is self:
        self._crop_extend_cache.clear()
    return strip


def lines_without_cycles() -> None:
    """Textual's lines no longer keep themselves in their own caches (see the module).
    Idempotent; what is drawn is the same."""
    Strip.divide = _divide_acyclic  # type: ignore[method-assign]
    Strip.crop_extend = _crop_extend_acyclic  # type: ignore[method-assign]


class Collector:
    """Full collections at quiet moments (see the module). :meth:`start` turns Python's own
    trigger off and :meth:`stop` back on; :meth:`busy` says a key came; :meth:`tick` (twice a
    second) collects when it is time. ``monotonic`` is the clock (seconds)."""

    def __init__(
        self,
        *,
        quiet: float = QUIET,
        every: float = EVERY,
        latest: float = LATEST,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quiet, self.every, self.latest = quiet, every, latest
        self.monotonic = monotonic
        self._thresholds: tuple[int, int, int] | None = None
        self._busy_at = self._collected_at = monotonic()
        self.collections = 0
        """Full collections run so far."""

    @property
    def started(self) -> bool:
        return self._thresholds is not None

    def start(self) -> None:
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            young, middle, _ = self._thresholds
            gc.set_threshold(young, middle, _NEVER)
            self._collected_at = self.monotonic()

    def stop(self) -> None:
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def busy(self) -> None:
        """A key came (one may follow)."""
        self._busy_at = self.monotonic()

    def tick(self) -> bool:
        """Collect if it is time; whether it did."""
        if self._thresholds is None:
            return False
        now = self.monotonic()
        since = now - self._collected_at
        if since < self.every or (now - self._busy_at < self.quiet and since < self.latest):
            return False
        gc.collect()
        self._collected_at = self.monotonic()
        self.collections += 1
        return True
