"""Raw reads of a store's files into a reused small buffer against batch-sized memory.

    python -m benchmarks.read_into PATH [--rounds 3]

One thread reads every file of PATH over 1 MiB (a store's shards) with ``os.preadv``,
three ways: into one reused 4 MiB buffer (the suite's raw-read ceiling), into four
reused 32 MiB buffers in turn (a batch of eight 4 MiB samples each, memory a loader must
fill because its batches are the training loop's to keep), into a new 32 MiB NumPy
array per read, and (``map-32m``) by mapping each 32 MiB of file into a new array of the
loader's pool (``BufferPool.map_file``, what the loader does with page-aligned Zarr
chunks) and reading one byte per 4 KiB page of it, which faults the pages in (the read
ways touch every byte through the kernel's copy). Prints MiB/s per way and round, each
round in a fresh order of the ways.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from simstore._buffers import BufferPool

MiB = 1 << 20
BATCH = 32 * MiB


def shard_files(root: str) -> list[str]:
    """The files of ``root`` over 1 MiB (a store's shards), sorted."""
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names if os.path.getsize(os.path.join(d, n)) > MiB]
    return sorted(out)


def read_all(files: list[str], way: str) -> float:
    """MiB/s of one pass over ``files`` read ``way`` (``reuse-4m``, ``pool-32m``, ``new-32m``,
    ``map-32m``)."""
    small = np.empty(4 * MiB, np.uint8)
    mapper = BufferPool(idle_bytes=0, min_bytes=1)
    pool = [np.ones(BATCH, np.uint8) for _ in range(4)] if way == "pool-32m" else []
    n = turn = 0
    t = time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            off = 0
            while True:
                if way == "reuse-4m":
                    buf = small
                elif way == "pool-32m":
                    buf = pool[turn % 4]
                    turn += 1
                elif way == "map-32m":
                    size = os.fstat(fd).st_size
                    k = min(BATCH, size - off) // 4096 * 4096
                    if k <= 0:
                        break
                    buf = mapper.array((k,), np.dtype(np.uint8))
                    if not mapper.map_file(buf, fd, off):
                        raise SystemExit("this platform cannot map files into the pool")
                    int(buf[::4096].sum())
                    n += k
                    off += k
                    continue
                else:
                    buf = np.empty(BATCH, np.uint8)
                k = os.preadv(fd, [buf], off)
                if not k:
                    break
                n += k
                off += k
        finally:
            os.close(fd)
    return n / (time.perf_counter() - t) / MiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    files = shard_files(args.path)
    if not files:
        raise SystemExit(f"{args.path}: no files over 1 MiB")
    ways = ["reuse-4m", "pool-32m", "new-32m", "map-32m"]
    read_all(files, "reuse-4m")  # the page cache warm
    for r in range(args.rounds):
        order = ways[r % len(ways):] + ways[:r % len(ways)]
        figures = {w: read_all(files, w) for w in order}
        print(f"round {r + 1}: " + ", ".join(f"{w} {figures[w]:,.0f} MiB/s" for w in ways))


if __name__ == "__main__":
    main()
