"""A step's result as the JSON text it is checkpointed as: the shortcut for the commonest
results (an int, a boolean, ``None``) spells them exactly as the JSON encoder does, and
fails exactly where it does."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest

from backend.durable.model import encode

ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


class Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize(
    "value", [0, -1, 7, 2**63, -(10**40), True, False, None, "", "é\x00", 1.5, [1, None], {"a": True}, Level.HIGH]
)
def test_encoded_as_the_json_encoder_spells_it(value: Any) -> None:
    assert encode(value) == (ENCODER.encode(value), None)


def test_an_int_too_long_to_spell_is_not_json_as_with_the_encoder() -> None:
    value = 10**5000  # past the interpreter's limit on digits
    with pytest.raises(ValueError) as raised:
        ENCODER.encode(value)
    text, problem = encode(value)
    assert text == ""
    assert problem is not None and problem.startswith("is not JSON (") and str(raised.value)[:40] in problem


def test_nan_is_not_json() -> None:
    text, problem = encode(float("nan"))
    assert text == "" and problem is not None and problem.startswith("is not JSON (")
