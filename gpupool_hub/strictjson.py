"""JSON as RFC 8259 defines it: no ``NaN``, ``Infinity`` nor ``-Infinity``, and no number that overflows.

Python's ``json`` reads those three words, and ``1e999``, as floats no JSON
has: a node report of ``{"utilization": NaN}`` passed every schema bound (NaN
compares false with each) and would have reached the pages, the metrics and a
charge. Every JSON text from outside (request bodies, the service's answers to
the spawner, the agents and the lab extension, the hub's answers, files the
servers write) is read through :func:`loads`. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["NonFiniteNumber", "loads"]


class NonFiniteNumber(ValueError):
    """A JSON text holds ``NaN``, ``Infinity``, ``-Infinity`` or a number too large for a float."""


def _constant(word: str) -> Any:
    raise NonFiniteNumber(f"{word} is not a JSON number (JSON has no NaN or Infinity)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumber(f"{text[:40]} is too large a number")
    return value


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` that raises :class:`NonFiniteNumber` (a ValueError) for a number JSON does not have.
    A ``parse_float`` given (``Decimal`` for money) still sees only finite numbers."""
    parse_float = kwargs.pop("parse_float", float)

    def finite(value: str) -> Any:
        _float(value)
        return parse_float(value)

    return json.loads(text, parse_constant=_constant, parse_float=finite, **kwargs)
