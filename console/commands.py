"""The command palette's provider: the console's actions by name, and "go to" each schedule."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from console.app import SchedtuiApp

__all__ = ["ConsoleCommands"]


class ConsoleCommands(Provider):
    """Offers every view ("View 2: Timeline") and every action that has a key (Run now,
    Enable/disable, Backfill, …) by name, each with its key and what it applies to, plus
    "Go to schedule NAME"."""

    @property
    def console(self) -> SchedtuiApp:
        # Only the app imports its parts (a part importing the app would be an import cycle).
        return cast("SchedtuiApp", self.app)

    def _commands(self) -> list[tuple[str, str, str]]:
        app = self.console
        target = app.selected_name or "the selected schedule"
        from console.views import VIEWS

        commands = [
            (f"View {spec.key}: {spec.title}", f"show_view('{spec.id}')", f"{spec.help} ({spec.key})") for spec in VIEWS
        ]
        commands += [(title.format(name=target), action, help_ + app.palette_key(action)) for action, title, help_ in app.PALETTE_ACTIONS]
        for name in app.schedule_names:
            commands.append((f"Go to schedule {name}", f"select('{name}')", "select it in the table"))
        return commands

    async def discover(self) -> Hits:
        for title, action, help_ in self._commands():
            if action.startswith("select("):
                continue
            yield DiscoveryHit(title, partial(self.console.run_action, action), help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, action, help_ in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self.console.run_action, action), help=help_)
