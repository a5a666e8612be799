"""What every numbered view is to the app: a widget that reads and draws its own data."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, ClassVar, cast

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

if TYPE_CHECKING:
    from console.app import SchedtuiApp

__all__ = ["UnavailableView", "View"]


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
    topics: ClassVar[tuple[str, ...]] = ()
    """Change signals (besides ``runs`` and ``schedules``, which every view follows) that
    make the app refresh while this view is on screen (see :mod:`backend.events.bus`)."""

    @property
    def console(self) -> SchedtuiApp:
        # Only the app imports its parts (a part importing the app would be an import cycle).
        return cast("SchedtuiApp", self.app)

    def selected_schedule(self) -> str | None:
        """The schedule the schedule actions (``r``, ``e``, ``b``) apply to, if any."""
        return None

    def select(self, name: str) -> bool:
        """Put the cursor on a schedule (the palette's "Go to schedule"); False if absent."""
        return False

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
