"""The console's buttons: ``enter`` presses one every time.

Textual's button ignores ``enter`` while its last press still shows (0.2 s of wall clock).
Keys typed ahead come faster than that: ``enter`` on *Backfill*, ``n`` to its question,
``enter`` again and ``y`` were one press, and the ``y`` (or an ``esc`` meant for the
question, which closed the dialog) went to the dialog under the question that never came.
The key gate (:mod:`console.keygate`) already hands a key on only once the one before has
done all it does, so here every ``enter`` presses, as every key does what it says however
soon it follows another. The press still shows."""

from __future__ import annotations

from textual.widgets import Button

__all__ = ["PressButton"]


class PressButton(Button):
    """A button ``enter`` presses however soon after its last press (a disabled or hidden
    one still takes no press)."""

    def action_press(self) -> None:
        self.press()
