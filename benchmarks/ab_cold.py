"""Cold-cache epochs from S3 (moto on 127.0.0.1), for source trees side by side.

    python -m benchmarks.ab_cold --trees TREE [TREE ...] [--format zarr] [--samples 96]
        [--workers 0] [--rounds 8] [--workdir DIR]

One moto server (a process of its own, as in ``bench_s3``) serves the ``large`` pool
ingested once (``--samples`` samples of 4 MiB, 64 MiB shards, no compression). Each
round then runs one epoch per tree, in turn (the order alternating from round to round,
so a noisy minute hits every tree alike): a new process imports simstore from its tree
(a checkout, e.g. ``git worktree add TREE REV``; ``installed`` for the installed one) and
reads the snapshot, pinned by its id, through an empty disk cache with ``SimDataLoader``
(batches of 8, shuffled), touching a byte per page of every batch: ``bench_s3``'s cold
epoch. Prints each tree's median epoch seconds, MiB/s and time to first batch, with
quartiles.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from benchmarks import bench_s3
from benchmarks.bench_ingest import TREE_IMPORTS, run_child

_CHILD = r"""
import json, os, sys
args = json.loads(sys.argv[1])
tree = args["tree"]
# the measuring code is this repository's for every tree (a tree's own benchmarks/ may
# measure differently); only simstore comes from the tree
from benchmarks import bench_s3
""" + TREE_IMPORTS + r"""
import simstore
assert (not tree) or simstore.__file__.startswith(tree), simstore.__file__
print(json.dumps(bench_s3.child(args["spec"])))
"""


def _epoch(tree: str, spec: dict) -> dict:
    result: dict = run_child(_CHILD, {"tree": tree, "spec": spec}, cwd=bench_s3.REPO,
                             what=f"cold epoch with {tree or 'installed'}")
    return result


def _summary(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f} ({q[0]:.3f}-{q[2]:.3f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="+", required=True)
    ap.add_argument("--format", default="zarr", choices=["parquet", "zarr", "lance"])
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workdir", default=os.path.join(bench_s3.REPO, ".bench", "s3"))
    args = ap.parse_args(argv)
    trees = ["" if t == "installed" else os.path.abspath(t) for t in args.trees]
    os.makedirs(args.workdir, exist_ok=True)
    from simstore.catalog import Catalog

    runs: dict[str, list[dict]] = {t: [] for t in trees}
    with bench_s3._serve(["moto"]) as endpoint, \
            tempfile.TemporaryDirectory(dir=args.workdir) as caches:
        local = bench_s3.build(args.workdir, args.format, args.samples)
        bench_s3.upload(endpoint, local, args.format)
        ref = f"large@{Catalog.open(local).resolve('large')}"
        for r in range(args.rounds):
            for i, tree in enumerate(trees if r % 2 == 0 else trees[::-1]):
                spec = {
                    "store": f"s3://{bench_s3.BUCKET}/{args.format}",
                    "options": bench_s3._options(endpoint),
                    "cache": os.path.join(caches, f"{r}-{i}"),
                    "workers": args.workers,
                    "ref": ref,
                }
                got = _epoch(tree, spec)
                runs[tree].append(got)
                print(f"round {r} {tree or 'installed'}: {got['s']:.3f} s, "
                      f"{got['mib_s']:.0f} MiB/s, first batch {got['ttfb_s']:.3f} s", flush=True)
    for tree in trees:
        got = runs[tree]
        print(f"{tree or 'installed'}: epoch {_summary([g['s'] for g in got])} s, "
              f"{statistics.median(g['mib_s'] for g in got):.0f} MiB/s, "
              f"first batch {_summary([g['ttfb_s'] for g in got])} s (median, quartiles)")


if __name__ == "__main__":
    main()
