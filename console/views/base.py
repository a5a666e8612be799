"""What every numbered view is to the app: a widget that reads and draws its own data."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar, TypeVar, cast

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from backend.errors import SchedtuiError, Unavailable
from console.keys import Key, action_key

if TYPE_CHECKING:
    from console.app import SchedtuiApp

T = TypeVar("T")

__all__ = ["SCHEDULE_KEYS", "UnavailableView", "View", "details_key", "filter_key"]

SCHEDULE_KEYS: tuple[Key, ...] = (
    action_key("run_now", "r", "Run now", method="app.run_now", help="Run now: fire the selected schedule once (manual)"),
    Key("e", "app.toggle_enabled", "On/off", ("enable_schedule", "disable_schedule"), title="Enable/disable",
        help="enable / disable the selected schedule (disabling asks for a note)"),
    Key("b", "app.backfill", "Backfill", ("plan_backfill", "start_backfill"),
        help="backfill a past range of the selected schedule"),
)
"""The keys of a view with a selected schedule (the schedules and the timeline)."""


def filter_key(what: str) -> Key:
    """``/``: the filter (it applies to ``what``; esc clears it)."""
    return Key("slash", "app.filter", "Filter", help=f"filter {what}")


def details_key(what: str, *, label: str = "Details") -> Key:
    """``enter``: the details of what is under the cursor (``what``)."""
    return Key("enter", "app.run_details", label, show=False, help=what)


class View(Vertical):
    """One numbered view. The app makes each view once and keeps it, so a view keeps its
    selection, scroll and paging when the operator switches away and back.

    The app calls, on the view on screen: :meth:`load` inside its refresh (after the
    schedules snapshot: read what else the view shows; errors are the app's to report),
    then :meth:`show`; :meth:`tick` twice a second. A view reads more on its own (a
    selection change) with workers of its own, reporting through ``console.report``."""

    DEFAULT_CSS = """
    View {
        height: 1fr;
    }
    """

    view_id: ClassVar[str] = ""
    KEYS: ClassVar[tuple[Key, ...]] = ()
    """The keys this view handles (the footer offers them while it is on screen); a
    subclass sets ``BINDINGS = bindings(KEYS)`` beside them."""
    BINDINGS: ClassVar[list[BindingType]] = []
    topics: ClassVar[tuple[str, ...]] = ()
    """Change signals (besides ``runs`` and ``schedules``, which every view follows) that
    make the app refresh while this view is on screen (see :mod:`backend.events.bus`)."""
    signalled_every: ClassVar[float] = 0.0
    """The least seconds between two refreshes that change signals start while this view
    is on screen (0: as soon as the one in flight is done); the signals in between are
    answered by one refresh once that much has passed."""

    loaded = False
    """Whether a :meth:`load` of this view has answered yet: until then its title says it
    is reading, not that there is nothing (behind a slow link the first read takes a while)."""

    @property
    def console(self) -> SchedtuiApp:
        # Only the app imports its parts (a part importing the app would be an import cycle).
        return cast("SchedtuiApp", self.app)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """As the app's (:meth:`console.app.SchedtuiApp.check_action`): a key that acts is
        disabled while the console is read-only."""
        return self.console.check_action(action, parameters)

    def shown_key(self, binding_id: str) -> str:
        """The key of this view (or of the app) bound as ``binding_id``, as the operator
        presses it now: for the hints a view writes (``x releases the selected lock``)."""
        console = self.console
        key = next(key for key in (*self.KEYS, *console.KEYS) if key.binding_id == binding_id)
        return console.key_display(key, alone=True)

    def selected_schedule(self) -> str | None:
        """The schedule the schedule actions (``r``, ``e``, ``b``) apply to, if any."""
        return None

    def select(self, name: str) -> bool:
        """Put the cursor on a schedule (the palette's "Go to schedule"); False if absent."""
        return False

    def selection_holds(self, action: str) -> bool:
        """Whether ``action`` may act on :meth:`selected_schedule`: not when the selection
        moved by itself since the operator last chose it (the schedule under the cursor was
        deleted elsewhere); then the view says so, and the next press acts."""
        return True

    async def attempt(self, call: Awaitable[T]) -> tuple[bool, T | None]:
        """A call to the backend that a key or a selection made (an operator's action, a
        read for the view): whether it went through, and its answer. A backend that cannot
        be reached is the connection's news (the header says it); any other refusal is said
        in a notification naming it."""
        console = self.console
        try:
            return True, await call
        except Unavailable as exc:
            console.connection_lost(exc)
        except SchedtuiError as exc:
            console.report(exc)
        return False, None

    async def load(self) -> None:
        """Read this view's own data (runs, jobs…) for what it will show."""

    def show(self) -> None:
        """Draw from the app's latest data."""

    def tick(self, now: datetime) -> None:
        """Redraw what depends on the time alone."""

    def open_details(self) -> None:
        """``enter``: the details of what is under the cursor."""

    def focus_main(self) -> None:
        """Give the focus to the view's main widget (on switching to it)."""
        self.focus()


class UnavailableView(View):
    """A view whose system this console or its backend does not offer (yet): it says so."""

    def __init__(self, title: str, why: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.why = why
        self.can_focus = True

    def compose(self) -> ComposeResult:
        yield Static(self.title.upper(), classes="section")
        yield Static(Content.assemble((f"{self.title} is not available here. ", "bold"), self.why), classes="unavailable")
