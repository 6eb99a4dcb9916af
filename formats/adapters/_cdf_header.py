"""A bounds check of a classic NetCDF (CDF-1, CDF-2, CDF-5) header, before netCDF-C reads it.

netCDF-C allocates what a classic header declares before it checks that the file holds
it: a 204-byte file whose attribute declares 2^30 characters made the library allocate
and touch 1 GiB (found by fuzzing). This walks the header as the format specification
lays it out (``magic numrecs dim_list gatt_list var_list``) and refuses any count or
length whose bytes cannot fit in what is left of the file, so a damaged header costs a
few microseconds and a one-line error, never the memory it claims. It checks only the
header's own sizes; the variables' data sizes are checked after the open, against the
file's size (``_check_classic_size``).
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from simstore.errors import SourceError

__all__ = ["check_classic_header"]

_ABSENT = 0
_DIMENSION, _VARIABLE, _ATTRIBUTE = 0x0A, 0x0B, 0x0C
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8}
"""Bytes per value of each ``nc_type`` (NC_BYTE .. NC_UINT64; 7-11 are CDF-5 only)."""
_MAX_NAME = 256 * 4
"""netCDF-C's NC_MAX_NAME is 256 characters of up to 4 bytes of UTF-8 each."""


class _Header:
    def __init__(self, f: BinaryIO, size: int, version: int, path: str) -> None:
        self.f = f
        self.size = size  # of the whole file: the header's lengths must fit in it
        self.pos = 4
        self.word = 8 if version == 5 else 4  # CDF-5: 64-bit counts and lengths
        self.version = version
        self.path = path

    def fail(self, what: str) -> SourceError:
        return SourceError(
            f"{self.path}: corrupt NetCDF header: {what} (at byte {self.pos} of {self.size})"
        )

    def _fits(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} runs past the end of the file")

    def take(self, n: int, what: str) -> bytes:
        self._fits(n, what)
        out = self.f.read(n)
        if len(out) != n:  # the file shrank under us
            raise self.fail(f"{what} runs past the end of the file")
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> None:
        self._fits(n, what)
        self.f.seek(n, 1)
        self.pos += n

    def int32(self, what: str) -> int:
        return int(struct.unpack(">i", self.take(4, what))[0])

    def count(self, what: str, each: int) -> int:
        """A non-negative count (32 or 64 bits) of items of at least ``each`` bytes each."""
        raw = self.take(self.word, what)
        n = int.from_bytes(raw, "big", signed=True)
        if n < 0:
            raise self.fail(f"{what} is negative ({n})")
        if n * each > self.size - self.pos:
            raise self.fail(
                f"{what} declares {n} items of at least {each} bytes, more than the "
                f"{self.size - self.pos} bytes left in the file"
            )
        return n

    def padded(self, n: int, what: str) -> None:
        self.skip(n + (-n % 4), what)

    def name(self, what: str) -> None:
        n = self.count(f"the length of {what}'s name", 1)
        if n > _MAX_NAME:
            raise self.fail(f"{what}'s name is {n} bytes long")
        self.padded(n, f"{what}'s name")

    def list_header(self, tag: int, what: str, each: int) -> int:
        """The item count of a list (0 when ABSENT); refuses a wrong tag."""
        got = self.int32(f"the {what} list tag")
        if got == _ABSENT:
            n = self.count(f"the absent {what} list's count", 0)
            if n:
                raise self.fail(f"an absent {what} list counts {n} items")
            return 0
        if got != tag:
            raise self.fail(f"the {what} list has tag {got:#x}, expected {tag:#x}")
        return self.count(f"the number of {what}s", each)

    def attributes(self, owner: str) -> None:
        # an attribute is at least a name length, a name, a type and a count
        for i in range(self.list_header(_ATTRIBUTE, "attribute", 12)):
            label = f"attribute {i} of {owner}"
            self.name(label)
            kind = self.int32(f"{label}'s type")
            size = _TYPE_SIZES.get(kind)
            if size is None or (kind > 6 and self.version != 5):
                raise self.fail(f"{label} has unknown type {kind}")
            n = self.count(f"{label}'s number of values", size)
            self.padded(n * size, f"{label}'s values")


def check_classic_header(path: str) -> None:
    """Refuse a classic NetCDF header whose counts or lengths do not fit the file.

    Not a classic file (no ``CDF`` signature, as a NetCDF-4 file is HDF5): nothing to
    check. Reads the header only, seeking over attribute values.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            magic = f.read(4)
            if magic[:3] != b"CDF":
                return
            if len(magic) < 4 or magic[3] not in (1, 2, 5):
                raise SourceError(f"{path}: corrupt NetCDF header: unknown version byte "
                                  f"{magic[3:4]!r}")
            _walk(_Header(f, size, magic[3], path))
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc}") from exc


def _walk(h: _Header) -> None:
    version = h.version
    h.take(h.word, "the record count")
    for i in range(h.list_header(_DIMENSION, "dimension", 8)):
        h.name(f"dimension {i}")
        h.count(f"dimension {i}'s length", 0)
    h.attributes("the file")
    offset = 8 if version in (2, 5) else 4
    for i in range(h.list_header(_VARIABLE, "variable", 16)):
        label = f"variable {i}"
        h.name(label)
        ndims = h.count(f"{label}'s number of dimensions", h.word)
        h.take(ndims * h.word, f"{label}'s dimension ids")
        h.attributes(label)
        h.int32(f"{label}'s type")
        h.take(h.word, f"{label}'s size")
        h.take(offset, f"{label}'s data offset")
