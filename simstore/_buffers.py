"""Reused memory for large arrays of one process: a pool of anonymous mappings.

Fresh memory costs a page fault and a page of zeroes per 4 KiB page. On a virtual machine
whose host has not backed the pages yet that ran at under 1 GiB/s, slower than the copy
that fills the memory. Ingest reads source arrays into pooled memory and the loader its
chunk buffers (``simstore.loaders``), so each process faults a working set in once.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["INGEST_IDLE_BYTES", "POOL", "BufferPool", "whole_pages"]


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
        self.reused = 0
        """Arrays handed out over a mapping that came back (for tests and metrics)."""

    def array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``.

        Over pooled memory when it is big enough to matter (``min_bytes``, 1 MiB by
        default); smaller ones come from NumPy.
        """
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < max(1, self.min_bytes):
            return np.empty(shape, dtype=dtype)
        mapping = self._take(nbytes)
        out = np.frombuffer(mapping, dtype=dtype, count=nbytes // dtype.itemsize)
        # ``out`` is the base of every view of it (its own base is the mapping, not an
        # array), so it lives exactly as long as the last view
        weakref.finalize(out, self._give_back, mapping)
        return out.reshape(shape)

    def _take(self, nbytes: int) -> mmap.mmap:
        with self._lock:
            fits = [m for m in self._idle if nbytes <= len(m) <= 2 * nbytes]
            if fits:
                best = min(fits, key=len)
                self._idle.remove(best)
                self.reused += 1
                return best
        size = whole_pages(nbytes)
        # no MADV_HUGEPAGE: a fresh process's huge pages are 2 MiB blocks the host has
        # often not backed, and their first touch ran at 0.4-2 GiB/s here, against a
        # steady 2.4 GiB/s for 4 KiB pages (the kernel's recently freed ones)
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def _give_back(self, mapping: mmap.mmap) -> None:
        with self._lock:
            self._idle.append(mapping)
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
