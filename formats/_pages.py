"""Direct reads of fixed-width values from uncompressed Parquet pages.

A blob column (``fields.data``: one ``BYTE_ARRAY`` per sample, the tensor's bytes) in an
uncompressed shard is stored PLAIN: each page holds its values as ``[u32 length][bytes]``
one after another. When every value of a page has one width, row ``r`` of the page sits at
a fixed offset, so its bytes can be copied straight from the memory-mapped file into the
batch, without Arrow decoding the column chunk first. A shuffled batch takes a few rows
from each of many row groups: decoding reads every row group whole (4 MiB for 16 rows of
8 KiB), and with several DataLoader workers each worker decodes every row group; a direct
read copies only the rows asked for.

This module reads the page headers (Thrift compact protocol, the few fields a data page
needs: pyarrow does not expose pages) and checks each page before its rows are used: its
CRC-32 where the writer stored one and the reader is not yet trusted, and its layout
(values section exactly ``rows x (4 + width)`` bytes, every length prefix equal to the
width, and the page's definition levels saying no value is null, so no row is null and
no value is ragged). Once the shard is trusted (hashed to its
id), only the length prefixes of the rows a read takes are checked: its writer wrote each
value's bytes and its shape from one array, and reading every prefix would fault the
whole page into the process for the few rows a shuffled batch takes from it. Anything else
(a compressed or dictionary-encoded chunk, a data page of another encoding, a ragged page)
declines, and the caller decodes through Arrow as before.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from simstore.errors import FormatError

from ._zip import crc32

__all__ = [
    "Page", "PagedColumn", "SharedWork", "all_defined", "check_page", "column_pages",
    "page_rows", "read_page_header",
]

_DATA_PAGE = 0
_DATA_PAGE_V2 = 3
_PLAIN = 0

# Thrift compact protocol field types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(
    1, 13
)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return int(b)

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int) -> None:
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.pos += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.pos += 8
        elif kind == _BINARY:
            size = self.varint()  # (not ``self.pos += self.varint()``: pos moves in varint)
            self.pos += size
        elif kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.skip(head & 0x0F)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4)
                    self.skip(types & 0x0F)
        elif kind == _STRUCT:
            self.struct(lambda _fid, k: self.skip(k))
        else:
            raise ValueError(f"unknown field type {kind}")

    def struct(self, field: object) -> None:
        """Call ``field(id, type)`` for each field of a struct (it reads or skips the value)."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:  # stop
                return
            kind = head & 0x0F
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            field(fid, kind)  # type: ignore[operator]
            last = fid


@dataclass(frozen=True, slots=True)
class PageHeader:
    """The fields of a Parquet page header that locating a page's values needs."""

    type: int
    compressed_size: int
    uncompressed_size: int
    crc: int | None
    num_values: int
    encoding: int
    num_rows: int | None  # data page v2 only
    levels_bytes: int | None  # data page v2: repetition + definition level bytes
    header_bytes: int
    num_nulls: int | None = None  # data page v2 only


def read_page_header(buf: bytes | memoryview, pos: int) -> PageHeader:
    """The page header at ``buf[pos:]``."""
    r = _Reader(buf, pos)
    top: dict[int, int] = {}
    sub: dict[int, int] = {}
    which: list[int] = []

    def sub_field(fid: int, kind: int) -> None:
        if kind in (_I32, _I64, _I16):
            sub[fid] = r.zigzag()
        elif kind in (_TRUE, _FALSE):
            sub[fid] = 1 if kind == _TRUE else 0
        else:
            r.skip(kind)

    def top_field(fid: int, kind: int) -> None:
        if fid in (1, 2, 3, 4) and kind == _I32:
            top[fid] = r.zigzag()
        elif fid in (5, 8) and kind == _STRUCT:
            which.append(fid)
            r.struct(sub_field)
        else:
            r.skip(kind)

    r.struct(top_field)
    if 1 not in top or 2 not in top or 3 not in top:
        raise ValueError("page header lacks its type or sizes")
    v2 = bool(which) and which[0] == 8
    return PageHeader(
        type=top[1],
        uncompressed_size=top[2],
        compressed_size=top[3],
        crc=(top[4] & 0xFFFFFFFF) if 4 in top else None,
        num_values=sub.get(1, 0),
        encoding=sub.get(4 if v2 else 2, -1),
        num_rows=sub.get(3) if v2 else None,
        levels_bytes=(sub.get(5, 0) + sub.get(6, 0)) if v2 else None,
        header_bytes=r.pos - pos,
        num_nulls=sub.get(2) if v2 else None,
    )


