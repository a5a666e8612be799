"""View 5: the project locks: who holds each, its fencing token, when it expires, when it
was last renewed; ``x`` releases the selected one by force, after asking."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content

from backend.locks import Lock, LocksSnapshot
from backend.safetext import in_line
from console import format as fmt
from console.keys import action_key, bindings
from console.screens.confirm import Confirm
from console.views.base import View
from console.widgets.line import Line
from console.widgets.palette import theme_color
from console.widgets.schedules import FreshTable
from console.workers import work

__all__ = ["LocksTable", "LocksView"]


class LocksTable(FreshTable):
    """One row per lock, by name; :meth:`tick` recomputes the expiry countdowns and the
    renewal ages from the lock clock's time (the database's, as estimated)."""

    # Fixed widths: a table that re-measures its columns as rows arrive draws differently
    # from one refresh to the next (and from one snapshot to the next).
    COLUMNS = (
        ("name", "NAME", 24),
        ("holder", "HOLDER", 22),
        ("token", "TOKEN", 8),
        ("state", "STATE", 9),
        ("expires", "EXPIRES", 18),
        ("renewed", "LAST RENEWAL", 12),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.locks: dict[str, Lock] = {}

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    @property
    def selected(self) -> Lock | None:
        if not self.row_count:
            return None
        try:
            name = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None
        return self.locks.get(name or "")

    def _since(self, what: str, then: datetime, now: datetime) -> str:
        """``released 13m 17s ago`` while it fits the EXPIRES column, else the larger unit
        alone (``released 13m ago``): the table cut the phrase mid-word (``13m 17s a``)."""
        width = dict((key, width) for key, _, width in self.COLUMNS)["expires"]
        exact = f"{what} {fmt.ago(then, now)}"
        return exact if len(exact) <= width else f"{what} {fmt.age(then, now)} ago"

    def _timed(self, lock: Lock, now: datetime) -> tuple[Text, Text, Text]:
        state = lock.state(now)
        color = {"held": "text-success", "expired": "text-warning", "free": "text-muted"}[state]
        glyph = {"held": "●", "expired": "⚠", "free": "○"}[state]
        if state == "held":
            expires = fmt.countdown(lock.expires_at, now)
        else:
            expires = self._since("expired" if state == "expired" else "released", lock.expires_at, now)
        renewed = fmt.ago(lock.renewed_at, now) if lock.holder is not None else "-"
        return Text(f"{glyph} {state}", style=theme_color(self.app, color)), Text(expires), Text(renewed)

    def show(self, snapshot: LocksSnapshot, now: datetime) -> None:
        selected = self.selected
        self.locks = {lock.name: lock for lock in snapshot.locks}
        self.clear()
        for lock in snapshot.locks:
            state, expires, renewed = self._timed(lock, now)
            self.add_row(Text(fmt.cut(lock.name, 24), style="bold"), Text(fmt.cut(lock.holder or "-", 22)),
                         Text(str(lock.token)), state, expires, renewed, key=lock.name)  # fmt: skip
        self.measure_now()
        if selected is not None and selected.name in self.locks:
            self.move_cursor(row=self.get_row_index(selected.name), animate=False, scroll=True)

    def tick(self, now: datetime) -> None:
        for name, lock in self.locks.items():
            for key, cell in zip(("state", "expires", "renewed"), self._timed(lock, now), strict=False):
                if self.get_cell(name, key) != cell:
                    self.update_cell(name, key, cell)


class LocksView(View):
    """The lock table, refreshed with the app; countdowns tick between refreshes."""

    view_id = "locks"
    topics: ClassVar[tuple[str, ...]] = ("locks",)

    KEYS = (
        action_key("release_lock", "x", "Release",
                   help="release the selected lock by force (the next holder gets a greater token)"),
    )  # fmt: skip
    BINDINGS = bindings(KEYS)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.view_id)
        self.snapshot: LocksSnapshot | None = None
        self._read_at: datetime | None = None

    def compose(self) -> ComposeResult:
        yield Line("LOCKS", id="locks-title", classes="section")
        yield LocksTable(id="locks-table")
        yield Line("", id="locks-hint")

    @property
    def table(self) -> LocksTable:
        return self.query_one(LocksTable)

    def focus_main(self) -> None:
        self.table.focus()

    def lock_now(self, now: datetime) -> datetime:
        """The lock clock now: its time at the last read plus what has passed since."""
        if self.snapshot is None or self._read_at is None:
            return now
        return self.snapshot.now + (now - self._read_at)

    async def load(self) -> None:
        self.snapshot = await self.console.backend.list_locks()
        self._read_at = self.console.clock.now()

    def show(self) -> None:
        snapshot = self.snapshot
        if snapshot is None:
            return
        now = self.lock_now(self.console.clock.now())
        self.table.show(snapshot, now)
        held = sum(1 for lock in snapshot.locks if lock.state(now) == "held")
        self._title(len(snapshot.locks), held)
        self.call_after_refresh(self._title, len(snapshot.locks), held)  # hidden columns: once laid out
        if not snapshot.locks:
            hint = "no lock has been taken in this store yet"
        elif self.console.refusal("release_lock") is not None:
            hint = "read-only: the locks are shown; none is released from here"  # the hint offers no key it refuses
        else:
            hint = f"{self.shown_key('release_lock')} releases the selected lock by force"
        self.query_one("#locks-hint", Line).update(Content.styled(hint, "$text-muted"))

    def _title(self, count: int, held: int) -> None:
        title = f"LOCKS {count} · {held} held" + self.table.off_screen()
        self.query_one("#locks-title", Line).update(title)

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self.show()

    def tick(self, now: datetime) -> None:
        if self.snapshot is not None:
            self.table.tick(self.lock_now(now))

    def action_release_lock(self) -> None:
        """``x``: release the selected lock by force, once confirmed."""
        console = self.console
        lock = self.table.selected
        if lock is None:
            console.notify("Release: no lock selected.", severity="warning")
            return
        now = self.lock_now(console.clock.now())
        if lock.holder is None:
            console.notify(f'Lock "{lock.name}" is not held; nothing to release.', title="Release", markup=False)
            return
        state = lock.state(now)
        until = (
            f"its lease runs {fmt.countdown(lock.expires_at, now)}" if state == "held"
            else f"its lease expired {fmt.ago(lock.expires_at, now)}"
        )  # fmt: skip
        held = f"Held by {in_line(lock.holder)} (token {lock.token}); {until}."

        def answer(yes: bool | None) -> None:
            if yes:  # (the lease confirmed: one taken since is refused, not cut)
                self._release(lock.name, lock.token)

        console.push_screen(Confirm.of("release_lock", {"name": lock.name}, facts=[held]), answer)

    @work(group="action")
    async def _release(self, name: str, token: int) -> None:
        console = self.console
        went, done = await self.attempt(console.backend.release_lock(name, if_token=token))
        if not went or done is None:
            return
        if done.released:
            console.notify(f'Lock "{name}" released (was held by {in_line(done.lock.holder or "-")}, token {done.lock.token}).',
                           title="Lock released", markup=False)  # fmt: skip
        else:
            console.notify(f'Lock "{name}" was not held any more.', title="Release", markup=False)
        console.request_refresh()

