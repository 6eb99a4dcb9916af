"""Time to a snapshot's first sample in a fresh process, for one simstore source tree.

    python -m benchmarks.ab_first_sample TREE STORE DATASET

Imports simstore from ``TREE`` (a checkout, e.g. ``git worktree add TREE REV``; "" for the
installed one), then builds ``SimDataset(STORE, DATASET)`` and takes its first sample six
times. Prints two figures: the first (a new process: nothing warm but the page cache) and
the median of the other five. Run it alternately for two trees to compare revisions
(docs/performance.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from benchmarks.bench_ingest import TREE_IMPORTS


def main(argv: list[str]) -> None:
    tree, store, name = argv
    exec(TREE_IMPORTS, {"sys": sys, "os": os, "tree": tree})  # noqa: S102  (our own text)
    import simstore.loaders
    from simstore.loaders import SimDataset

    import simstore

    if tree:
        for mod in (simstore, simstore.loaders):
            assert str(mod.__file__).startswith(tree), mod.__file__
    times = []
    for _ in range(6):
        t = time.perf_counter()
        next(iter(SimDataset(store, name)))
        times.append(time.perf_counter() - t)
    print(f"{times[0]:.4f} {statistics.median(times[1:]):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
