"""Reading open-shaped JSON without ``Any``: a stored result record, a wire body, a run's plan.

The report, the exports and the command line read records whose shape they do not declare
(``ResultRecord.result``, a ``cellcal/v1/*`` body, ``RunRecord.plan``). They take them as
``Mapping[str, object]`` and narrow each value with these helpers where they use it, so the
type checker follows the value and the code type-checks whatever type the record is declared
with (a ``dict``, ``protocol.JsonObject`` or a ``TypedDict``).

Each helper reads a value as the code before it did: :func:`as_map` is ``v or {}``,
:func:`as_list` is ``v or []``, :func:`to_float` and :func:`to_int` are ``float(v)`` and
``int(v)``. A value of another type raises ``TypeError`` (as the attribute or argument error
of the plain reading did), so a caller that shows a body of another version raw
(``cellcal watch``) still does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import SupportsFloat, SupportsIndex, SupportsInt

__all__ = ["as_map", "as_list", "to_float", "to_int"]


def _what(v: object) -> str:
    return type(v).__name__


def as_map(v: object, where: str = "value") -> Mapping[str, object]:
    """``v`` as a JSON object: itself when it is a mapping, empty when it is missing or
    empty (None, ``{}`` or any other false value: what ``v or {}`` gave).

    Raises
    ------
    TypeError
        ``v`` is something else, naming ``where``.
    """
    if isinstance(v, Mapping):
        return v
    if not v:
        return {}
    raise TypeError(f"{where}: expected a map, got {_what(v)}")


def as_list(v: object, where: str = "value") -> Sequence[object]:
    """``v`` as a JSON array: itself when it is a list or tuple, empty when it is missing or
    empty (what ``v or []`` gave).

    Raises
    ------
    TypeError
        ``v`` is something else (a string is no array), naming ``where``.
    """
    if isinstance(v, (list, tuple)):
        return v
    if not v:
        return ()
    raise TypeError(f"{where}: expected an array, got {_what(v)}")


def to_float(v: object) -> float:
    """``float(v)``: a number, a numpy scalar or a numeric string.

    Raises
    ------
    TypeError
        ``v`` is of a type ``float`` does not read; ValueError: a string that is no number.
    """
    if isinstance(v, (str, bytes, bytearray, SupportsFloat, SupportsIndex)):
        return float(v)
    raise TypeError(f"expected a number, got {_what(v)}")


def to_int(v: object) -> int:
    """``int(v)``: an integer, a float (truncated), a numpy scalar or an integer string.

    Raises
    ------
    TypeError
        ``v`` is of a type ``int`` does not read; ValueError: a string that is no integer.
    """
    if isinstance(v, (str, bytes, bytearray, SupportsInt, SupportsIndex)):
        return int(v)
    raise TypeError(f"expected an integer, got {_what(v)}")