@dataclass(frozen=True, slots=True)
class Page:
    """One data page of a blob column: its rows and where its values are in the file."""

    first_row: int
    rows: int
    body: int  # file offset of the page body (what the CRC covers)
    body_bytes: int
    values: int  # file offset of the first value's length prefix
    crc: int | None


@dataclass(frozen=True, slots=True)
class PagedColumn:
    """A column chunk's data pages; row ``r`` of the chunk is in the page whose rows hold it."""

    pages: tuple[Page, ...]
    starts: np.ndarray  # first row of each page, ascending

    @property
    def num_rows(self) -> int:
        last = self.pages[-1] if self.pages else None
        return last.first_row + last.rows if last is not None else 0


def column_pages(
    data: np.ndarray, start: int, length: int, num_rows: int,
    *, max_def: int, max_rep: int,
) -> PagedColumn | None:
    """The data pages of an uncompressed, PLAIN, unnested column chunk at ``data[start:]``.

    ``data`` is the file as a uint8 array. None when the chunk is anything else (a
    dictionary page, another encoding, repeated values, pages that do not add up to
    ``num_rows``): the caller decodes it instead.
    """
    if max_rep:
        return None
    view = data.data  # the array's buffer, one byte per item
    end = start + length
    pos = start
    row = 0
    pages: list[Page] = []
    while pos < end:
        try:
            h = read_page_header(view, pos)
        except (ValueError, IndexError):
            return None
        body = pos + h.header_bytes
        if h.type not in (_DATA_PAGE, _DATA_PAGE_V2) or h.encoding != _PLAIN:
            return None
        if h.compressed_size != h.uncompressed_size or body + h.compressed_size > end:
            return None
        if h.type == _DATA_PAGE:
            rows = h.num_values
            levels = 0
            if max_def:
                if h.compressed_size < 4:
                    return None
                levels = 4 + struct.unpack_from("<I", view, body)[0]
                if levels > h.compressed_size or not all_defined(
                        view[body + 4 : body + levels], rows, max_def):
                    return None  # a null among its values (or levels it cannot read)
        else:  # a data page v2 (any other page has no PLAIN encoding: declined above)
            rows = h.num_rows if h.num_rows is not None else h.num_values
            levels = h.levels_bytes or 0
            if max_def and (h.num_nulls is None or h.num_nulls != 0
                            or h.num_values != rows):
                return None  # a null among its values (or a header that does not say)
        if levels > h.compressed_size:
            return None
        pages.append(Page(row, rows, body, h.compressed_size, body + levels, h.crc))
        row += rows
        pos = body + h.compressed_size
    if row != num_rows or pos != end:
        return None
    return PagedColumn(tuple(pages), np.asarray([p.first_row for p in pages], dtype=np.int64))


def all_defined(levels: memoryview, count: int, max_def: int) -> bool:
    """Whether a data page v1's definition levels say none of its values is null.

    ``levels`` (RLE / bit-packed hybrid) must hold exactly ``count`` values, each
    ``max_def``. The length prefixes alone do not show a null: a crafted page can hold one value
    fewer and a longer value before it whose bytes fill the place of the missing one,
    every prefix where a row's would be equal to the width. A page that says anything
    else, or whose levels do not parse, declines the direct read (Arrow decodes it).
    """
    width = max_def.bit_length()
    nbytes = (width + 7) // 8
    pos, seen, end = 0, 0, len(levels)
    while seen < count:
        header, shift = 0, 0
        while True:  # the run's header, a ULEB128 varint
            if pos >= end or shift > 35:
                return False
            b = levels[pos]
            pos += 1
            header |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if header & 1:  # bit-packed: groups of eight values, ``width`` bits each
            groups = header >> 1
            size = groups * width
            if groups == 0 or pos + size > end:
                return False
            bits = np.unpackbits(np.frombuffer(levels[pos : pos + size], np.uint8),
                                 bitorder="little").reshape(-1, width)
            values = bits @ (1 << np.arange(width))
            take = min(groups * 8, count - seen)
            if not (values[:take] == max_def).all():
                return False
            seen += take
            pos += size
        else:  # a run of one value repeated
            run = header >> 1
            if run == 0 or pos + nbytes > end:
                return False
            if int.from_bytes(levels[pos : pos + nbytes], "little") != max_def:
                return False
            seen += run
            pos += nbytes
    return seen == count


