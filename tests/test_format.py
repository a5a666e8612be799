"""The console's and the CLI's time texts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from console.format import compact_delta


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=59), "59s"),
        (timedelta(minutes=4, seconds=59), "4m 59s"),
        (timedelta(hours=3, minutes=2, seconds=5), "3h 2m"),
        (timedelta(hours=10, seconds=46), "10h"),  # never "10h 46s": the units are adjacent
        (timedelta(days=2, minutes=5), "2d"),
        (timedelta(days=2, hours=4, minutes=5), "2d 4h"),
        (timedelta(minutes=7), "7m"),
    ],
)
def test_two_adjacent_units_the_smaller_left_out_when_zero(delta: timedelta, text: str) -> None:
    assert compact_delta(delta) == text
