"""SVG snapshots of the console at a frozen time, at 120x32 and 80x24: every view (the
timeline with gaps, missed slots, backfills and many runs per cell), the dialogs, a silent
fleet, a lost connection and NO_COLOR.

The scenes (tests/console_scenes.py) are the same ones the screenshots script draws. Update
them with ``pytest tests/test_console_snapshots.py -n 0 --snapshot-update`` and look at the SVGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.console_scenes import SCENES, SIZES, make_ledger, scene_app


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ledger(tmp_path_factory.mktemp("snapshot-ledger"))


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("scene", list(SCENES))
def test_console_snapshot(snap_compare: Any, ledger: Path, scene: str, size: str) -> None:
    app, run_before = scene_app(ledger, scene)
    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)
