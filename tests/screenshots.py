"""Draw the README's pictures: ``python -m tests.screenshots [OUT_DIR]`` (default screenshots/).

The same scenes as the snapshot tests (tests/console_scenes.py), from the same frozen
fixture ledger, at 120x32; the main screen and NO_COLOR at 80x24 too.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from textual._doc import take_svg_screenshot

from tests.console_scenes import SIZES, make_ledger, scene_app

PICTURES = [
    ("main", "120x32"),
    ("main", "80x24"),
    ("timeline", "120x32"),
    ("timeline", "80x24"),
    ("schedule-create", "120x32"),
    ("schedule-create-error", "80x24"),
    ("schedule-created", "120x32"),
    ("backfill-ok", "120x32"),
    ("backfill-confirm", "120x32"),
    ("backfill-refused", "120x32"),
    ("backfill-live-slots", "120x32"),
    ("backfill-running", "120x32"),
    ("token-refused", "80x24"),
    ("read-only", "120x32"),
    ("disconnected", "120x32"),
    ("nothing-fires", "120x32"),
    ("no-color", "80x24"),
    ("jobs", "80x24"),
    ("jobs", "120x32"),
    ("job-details", "120x32"),
    ("locks", "120x32"),
    ("confirm", "120x32"),
    ("quit-backfill", "80x24"),
    ("help", "120x32"),
    ("audit", "120x32"),
    ("audit-entry", "120x32"),
    ("locks", "80x24"),
    ("durable", "120x32"),
    ("durable-steps", "120x32"),
    ("alerting", "80x24"),
    ("health", "120x32"),
    ("health-no-color", "80x24"),
    ("run-log", "80x24"),
    ("clock-off", "120x32"),
    ("clock-off", "80x24"),
    ("schedule-not-valid-here", "80x24"),
]


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    ledger = make_ledger(Path(tempfile.mkdtemp(prefix="schedtui-shots-")))
    for scene, size in PICTURES:
        app, run_before = scene_app(ledger, scene)
        svg = take_svg_screenshot(app=app, terminal_size=SIZES[size], run_before=run_before, title=f"schedtui — {scene}")
        target = out / f"console-{scene}-{size}.svg"
        target.write_text(svg)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
