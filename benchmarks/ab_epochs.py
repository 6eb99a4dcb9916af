"""This tree's loader against another revision's, on the same store, side by side.

    python -m benchmarks.ab_epochs --baseline TREE --store PATH --dataset NAME \
        [--baseline-store PATH] [--batch 8] [--workers 0 2] [--epochs 5] [--rounds 3]
        [--tier local|s3-warm] [--one-loader] [--context fork|spawn|forkserver]
        [--persistent]

``TREE`` is a checkout of an earlier revision (``git worktree add /tmp/before REV``);
``PATH`` a store written by either (the benchmark suite's, for instance
``.bench/systems/simstore-zarr/large-96-v1``). Each round runs, for each worker count,
one fresh process per tree, back to back; a process reads ``--epochs`` shuffled epochs
(new seeds) with ``SimDataLoader``, touching every batch's tensors once per 4 KiB page, and
reports the median epoch time, time to first batch and time to build the ``SimDataset``
(all three from the start of that build); with ``--one-loader``, one dataset and loader
read every epoch (``set_epoch``), as a training job does, and the epoch and first-batch
figures are of the epochs after the first (from the start of each epoch). The figures
are the medians over rounds of each tree's time and of the per-round ratios (before /
after: above 1 means this tree is faster), so a noisy machine moves both trees alike, and
the range of the ratios.
On this shared 2-core machine one fresh epoch per process needs a dozen rounds: with 5,
two runs of the same pair of trees gave x0.90 and x1.11.

``--tier s3-warm``: the store's objects are uploaded to a moto server started on
127.0.0.1 (``benchmarks.suite.s3``), and each tree reads them from there through a disk
cache of its own, filled by one untimed epoch first: a warm node, whose processes still
make their S3 client and read the ref (and, before the snapshot was cached, the snapshot).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile

from benchmarks.bench_ingest import TREE_IMPORTS, link_tree, run_child

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUN = r"""
import json, os, sys, time
args = json.loads(sys.argv[1])
tree = args["tree"]
""" + TREE_IMPORTS + r"""import simstore.loaders
if args["store"].startswith("s3://"):
    import simstore.storage._s3  # as the suite does: the S3 library is imported before the clock
from benchmarks.suite.runner import touch_pages
from simstore.loaders import SimDataLoader, SimDataset
assert (not tree) or simstore.loaders.__file__.startswith(tree), simstore.loaders.__file__
w = args["workers"]
epochs, firsts, builds = [], [], []
one = args["one_loader"]
for seed in range(args["epochs"]):
    t0 = time.perf_counter()
    if not one or seed == 0:
        ds = SimDataset(args["store"], args["dataset"], shuffle=True, seed=seed,
                        cache_dir=args["cache_dir"],
                        cache_limit="8GiB" if args["cache_dir"] else None)
        builds.append(time.perf_counter() - t0)
        loader = SimDataLoader(ds, batch_size=args["batch"], num_workers=w,
                               multiprocessing_context=args.get("context", "fork") if w else None,
                               **({"persistent_workers": True} if args.get("persistent") else {}))
    else:
        ds.set_epoch(seed)
    it = iter(loader)
    first = True
    for batch in it:
        if first:
            firsts.append(time.perf_counter() - t0)
            first = False
        touch_pages(batch)
    epochs.append(time.perf_counter() - t0)
    del it
    if not one:
        del loader, ds
if one and len(epochs) > 1:  # the later epochs of one loader: what a training job repeats
    epochs, firsts = epochs[1:], firsts[1:]
epochs.sort(); firsts.sort(); builds.sort()
print(json.dumps({"epoch_s": epochs[len(epochs) // 2], "ttfb_s": firsts[len(firsts) // 2],
                  "dataset_s": builds[len(builds) // 2]}))
"""


def _one(tree: str, store: str, args: argparse.Namespace, workers: int,
         cache_dir: str | None = None, env: dict[str, str] | None = None,
         epochs: int | None = None, persistent: bool = False,
         context: str = "fork") -> dict[str, float]:
    spec = {"tree": tree, "dataset": args.dataset, "batch": args.batch, "workers": workers,
            "epochs": epochs or args.epochs, "cache_dir": cache_dir,
            "one_loader": args.one_loader, "persistent": persistent, "context": context,
            "store": store if store.startswith("s3://") else os.path.abspath(store)}
    result: dict[str, float] = run_child(_RUN, spec, cwd=_ROOT, env=env,
                                         what=f"epochs with {tree or 'installed'}")
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
    p.add_argument("--tier", choices=["local", "s3-warm"], default="local")
    p.add_argument("--one-loader", action="store_true",
                   help="one dataset and loader per process, its epochs by set_epoch; the "
                        "figures are of the epochs after the first")
    p.add_argument("--context", choices=["fork", "spawn", "forkserver"], default="fork",
                   help="the workers' start method")
    p.add_argument("--persistent", action="store_true",
                   help="persistent_workers=True (with --one-loader: one set of workers "
                        "serves every epoch)")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        _compare(args, stack)


def _compare(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    trees = {"before": os.path.abspath(args.baseline), "after": ""}
    link_tree(trees["before"])  # its spawned workers import its own loader too
    stores = {"before": args.baseline_store or args.store, "after": args.store}
    caches: dict[str, str | None] = {"before": None, "after": None}
    env = None
    if args.tier == "s3-warm":
        from benchmarks.suite import s3

        endpoint = stack.enter_context(s3.moto())
        env = {**s3.client_env(endpoint), "PYTHONPATH": _ROOT}
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="simstore-ab-"))
        uploaded: dict[str, str] = {}
        for name in trees:
            if stores[name] not in uploaded:
                prefix = f"store-{len(uploaded)}"
                s3.upload_tree(endpoint, "simstore-ab", prefix, stores[name])
                uploaded[stores[name]] = f"s3://simstore-ab/{prefix}"
            stores[name] = uploaded[stores[name]]
            caches[name] = os.path.join(work, f"cache-{name}")
            _one(trees[name], stores[name], args, 0, caches[name], env, epochs=1)  # fill
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for w in args.workers:
            for name, tree in trees.items():
                runs.setdefault((w, name), []).append(
                    _one(tree, stores[name], args, w, caches[name], env,
                         persistent=args.persistent, context=args.context))
    for w in args.workers:
        before, after = runs[(w, "before")], runs[(w, "after")]
        line = [f"{args.dataset}, {w} workers:"]
        for key in ("epoch_s", "ttfb_s", "dataset_s"):
            b = statistics.median(r[key] for r in before)
            a = statistics.median(r[key] for r in after)
            ratios = sorted(x[key] / y[key] for x, y in zip(before, after, strict=True))
            line.append(f"{key} {b:.3f} -> {a:.3f} (x{statistics.median(ratios):.2f}, "
                        f"rounds x{ratios[0]:.2f}-x{ratios[-1]:.2f})")
        print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
