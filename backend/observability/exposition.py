"""One metric family's exposition text, kept between scrapes and rendered again only where it changed.

prometheus_client formats some microseconds a series, and a thousand schedules make
thousands of series, most of them unchanged from one scrape to the next. A
:class:`FamilyText` keeps the text of each group of series (a schedule's histogram, a
queue's counts) with the value it shows, and has ``generate_latest`` render only the groups
whose value changed, all in one family. The format stays prometheus_client's own: every
sample is one line (label values have their newlines escaped), so the rendered family is
cut back into its groups by counting lines.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["FamilyText", "Families"]

M = TypeVar("M", bound=Metric)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)


class Families(Collector):
    """Given families, as a collector (what ``generate_latest`` renders)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


class FamilyText(Generic[M, K, V]):
    """One family's text, from groups of its series.

    Contract: :meth:`update` is given every group in the order they are to be shown (``key``,
    the ``value`` its series show) and returns the family's whole text, as ``generate_latest``
    renders the family holding every group's samples; ``add(family, key, value)`` adds one
    group's samples and is called only for the groups whose value differs from the last
    update's (or that were not in it). Not thread-safe: one update at a time.
    """

    def __init__(self, make: Callable[[], M], add: Callable[[M, K, V], None]) -> None:
        self.make = make
        self.add = add
        self.header = generate_latest(Families([make()]))
        """The family's ``# HELP`` and ``# TYPE`` lines (what an empty family renders)."""
        self.rendered = 0
        """Groups rendered so far (a cost, told to tests and the benchmark)."""
        self._kept: dict[K, tuple[V, bytes]] = {}

    def family(self, groups: Iterable[tuple[K, V]]) -> M:
        """The family holding every group's samples (as a collector's ``collect`` yields it)."""
        family = self.make()
        for key, value in groups:
            self.add(family, key, value)
        return family

    def update(self, groups: Sequence[tuple[K, V]]) -> bytes:
        kept = self._kept
        family = self.make()
        changed: list[tuple[K, V, int]] = []
        for key, value in groups:
            old = kept.get(key)
            if old is None or (old[0] is not value and old[0] != value):
                before = len(family.samples)
                self.add(family, key, value)
                changed.append((key, value, len(family.samples) - before))
        if changed:
            body = generate_latest(Families([family]))
            if not body.startswith(self.header):
                raise AssertionError(f"{family.name}: prometheus_client rendered a header unlike an empty family's")
            lines = body[len(self.header) :].split(b"\n")[:-1]
            if len(lines) != len(family.samples):
                raise AssertionError(f"{family.name}: {len(family.samples)} samples rendered as {len(lines)} lines")
            at = 0
            for key, value, count in changed:
                kept[key] = (value, b"".join(line + b"\n" for line in lines[at : at + count]))
                at += count
            self.rendered += len(changed)
        if len(kept) > len(groups):  # a group gone (a schedule removed): its series go too
            shown = {key for key, _ in groups}
            for key in [key for key in kept if key not in shown]:
                del kept[key]
        return self.header + b"".join([kept[key][1] for key, _ in groups])
