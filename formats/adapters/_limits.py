"""Limits on what an adapter holds in memory whole.

Dense numeric arrays stream in bounded blocks; string arrays, variable-length data and
JSON-like values do not (they become one value of a sample: a list of strings, a JSON
document), so their size is capped instead, to keep an ingest's memory bounded by
configuration rather than by a source file.
"""

from __future__ import annotations

from simstore.errors import SourceError

__all__ = ["MAX_WHOLE_VALUE_BYTES", "check_whole_value"]

MAX_WHOLE_VALUE_BYTES = 64 * 1024 * 1024
"""The largest string, variable-length or JSON value read whole (bytes in the source)."""


def check_whole_value(path: str, field: str, nbytes: int) -> None:
    """Refuse a value that would be read whole and holds more than the cap."""
    if nbytes > MAX_WHOLE_VALUE_BYTES:
        raise SourceError(
            f"{path}: field {field!r}: {nbytes:,} bytes of strings or variable-length "
            f"values are read whole, and the limit is {MAX_WHOLE_VALUE_BYTES:,} "
            "(store them as numeric arrays or split them)"
        )
