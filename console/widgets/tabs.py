"""The line of numbered views under the header, and the zone times are shown in."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

__all__ = ["ViewTabs"]


class ViewTabs(Widget):
    """``1 Schedules  2 Timeline  3 Jobs …``: the view on screen reversed, views that are
    not available dimmed; on the right, the zone times are shown in (``z`` toggles)."""

    DEFAULT_CSS = """
    ViewTabs {
        height: 1;
        background: $panel;
        padding: 0 1;
    }
    """

    tabs: reactive[tuple[tuple[str, str, str, bool], ...]] = reactive(())
    """(view id, key, title, available) in order."""
    active: reactive[str] = reactive("")
    zone: reactive[str] = reactive("")
    """The display zone's label, e.g. ``Europe/Berlin`` or ``UTC``."""

    def render(self) -> Content:
        parts: list[str | tuple[str, str]] = []
        for view_id, key, title, available in self.tabs:
            if view_id == self.active:
                parts += [(f" {key} {title} ", "bold reverse $accent"), " "]
            elif available:
                parts += [(f" {key}", "bold $text-accent"), (f" {title} ", ""), " "]
            else:
                parts += [(f" {key} {title} ", "$text-disabled"), " "]
        left = Content.assemble(*parts)
        right = Content.assemble(("times ", "$text-muted"), (self.zone, "bold"), (" (z)", "$text-muted"))
        room = self.size.width - 2 - left.cell_length - right.cell_length
        if room < 1:
            return left
        return Content.assemble(left, " " * room, right)
