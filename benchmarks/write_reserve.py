"""Writes into a new file with its disk blocks reserved first, against without.

    python -m benchmarks.write_reserve [--dir DIR] [--mib 32] [--rounds 15]

Each round writes a new file of ``--mib`` MiB (random float32 bytes, already in memory)
in writes of 64 KiB, 256 KiB, 1 MiB and 4 MiB, two ways one after the other, in an order
that alternates from round to round: plain ``os.write`` calls, and the same after
:class:`simstore._reserve.Reservation` reserved the file's blocks ahead of them (what a
Zarr shard file, a Parquet shard and a cache fill do), freeing the rest at the end. The
previous file is removed just before each clock starts. Prints the median MiB/s of each
way and write size, and their ratio. ``--dir`` should be on the disk a store lives on
(by default a temporary folder under ``.bench``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from simstore._reserve import Reservation

MiB = 1 << 20


def write_file(path: str, data: memoryview, size: int, reserve: bool) -> float:
    """Seconds to create ``path`` and write ``data`` to it in writes of ``size`` bytes."""
    if os.path.exists(path):
        os.unlink(path)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        reserved = Reservation(fd) if reserve else None
        for offset in range(0, data.nbytes, size):
            if reserved is not None:
                reserved.ahead(offset + size)
            os.write(fd, data[offset : offset + size])
        if reserved is not None:
            reserved.release(data.nbytes)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="")
    p.add_argument("--mib", type=int, default=32)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = args.dir or os.path.join(root, ".bench")
    os.makedirs(base, exist_ok=True)
    data = np.random.default_rng(0).standard_normal(args.mib * MiB // 4).astype(np.float32)
    view = memoryview(data).cast("B")
    sizes = (64 << 10, 256 << 10, MiB, 4 * MiB)
    times: dict[tuple[int, bool], list[float]] = {(s, r): [] for s in sizes for r in (False, True)}
    with tempfile.TemporaryDirectory(dir=base, prefix="write-reserve-") as work:
        path = os.path.join(work, "f")
        for rnd in range(args.rounds):
            for size in sizes:
                for reserve in ((False, True) if rnd % 2 == 0 else (True, False)):
                    times[(size, reserve)].append(write_file(path, view, size, reserve))
    print(f"{args.mib} MiB files, medians of {args.rounds} rounds")
    print("| write size | plain MiB/s | reserved MiB/s | ratio |")
    print("|---|---|---|---|")
    for size in sizes:
        plain = args.mib / statistics.median(times[(size, False)])
        reserved = args.mib / statistics.median(times[(size, True)])
        print(f"| {size // 1024} KiB | {plain:,.0f} | {reserved:,.0f} | {reserved / plain:.2f} |")


if __name__ == "__main__":
    main()
