"""Disk blocks reserved ahead of a file written front to back.

A write into a new file on ext4 (and other file systems that allocate blocks at
writeback) reserves its blocks page by page as it copies; with the blocks allocated
beforehand (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``: the file's size is unchanged) the
same writes into the page cache ran 1.3-1.4x faster on ext4 (``python -m
benchmarks.write_reserve``: 1 MiB writes of a 32 MiB file, 4,612 against 5,956 MiB/s).
Shard writers reserve exactly the bytes of each large write just before it
(``step=0``), so a finished file holds no block past its end and nothing is given back.
Reserving a step ahead and giving back the rest at close cost more than it saved under
sustained writes: the truncate that frees the unused blocks waits, on ext4 in ordered
mode, for the writeback of the file's data that the journal is committing (96 files of
32 MiB written back to back: 0.8-1.2 s with a 64 MiB step given back at close, 0.51-0.56
s reserved exactly, 0.65 s unreserved; up to 123 ms for one truncate). Writes under 1 MiB
are not worth a call each (64 KiB writes reserved one by one: 0.66 s against 0.62 s
unreserved). Where the call is missing or refused (another system, a file system
without it, a full disk) nothing is reserved and the writes go on as before: a full disk
is then reported by the write that meets it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from typing import Any

from ._buffers import libc

__all__ = ["Reservation"]

_KEEP_SIZE = 0x01
"""Linux's ``FALLOC_FL_KEEP_SIZE``: allocate blocks past the end, leave the size alone."""


@functools.cache
def _fallocate() -> Any:
    """The C library's ``fallocate`` with 64-bit offsets, on Linux; else None."""
    lib = libc()
    for name in ("fallocate64", "fallocate"):  # musl has only the second, 64-bit too
        call = None if lib is None else getattr(lib, name, None)
        if call is not None:
            call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            call.restype = ctypes.c_int
            return call
    return None


class Reservation:
    """Blocks allocated ahead of the writes to one descriptor, ``step`` bytes at a time."""

    STEP = 64 << 20
    """Bytes reserved at a time past what a write needs (given back at :meth:`release`);
    the shard writers reserve exactly (``step=0``), see the module's note."""

    MIN_WRITE = 1 << 20
    """The smallest write worth reserving for on its own (see the module's note)."""

    def __init__(self, fd: int, step: int = STEP) -> None:
        self.fd = fd
        self.step = step
        self.end = 0
        """Offset up to which blocks are reserved."""
        self._fallocate = _fallocate()

    def ahead(self, upto: int) -> None:
        """Reserve blocks up to at least offset ``upto`` (a step past it), if none are yet."""
        if self._fallocate is None or upto <= self.end:
            return
        end = upto + self.step
        if self._fallocate(self.fd, _KEEP_SIZE, self.end, end - self.end) != 0:
            failed = ctypes.get_errno()
            self._fallocate = None  # written from here on without reserving
            if failed != errno.ENOSPC:
                return  # not supported here: nothing was allocated
            # a disk that filled part way may have allocated some: given back at release
        self.end = end

    def claim(self, upto: int) -> bool | None:
        """Reserve blocks up to offset ``upto`` now, and say how it went.

        True; False for a full disk; None where blocks cannot be reserved (another
        system or file system). Unlike :meth:`ahead`, a full disk changes nothing here:
        the caller may make room (the loader's cache evicts copies) and claim again. The
        file system's own answer, which counts what this process may use (a root process
        may use the reserve an ext4 disk keeps back from others, which ``statvfs`` does
        not say).
        """
        if self._fallocate is None:
            return None
        if upto <= self.end:
            return True
        if self._fallocate(self.fd, _KEEP_SIZE, self.end, upto - self.end) == 0:
            self.end = upto
            return True
        failed = ctypes.get_errno()
        if failed in (errno.ENOSPC, errno.EDQUOT):
            return False
        self._fallocate = None  # not supported here: nothing was allocated
        return None

    def release(self, size: int) -> None:
        """Give back the blocks reserved past ``size``, the file's final length.

        Truncating a file to its own size frees them on ext4 but not everywhere, so the
        file is grown by a byte and cut back: a shrinking truncate frees blocks past the
        new end on every file system.
        """
        if self.end <= size:
            return
        self.end = size
        os.ftruncate(self.fd, size + 1)
        os.ftruncate(self.fd, size)
