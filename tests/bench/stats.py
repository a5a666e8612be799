"""Percentiles for the benchmarks: one definition, so their figures compare."""

from __future__ import annotations

import math
from collections.abc import Sequence

STATS = {
    "p50": 50.0,
    "p90": 90.0,
    "p99": 99.0,
    "p999": 99.9,
}


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    index = max(0, math.ceil(p / 100 * len(sorted_values)) - 1)
    return sorted_values[min(index, len(sorted_values) - 1)]


def summary_ms(
    samples_s: Sequence[float], keys: Sequence[str] = ("p50", "p90", "p99", "max"), digits: int = 3
) -> dict[str, float | None]:
    """The named statistics (``p50`` … ``p999``, ``max``, ``min``, ``mean``) of samples given
    in seconds, in milliseconds; all ``None`` when there are no samples."""
    if not samples_s:
        return {key: None for key in keys}
    values = sorted(samples_s)

    def stat(key: str) -> float:
        if key == "max":
            return values[-1]
        if key == "min":
            return values[0]
        if key == "mean":
            return sum(values) / len(values)
        return percentile(values, STATS[key])

    return {key: round(stat(key) * 1000, digits) for key in keys}
