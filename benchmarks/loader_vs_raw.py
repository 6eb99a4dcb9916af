"""A training job's epochs against the raw-read ceiling, alternating in one process.

    python -m benchmarks.loader_vs_raw STORE DATASET [--batch 8] [--workers 0]
        [--rounds 6] [--persistent-workers]

One ``SimDataset`` and ``SimDataLoader`` read a shuffled epoch per round (``set_epoch``),
touching every batch's tensors once per 4 KiB page as the suite does, as a training job's
later epochs do; before each epoch, one thread reads the store's shard files into one
reused 4 MiB buffer (the suite's raw sequential read ceiling,
``benchmarks.suite.ceilings.raw_read``). A round's figure is the loader's MiB/s of
sample bytes over the ceiling's MiB/s of file bytes measured just before it, so the
machine's swings (this VM's ceiling moves 2x within minutes) move both. The first epoch
(the dataset's first, which hashes shards a node has no records of and fills the
memory pool) is read but not counted. Prints each round and the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.read_into import shard_files
from benchmarks.suite.ceilings import raw_read
from benchmarks.suite.runner import touch_pages

MiB = 1 << 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("dataset")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--persistent-workers", action="store_true")
    args = p.parse_args()
    from simstore.loaders import SimDataLoader, SimDataset

    files = shard_files(os.path.join(args.store, "objects"))
    if not files:
        raise SystemExit(f"{args.store}: no shard files over 1 MiB under objects/")
    ds = SimDataset(args.store, args.dataset, shuffle=True, seed=0)
    extra = {"persistent_workers": True} if args.persistent_workers and args.workers else {}
    loader = SimDataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                           multiprocessing_context="fork" if args.workers else None, **extra)

    def epoch(number: int) -> float:
        ds.set_epoch(number)
        nbytes = 0
        t = time.perf_counter()
        for batch in loader:
            nbytes += touch_pages(batch)[0]
        return nbytes / (time.perf_counter() - t) / MiB

    epoch(0)
    raw_read(files)  # the page cache warm
    ratios, loads, ceilings = [], [], []
    for r in range(1, args.rounds + 1):
        ceiling = raw_read(files)
        load = epoch(r)
        ratios.append(load / ceiling)
        loads.append(load)
        ceilings.append(ceiling)
        print(f"round {r}: raw read {ceiling:,.0f} MiB/s, loader {load:,.0f} MiB/s, "
              f"{load / ceiling:.0%}", flush=True)
    print(f"median: raw read {statistics.median(ceilings):,.0f} MiB/s, loader "
          f"{statistics.median(loads):,.0f} MiB/s, ratio {statistics.median(ratios):.0%} "
          f"(rounds {min(ratios):.0%}-{max(ratios):.0%})")


if __name__ == "__main__":
    main()