def page_rows(data: np.ndarray, page: Page, width: int, *, check_crc: bool,
              name: str, every_length: bool = True) -> np.ndarray | None:
    """Page ``page``'s values as a ``(rows, width)`` uint8 view of ``data`` (the mapped file).

    None when its values are not ``rows`` values of exactly ``width`` bytes. With
    ``check_crc``, a page whose stored CRC-32 does not match its body raises
    :class:`FormatError` naming ``name``. ``every_length=False`` checks the values
    section's size only: the caller checks the length prefix of each row it takes (the
    Parquet reader does, in one gather for all the rows of a read), so a page is not read
    whole (every 4 KiB of it faulted into the process) for the few rows a shuffled batch
    takes from it.
    """
    step = 4 + width
    end = page.body + page.body_bytes
    if end - page.values != page.rows * step or width <= 0:
        return None
    if check_crc:
        check_page(data, page, name)
    if page.rows == 0:
        return np.empty((0, width), dtype=np.uint8)
    region = data[page.values:end]
    if every_length and not (_prefixes(region, page.rows, step).copy().view("<u4") == width).all():
        return None
    return np.lib.stride_tricks.as_strided(
        region[4:], shape=(page.rows, width), strides=(step, 1), writeable=False
    )


def _prefixes(region: np.ndarray, rows: int, step: int) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(
        region[: rows * step].view(np.uint8), shape=(rows, 4), strides=(step, 1),
        writeable=False,
    )


def check_page(data: np.ndarray, page: Page, name: str) -> None:
    """Raise :class:`FormatError` naming ``name`` if ``page``'s stored CRC-32 is wrong."""
    if page.crc is None:
        return
    actual = crc32(data[page.body:page.body + page.body_bytes]) & 0xFFFFFFFF
    if actual != page.crc:
        raise FormatError(
            f"{name}: page at byte {page.body} fails its CRC-32 "
            f"(stored {page.crc:08x}, computed {actual:08x})"
        )


class SharedWork:
    """A read's units of work (a row group to decode and check), shared with helpers.

    The reading thread goes through its units in order, calling :meth:`do` for each: a
    unit no helper has begun is done there and then; one a helper has begun is waited
    for (its error raised there). Helpers (:meth:`help`, on other threads) take units
    from the far end, so both meet in the middle. :meth:`close` ends the sharing: no
    helper begins a unit after it, and it returns once the units begun are done.
    ``work(unit)`` must be safe to run on two threads at once for different units.
    """

    def __init__(self, units: Iterable[Hashable], work: Callable[[Hashable], None]) -> None:
        self._queued = dict.fromkeys(units)
        self._begun: dict[Hashable, threading.Event] = {}
        self._errors: dict[Hashable, BaseException] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._work = work
        self.helped = 0
        """Units a helper did."""

    def help(self) -> None:
        """Do queued units, the last first, until none is left or the sharing is closed."""
        while True:
            with self._lock:
                if self._closed or not self._queued:
                    return
                unit, _ = self._queued.popitem()
                done = self._begun[unit] = threading.Event()
            try:
                self._work(unit)
            except BaseException as exc:  # raised on the reading thread by ``do``
                with self._lock:
                    self._errors[unit] = exc
                return
            finally:
                done.set()
            with self._lock:
                self.helped += 1

    def do(self, unit: Hashable) -> None:
        """Have ``unit`` done: here, unless a helper has begun it (then wait for it)."""
        with self._lock:
            queued = self._queued.pop(unit, self) is not self
            done = None if queued else self._begun.get(unit)
        if queued:
            self._work(unit)
            return
        if done is None:
            return
        done.wait()
        error = self._errors.get(unit)
        if error is not None:
            raise error

    def close(self) -> None:
        """No unit begins after this; the ones begun are done when it returns."""
        with self._lock:
            self._closed = True
            self._queued.clear()
            begun = list(self._begun.values())
        for done in begun:
            done.wait()
