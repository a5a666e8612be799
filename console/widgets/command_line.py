"""``:``: a command line, as k9s and vi have one: ``:jobs``, ``:locks``, ``:q``.

A command is a view by its name or number (``:locks``, ``:5``), ``:help``, or ``:q``
(``:quit``): it runs what the view's key, ``?`` or ``q`` runs (so ``:q`` asks when ``q``
would). A name may be shortened while it stays one (``:lo``); what names nothing, or more
than one, is a notification naming it. Enter runs it, esc closes the line.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widget import Widget
from textual.widgets import Input

from console import format as fmt
from console.widgets.bounded import LINE_CHARS, BoundedInput

__all__ = ["CommandLine", "commands_of", "resolve"]


def commands_of(views: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Every command by name: each view (``(id, key)``) by its id and its key, then the
    console's own; the value is the Textual action it runs."""
    commands: dict[str, str] = {}
    for view_id, key in views:
        commands[view_id] = commands[key] = f"show_view('{view_id}')"
    commands.update({"help": "help", "q": "quit", "quit": "quit"})
    return commands


def resolve(text: str, commands: dict[str, str]) -> tuple[str | None, str]:
    """``(action, "")`` for the command ``text`` names (a leading ``:`` and any case
    allowed), or ``(None, why)`` when it names none or several."""
    typed = text.strip().lstrip(":").strip()
    word = typed.lower()  # echoed as typed
    if not word:
        return None, ""
    if word in commands:
        return commands[word], ""
    names = [name for name in commands if not name.isdigit()]
    matches = sorted({name for name in names if name.startswith(word) and len(name) > 1})
    actions = {commands[name] for name in matches}
    if len(actions) == 1:
        return actions.pop(), ""
    if matches:
        return None, f"“:{fmt.echo(typed)}” could be " + " or ".join(f":{name}" for name in matches)
    views = [name for name in names if commands[name].startswith("show_view")]
    return None, f"no command “:{fmt.echo(typed)}”; try {', '.join(f':{name}' for name in views)}, :help or :q"


class CommandLine(BoundedInput):
    """The one-line input ``:`` opens (see the module docstring). It posts :class:`Run`
    with the command's action, or :class:`Refused` with why; either way it closes."""

    BINDINGS = [
        # in the footer while it is open (the keys that work everywhere are typed into it)
        Binding("enter", "submit", "Run", key_display="enter"),
        Binding("escape", "close", "Close", key_display="esc"),
    ]

    class Run(Message):
        def __init__(self, action: str) -> None:
            super().__init__()
            self.action = action

    class Refused(Message):
        def __init__(self, why: str) -> None:
            super().__init__()
            self.why = why

    def __init__(self, commands: dict[str, str], *, id: str | None = None) -> None:
        names = [name for name in commands if not name.isdigit()]
        shown = "  ".join(f":{name}" for name in names if name != "quit")
        super().__init__(placeholder=f"{shown}   (enter runs, esc closes)", id=id,
                         suggester=SuggestFromList(names, case_sensitive=False), limit=LINE_CHARS, unit="characters",
                         what="A command")
        self.commands = commands
        self._back: Widget | None = None

    def open(self) -> None:
        """Show the line and take the focus now, not at the next turn of the loop (as
        ``focus()`` would): keys typed right after ``:`` land here."""
        self._back = self.screen.focused
        self.value = ""
        self.display = True
        self.screen.set_focus(self)

    def action_close(self) -> None:
        """Hide the line and give the focus back to what had it (at once, as :meth:`open`)."""
        self.value = ""
        self.display = False
        back, self._back = self._back, None
        self.screen.set_focus(back if back is not None and back.is_attached else None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is not self:
            return
        event.stop()
        action, why = resolve(event.value, self.commands)
        self.action_close()
        if action is not None:
            self.post_message(self.Run(action))
        elif why:
            self.post_message(self.Refused(why))
