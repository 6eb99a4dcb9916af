"""Random access by key: ``SimDataset.get`` and ``get_many`` on one store.

    python -m benchmarks.bench_get STORE REF [--keys 50] [--many 64] [--seed 0]

Makes one dataset, times its first ``get`` (the process's first shard opened), then
``--keys`` random keys one by one (median and 90th percentile), then one ``get_many``
of ``--many`` random keys. Warm page cache: run it twice and read the second.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from simstore.loaders import SimDataset

from simstore.catalog import Catalog


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("ref")
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--many", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ds = SimDataset(args.store, args.ref)
    cat = Catalog.open(args.store)
    keys = [k for table in cat.iter_rows(cat.snapshot(ds.snapshot_id))
            for k in table.column("key").to_pylist()]
    rng = random.Random(args.seed)
    t = time.perf_counter()
    ds.get(keys[0])
    first = time.perf_counter() - t
    times = []
    for key in rng.sample(keys, min(args.keys, len(keys))):
        t = time.perf_counter()
        ds.get(key)
        times.append(time.perf_counter() - t)
    times.sort()
    t = time.perf_counter()
    ds.get_many(rng.sample(keys, min(args.many, len(keys))))
    many = time.perf_counter() - t
    print(f"first get {first * 1e3:.1f} ms; then median {statistics.median(times) * 1e3:.2f} ms, "
          f"p90 {times[int(0.9 * (len(times) - 1))] * 1e3:.2f} ms per key; "
          f"get_many({min(args.many, len(keys))}) {many * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
