"""The footer: the keys the view on screen handles, with ``?`` and ``q`` always in sight.

Textual's footer draws every binding in a row and lets the terminal cut the end: at 80
columns that was ``? Help`` and ``q Quit``, and it offered keys it would then refuse. This
one draws from the same bindings (:attr:`textual.screen.Screen.active_bindings`), so it
follows the focus, the view on screen and a keymap, and chooses what fits:

* ``?`` and ``q`` (the bindings :data:`PINNED`) always, at the right end;
* then the keys of the view on screen (and of the focused widget), in their declared order;
* then the keys that work everywhere, in theirs (the tab line shows the views and the zone).

What does not fit is left out from the end, the keys that work everywhere first, and a
``…`` says so (``?`` lists every key). A key refused now (an action while the console is
read-only) is left out: the view does not handle it, and the footer does not offer it.
"""

from __future__ import annotations

from textual import events
from textual.app import App
from textual.content import Content
from textual.screen import Screen
from textual.widget import Widget

__all__ = ["PINNED", "FooterItem", "KeyFooter"]

PINNED = ("help", "quit")
"""The binding ids always shown, at the right end."""

FooterItem = tuple[str, str, str]
"""(key as bound, key as shown, label)."""

_MORE = "…"


class KeyFooter(Widget):
    """See the module docstring."""

    DEFAULT_CSS = """
    KeyFooter {
        height: 1;
        background: $footer-background;
        color: $footer-description-foreground;
        text-wrap: nowrap;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._spans: list[tuple[int, int, str]] = []
        """(first column, past the last, key) of each item drawn: a click presses it."""

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        if screen is self.screen:
            self.refresh()

    def on_resize(self) -> None:
        self.refresh()

    def offered(self) -> tuple[list[FooterItem], list[FooterItem], list[FooterItem]]:
        """What could be shown: the view's keys, the keys that work everywhere, the pinned
        ones (each shown, enabled, once per action)."""
        app: App[object] = self.app
        local: list[FooterItem] = []
        everywhere: list[FooterItem] = []
        pinned: dict[str, FooterItem] = {}
        seen: set[str] = set()
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if not binding.show or not active.enabled or binding.action in seen:
                continue
            seen.add(binding.action)
            item = (key, app.get_key_display(binding), binding.description)
            if active.node is app and binding.id in PINNED:
                pinned[binding.id] = item
            elif active.node is app:
                everywhere.append(item)
            else:
                local.append(item)
        return local, everywhere, [pinned[i] for i in PINNED if i in pinned]

    def chosen(self, width: int) -> tuple[list[FooterItem], bool, list[FooterItem]]:
        """What fits ``width`` cells: the view's and the everywhere keys kept (in order),
        whether some were left out, and the pinned ones."""
        local, everywhere, pinned = self.offered()
        middle = [*local, *everywhere]

        def length(items: list[FooterItem], more: bool) -> int:
            cells = sum(len(shown) + 1 + len(label) + 1 for _, shown, label in items)
            return 1 + cells + (len(_MORE) + 1 if more else 0)  # a cell of padding on the left

        kept = list(middle)
        while kept and length([*kept, *pinned], len(kept) < len(middle)) > width:
            kept.pop()
        return kept, len(kept) < len(middle), pinned

    def render(self) -> Content:
        kept, more, pinned = self.chosen(self.size.width)
        parts: list[str | tuple[str, str]] = [" "]
        self._spans = []
        column = 1

        def add(items: list[FooterItem]) -> None:
            nonlocal column
            for key, shown, label in items:
                parts.extend([(shown, "bold $footer-key-foreground"), f" {label} "])
                self._spans.append((column, column + len(shown) + 1 + len(label), key))
                column += len(shown) + len(label) + 2

        add(kept)
        if more:
            parts.append((_MORE + " ", "$text-muted"))
            column += len(_MORE) + 1
        add(pinned)
        return Content.assemble(*parts)

    def on_click(self, event: events.Click) -> None:
        for start, end, key in self._spans:
            if start <= event.x < end:
                self.app.simulate_key(key)
                return
