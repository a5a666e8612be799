"""A one-line text widget that redraws without a re-layout."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

__all__ = ["Line"]


class Line(Widget):
    """One line of text (``height: 1`` unless styled otherwise). Unlike ``Static.update``,
    which lays the whole screen out again on every call, setting :attr:`content` redraws
    this line alone, and only when the text changed: titles and status lines change with
    every refresh and every cursor move."""

    DEFAULT_CSS = """
    Line {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    content: reactive[Content] = reactive(Content(""))

    def __init__(self, content: Content | str = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.set_reactive(Line.content, Content(content) if isinstance(content, str) else content)

    def update(self, content: Content | str) -> None:
        self.content = Content(content) if isinstance(content, str) else content

    def render(self) -> Content:
        return self.content
