"""Exceptions that resist being described: their text, their class or their traceback
raises when asked for. A handler raising any of them fails its run at once, tagged with
the class's name (what ``backend.errors.describe_exception`` guarantees).

A module of its own so that a handler in a child process (``isolation="process"``) can
raise them too: its definitions file imports them from here."""

from __future__ import annotations

from typing import Any, NoReturn


class StrRaises(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


class StrAndReprRaise(Exception):
    def __str__(self) -> str:
        raise ValueError("no text")

    def __repr__(self) -> str:
        raise ValueError("no repr either")


class StrRaisesSystemExit(Exception):
    """Its ``__str__`` raises a BaseException, which ``traceback`` does not catch."""

    def __str__(self) -> str:
        raise SystemExit(9)


class _SlyText(str):
    """A str whose own methods raise: slicing, length, truth, formatting."""

    def __getitem__(self, key: Any) -> NoReturn:
        raise RuntimeError("no slicing")

    def __len__(self) -> NoReturn:
        raise RuntimeError("no length")

    def __bool__(self) -> NoReturn:
        raise RuntimeError("no truth")

    def __format__(self, spec: str) -> NoReturn:
        raise RuntimeError("no format")


class SlyText(Exception):
    def __str__(self) -> str:
        return _SlyText("sly")


class ClassRaises(Exception):
    """``isinstance`` reads ``__class__`` when the real type does not match."""

    @property  # type: ignore[misc]  # __class__ as a property, on purpose
    def __class__(self) -> NoReturn:  # type: ignore[override]  # it raises, on purpose
        raise RuntimeError("no class")


class _NameRaises(type):
    @property
    def __name__(cls) -> NoReturn:  # type: ignore[override]  # it raises, on purpose
        raise RuntimeError("no name")


class MetaNameRaises(Exception, metaclass=_NameRaises):
    pass


class Unreadable(Exception):
    """Every attribute read raises: its traceback cannot be formatted."""

    def __getattribute__(self, name: str) -> NoReturn:
        raise RuntimeError(f"no {name}")


class NotesRaise(Exception):
    @property
    def __notes__(self) -> NoReturn:  # type: ignore[override]  # it raises, on purpose
        raise RuntimeError("no notes")


#: Each class with the tag its failure is recorded with (its real name).
ODD_EXCEPTIONS: list[type[BaseException]] = [
    StrRaises, StrAndReprRaise, StrRaisesSystemExit, SlyText, ClassRaises, MetaNameRaises, Unreadable, NotesRaise,
]


def tag_of(cls: type[BaseException]) -> str:
    """The class's real name (``cls.__name__`` itself may raise)."""
    name: str = type.__dict__["__name__"].__get__(cls)
    return name
