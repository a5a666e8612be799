"""The console's workers: Textual's ``@work``, where a failure nobody caught is said.

Every worker of the console runs with ``exit_on_error=False`` (an error in one must not end
the operator's session), and Textual then only logs what it raised: a worker that caught
:class:`~backend.errors.SchedtuiError` but met something else (a bug, a value the remote
client could not encode) did nothing, without a word. Here what escapes a worker is shown
as a notification (:meth:`~console.reading.Reading.report`), as every refusal is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from textual import work as textual_work
from textual.dom import DOMNode
from textual.worker import Worker

__all__ = ["work"]

P = ParamSpec("P")
R = TypeVar("R")
N = TypeVar("N", bound=DOMNode)


class _Reports(Protocol):
    def report(self, exc: BaseException) -> None: ...


def work(
    *, group: str = "default", exclusive: bool = False
) -> Callable[[Callable[Concatenate[N, P], Coroutine[Any, Any, R]]], Callable[Concatenate[N, P], Worker[R | None]]]:
    """``@work(group=..., exclusive=...)`` on an async method of a widget, screen or the app."""

    def decorate(
        method: Callable[Concatenate[N, P], Coroutine[Any, Any, R]],
    ) -> Callable[Concatenate[N, P], Worker[R | None]]:
        @functools.wraps(method)
        async def reported(node: N, *args: P.args, **kwargs: P.kwargs) -> R | None:
            try:
                return await method(node, *args, **kwargs)
            except Exception as exc:
                app: Any = node.app
                if not hasattr(app, "report"):
                    raise
                reporter: _Reports = app
                reporter.report(exc)
                return None

        return textual_work(reported, group=group, exclusive=exclusive, exit_on_error=False)

    return decorate
