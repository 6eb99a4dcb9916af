"""Raw reads of a store's files into a reused small buffer against batch-sized memory.

    python -m benchmarks.read_into PATH [--rounds 3]

One thread reads every file of PATH over 1 MiB (a store's shards) with ``os.preadv``,
three ways: into one reused 4 MiB buffer (the suite's raw-read ceiling), into four
reused 32 MiB buffers in turn (a batch of eight 4 MiB samples each, memory a loader must
fill because its batches are the training loop's to keep), and into a new 32 MiB NumPy
array per read. Prints MiB/s per way and round, each round in a fresh order of the ways.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

MiB = 1 << 20
BATCH = 32 * MiB


def _files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names if os.path.getsize(os.path.join(d, n)) > MiB]
    return sorted(out)


def read_all(files: list[str], way: str) -> float:
    """MiB/s of one pass over ``files`` read ``way`` (``reuse-4m``, ``pool-32m``, ``new-32m``)."""
    small = np.empty(4 * MiB, np.uint8)
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
    files = _files(args.path)
    if not files:
        raise SystemExit(f"{args.path}: no files over 1 MiB")
    ways = ["reuse-4m", "pool-32m", "new-32m"]
    read_all(files, "reuse-4m")  # the page cache warm
    for r in range(args.rounds):
        order = ways[r % 3:] + ways[:r % 3]
        figures = {w: read_all(files, w) for w in order}
        print(f"round {r + 1}: " + ", ".join(f"{w} {figures[w]:,.0f} MiB/s" for w in ways))


if __name__ == "__main__":
    main()
