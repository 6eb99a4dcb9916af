"""This tree's loader against another revision's, on the same store, side by side.

    python -m benchmarks.ab_epochs --baseline TREE --store PATH --dataset NAME \
        [--baseline-store PATH] [--batch 8] [--workers 0 2] [--epochs 5] [--rounds 3]

``TREE`` is a checkout of an earlier revision (``git worktree add /tmp/before REV``);
``PATH`` a store written by either (the benchmark suite's, for instance
``.bench/systems/simstore-zarr/large-96-v1``). Each round runs, for each worker count,
one fresh process per tree, back to back; a process reads ``--epochs`` shuffled epochs
(new seeds) with ``SimDataLoader``, touching every batch's tensors once per 4 KiB page, and
reports the median epoch time and time to first batch. The figures are the medians over
rounds of each tree's time and of the per-round ratios (before / after: above 1 means this
tree is faster), so a noisy machine moves both trees alike, and the range of the ratios.
On this shared 2-core machine one fresh epoch per process needs a dozen rounds: with 5,
two runs of the same pair of trees gave x0.90 and x1.11.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.bench_ingest import TREE_IMPORTS

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUN = r"""
import json, os, sys, time
args = json.loads(sys.argv[1])
tree = args["tree"]
""" + TREE_IMPORTS + r"""import simstore.loaders
from benchmarks.suite.runner import touch_pages
from simstore.loaders import SimDataLoader, SimDataset
assert (not tree) or simstore.loaders.__file__.startswith(tree), simstore.loaders.__file__
w = args["workers"]
epochs, firsts = [], []
for seed in range(args["epochs"]):
    t0 = time.perf_counter()
    ds = SimDataset(args["store"], args["dataset"], shuffle=True, seed=seed)
    loader = SimDataLoader(ds, batch_size=args["batch"], num_workers=w,
                           multiprocessing_context="fork" if w else None)
    it = iter(loader)
    first = True
    for batch in it:
        if first:
            firsts.append(time.perf_counter() - t0)
            first = False
        touch_pages(batch)
    epochs.append(time.perf_counter() - t0)
    del it, loader, ds
epochs.sort(); firsts.sort()
print(json.dumps({"epoch_s": epochs[len(epochs) // 2], "ttfb_s": firsts[len(firsts) // 2]}))
"""


def _one(tree: str, store: str, args: argparse.Namespace, workers: int) -> dict[str, float]:
    spec = {"tree": tree, "store": os.path.abspath(store), "dataset": args.dataset,
            "batch": args.batch, "workers": workers, "epochs": args.epochs}
    out = subprocess.run([sys.executable, "-c", _RUN, json.dumps(spec)], cwd=_ROOT,
                         check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="checkout of the earlier revision")
    p.add_argument("--store", required=True)
    p.add_argument("--baseline-store", default=None,
                   help="the store the baseline reads (default --store): for a change of "
                        "what ingest writes, each tree reads what its own ingest wrote")
    p.add_argument("--dataset", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    trees = {"before": os.path.abspath(args.baseline), "after": ""}
    stores = {"before": args.baseline_store or args.store, "after": args.store}
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for w in args.workers:
            for name, tree in trees.items():
                runs.setdefault((w, name), []).append(_one(tree, stores[name], args, w))
    for w in args.workers:
        before, after = runs[(w, "before")], runs[(w, "after")]
        line = [f"{args.dataset}, {w} workers:"]
        for key in ("epoch_s", "ttfb_s"):
            b = statistics.median(r[key] for r in before)
            a = statistics.median(r[key] for r in after)
            ratios = sorted(x[key] / y[key] for x, y in zip(before, after, strict=True))
            line.append(f"{key} {b:.3f} -> {a:.3f} (x{statistics.median(ratios):.2f}, "
                        f"rounds x{ratios[0]:.2f}-x{ratios[-1]:.2f})")
        print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
