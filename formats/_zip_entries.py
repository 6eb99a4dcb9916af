"""A zip's stored entries read past ``zipfile``: one call each, into the caller's memory.

The Zarr shard reader's own access to its zip (:class:`ZipEntries`, which it inherits):
where an entry's data lies (checked against its local header, which repeats its name),
reads of it straight into a destination array or mapped into it, the CRC-32 checks until
the whole file has hashed to its id, and the careful way for entries laid out otherwise
(compressed, or with local headers the writer does not write). The Zarr side (nodes,
samples, fields, boxes) is in :mod:`._zarr`.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from simstore.errors import FormatError

from . import _zip
from ._zip import MAGIC, ZipEntry, crc32

__all__ = ["Mapper", "ZipEntries"]

Mapper = Callable[[np.ndarray, int, int, bool], bool]
"""``map_file(array, fd, offset, check)``: take over filling ``array`` with the bytes of
file ``fd`` at ``offset`` (True), or not (False: read them). With ``check`` (the reader
checks the bytes against their CRC-32 next) the bytes must be in ``array`` on return."""


_ONE_READ_BYTES = 1 << 30
"""The most a chunk read with its header takes (Linux returns at most about 2 GiB from one
``preadv``; a larger entry is read the careful way, in pieces, and its zip64 sizes make
its local header longer than the writer's plain one)."""


def _read_all(fd: int, view: memoryview, offset: int) -> int:
    """Read ``len(view)`` bytes of ``fd`` at ``offset`` into ``view``; fewer only at the end.

    One ``preadv`` returns at most about 2 GiB on Linux: a larger entry takes several.
    """
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            break
        done += got
    return done


def _data_at(info: ZipEntry, name: bytes) -> int:
    """Where the writer puts an entry's data (from the central directory alone).

    After a local header that repeats the name and holds no extra field but the padding
    that page-aligns a large entry (``_zip.aligned_padding``).
    """
    start = info.header_offset + 30 + len(name)
    return start + _zip.aligned_padding(start, info.compress_size)


def _header_holds(head: bytes | bytearray, name: bytes, extra: int) -> bool:
    """Whether ``head``, read at a local header, names ``name`` with ``extra`` extra bytes.

    Then the entry's data is where :func:`_data_at` put it.
    """
    return (head[:4] == MAGIC and struct.unpack_from("<HH", head, 26) == (len(name), extra)
            and head[30 : 30 + len(name)] == name)


class ZipEntries:
    """Reads of a zip's stored entries, for a reader that has opened the zip.

    The reader sets the attributes below when it opens the file: ``_fd`` is a path's
    descriptor (None for a caller's file object, read through ``_fp``), ``_infos`` the
    central directory, ``_offsets`` the data places found so far.
    """

    name: str
    verifies_pages: bool
    _infos: Mapping[str, ZipEntry]
    _offsets: dict[str, tuple[int, int]]
    _fd: int | None
    _fp: Any
    _file_size: int
    _zip: zipfile.ZipFile | None

    def _entry_size(self, key: str) -> int:
        info = self._infos.get(key)
        return 0 if info is None else info.compress_size

    def _stored_at(self, key: str) -> tuple[int, int] | None:
        """(offset, size) of a stored (uncompressed) zip entry's data, or None."""
        info = self._infos.get(key)
        if info is None or info.compress_type != zipfile.ZIP_STORED:
            return None
        where = self._offsets.get(key)
        if where is None:
            # the local header repeats the entry's name: a name or an offset damaged in
            # the central directory (which no CRC covers) finds another entry's header
            name = key.encode("utf-8")
            if self._fd is not None:
                local = os.pread(self._fd, 30 + len(name), info.header_offset)
            else:
                self._fp.seek(info.header_offset)
                local = self._fp.read(30 + len(name))
            if local[:4] != MAGIC:
                raise FormatError(f"{self.name}: bad zip entry {key}")
            n, m = struct.unpack("<HH", local[26:30])
            if local[30:] != name or n != len(name):
                raise FormatError(
                    f"{self.name}: zip entry {key}: its local header names "
                    f"{local[30 : 30 + n]!r}: the shard's index is damaged"
                )
            where = (info.header_offset + 30 + n + m, info.compress_size)
            self._check_inside(key, *where)
            self._offsets[key] = where
        return where

    def _check_inside(self, key: str, offset: int, size: int) -> None:
        """Refuse an entry whose declared size runs past the end of the file.

        Its bytes are read in one piece into memory of that size: a crafted size (up to
        2^64 through a zip64 field) would otherwise be allocated before the short read
        is noticed.
        """
        if offset + size > self._file_size:
            raise FormatError(
                f"{self.name}: zip entry {key} declares {size} bytes at byte {offset}, past "
                f"the end of the shard ({self._file_size} bytes): the shard's index is damaged"
            )

    def _read_into(self, key: str, out: np.ndarray, mapper: Mapper | None = None) -> bool:
        """Read an uncompressed chunk straight into ``out`` (one copy); False if not possible.

        With ``mapper`` (``ChunkBuffers.map_file``), a chunk whose data starts at a page
        boundary of the file (the writer aligns large ones) is mapped into ``out`` instead
        of read, when the mapper can; it is checked against its CRC-32 all the same.
        ``out`` may hold other bytes when this returns False or raises.
        """
        if mapper is None and self._fd is not None and key not in self._offsets:
            if self._read_with_header(key, out):
                return True
        where = self._stored_at(key)
        if where is None or where[1] != out.nbytes or not out.flags.c_contiguous:
            return False
        view = out.reshape(-1).view(np.uint8).data
        if mapper is not None and self._fd is not None and mapper(
                out, self._fd, where[0], self.verifies_pages):
            self._check_crc(key, view)
            return True
        if self._fd is not None:
            got = _read_all(self._fd, view, where[0])
        else:
            self._fp.seek(where[0])
            got = self._fp.readinto(view)
        if got != where[1]:
            raise FormatError(f"{self.name}: zip entry {key} is truncated")
        self._check_crc(key, view)
        return True

    def _read_with_header(self, key: str, out: np.ndarray) -> bool:
        """Read stored entry ``key``'s local header and data in one ``preadv`` (False: not so).

        Where the writer put an entry's data follows from the central directory alone: its
        local header repeats the name and holds no extra field but the padding that puts
        a large entry's data at a page boundary (``_zip.aligned_padding``). The header,
        read into a scratch buffer with the data, says whether that held: False (the
        entry is then read the careful way, :meth:`_stored_at` first) when it did not,
        when the entry is not stored or not ``out``'s size, or when it would run past the
        end of the file. This saves a chunk's first read the separate read of its header.
        ``out`` may hold the bytes at the predicted place when it returns False.
        """
        info = self._infos.get(key)
        size = out.nbytes
        if (info is None or info.compress_type != zipfile.ZIP_STORED
                or info.compress_size != size or not out.flags.c_contiguous
                or size > _ONE_READ_BYTES):  # zip64 sizes: another header
            return False
        assert self._fd is not None
        name = key.encode("utf-8")
        at = _data_at(info, name)
        if at + size > self._file_size:
            return False
        head = bytearray(at - info.header_offset)
        view = out.reshape(-1).view(np.uint8).data
        got = os.preadv(self._fd, [head, view], info.header_offset)
        if got != len(head) + size or not _header_holds(head, name, len(head) - 30 - len(name)):
            return False
        self._offsets[key] = (at, size)
        self._check_crc(key, view)
        return True

    def _page_aligned(self, key: str) -> bool:
        """Whether stored entry ``key``'s data is whole pages at a page boundary of the file."""
        where = self._stored_at(key)
        return where is not None and not where[0] % _zip.PAGE_ALIGN and not (
            where[1] % _zip.PAGE_ALIGN)

    def trust(self) -> None:
        """Stop checking chunk CRC-32s: the whole file has been hashed to its id.

        The CRC-32s (ISA-L's, about 17 GiB/s here; zlib's where isal is missing, about 2)
        are work on top of the whole-object hash, which runs once per process anyway, so
        a shard is read with the checks only until that hash is known.
        """
        self.verifies_pages = False

    def _check_crc(self, key: str, data: Any) -> None:
        """The zip entry's CRC-32 against its bytes (read past zipfile, which checks it)."""
        if self.verifies_pages and crc32(data) != self._infos[key].CRC:
            raise FormatError(f"{self.name}: zip entry {key} fails its CRC-32 check")

    def _entry(self, key: str) -> bytes | None:
        info = self._infos.get(key)
        if info is None:
            return None
        if info.compress_type != zipfile.ZIP_STORED:
            # the writer stores every entry: another method is a foreign zip or damage
            # (a flipped method field), which zipfile meets with its own exceptions
            try:
                if self._zip is None:
                    self._zip = zipfile.ZipFile(self._fp, mode="r")
                return self._zip.read(key)
            except (NotImplementedError, zipfile.BadZipFile, zlib.error, EOFError,
                    RuntimeError, ValueError) as exc:
                raise FormatError(f"{self.name}: zip entry {key} is unreadable: {exc}") from exc
        where = self._stored_at(key)
        assert where is not None  # a stored entry that exists
        self._fp.seek(where[0])
        data: bytes = self._fp.read(where[1])
        if len(data) != where[1]:
            raise FormatError(f"{self.name}: zip entry {key} is truncated")
        self._check_crc(key, data)
        return data

    def _small_entry(self, key: str) -> bytes | None:
        """A small stored entry's bytes in one read (of its header and data, or its data).

        Once the entry's place is known (read before), its data alone is read. Else the
        data is assumed to be where the writer's layout puts it (:func:`_data_at`); the
        header read with it says whether it was, and if not the entry is read the careful
        way (:meth:`_entry`).
        """
        info = self._infos.get(key)
        if info is None or info.compress_type != zipfile.ZIP_STORED or self._fd is None:
            return self._entry(key)
        where = self._offsets.get(key)
        if where is not None:  # read before: its data's place is known
            known = os.pread(self._fd, where[1], where[0])
            if len(known) != where[1]:
                raise FormatError(f"{self.name}: zip entry {key} is truncated")
            self._check_crc(key, known)
            return known
        name = key.encode("utf-8")
        at = _data_at(info, name)
        if at + info.compress_size > self._file_size:
            return self._entry(key)  # which says what is wrong
        head = at - info.header_offset
        blob = os.pread(self._fd, head + info.compress_size, info.header_offset)
        if (len(blob) != head + info.compress_size
                or not _header_holds(blob, name, head - 30 - len(name))):
            return self._entry(key)
        data = blob[head:]
        self._offsets[key] = (at, info.compress_size)
        self._check_crc(key, data)
        return data
