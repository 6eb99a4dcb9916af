"""Reused memory for large arrays of one process: a pool of anonymous mappings.

Fresh memory costs a page fault and a page of zeroes per 4 KiB page. On a virtual machine
whose host has not backed the pages yet that ran at under 1 GiB/s, slower than the copy
that fills the memory. Ingest reads source arrays into pooled memory and the loader its
chunk buffers (``simstore.loaders``), so each process faults a working set in once.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["INGEST_IDLE_BYTES", "POOL", "BufferPool", "libc", "whole_pages"]


class BufferPool:
    """Arrays over anonymous mappings that come back to the pool when unused.

    When every view of an array handed out is gone, its mapping returns and the next
    array of a similar size lands in memory that is already faulted in. Idle mappings are
    kept up to ``idle_bytes``; anything past that is unmapped, and :meth:`release` unmaps
    them all. A caller that keeps its arrays simply makes the pool map more.
    """

    def __init__(self, idle_bytes: int = 256 << 20, min_bytes: int = 1 << 20) -> None:
        self.idle_bytes = idle_bytes
        self.min_bytes = min_bytes
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._lent: dict[int, tuple[weakref.ref[np.ndarray], mmap.mmap]] = {}
        """Mappings out, by the id of the array over each (the base of all its views)."""
        self._filed: set[int] = set()
        """Mappings (by id) unmapped when they come back: those with file pages in them,
        and fresh ones (their pages mostly never touched: no faster to reuse than new)."""
        self.reused = 0
        """Arrays handed out over a mapping that came back (for tests and metrics)."""
        self.mapped_bytes = 0
        """Bytes mapped from files by :meth:`map_file` (for tests and metrics)."""

    def array(self, shape: tuple[int, ...], dtype: np.dtype[Any], *,
              fresh: bool = False) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``.

        Over pooled memory when it is big enough to matter (``min_bytes``, 1 MiB by
        default); smaller ones come from NumPy. ``fresh``: over a new mapping, never an
        idle one, for an array whose bytes will mostly be mapped from files
        (:meth:`map_file`): mapping over untouched memory frees no pages, and the idle
        mappings, already faulted in, stay for arrays that are read into.
        """
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < max(1, self.min_bytes):
            return np.empty(shape, dtype=dtype)
        mapping = self._new(nbytes) if fresh else self._take(nbytes)
        out = np.frombuffer(mapping, dtype=dtype, count=nbytes // dtype.itemsize)
        # ``out`` is the base of every view of it (its own base is the mapping, not an
        # array), so it lives exactly as long as the last view
        with self._lock:
            self._lent[id(out)] = (weakref.ref(out), mapping)
            if fresh:
                self._filed.add(id(mapping))
        weakref.finalize(out, self._give_back, mapping, id(out))
        return out.reshape(shape)

    def map_file(self, array: np.ndarray, fd: int, offset: int) -> bool:
        """Make ``array``'s bytes those of file ``fd`` at ``offset``, mapped, not read.

        ``array`` must be a view of an array this pool handed out, C-contiguous, starting
        at a page boundary and a whole number of pages long, and ``offset`` a multiple of
        the page size; the caller owns those bytes (it was about to read the file into
        them). The pages are mapped private (copy-on-write) over the pool's memory: reading
        them reads the file's page cache with no copy, writing one copies that page first,
        and the file itself never changes. What the array shows is the file's content at
        the time each page is first touched, so only files that are never rewritten in
        place may be mapped (shard files: written whole, then renamed), and a file cut
        short under a mapping faults its reader (SIGBUS), as for any mapped file. The
        mapping that holds such pages is unmapped, not reused, once every view of it is
        gone. False (nothing changed) where it does not apply: then read the bytes.
        """
        nbytes = array.nbytes
        page = mmap.PAGESIZE
        addr = array.ctypes.data
        if (nbytes == 0 or nbytes % page or addr % page or offset % page
                or not array.flags.c_contiguous):
            return False
        lib = libc()
        if lib is None or ctypes.sizeof(ctypes.c_void_p) != 8:  # off_t a ``long``
            return False
        base = array.base
        with self._lock:
            lent = self._lent.get(id(base))
            if lent is None or lent[0]() is not base:
                return False
            mapping = lent[1]
            start = base.ctypes.data  # type: ignore[union-attr]
            if addr < start or addr + nbytes > start + len(mapping):
                return False
            self._filed.add(id(mapping))
        got = lib.mmap(addr, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                       mmap.MAP_PRIVATE | _MAP_FIXED, fd, offset)
        if got == addr:
            with self._lock:
                self.mapped_bytes += nbytes
            return True
        # a failed fixed mapping may leave the range unmapped (kernels before 6.12): put
        # fresh memory back before the caller reads into it
        again = lib.mmap(addr, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
        if again != addr:  # pragma: no cover - the kernel refused anonymous memory
            raise MemoryError(f"could not restore {nbytes} bytes of memory at {addr:#x}")
        return False

    def _take(self, nbytes: int) -> mmap.mmap:
        with self._lock:
            fits = [m for m in self._idle if nbytes <= len(m) <= 2 * nbytes]
            if fits:
                best = min(fits, key=len)
                self._idle.remove(best)
                self.reused += 1
                return best
        return self._new(nbytes)

    @staticmethod
    def _new(nbytes: int) -> mmap.mmap:
        size = whole_pages(nbytes)
        # no MADV_HUGEPAGE: a fresh process's huge pages are 2 MiB blocks the host has
        # often not backed, and their first touch ran at 0.4-2 GiB/s here, against a
        # steady 2.4 GiB/s for 4 KiB pages (the kernel's recently freed ones)
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def _give_back(self, mapping: mmap.mmap, key: int) -> None:
        with self._lock:
            self._lent.pop(key, None)
            filed = id(mapping) in self._filed
            self._filed.discard(id(mapping))
            if not filed:
                self._idle.append(mapping)
        if filed:
            # file pages: a later array must get memory of its own; the mapping is unmapped
            # when the last reference goes (the array's buffer export still holds it now)
            return
        self._trim(self.idle_bytes)

    def release(self) -> None:
        """Unmap every idle mapping (arrays still in use keep theirs until they go)."""
        self._trim(0)

    def _trim(self, keep_bytes: int) -> None:
        """Unmap the oldest idle mappings until at most ``keep_bytes`` stay idle.

        Newest first out of the pool's keep; a mapping something still exports is dropped,
        not closed.
        """
        with self._lock:
            dropped = []
            while self._idle and sum(len(m) for m in self._idle) > keep_bytes:
                dropped.append(self._idle.pop(0))
        for old in dropped:
            try:
                old.close()
            except BufferError:
                pass


_MAP_FIXED = 0x10
"""Linux's ``MAP_FIXED`` (not in Python's ``mmap`` module)."""


@functools.cache
def libc() -> Any:
    """The C library with ``mmap`` and ``madvise`` declared, on Linux; else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.mmap.restype = ctypes.c_void_p
    except (OSError, AttributeError):
        return None
    return lib


def whole_pages(nbytes: int) -> int:
    """``nbytes`` rounded up to whole memory pages."""
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE


INGEST_IDLE_BYTES = 128 << 20
"""Idle memory the ingest pool keeps: a sample's arrays up to ``--dense-threshold`` (16
MiB each by default) and a Zarr writer's slab (64 MiB), with room for sizes that vary."""

POOL = BufferPool(INGEST_IDLE_BYTES)
"""This process's pool for source arrays read by ingest (the loader keeps its own)."""


def _fresh_pool_after_fork() -> None:
    global POOL
    POOL = BufferPool(POOL.idle_bytes, POOL.min_bytes)


os.register_at_fork(after_in_child=_fresh_pool_after_fork)
