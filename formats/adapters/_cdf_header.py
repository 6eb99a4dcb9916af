"""A bounds check of a classic NetCDF (CDF-1, CDF-2, CDF-5) header, before netCDF-C reads it.

netCDF-C allocates what a classic header declares before it checks that the file holds
it: a 204-byte file whose attribute declares 2^30 characters made the library allocate
and touch 1 GiB (found by fuzzing). This walks the header as the format specification
lays it out (``magic numrecs dim_list gatt_list var_list``) and refuses any count or
length whose bytes cannot fit in what is left of the file, so a damaged header costs a
few microseconds and a one-line error, never the memory it claims.

Then every variable's values must lie inside the file: a fixed-size variable's from its
``begin`` offset for the size its shape and type give, a record variable's last record at
``begin + (numrecs - 1) * recsize`` likewise. netCDF-C reads the missing tail of a
truncated file as fill values (zeros), so a file short by a few bytes would otherwise be
ingested with made-up values.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

from simstore.errors import SourceError

__all__ = ["check_classic_header"]

_ABSENT = 0
_DIMENSION, _VARIABLE, _ATTRIBUTE = 0x0A, 0x0B, 0x0C
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8}
"""Bytes per value of each ``nc_type`` (NC_BYTE .. NC_UINT64; 7-11 are CDF-5 only)."""
_MAX_NAME = 256 * 4
"""netCDF-C's NC_MAX_NAME is 256 characters of up to 4 bytes of UTF-8 each."""
_STREAMING = -1
"""A CDF-1/CDF-2 record count of 0xFFFFFFFF: "indeterminate", netCDF-C counts the records
that the file holds (so none can be missing)."""


@dataclass(frozen=True, slots=True)
class _Variable:
    name: str
    shape: tuple[int, ...]  # the record dimension's length is 0
    record: bool
    itemsize: int
    begin: int


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

    def name(self, what: str) -> str:
        n = self.count(f"the length of {what}'s name", 1)
        if n > _MAX_NAME:
            raise self.fail(f"{what}'s name is {n} bytes long")
        raw = self.take(n, f"{what}'s name")
        self.skip(-n % 4, f"{what}'s name padding")
        # for messages only: netCDF-C itself refuses a name that is not UTF-8
        return raw.decode("utf-8", errors="backslashreplace")

    def unsigned(self, what: str) -> int:
        """A 32-bit (64 in CDF-5) unsigned word."""
        return int.from_bytes(self.take(self.word, what), "big", signed=False)

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
    numrecs = int.from_bytes(h.take(h.word, "the record count"), "big", signed=True)
    dims: list[int] = []
    for i in range(h.list_header(_DIMENSION, "dimension", 8)):
        h.name(f"dimension {i}")
        dims.append(h.count(f"dimension {i}'s length", 0))
    h.attributes("the file")
    offset = 8 if version in (2, 5) else 4
    variables: list[_Variable] = []
    for i in range(h.list_header(_VARIABLE, "variable", 16)):
        label = f"variable {i}"
        name = h.name(label)
        ndims = h.count(f"{label}'s number of dimensions", h.word)
        ids = [h.unsigned(f"{label}'s dimension ids") for _ in range(ndims)]
        if any(d >= len(dims) for d in ids):
            raise h.fail(f"{label} ({name!r}) names dimension {max(ids)} of {len(dims)}")
        h.attributes(label)
        kind = h.int32(f"{label}'s type")
        itemsize = _TYPE_SIZES.get(kind)
        if itemsize is None or (kind > 6 and version != 5):
            raise h.fail(f"{label} ({name!r}) has unknown type {kind}")
        h.take(h.word, f"{label}'s size")  # vsize: redundant, and capped for big variables
        begin = int.from_bytes(h.take(offset, f"{label}'s data offset"), "big", signed=False)
        shape = tuple(dims[d] for d in ids)
        # the record dimension (length 0 in the header) can only be a variable's first
        record = bool(shape) and shape[0] == 0 and dims.count(0) == 1
        variables.append(_Variable(name, shape, record, itemsize, begin))
    _check_data(h, numrecs, variables)


def _check_data(h: _Header, numrecs: int, variables: list[_Variable]) -> None:
    """Refuse a variable whose values the header places (partly) past the end of the file.

    A fixed-size variable's values are ``product(shape) * itemsize`` bytes from ``begin``.
    Records interleave the record variables' slabs: record ``r`` of a variable starts at
    ``begin + r * recsize``, where ``recsize`` is the sum of their slab sizes, each padded
    to 4 bytes (unpadded when there is one record variable). Only the values' own bytes
    must be in the file, not the padding after the last one.
    """
    slabs = {v.name: math.prod(v.shape[1:]) * v.itemsize for v in variables if v.record}
    if len(slabs) == 1:
        recsize = next(iter(slabs.values()))
    else:
        recsize = sum(n + (-n % 4) for n in slabs.values())
    for v in variables:
        if v.record:
            if numrecs == _STREAMING or numrecs <= 0 or slabs[v.name] == 0:
                continue
            end = v.begin + (numrecs - 1) * recsize + slabs[v.name]
            what = f"{numrecs} records of {slabs[v.name]} bytes"
        else:
            nbytes = math.prod(v.shape) * v.itemsize
            if nbytes == 0:
                continue
            end = v.begin + nbytes
            what = f"{nbytes} bytes"
        if end > h.size:
            raise SourceError(
                f"{h.path}: field {v.name!r}: the header declares {what} ending at byte "
                f"{end} but the file holds {h.size}: truncated or corrupt NetCDF file"
            )
