"""Backed memory before a measurement: on VMs whose host takes back the guest's free memory.

A guest kernel with virtio-balloon free page reporting (the benchmark VMs here have it:
the device offers VIRTIO_BALLOON_F_REPORTING) tells the host about free blocks of 2 MiB
and more once they have been free for a couple of seconds, and the host drops their
backing. The next use of such a block faults into the host, slowly when the host is
busy. Huge pages and large page-cache folios (which ext4 uses on recent kernels) are
carved from exactly those blocks: here, touching 1 GiB of fresh huge pages took 8.2 s
in one minute and 0.14 s right after; writing a disk cache's copies ran at 69-300 MiB/s
in a forked loader worker against 1-2 GiB/s once backed, and a cold S3 epoch took 1.4-3 s
against 0.64-0.92 s. A reader that keeps what it fetches (a disk cache's new copies, a
loader's batch pool) pays that on every block; a raw GET that reads into buffers it
frees and reuses barely does. So a measurement of the first kind, started after the
previous one freed its memory, timed the host more than the reader.

:func:`back_free_memory` touches 1 GiB of huge pages and frees it right before the clock
starts, so the blocks the measurement takes from the kernel's free lists are backed, as
on a physical machine. Every system's read in a run gets the same treatment (the ceilings
read into reused buffers and do not need it); the time it took is reported apart
(``backing_s``), never in a measurement.
"""

from __future__ import annotations

import mmap
import time

import numpy as np

BACKED_BYTES = 1 << 30
"""What is touched before each measurement: more than one epoch of the suite's largest
profile keeps as new page-cache pages (a disk cache's copies) plus a loader's buffers."""


def back_free_memory(nbytes: int = BACKED_BYTES) -> float:
    """Touch ``nbytes`` of fresh anonymous memory, a byte per page, and free it; seconds."""
    t0 = time.perf_counter()
    if nbytes <= 0:
        return 0.0
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        # huge pages take whole 2 MiB blocks, the ones free page reporting hands to the
        # host (and the ones large page-cache folios are made of); 4 KiB pages come
        # from the fragments the kernel kept, already backed
        if hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)
        view = np.frombuffer(m, dtype=np.uint8)
        view[:: mmap.PAGESIZE] = 1
        del view
    finally:
        m.close()
    return time.perf_counter() - t0
