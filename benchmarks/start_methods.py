"""Time to first batch and epoch time of fresh DataLoader workers, per start method.

    python -m benchmarks.start_methods STORE DATASET [--methods spawn forkserver fork]
        [--batch 8] [--workers 2] [--epochs 4] [--setup 0 2] [--rounds 3]
        [--baseline TREE]

Each round runs one fresh process per (start method, setup) pair, in turn; a process
makes a ``SimDataset`` and a ``SimDataLoader`` whose workers start afresh each epoch (not
persistent), waits ``--setup`` seconds (the work a training script does between making
its loader and its first ``iter()``: building the model, say), then reads ``--epochs``
shuffled epochs (``set_epoch``), touching every batch's tensors once per 4 KiB page.
Prints, per pair, the medians over rounds of the first epoch's time to first batch and
of the later epochs' (each from its own ``iter()``), and of their epoch times. With
``--baseline TREE`` (a checkout of an earlier revision) each pair runs with that tree's
loader too, right after this tree's, in every round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from benchmarks.bench_ingest import link_tree, run_child

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, time

def main():
    args = json.loads(sys.argv[1])
    from benchmarks.suite.runner import touch_pages
    from simstore.loaders import SimDataLoader, SimDataset

    ds = SimDataset(args["store"], args["dataset"], shuffle=True, seed=0)
    loader = SimDataLoader(ds, batch_size=args["batch"], num_workers=args["workers"],
                           multiprocessing_context=args["method"])
    time.sleep(args["setup"])
    out = []
    for epoch in range(args["epochs"]):
        ds.set_epoch(epoch)
        t = time.perf_counter()
        first = None
        for batch in loader:
            touch_pages(batch)
            if first is None:
                first = time.perf_counter() - t
        out.append([first, time.perf_counter() - t])
    import simstore.loaders
    print(json.dumps({"epochs": out, "loader": simstore.loaders.__file__}))

if __name__ == "__main__":
    main()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("dataset")
    p.add_argument("--methods", nargs="+", default=["spawn", "forkserver", "fork"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--setup", type=float, nargs="+", default=[0.0, 2.0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", metavar="TREE")
    args = p.parse_args()
    if args.epochs < 2:
        raise SystemExit("--epochs must be at least 2 (the first epoch and later ones)")
    trees = {"this tree": _ROOT}
    if args.baseline:
        trees["baseline"] = os.path.abspath(args.baseline)
        link_tree(trees["baseline"])  # its workers import its own loader, as its process
    runs = [(t, m, s) for m in args.methods for s in args.setup for t in trees]
    got: dict[tuple[str, str, float], list[list[list[float]]]] = {run: [] for run in runs}
    for r in range(args.rounds):
        for tree, method, setup in runs:
            child = {"store": args.store, "dataset": args.dataset, "batch": args.batch,
                     "workers": args.workers, "epochs": args.epochs, "method": method,
                     "setup": setup}
            # run in the tree and with it first on the path, for this process and every
            # worker it starts (a ``-c`` process looks in its folder first); ``-c``: a file
            # of its own would be imported by spawn and the fork server as the main module
            env = {**os.environ, "PYTHONPATH": trees[tree]}
            result = run_child(_CHILD, child, cwd=trees[tree], env=env,
                               what=f"{method} with {tree}")
            if not result["loader"].startswith(trees[tree] + os.sep):
                raise SystemExit(f"{tree}: the process read with {result['loader']}")
            got[(tree, method, setup)].append(result["epochs"])
        print(f"round {r + 1} done", file=sys.stderr, flush=True)
    for (tree, method, setup), rounds in got.items():
        first = statistics.median(e[0][0] for e in rounds)
        first_epoch = statistics.median(e[0][1] for e in rounds)
        later = statistics.median(x[0] for e in rounds for x in e[1:])
        later_epoch = statistics.median(x[1] for e in rounds for x in e[1:])
        print(f"{method:10s} setup {setup:.1f} s, {tree:9s}: first batch {first:.3f} s "
              f"(epoch {first_epoch:.3f}), later epochs' first batch {later:.3f} s (epoch "
              f"{later_epoch:.3f})")


if __name__ == "__main__":
    main()
