"""xxh3-128 content hashing.

Every immutable object is named by the xxh3-128 hash of its bytes, as 32 lowercase hex
characters. Hashing is streaming: files are read in bounded blocks, never whole.
Pure apart from :func:`hash_file`, which reads the file it is given.
"""

from __future__ import annotations

import mmap
import re
import zlib
from collections.abc import Callable, Iterable
from typing import BinaryIO, NewType

import xxhash

try:  # ISA-L's CRC-32: the zip format's (and zlib's) polynomial at about 8x zlib's speed
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without isal wheels: the same values
    crc32 = zlib.crc32

__all__ = [
    "HASH_HEX_LEN",
    "ObjectId",
    "Hasher",
    "crc32",
    "hash_bytes",
    "hash_chunks",
    "hash_file",
    "hash_stream",
    "is_object_id",
    "object_key",
]

ObjectId = NewType("ObjectId", str)

HASH_HEX_LEN = 32
_BLOCK_BYTES = 4 * 1024 * 1024
_MAP_WINDOW_BYTES = 16 * 1024 * 1024
_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")


class Hasher:
    """Incremental xxh3-128 hasher; ``update`` with blocks, ``hexdigest`` at the end."""

    __slots__ = ("_h", "size_bytes")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.size_bytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Feed more bytes."""
        self._h.update(data)
        self.size_bytes += len(data)

    def hexdigest(self) -> ObjectId:
        """The 32-hex-character id of everything fed so far."""
        return ObjectId(self._h.hexdigest())


def hash_bytes(data: bytes | bytearray | memoryview) -> ObjectId:
    """The object id of ``data``."""
    return ObjectId(xxhash.xxh3_128_hexdigest(data))


def hash_chunks(chunks: Iterable[bytes | bytearray | memoryview]) -> ObjectId:
    """The object id of the concatenation of ``chunks``."""
    h = Hasher()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def hash_stream(
    stream: BinaryIO,
    block_bytes: int = _BLOCK_BYTES,
    *,
    pace: Callable[[int], object] | None = None,
) -> tuple[ObjectId, int]:
    """Hash a binary stream in bounded blocks; returns (id, size in bytes).

    ``pace(block_bytes)``, when given, is called before each block is read.
    """
    h = Hasher()
    while True:
        if pace is not None:
            pace(block_bytes)
        block = stream.read(block_bytes)
        if not block:
            break
        h.update(block)
    return h.hexdigest(), h.size_bytes


def hash_file(
    path: str | int, block_bytes: int = _BLOCK_BYTES, *,
    pace: Callable[[int], object] | None = None,
) -> tuple[ObjectId, int]:
    """Hash a local file in bounded blocks; returns (id, size in bytes).

    The file is memory-mapped and hashed in windows of 16 MiB, each dropped from the
    mapping once hashed (no read copy: 6,960 against 3,883 MiB/s from the page cache,
    64 MiB shards); a file that cannot be mapped (empty, a pipe) is read in blocks.
    ``pace(nbytes)``, when given, is called before each window or block is read (a
    bandwidth cap waits there). ``path`` may be an open descriptor instead (it stays
    open): the file it holds is hashed, whatever its path names by now.
    """
    # a descriptor is read through a file object that leaves it open (closefd=False)
    opened = open(path, "rb", closefd=False) if isinstance(path, int) else open(path, "rb")
    with opened as f:
        f.seek(0)
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):
            return hash_stream(f, block_bytes, pace=pace)
        with mapped:
            h = Hasher()
            size = len(mapped)
            view = memoryview(mapped)
            try:
                for lo in range(0, size, _MAP_WINDOW_BYTES):
                    hi = min(size, lo + _MAP_WINDOW_BYTES)
                    if pace is not None:
                        pace(hi - lo)
                    h.update(view[lo:hi])
                    if hasattr(mapped, "madvise"):
                        mapped.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            finally:
                view.release()
            return h.hexdigest(), size


def is_object_id(text: str) -> bool:
    """Whether ``text`` is a well-formed object id (32 lowercase hex characters)."""
    return bool(_ID_RE.match(text))


def object_key(object_id: str) -> str:
    """The store key of an immutable object: ``objects/<2 hex>/<32 hex>``."""
    return f"objects/{object_id[:2]}/{object_id}"


def is_object_key(key: str) -> bool:
    """Whether ``key`` is where an object is stored: ``objects/<its 2 first digits>/<id>``.

    Anything else under ``objects/`` (a file put there by hand, a store nested there) is
    not the store's: gc leaves it, and the store's footprint does not count it.
    """
    oid = key.rsplit("/", 1)[-1]
    return is_object_id(oid) and key == object_key(oid)
