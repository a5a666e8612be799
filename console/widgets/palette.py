"""Status and outcome colours and glyphs: one table, used by every widget and the help legend.

Colours are names of theme variables (``$success``, ``$error``, …), resolved against the
running app's theme when drawn, so a theme change recolours everything consistently and
``NO_COLOR`` (Textual's monochrome filter) still leaves a glyph on every cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.style import Style
from rich.text import Text
from textual.color import Color

from console import format as fmt

if TYPE_CHECKING:
    from textual.app import App

__all__ = [
    "KIND_GLYPHS",
    "KIND_MEANINGS",
    "OUTCOME_COLORS",
    "STATUS_BACKGROUNDS",
    "STATUS_COLORS",
    "outcome_text",
    "status_cell",
    "status_style",
    "status_text",
    "theme_color",
]

STATUS_COLORS: dict[str, str] = {
    "succeeded": "text-success",
    "failed": "text-error",
    "skipped": "text-warning",
    "missed": "foreground-darken-2",
    "running": "text-primary",
}
"""The theme variable giving each run status its text colour."""

STATUS_BACKGROUNDS: dict[str, str] = {
    "succeeded": "success",
    "failed": "error",
    "skipped": "warning",
    "missed": "panel-lighten-2",
    "running": "primary",
}
"""The theme variable filling each status's cell in the run timeline."""

OUTCOME_COLORS: dict[str, str] = {
    "single": "text-secondary",
    "wonLock": "text-success",
    "cluster": "text-warning",
    "external": "text-primary",
    "manual": "text-accent",
}
"""The theme variable giving each coordination outcome its text colour."""

STATUS_MEANINGS: dict[str, str] = {
    "succeeded": "the handler returned within max_runtime",
    "failed": "raised, timed out, abandoned or interrupted",
    "skipped": "due while a run was still in flight",
    "missed": "did not run (engine down or behind)",
    "running": "in flight now",
}
OUTCOME_MEANINGS: dict[str, str] = {
    "single": "fired by the only instance (coordination single)",
    "wonLock": "this instance won the slot's claim (advisoryLock)",
    "cluster": "fired by the owner of the schedule's shard (cluster)",
    "external": "fired by a platform scheduler's call",
    "manual": "Run now or a range backfill",
}


KIND_GLYPHS: dict[str, str] = {
    "single": fmt.OUTCOME_GLYPHS["single"],
    "wonLock": fmt.OUTCOME_GLYPHS["wonLock"],
    "external": fmt.OUTCOME_GLYPHS["external"],
    "runnow": fmt.OUTCOME_GLYPHS["manual"],
    "backfill": "↺",
}
"""The timeline's mark for a run that ran (succeeded or failed): who fired it."""
KIND_MEANINGS: dict[str, str] = {
    "single": "fired by the only instance",
    "wonLock": "fired by the instance that won the slot's claim",
    "external": "fired by a platform scheduler's call",
    "runnow": "Run now (manual)",
    "backfill": "a backfill (manual, an old slot)",
}

FAILED_EMPHASIS = Style(bold=True, reverse=True)
"""Added to every failed status: it must stand out without colour (NO_COLOR) and where
16 colours draw red and green alike."""


_RESOLVED: dict[tuple[str, str], str] = {}


def theme_color(app: App[Any], variable: str) -> str:
    """A theme variable's value as a colour Rich understands (``#RRGGBB``); cached per theme
    (a thousand rows are drawn from a handful of colours)."""
    key = (app.theme, variable)
    cached = _RESOLVED.get(key)
    if cached is None:
        cached = _RESOLVED[key] = _resolve(app, variable)
    return cached


def _resolve(app: App[Any], variable: str) -> str:
    value = app.theme_variables.get(variable) or app.get_css_variables().get(variable, "")
    try:
        color = Color.parse(value)
    except Exception:  # a variable such as "auto 60%": fall back to the foreground
        color = Color.parse(app.theme_variables.get("foreground", "#e0e0e0"))
    background = Color.parse(app.theme_variables.get("background", "#000000"))
    return (background + color).hex6 if color.a < 1 else color.hex6


def status_style(app: App[Any], status: str) -> Style:
    """The status's colour; a failure is bold and reversed as well."""
    style = Style(color=theme_color(app, STATUS_COLORS.get(status, "foreground")))
    return style + FAILED_EMPHASIS if status == "failed" else style


def status_text(app: App[Any], status: str, label: str | None = None) -> Text:
    """``✓ succeeded`` in the status's colour (``✗ failed`` reversed, bold)."""
    glyph = fmt.STATUS_GLYPHS.get(status, "?")
    return Text(f"{glyph} {status if label is None else label}", style=status_style(app, status))


def status_cell(app: App[Any], status: str) -> Text:
    """One cell of the recent-runs strip: the status's glyph in its colour (a failure
    reversed)."""
    return Text(fmt.STATUS_GLYPHS.get(status, "?"), style=status_style(app, status) + Style(bold=True))


def outcome_text(app: App[Any], outcome: str) -> Text:
    """``◆ wonLock`` in the outcome's colour."""
    glyph = fmt.OUTCOME_GLYPHS.get(outcome, "?")
    return Text(f"{glyph} {outcome}", style=Style(color=theme_color(app, OUTCOME_COLORS.get(outcome, "foreground"))))
