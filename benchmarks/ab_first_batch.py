"""The first batches of a fresh process, for source trees side by side.

    python -m benchmarks.ab_first_batch --store STORE --dataset NAME --trees TREE [TREE ...]
        [--batch 256] [--workers 0] [--rounds 31] [--step-ms 50] [--cold]

Each round runs one new process per tree, in turn (the order alternating from round to
round, so a noisy minute and the second place hit every tree alike; runs recorded before
2026-12-02 kept one order). A process imports simstore from its tree (a checkout, e.g. ``git
worktree add TREE REV``; ``installed`` for the installed one), pins ``DATASET`` to its
snapshot id, and then times, from building ``SimDataset`` and ``SimDataLoader``: the first
batch; after a pretend training step of ``--step-ms`` (a sleep), the wait for the second
batch; after two more steps, the wait for the fifth. Prints each figure's median,
quartiles and minimum per tree. A change that brings the first batch sooner by starting
less work must not make the second one wait: the step is where prefetching hides it.

``--cold``: each process a node's first job, with an empty folder of its own as
``SIMSTORE_VERIFIED_DIR`` (no shard hash records, no decoded manifest rows); otherwise
the processes share the environment's folder, and all but the first find it filled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

from benchmarks.bench_ingest import TREE_IMPORTS, run_child

_CHILD = r"""
import json, os, sys, time
args = json.loads(sys.argv[1])
tree = args["tree"]
""" + TREE_IMPORTS + r"""
import simstore
import simstore.loaders
assert (not tree) or simstore.__file__.startswith(tree), simstore.__file__
from simstore.catalog import Catalog
from simstore.loaders import SimDataLoader, SimDataset
from simstore.storage import LocalStore

store, name, workers = args["store"], args["dataset"], args["workers"]
ref = f"{name}@{Catalog(LocalStore(store)).resolve(name)}"
step = args["step_ms"] / 1000
t0 = time.perf_counter()
ds = SimDataset(store, ref, shuffle=True, seed=0)
dl = SimDataLoader(ds, batch_size=args["batch"], num_workers=workers,
                   multiprocessing_context="fork" if workers else None)
it = iter(dl)
next(it)
first = time.perf_counter() - t0
waits = []
for _ in range(4):
    time.sleep(step)
    t = time.perf_counter()
    next(it)
    waits.append(time.perf_counter() - t)
print(json.dumps({"first": first, "second": waits[0], "fifth": waits[3]}))
"""


def _run(tree: str, args: argparse.Namespace) -> dict[str, float]:
    spec = {"tree": "" if tree == "installed" else os.path.abspath(tree), "store": args.store,
            "dataset": args.dataset, "batch": args.batch, "workers": args.workers,
            "step_ms": args.step_ms}
    if not args.cold:
        result: dict[str, float] = run_child(_CHILD, spec, what=f"first batch with {tree}")
        return result
    node = tempfile.mkdtemp(prefix="simstore-node-")
    try:
        env = dict(os.environ, SIMSTORE_VERIFIED_DIR=node)
        result = run_child(_CHILD, spec, what=f"first batch with {tree}", env=env)
    finally:
        shutil.rmtree(node, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--cold", action="store_true",
                   help="each process with an empty node folder (a node's first job)")
    args = p.parse_args(argv)
    got: dict[str, dict[str, list[float]]] = {
        t: {"first": [], "second": [], "fifth": []} for t in args.trees}
    for r in range(args.rounds):
        for tree in args.trees if r % 2 == 0 else args.trees[::-1]:
            for key, value in _run(tree, args).items():
                got[tree][key].append(value * 1000)
    for tree in args.trees:
        for key, xs in got[tree].items():
            xs = sorted(xs)
            n = len(xs)
            print(f"{tree}: {key} batch {statistics.median(xs):.1f} ms "
                  f"(quartiles {xs[n // 4]:.1f}-{xs[(3 * n) // 4]:.1f}, min {xs[0]:.1f})")


if __name__ == "__main__":
    main()
