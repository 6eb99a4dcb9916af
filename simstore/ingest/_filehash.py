"""The content hash of a local file (xxh3-128), in one mapped pass with any CRC-32 checks.

Ingest hashes every source file it reads (its lineage) and every shard it writes (its
object id); an adapter whose files record CRC-32s of parts of them (a stored ``.npz``
member) has those taken in the same pass.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

from simstore.hashing import Hasher, ObjectId, crc32
from simstore.ingest._arrays import MiB

__all__ = ["crc_ranges", "hash_file", "hash_file_checked"]

_HASH_WINDOW = 64 * MiB  # a multiple of mmap.ALLOCATIONGRANULARITY
# MAP_POPULATE maps a window's pages in one call instead of one fault per page (~2x faster)
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
_READ_WHOLE = 256 << 10


def hash_file(path: str) -> tuple[ObjectId, int]:
    """xxh3-128 id and size of a local file, equal to :func:`simstore.hashing.hash_file`.

    Hashes memory-mapped windows of 64 MiB, unmapping each before the next: no copy into
    Python buffers (about 8x faster than reading blocks here; a window's pages are mapped
    up front where the platform can) and mapped pages never exceed one window, so the
    resident memory stays bounded (the pass of :func:`hash_file_checked`, with no ranges).
    """
    oid, size, _ = hash_file_checked(path, ())
    return oid, size


_CHECK_BLOCK = 1 * MiB
"""The pass of :func:`hash_file_checked` goes through a window in blocks this size, so a
block's bytes are still in the CPU's cache for its CRC-32s after its hash."""


def hash_file_checked(
    path: str, ranges: Sequence[tuple[int, int]]
) -> tuple[ObjectId, int, list[int | None]]:
    """:func:`hash_file`, plus the CRC-32 of each ``(offset, size)`` byte range, in one pass.

    An adapter that checks parts of its files against CRC-32s they record (a stored
    ``.npz`` member) names them (``crc_ranges``); their CRC-32s are taken block by block
    while each block is hashed, instead of in a second pass over the file: 32 MiB .npz
    files, 4.3 ms against 3.1 ms of hash and 3.3 of CRC-32 one after the other. A range
    that does not lie inside the file gets None (the adapter's own check then says what
    is wrong).
    """
    h = Hasher()
    crcs = [0] * len(ranges)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        wanted = [
            (i, off, off + n) for i, (off, n) in enumerate(ranges) if 0 <= off and off + n <= size
        ]
        for start in range(0, size, _HASH_WINDOW):
            length = min(_HASH_WINDOW, size - start)
            if size <= _READ_WHOLE:  # a small file: one read costs less than mapping it
                m = None
                view = memoryview(f.read())
            else:
                m = mmap.mmap(f.fileno(), length, flags=_MAP_FLAGS, prot=mmap.PROT_READ,
                              offset=start)
                view = memoryview(m)
            # Views are released explicitly: a sampling profiler (dask's workers run one)
            # may still hold a frame that received one, and a live export makes closing
            # the map fail with BufferError (which replaced a Ctrl-C during a block's hash).
            block: memoryview | None = None
            try:
                step = _CHECK_BLOCK if wanted else length  # no ranges: the window at once
                for lo in range(0, length, step):
                    hi = min(length, lo + step)
                    block = view[lo:hi]
                    h.update(block)
                    a, b = start + lo, start + hi
                    for i, r0, r1 in wanted:
                        if r0 < b and a < r1:
                            crcs[i] = crc32(block[max(r0, a) - a : min(r1, b) - a], crcs[i])
                    block.release()
            finally:
                if block is not None:
                    block.release()
                view.release()
                if m is not None:
                    m.close()
    inside = {i for i, _, _ in wanted}
    return h.hexdigest(), size, [c if i in inside else None for i, c in enumerate(crcs)]


def crc_ranges(adapter: Any, path: str) -> list[tuple[int, int]]:
    """The ``(offset, size)`` byte ranges of ``path`` its adapter checks against CRC-32s.

    An adapter may name them (``crc_ranges(path)``, as the ``.npz`` adapter does for its
    stored members) so their CRC-32s are taken in the source hash's pass over the file
    and handed to it as ``options["checked_crcs"]``. None named, or a file the adapter
    cannot read that far: no ranges (the adapter then checks, and fails, as before).
    """
    named = getattr(adapter, "crc_ranges", None)
    if not callable(named):
        return []
    try:
        return [(int(offset), int(size)) for offset, size in named(path)]
    except Exception:  # a corrupt file: iter_samples names what is wrong
        return []
