"""Checks of the arguments a user gives the loader, each naming the parameter.

Bad input is a one-line :class:`InvalidInputError` that names the parameter (or the state
field) and what is wrong with it, raised where the value is given (construction, not the
first iteration). Integers are Python or NumPy integers, never ``bool`` (a subclass of
``int`` that would read as 0 or 1), floats or strings. A leaf module: the loader's
modules all import it.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import ItemsView, Iterable, KeysView, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from simstore._sizes import SizeError, parse_size
from simstore.errors import InvalidInputError

__all__ = [
    "check_bool",
    "check_bytes",
    "check_callable",
    "check_int",
    "check_number",
    "check_optional_int",
    "is_int",
    "MAX_BYTES",
    "MAX_COUNT",
    "parse_bytes",
    "shown",
    "to_list",
]

MAX_COUNT = 2**31
"""The largest count an option takes (ranks, shards in a window, blocks in a buffer): the
loader's plans hold positions and products of counts in 64-bit integers."""
MAX_BYTES = 2**50
"""The largest byte size an option takes (1 PiB), for the same reason."""

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60


def shown(value: object) -> str:
    """``value`` for a one-line message: a short repr and its type, e.g. ``'2' (str)``."""
    text = _repr.repr(value).replace("\n", " ")
    return f"{text} ({type(value).__name__})"


def is_int(value: object) -> bool:
    """Whether ``value`` is a Python or NumPy integer (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _bounded(value: int, name: str, minimum: int | None, maximum: int | None) -> int:
    if minimum is not None and value < minimum:
        need = {0: "non-negative", 1: "at least 1"}.get(minimum, f"at least {minimum}")
        raise InvalidInputError(f"{name} must be {need}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidInputError(f"{name} must be at most {maximum}, got {value}")
    return value


def check_int(
    value: object, name: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an ``int`` within ``[minimum, maximum]``; refuses bools, floats, strings."""
    if not is_int(value):
        raise InvalidInputError(f"{name} must be an integer, got {shown(value)}")
    return _bounded(int(value), name, minimum, maximum)  # type: ignore[call-overload]


def check_optional_int(
    value: object, name: str, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """:func:`check_int`, or None for None."""
    return None if value is None else check_int(value, name, minimum=minimum, maximum=maximum)


def check_bool(value: object, name: str) -> bool:
    """``value`` as a ``bool``: True or False only (a string such as ``'no'`` is refused)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise InvalidInputError(f"{name} must be True or False, got {shown(value)}")


def check_number(
    value: object, name: str, *, positive: bool = False, finite: bool = True
) -> float:
    """``value`` (a real number, not a bool) as a float; finite and > 0 when asked."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
        raise InvalidInputError(f"{name} must be a number, got {shown(value)}")
    try:
        out = float(value)
    except OverflowError:
        kind = type(value).__name__
        raise InvalidInputError(f"{name} is too large to be a float ({kind})") from None
    if finite and not math.isfinite(out):
        raise InvalidInputError(f"{name} must be finite, got {out}")
    if positive and not out > 0:
        raise InvalidInputError(f"{name} must be positive, got {out}")
    return out


def check_callable(value: object, name: str) -> None:
    """Refuse a ``value`` that cannot be called."""
    if not callable(value):
        raise InvalidInputError(f"{name} must be callable, got {shown(value)}")


def to_list(value: object, name: str, what: str, *, ordered: bool = False) -> list[Any]:
    """The items of a list-like ``value`` (not a string, bytes or a mapping).

    ``ordered``: the items pair up by position with others (a mixture's datasets and
    weights), so a set, whose order is its hashes', is refused too (a dict's keys, in
    their insertion order, are not).
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidInputError(f"{name} must be a list of {what}, got {shown(value)}")
    if ordered and isinstance(value, AbstractSet) and not isinstance(value, KeysView | ItemsView):
        raise InvalidInputError(
            f"{name} must be a list of {what}, in order, got a set ({shown(value)}): "
            "a set has no order"
        )
    return list(value)


def parse_bytes(value: object, name: str, *, minimum: int = 1) -> int | None:
    """:func:`check_bytes`, or None for None."""
    return None if value is None else check_bytes(value, name, minimum=minimum)


def check_bytes(value: object, name: str, *, minimum: int = 1) -> int:
    """Bytes from an integer, an integral float or a string such as ``"512MiB"``.

    At least ``minimum``. A float must be a whole, finite number (``1.5e9``, as ingest
    takes sizes). A string is read by the rule of :mod:`simstore._sizes`: ``"20GB"`` is
    20 * 1000**3 bytes, ``"512MiB"`` 512 * 1024**2, ``"4096"`` bytes; its number may have
    a fraction (``"1.5GiB"``), rounded down to whole bytes.
    """
    n: int
    if is_int(value):
        n = int(value)  # type: ignore[call-overload]
    elif isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        f = float(value)
        if not (math.isfinite(f) and f.is_integer()):
            raise InvalidInputError(f"{name} must be a whole number of bytes, got {f}")
        n = int(f)
    elif isinstance(value, str):
        n = _parse_size(value, name)
    else:
        raise InvalidInputError(
            f"{name} must be a number of bytes or a size such as '512MiB', got {shown(value)}"
        )
    if n < minimum:
        need = "positive" if minimum == 1 else f"at least {minimum}"
        raise InvalidInputError(f"{name} must be {need}, got {n} bytes")
    if n > MAX_BYTES:
        raise InvalidInputError(f"{name} must be at most 1 PiB ({MAX_BYTES} bytes), got {n} bytes")
    return n


def _parse_size(value: str, name: str) -> int:
    """Bytes in a size string, or an error naming ``name``.

    The rule of :mod:`simstore._sizes`: ``KB`` is 1000 bytes, ``KiB`` 1024, a fraction
    rounds down.
    """
    try:
        return parse_size(value)
    except SizeError as exc:
        raise InvalidInputError(f"invalid {name} {value!r}: {exc}") from None
