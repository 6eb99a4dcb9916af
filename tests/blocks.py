"""Which of a file's bytes have disk blocks, for tests of blocks reserved past its end.

``st_blocks`` counts a file system's own blocks for the file as well as its data: ext4
adds a block of extent tree once a file has more than four extents, which a fragmented
disk gives even a 12 MiB file. So where the kernel can list a file's extents
(``FS_IOC_FIEMAP``: ext4, XFS, btrfs) the tests ask it where the data blocks end, and
fall back to ``st_blocks`` only where it cannot (tmpfs, for one).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

_FS_IOC_FIEMAP = 0xC020660B
_HEAD = struct.Struct("=QQIIII")  # start, length, flags, mapped, count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3
_LAST = 0x1  # FIEMAP_EXTENT_LAST
_BATCH = 64


def allocated(path) -> int:
    """Bytes of disk the file system counts for ``path``, its own blocks included."""
    return os.stat(path).st_blocks * 512


def rounded(size: int, block: int) -> int:
    """``size`` rounded up to whole blocks of ``block`` bytes."""
    return -(-size // block) * block


def _data_end(fd: int) -> int | None:
    """The offset where the file's last extent ends (past its size, if reserved there);
    None where the file system cannot list extents."""
    start, end = 0, 0
    while True:
        buf = bytearray(_HEAD.size + _BATCH * _EXTENT.size)
        _HEAD.pack_into(buf, 0, start, (1 << 64) - 1 - start, 0, 0, _BATCH, 0)
        try:
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
                return None
            raise
        mapped = _HEAD.unpack_from(buf, 0)[3]
        if mapped == 0:
            return end
        for i in range(mapped):
            logical, _, length, _, _, flags, *_ = _EXTENT.unpack_from(
                buf, _HEAD.size + i * _EXTENT.size)
            end = max(end, logical + length)
            if flags & _LAST:
                return end
        start = end


def blocks_end(path) -> int:
    """Where the file's data blocks end, in bytes: from its extents where they can be
    listed, else from ``st_blocks`` (an upper bound there)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        end = _data_end(fd)
    finally:
        os.close(fd)
    return allocated(path) if end is None else end


def holds_no_block_past_its_end(path) -> bool:
    """True when no disk block of ``path`` lies past its size rounded to whole blocks."""
    st = os.stat(path)
    return blocks_end(path) <= rounded(st.st_size, st.st_blksize)
