"""What a key does in the console, in general: every key by the action it runs, a key that
acts refused while read-only (and why), the key as bound now (a keymap may move it), and
the help screen's lists (a part of :class:`~console.app.SchedtuiApp`; the keys are declared
in :mod:`console.keys`, what each one does in the app, its views and
:mod:`console.schedule_actions`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import ClassVar

from textual.actions import ActionParseResult, parse
from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode

from backend.client.interface import ConnectionInfo
from console.keys import Key
from console.screens.help import HelpScreen
from console.views import VIEWS, View

__all__ = ["NAVIGATION", "Keyboard"]


@functools.cache
def _every_key(app: type[Keyboard]) -> dict[str, Key]:
    """:meth:`Keyboard.every_key` of an app class, once (they are declared when the classes are)."""
    return app.every_key()


class Keyboard(App[None]):
    """Every key of the app and its views, as the app runs them (see the module docstring):
    a part of the app, which declares the keys (:attr:`KEYS`) and the state read here."""

    KEYS: ClassVar[tuple[Key, ...]]
    read_only: bool
    read_only_flag: bool
    info: ConnectionInfo | None

    def _read_only_reason(self) -> str | None:
        if not self.read_only:
            return None
        if self.read_only_flag:
            return "the console was started with --read-only"
        if self.info is not None and self.info.kind == "remote":
            return "the token may only read"
        return "the backend is read-only"

    @classmethod
    def every_key(cls) -> dict[str, Key]:
        """Every key of the console (the app's and every view's) by the name of the Textual
        action it runs, the name :meth:`check_action` and :meth:`run_action` are given."""
        found: dict[str, Key] = {}
        for key in (*cls.KEYS, *(key for spec in VIEWS if spec.make is not None for key in spec.make.KEYS)):
            same = found.setdefault(key.name, key)
            if same.actions != key.actions:
                raise TypeError(f"the keys {same.key} and {key.key} run {key.name} but perform different actions")
        return found

    def key_display(self, key: Key, *, alone: bool = False) -> str:
        """The key as the operator presses it now (a keymap may have moved it); ``alone``:
        itself, not the footer's summary of several (``1`` rather than ``1-7``)."""
        keys = self._keymap.get(key.binding_id, "") or key.key
        first = keys.split(",")[0].strip()
        return self.get_key_display(Binding(first, key.method, key.label, key_display=None if alone else key.key_display))

    def get_key_display(self, binding: Binding) -> str:
        """As Textual shows keys, but ``enter`` spelled out (the screens' hints say "enter")."""
        if binding.key == "enter" and not binding.key_display:
            return "enter"
        return super().get_key_display(binding)

    def palette_key(self, name: str) -> str:
        """`` (r)``: the key that runs the action ``name``, as bound now; ``""`` if none does."""
        key = _every_key(type(self)).get(name)
        return f" ({self.key_display(key, alone=True)})" if key is not None else ""

    def refusal(self, name: str) -> tuple[Key, str] | None:
        """The key that runs the action ``name`` and why it may not now (its actions change
        something, and the console is read-only); ``None`` when it may."""
        key = _every_key(type(self)).get(name)
        if key is None or not key.operates or not self.read_only:
            return None
        return key, self._read_only_reason() or "the console is read-only"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A key that acts is disabled (left out of the footer) while read-only; the views ask
        the same (:meth:`console.views.base.View.check_action`)."""
        return None if self.refusal(action) is not None else True

    async def run_action(
        self, action: str | ActionParseResult, default_namespace: DOMNode | None = None,
        namespaces: Mapping[str, DOMNode] | None = None,
    ) -> bool:
        """Every key and every command of the palette comes here: a key of the app's or of a
        view's that is refused while read-only says why, and does nothing."""
        namespace, name, _ = parse(action) if isinstance(action, str) else action
        target = self if namespace == "app" or default_namespace is None else default_namespace
        refused = self.refusal(name) if target is self or isinstance(target, View) else None
        if refused is not None:
            key, why = refused
            self.notify(f"{key.what} does nothing here: {why}.", title="Read-only", severity="warning")
            return True
        return await super().run_action(action, default_namespace, namespaces)  # fmt: skip

    def may_act(self, action: str) -> bool:
        """Whether ``action`` may go ahead (connected); otherwise say why not. (Read-only is
        decided before: :meth:`run_action`.)"""
        if self.info is None:
            self.notify(f"{action}: not connected yet.", title="Not connected", severity="warning")
            return False
        return True

    def action_help(self) -> None:
        """``?``: keys and the legend."""
        self.push_screen(HelpScreen(self.help_keys(), self.read_only_note()))

    def help_line(self, key: Key) -> tuple[str, str]:
        """A key as the help screen lists it: as bound now, and what it does (whether it
        asks first, and whether read-only refuses it, follow from its actions)."""
        text = key.description + (" (asks first)" if key.dangerous else "")
        if self.refusal(key.name) is not None:
            text += " · read-only: does nothing"
        return self.key_display(key, alone=True), text

    def help_keys(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """Every key, from the same declarations as the bindings, as bound now (a keymap may
        have moved one), in sections: everywhere, the views, then each view's own keys and
        the keys its widgets handle (:data:`NAVIGATION`)."""
        views = {key.binding_id: key for key in self.KEYS if key.name == "show_view"}
        everywhere = [self.help_line(key) for key in self.KEYS if key.name != "show_view"]
        palette = Binding(self.COMMAND_PALETTE_BINDING, "command_palette", "Commands")
        everywhere.append((self.get_key_display(palette), "command palette: every action by name, go to a schedule or a view"))
        listed = [(self.key_display(key, alone=True), key.description + ("" if spec.make else " (not yet)"))
                  for spec in VIEWS if (key := views.get(f"view_{spec.id}")) is not None]  # fmt: skip
        sections = [("Everywhere", everywhere), ("Views", listed)]
        for spec in VIEWS:
            if spec.make is None:
                continue
            moves = [(" ".join(self.get_key_display(Binding(k, "")) for k in keys), what)
                     for keys, what in NAVIGATION.get(spec.id, ())]  # fmt: skip
            sections.append((f"{spec.key} {spec.title}", [*(self.help_line(key) for key in spec.make.KEYS), *moves]))
        return sections

    def read_only_note(self) -> str | None:
        """Why the console is read-only, and the keys that therefore do nothing."""
        why = self._read_only_reason()
        if why is None:
            return None
        refused = sorted({self.key_display(key, alone=True) for key in _every_key(type(self)).values() if key.operates})
        return f"{why}: {' '.join(refused)} do nothing"


NAVIGATION: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "schedules": (
        (("up", "down", "k", "j"), "move in the table (pgup/pgdn a page)"),
        (("home", "end", "g", "G"), "first / last row"),
        (("left", "right"), "scroll the table sideways (hidden columns)"),
        (("tab",), "switch between the schedules and the runs"),
    ),
    "timeline": (
        (("up", "down", "k", "j"), "another schedule (pgup/pgdn a page)"),
        (("home", "end", "g", "G"), "the first / last schedule"),
        (("left", "right"), "the previous / next run of the row"),
    ),
    "jobs": (
        (("up", "down", "k", "j"), "move in the table"),
        (("home", "end", "g", "G"), "first / last row"),
        (("tab",), "switch between the queues and their jobs"),
    ),
    "durable": (
        (("up", "down", "k", "j"), "move in the table"),
        (("home", "end", "g", "G"), "first / last row"),
    ),
    "locks": (
        (("up", "down", "k", "j"), "move in the table (pgup/pgdn a page)"),
        (("home", "end", "g", "G"), "first / last row"),
    ),
    "audit": (
        (("up", "down", "k", "j"), "move in the table"),
        (("home", "end", "g", "G"), "first / last row"),
    ),
    "health": (
        (("up", "down", "k", "j"), "scroll the rows (pgup/pgdn a page)"),
        (("home", "end", "g", "G"), "top / bottom"),
    ),
}
"""Keys the views' widgets handle themselves (a table's cursor, tab between tables), for the
help screen; a test holds each to a binding of a widget in its view."""
