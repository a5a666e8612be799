"""The console's keys, each declared once, with the backend action it performs.

A :class:`Key` is one key of the console: what is pressed, the Textual action it runs
(its *method*), the footer's label, and, for a key that calls the backend, the declared
actions it performs (:mod:`backend.client.actions`). A key that performs one action binds
to that action's name (:func:`action_key`: ``x`` runs ``release_lock``); a toggle names
the pair it chooses from (``e``: ``enable_schedule`` or ``disable_schedule``). Everything
else follows from the declarations:

* bindings: an owner's ``BINDINGS`` are :func:`bindings` of its ``KEYS`` (a view's keys live
  on the view, so the footer offers them only while that view is on screen);
* read-only: a key whose action is an ``operate`` one is disabled (left out of the footer),
  and pressing it says why (:meth:`console.app.SchedtuiApp.run_action`); read keys stay;
* confirmation: a key whose action declares a :class:`~backend.client.actions.Danger`
  asks first, with :class:`~console.screens.confirm.Confirm`, in the declaration's words;
* the help screen (``?``) and the read-only notes list the keys from the same declarations.

A key that calls no backend action (``z``, ``?``) is declared the same way, with no
actions, and one that only reads names its ``read`` action (``]``: ``list_runs``): neither is
ever refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.actions import parse
from textual.binding import Binding, BindingType

import backend.client.operations  # noqa: F401 - importing it declares the actions
from backend.client.actions import Action, action_of

__all__ = ["Key", "action_key", "bindings", "method_name"]


def method_name(method: str) -> str:
    """The action's name in a Textual action string: ``app.zoom(-1)`` -> ``zoom``."""
    return parse(method)[1]


@dataclass(frozen=True)
class Key:
    """One key of the console (see the module docstring)."""

    key: str
    """What is pressed, as Textual names it (``x``, ``question_mark``, ``plus,equals_sign``)."""
    method: str
    """The Textual action the key runs on its owner (``release_lock``; ``app.run_now`` on the
    app from a view's binding; ``zoom(-1)``)."""
    label: str
    """The footer's word for it."""
    actions: tuple[str, ...] = ()
    """The declared backend actions it performs (none: it only reads or changes the view)."""
    title: str = ""
    """What notifications and the command palette call it (default: the label)."""
    help: str = ""
    """What the help screen says it does (default: the first action's summary)."""
    id: str = ""
    """The binding's id, the name ``$SCHEDTUI_KEYMAP`` remaps it by (default: the method's
    name, which for a key that performs one action is that action's name)."""
    show: bool = True
    """Shown in the footer (``?`` lists every key either way)."""
    key_display: str | None = None
    priority: bool = False
    """Handled before the focused widget sees the key (its action raises ``SkipAction`` to
    hand it on), so that keys typed right after it go where it sent the focus."""

    def __post_init__(self) -> None:
        for name in self.actions:
            action_of(name)  # a key naming no declared action fails at import, not when pressed

    @property
    def name(self) -> str:
        """The Textual action's name (``check_action`` and ``run_action`` see this)."""
        return method_name(self.method)

    @property
    def binding_id(self) -> str:
        return self.id or self.name

    @property
    def what(self) -> str:
        return self.title or self.label

    @property
    def declared(self) -> tuple[Action, ...]:
        return tuple(action_of(name) for name in self.actions)

    @property
    def operates(self) -> bool:
        """Whether it changes anything: one of its actions is an ``operate`` one (refused
        while the console is read-only)."""
        return any(action.permission == "operate" for action in self.declared)

    @property
    def dangerous(self) -> tuple[Action, ...]:
        """Its actions that ask before they act."""
        return tuple(action for action in self.declared if action.danger is not None)

    @property
    def description(self) -> str:
        """What the help screen says: its own help, else its first action's summary."""
        if self.help:
            return self.help
        summary = self.declared[0].summary if self.actions else self.what
        return summary + (" (asks first)" if self.dangerous else "")

    def binding(self) -> Binding:
        return Binding(self.key, self.method, self.label, show=self.show, key_display=self.key_display,
                       id=self.binding_id, tooltip=self.description, priority=self.priority)  # fmt: skip


def action_key(
    action: str, key: str, label: str, *, method: str = "", title: str = "", help: str = "", show: bool = True,
    key_display: str | None = None,
) -> Key:
    """A key that performs the declared action ``action``, bound by its name: its binding id
    is the action's name, and so is its method (``action_<action>`` on the key's owner)
    unless ``method`` names it elsewhere (``app.run_now``: the app's, from a view)."""
    return Key(key, method or action, label, (action,), title=title, help=help, id=action, show=show,
               key_display=key_display)  # fmt: skip


def bindings(keys: Iterable[Key]) -> list[BindingType]:
    """The Textual bindings of ``keys``, for an owner's ``BINDINGS``."""
    return [key.binding() for key in keys]
