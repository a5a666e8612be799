"""SVG snapshots of the console at a frozen time, at 120x32 and 80x24: every view (the
timeline with gaps, missed slots, backfills and many runs per cell), the dialogs, a silent
fleet, a lost connection and NO_COLOR.

The scenes (tests/console_scenes.py) are the same ones the screenshots script draws. Update
them with ``pytest tests/test_console_snapshots.py -n 0 --snapshot-update`` and look at the SVGs.
"""

from __future__ import annotations

import difflib
import html
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from pytest_textual_snapshot import node_to_report_path  # type: ignore[import-untyped]  # the plugin ships no types

from tests.console_scenes import SCENES, SIZES, make_ledger, scene_app

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')


def screen_text(svg: str) -> list[str]:
    """The characters of an SVG screenshot, row by row (its colours left out)."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for x, y, text in _TEXT.findall(svg):
        rows.setdefault(float(y), []).append((float(x), html.unescape(text).replace("\xa0", " ")))
    return ["".join(text for _, text in sorted(cells)) for _, cells in sorted(rows.items())]


def mismatch(request: pytest.FixtureRequest) -> str:
    """What differs between the stored picture and the one just taken, as text: a CI log then
    says why a picture failed (the HTML report stays on the machine that ran it)."""
    data = pickle.loads(node_to_report_path(request.node).read_bytes())
    expected, actual = screen_text(str(data[1])), screen_text(str(data[2]))
    diff = list(difflib.unified_diff(expected, actual, "stored", "taken", lineterm="", n=1))
    return "\n".join(diff) if diff else "the characters are the same; the colours or styles differ"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("snapshot-ledger"))


# A loaded machine can catch a frame mid-update (an input's line drawn before its width, a
# blink): a picture that differs is taken once more, from a fresh app. A real change differs twice.
@pytest.mark.flaky(reruns=1)
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("scene", list(SCENES))
def test_console_snapshot(snap_compare: Any, ledger: Path, scene: str, size: str, request: pytest.FixtureRequest) -> None:
    app, run_before = scene_app(ledger, scene)
    if not snap_compare(app, terminal_size=SIZES[size], run_before=run_before):
        pytest.fail(f"the {scene} scene at {size} differs from its snapshot:\n{mismatch(request)}")
