"""The zip container of Zarr shards: fast stored writes, and an index in one read.

Stored entries are written with ISA-L's CRC-32 through a file that hashes what it writes
(so a finished shard needs no second read for its object id), and a zip's entries are
indexed from one read of its central directory. Both keep to the plain zip format: stock readers
(zipfile, zarr-python's ``ZipStore``) read what is written, and zips the index does not
handle are left to ``zipfile``.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from simstore._reserve import Reservation
from simstore.hashing import Hasher, ObjectId, crc32

__all__ = [
    "ALIGN_MIN_BYTES", "MAGIC", "PAGE_ALIGN", "HashingFile", "ZipEntry", "aligned_padding",
    "crc32", "write_stored", "zip_index",
]

MAGIC = b"PK\x03\x04"
"""A zip file's (and its every local header's) first four bytes."""


class HashingFile:
    """A new file written front to back that hashes its bytes on the way out.

    The file object a ``ZipFile`` writes a shard through: ``object_id()`` is the xxh3-128
    of the whole file once it is complete, from the bytes as they were written (while a
    chunk is still in cache after its CRC-32), so the shard is not read again to be
    stored under its hash. Small writes (zip headers) wait in a buffer and go out with
    the next large one in one ``writev``; ``tell`` is counted, not asked of the kernel.
    The disk blocks of each write of 1 MiB or more are reserved just before it, exactly
    (:class:`simstore._reserve.Reservation` with ``step=0``): nothing is left to give back
    at close, whose truncate waited on the journal's writeback.
    A seek anywhere but the end, or a failed write, leaves no id (``None``): the caller
    then hashes the file.
    """

    _SMALL = 64 << 10

    def __init__(self, path: str) -> None:
        self.name = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._reserved = Reservation(self._fd, step=0)
        self._pos = 0
        self._size = 0
        self._pending = bytearray()
        self._hasher: Hasher | None = Hasher()
        self.closed = False

    def writable(self) -> bool:
        """Always (a write-only file)."""
        return True

    def seekable(self) -> bool:
        """Always (``ZipFile`` then writes sizes into local headers, not descriptors)."""
        return True

    def tell(self) -> int:
        """The position: bytes written so far (and seeks)."""
        return self._pos + len(self._pending)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; returns its length."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        if self._hasher is not None:
            self._hasher.update(view)
        if n < self._SMALL:
            self._pending += view
            if len(self._pending) >= self._SMALL:
                self.flush()
            return n
        self._out([memoryview(self._pending), view] if self._pending else [view])
        self._pending = bytearray()
        return n

    def _out(self, parts: list[memoryview]) -> None:
        n = sum(p.nbytes for p in parts)
        if n >= Reservation.MIN_WRITE:
            self._reserved.ahead(self._pos + n)
        try:
            while parts:
                done = os.writev(self._fd, parts)
                self._pos += done
                while parts and done >= parts[0].nbytes:
                    done -= parts[0].nbytes
                    parts.pop(0)
                if parts and done:
                    parts[0] = parts[0][done:]
            self._size = max(self._size, self._pos)
        except BaseException:
            self._hasher = None
            raise

    def flush(self) -> None:
        """Write out the buffered small writes."""
        if self._pending:
            self._out([memoryview(self._pending)])
            self._pending = bytearray()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move the position; anywhere but the end gives up the running hash."""
        if whence == os.SEEK_SET and offset == self.tell():
            return offset
        self.flush()
        self._pos = os.lseek(self._fd, offset, whence)
        if self._hasher is None or self._pos != self._hasher.size_bytes:
            self._hasher = None
        return self._pos

    def object_id(self) -> ObjectId | None:
        """The id of everything written, if it was written front to back (else None)."""
        self.flush()
        return None if self._hasher is None else self._hasher.hexdigest()

    def close(self) -> None:
        """Write out what is buffered, free the unused reserved blocks, close (once)."""
        if self.closed:
            return
        try:
            self.flush()
            self._reserved.release(self._size)
        finally:
            self.closed = True
            os.close(self._fd)


def write_stored(zf: zipfile.ZipFile, info: zipfile.ZipInfo, data: bytes | memoryview) -> None:
    """Append a stored (uncompressed) entry to ``zf``, its CRC-32 computed here.

    ``ZipFile.writestr`` computes the CRC-32 with zlib (about 2 GiB/s here, the largest
    cost of writing a Zarr shard) and writes each local header twice (once before the
    data, then again, after a seek back, with the CRC). Here the CRC comes first (ISA-L,
    about 17 GiB/s) and the header is written once: the bytes ``writestr`` gives, but for
    a padding record in the local header of a large entry (:func:`aligned_padding`) that
    starts its data at a page boundary of the file.
    This uses ``ZipFile``'s bookkeeping attributes (``start_dir``, ``filelist``,
    ``NameToInfo``, ``_writecheck``), unchanged since Python 3.6; where they are missing,
    ``writestr`` writes the entry.
    """
    z: Any = zf
    if not all(hasattr(z, a) for a in ("start_dir", "filelist", "NameToInfo", "_writecheck")):
        zf.writestr(info, data)
        return
    n = memoryview(data).nbytes
    info.file_size = info.compress_size = n
    info.CRC = crc32(data)
    info.flag_bits = 0
    zip64 = n * 1.05 > zipfile.ZIP64_LIMIT
    z.fp.seek(z.start_dir)
    info.header_offset = z.fp.tell()
    z._writecheck(info)
    z._didModify = True
    header = info.FileHeader(zip64)
    pad = aligned_padding(info.header_offset + len(header), n)
    if pad:
        # the padding is in the local header alone: the central directory's copy of the
        # entry (written at close, from ``info.extra``) stays as ``writestr`` writes it
        extra = info.extra
        info.extra = extra + _padding_record(pad)
        header = info.FileHeader(zip64)
        info.extra = extra
    z.fp.write(header)
    z.fp.write(data)
    z.start_dir = z.fp.tell()
    z.filelist.append(info)
    z.NameToInfo[info.filename] = info


