"""Units and the checks of numbers that every part of the cost model shares. Pure."""

from __future__ import annotations

import math

from simstore.errors import FormatError

GIB = 1024**3
PRICE_TABLE_FORMAT_VERSION = 1
_DAYS_PER_MONTH = 365.25 / 12
_SECONDS_PER_MONTH = _DAYS_PER_MONTH * 86400

_MAX_COUNT = 2**63 - 1
"""The largest count a report may give: counts are int64 wherever they are made, and a
larger one (JSON numbers have no bound) would overflow float prices."""


def _count(value: object, what: str) -> int:
    # NaN compares false with everything, so finiteness is checked before the sign
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"{what} must be a non-negative number, got {value!r}")
    if isinstance(value, float) and not _is_finite(value):
        raise FormatError(f"{what} must be a finite, non-negative number, got {value!r}")
    if value < 0:
        raise FormatError(f"{what} must be a non-negative number, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise FormatError(f"{what} must be a whole number, got {value!r}")
    if value > _MAX_COUNT:
        raise FormatError(f"{what} is too large: {_size_of(value)}, over 2**63 - 1")
    return int(value)


def _is_finite(value: float) -> bool:
    """``math.isfinite`` that says False, not OverflowError, for an int beyond a float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _price(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"{what} must be a number, got {value!r}")
    if not _is_finite(value) or value < 0:
        raise FormatError(f"{what} must be a finite, non-negative number, got {value!r}")
    return float(value)


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FormatError(f"{what} must be a non-negative whole number, got {value!r}")
    if value > _MAX_COUNT:
        raise FormatError(f"{what} is too large: {_size_of(value)}, over 2**63 - 1")
    return value


def _size_of(value: int | float) -> str:
    """A number too large for a count, said briefly (a report may hold 400 digits)."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value) if value.bit_length() <= 80 else f"about 2**{value.bit_length() - 1}"


def month_fraction(seconds: float) -> float:
    """``seconds`` as a fraction of an average month (365.25 / 12 days)."""
    return seconds / _SECONDS_PER_MONTH
