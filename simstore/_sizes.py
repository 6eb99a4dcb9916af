"""Byte sizes as people write them: ``4096``, ``20GB``, ``256MiB``, ``1.5GiB``, ``64K``.

The one rule, for every size simstore reads (the CLI's ``--shard-size``, ``--limit`` and
the other size flags, :class:`~simstore.ingest.IngestConfig`'s sizes, ``SimDataset``'s
``cache_limit``, ``max_bandwidth`` and ``shuffle_block_bytes``):

- a size is a number, optionally followed by a unit; spaces around and between the two are
  allowed, and the unit's case does not matter (``20gb`` is ``20GB``);
- ``B`` or no unit: bytes;
- ``KB``, ``MB``, ``GB``, ``TB``, ``PB``: powers of 1000 (SI);
- ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``: powers of 1024 (binary);
- ``K``, ``M``, ``G``, ``T``, ``P`` alone: the binary units, as in GNU tools (``64K`` is
  65,536 bytes);
- the number is written in decimal digits and may have a fraction (``1.5GiB``); the size
  is rounded down to a whole number of bytes, computed exactly (``0.1KB`` is 100 bytes);
- refused: an empty text, a sign (``-1``, ``+1``), NaN and infinity, an exponent
  (``1e9``), an unknown unit, and more than ``MAX_SIZE`` bytes.

This module only parses. It raises :class:`SizeError`, whose text is the reason alone
(``unknown unit 'XB'``); each caller turns it into its own error naming its option, and
checks its own minimum (most sizes must be positive).

Pure: no I/O, nothing beyond the standard library.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_SIZE", "SIZE_EXAMPLES", "SizeError", "human_bytes", "parse_size"]

MAX_SIZE = (1 << 63) - 1
"""The largest size accepted: the largest signed 64-bit integer (8 EiB less one byte)."""

SIZE_EXAMPLES = "bytes or e.g. 512MiB, 20GB (KB, MB... are powers of 1000; KiB, MiB... of 1024)"
"""What a size looks like, for the end of an error message."""

_UNITS: dict[str, int] = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgtp", start=1):
    _UNITS[_letter] = 1024**_power
    _UNITS[_letter + "ib"] = 1024**_power
    _UNITS[_letter + "b"] = 1000**_power

_MAX_DIGITS = 100
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.ASCII)
_NOT_FINITE = re.compile(r"[+-]?\s*(nan|inf)", re.ASCII)


class SizeError(ValueError):
    """A text that is not a size; ``str()`` is the reason, e.g. ``unknown unit 'XB'``."""


def parse_size(text: str) -> int:
    """The number of bytes ``text`` stands for, by the rule of this module's docstring.

    Raises :class:`SizeError` saying what is wrong; zero is a size (callers that need a
    positive one check it).
    """
    if not isinstance(text, str):
        raise SizeError(f"expected a string, got {type(text).__name__}")
    s = text.strip().lower()
    if not s:
        raise SizeError(f"empty; give {SIZE_EXAMPLES}")
    if _NOT_FINITE.match(s):
        raise SizeError("not a finite number")
    if s[0] == "-":
        raise SizeError("a size cannot be negative")
    m = _SIZE.fullmatch(s)
    if m is None:
        raise SizeError(f"not a size; give {SIZE_EXAMPLES}")
    number, unit = m.group(1), m.group(2)
    scale = _UNITS.get(unit)
    if scale is None:
        shown = text.strip()[len(text.strip()) - len(unit) :]
        raise SizeError(f"unknown unit {shown!r}; give {SIZE_EXAMPLES}")
    if len(number) > _MAX_DIGITS:
        raise SizeError(f"too many digits: more than {_MAX_DIGITS}")
    value = int(Fraction(number) * scale)  # exact; int() rounds a fraction down
    if value > MAX_SIZE:
        raise SizeError(f"too large: more than {MAX_SIZE} bytes")
    return value


def human_bytes(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ... up to PiB (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