PAGE_ALIGN = 4096
"""File offset every large stored entry's data starts at a multiple of: a memory page,
so a reader can map the entry's bytes from the file instead of copying them."""

ALIGN_MIN_BYTES = 256 << 10
"""Entries this large and a whole number of pages long are aligned (at most 4 KiB of
padding each, under 1.6% of the entry; smaller ones are not worth mapping)."""

_PADDING_ID = 0xD935
"""The extra-field id of the padding record (the one Android's ``zipalign`` uses; zip
readers skip extra records they do not know)."""


def aligned_padding(data_offset: int, nbytes: int) -> int:
    """Bytes of padding record that put an entry's data at a page boundary (0: none).

    ``data_offset``: where the data would start with no padding; ``nbytes``: its length.
    Only entries of at least :data:`ALIGN_MIN_BYTES` whose length is a whole number of
    pages are aligned; a padding record is at least 4 bytes (its id and length).
    """
    if nbytes < ALIGN_MIN_BYTES or nbytes % PAGE_ALIGN:
        return 0
    pad = -data_offset % PAGE_ALIGN
    if 0 < pad < 4:
        pad += PAGE_ALIGN
    return pad


def _padding_record(pad: int) -> bytes:
    """An extra-field record of ``pad`` bytes in all: id, length, zeros."""
    return struct.pack("<HH", _PADDING_ID, pad - 4) + bytes(pad - 4)


class ZipEntry(NamedTuple):
    """What a reader needs of a zip entry (the names ``zipfile.ZipInfo`` gives them)."""

    header_offset: int
    compress_size: int
    compress_type: int
    CRC: int


_new_entry = tuple.__new__
"""Makes a :class:`ZipEntry` from a tuple of its fields without its ``__new__``'s call."""

_CENTRAL = struct.Struct("<4s4x2H4x3L5H4xL")
"""A central directory header: signature, flags, method, CRC-32, sizes, name, extra and
comment lengths, disk, internal attributes, local header offset."""


def _end_record(f: Any) -> tuple[bytes, int, int, int] | None:
    """The zip's end-of-central-directory record: where it lies, or None if it has none.

    ``(the file's tail, the record's start in it, the tail's length, the file's size)``.
    """
    f.seek(0, os.SEEK_END)
    size = f.tell()
    tail_len = min(size, 22 + 0xFFFF)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    return tail, at, tail_len, size


def declared_entries(f: Any) -> int | None:
    """The entry count a zip's end-of-central-directory record declares.

    None where there is no such record, or in a Zip64 file, whose record holds a marker.
    """
    end = _end_record(f)
    if end is None:
        return None
    tail, at, _, _ = end
    count: int = struct.unpack("<H", tail[at + 10 : at + 12])[0]
    return None if count == 0xFFFF else count


def zip_index(f: Any) -> Mapping[str, ZipEntry] | None:
    """Every entry of a zip file from one read of its central directory, or None.

    ``zipfile.ZipFile`` builds a ``ZipInfo`` per entry: 0.22 s for the 22,881 entries of
    a 79 MiB shard of 8 KiB samples, where this takes a fraction of it. None (the caller
    then uses ``zipfile``) for anything but plain zips: Zip64 records, encryption,
    several disks, a directory that does not add up.
    """
    end = _end_record(f)
    if end is None:
        return None
    tail, at, tail_len, size = end
    disk, cd_disk, _, count, cd_size, cd_offset = struct.unpack("<4H2L", tail[at + 4 : at + 20])
    if disk or cd_disk or count == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_offset):
        return None
    if cd_offset + cd_size > size - tail_len + at:
        return None
    f.seek(cd_offset)
    cd = f.read(cd_size)
    if len(cd) != cd_size:
        return None
    fast = _directory(cd, count)
    if fast is not None:
        return fast
    out: dict[str, ZipEntry] = {}
    pos, unpack = 0, _CENTRAL.unpack_from
    for _ in range(count):
        if pos + 46 > cd_size:
            return None
        sig, flags, method, crc, csize, usize, n, m, k, start, _, offset = unpack(cd, pos)
        if sig != b"PK\x01\x02" or flags & 0x1 or start or 0xFFFFFFFF in (csize, usize, offset):
            return None
        raw = cd[pos + 46 : pos + 46 + n]
        try:  # ASCII names (the writer's) decode in C; cp437 is a Python codec
            name = raw.decode("utf-8" if flags & 0x800 else "ascii")
        except UnicodeDecodeError:
            name = raw.decode("cp437")
        if name in out:  # zipfile would keep the last: a damaged name can copy another's
            raise ValueError(f"zip entry {name} appears twice in the central directory")
        out[name] = ZipEntry(offset, csize, method, crc)
        pos += 46 + n + m + k
    return out if pos == cd_size else None


def _directory(cd: bytes, count: int) -> ZipIndex | None:
    """:func:`zip_index`'s entries found with array operations; None: parse one by one.

    The headers are found by their signature and must chain end to end (each at the end
    of the one before, the last at the end of the directory), so a signature's bytes
    inside a name cannot pass for a header. Names are ASCII (the writer's), no entry is
    encrypted or on another disk, no size or offset is a Zip64 marker; anything else
    goes to the loop.
    """
    if count == 0 or len(cd) < 46:
        return None
    b = np.frombuffer(cd, dtype=np.uint8)
    at = np.flatnonzero((b[:-3] == 0x50) & (b[1:-2] == 0x4B) & (b[2:-1] == 1) & (b[3:] == 2))
    if len(at) != count or at[0] != 0 or int(at[-1]) + 46 > len(cd):
        return None

    def u16(off: int) -> np.ndarray:
        low, high = b[at + off].astype(np.int64), b[at + off + 1].astype(np.int64)
        return np.asarray(low | (high << 8))

    def u32(off: int) -> np.ndarray:
        return np.asarray(u16(off) | (u16(off + 2) << 16))

    flags, n, m, k = u16(8), u16(28), u16(30), u16(32)
    ends = at + 46 + n + m + k
    if (not np.array_equal(ends[:-1], at[1:]) or int(ends[-1]) != len(cd)
            or (flags & 0x1).any() or u16(34).any()):
        return None
    csize, usize, offset = u32(20), u32(24), u32(42)
    if ((csize == 0xFFFFFFFF) | (usize == 0xFFFFFFFF) | (offset == 0xFFFFFFFF)).any():
        return None
    starts = (at + 46).tolist()
    stops = (at + 46 + n).tolist()
    try:
        names = [cd[i:j].decode("ascii") for i, j in zip(starts, stops, strict=True)]
    except UnicodeDecodeError:
        return None
    index = ZipIndex(names, offset.tolist(), csize.tolist(), u16(10).tolist(), u32(16).tolist())
    return index if len(index) == count else None


class ZipIndex(Mapping[str, ZipEntry]):
    """A zip's entries by name, each :class:`ZipEntry` made when it is asked for.

    A shard of small samples holds tens of thousands of entries, and a reader asks for
    the few it reads: making a tuple for each up front was a third of opening the shard.
    """

    __slots__ = ("_at", "_crc", "_method", "_names", "_offset", "_size")

    def __init__(self, names: list[str], offset: list[int], size: list[int],
                 method: list[int], crc: list[int]) -> None:
        self._at = dict(zip(names, range(len(names)), strict=True))
        self._offset, self._size, self._method, self._crc = offset, size, method, crc
        self._names: list[str] | None = None  # in directory order, listed when first asked

    def extent(self, first: str, after: str, prefix: str) -> tuple[int, int] | None:
        """The bytes from entry ``first``'s header to entry ``after``'s, if they are a run.

        A run: every entry the directory lists from ``first`` up to ``after`` is named
        under ``prefix``, their headers lie in that order, and they fill those bytes (each
        its header, name, at most a page of alignment and its data). None otherwise (a
        foreign order, or offsets a damaged directory gives).
        """
        i, j = self._at.get(first), self._at.get(after)
        if i is None or j is None or j <= i:
            return None
        if self._names is None:
            self._names = list(self._at)
        lo, hi = self._offset[i], self._offset[j]
        room, at = 0, lo
        for k in range(i, j):
            name = self._names[k]
            if not name.startswith(prefix) or self._offset[k] < at:
                return None
            at = self._offset[k]
            room += 30 + len(name.encode("utf-8")) + PAGE_ALIGN + self._size[k]
        return (lo, hi) if at < hi and hi - lo <= room else None

    def __getitem__(self, name: str) -> ZipEntry:
        entry: ZipEntry | None = self.get(name)
        if entry is None:
            raise KeyError(name)
        return entry

    def get(self, name: str, default: Any = None) -> Any:
        """The entry named ``name``, or ``default`` (one lookup; readers ask per chunk)."""
        i = self._at.get(name)
        if i is None:
            return default
        return _new_entry(ZipEntry, (self._offset[i], self._size[i], self._method[i], self._crc[i]))

    def __contains__(self, name: object) -> bool:
        return name in self._at

    def __iter__(self) -> Iterator[str]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)
