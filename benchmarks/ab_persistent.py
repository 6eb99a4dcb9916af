"""Persistent DataLoader workers against fresh ones per epoch, side by side.

    python -m benchmarks.ab_persistent --store PATH --dataset NAME [--batch 8]
        [--workers 2] [--epochs 6] [--rounds 5] [--context fork|spawn]

Each round runs two fresh processes back to back, one per setting; each builds one
``SimDataset`` and one ``SimDataLoader`` (workers started by ``--context``) and reads
``--epochs`` shuffled epochs with ``set_epoch``, as a training job does, touching every
batch's tensors once per 4 KiB page (see :mod:`benchmarks.ab_epochs`, whose process
this is). The figures are of the epochs after the first, from the start of each epoch:
with ``persistent_workers=False`` that includes starting the workers, with ``True`` the
workers started with the first epoch serve the rest. Medians over rounds of each
setting's median epoch and first batch, and of the per-round ratios (fresh / persistent:
above 1 means persistent workers are faster).
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.ab_epochs import _one


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[2])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--context", choices=["fork", "spawn"], default="fork",
                   help="how workers start (a dataset with Lance shards spawns them)")
    args = p.parse_args(argv)
    if any(w < 1 for w in args.workers):
        p.error("--workers: persistent workers need at least one worker")
    args.one_loader = True
    for w in args.workers:
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for persistent in (False, True):
                runs[persistent].append(_one("", args.store, args, w, persistent=persistent,
                                             context=args.context))
        line = [f"{args.dataset}, {w} {args.context} workers, epochs after the first:"]
        for key in ("epoch_s", "ttfb_s"):
            fresh = statistics.median(r[key] for r in runs[False])
            kept = statistics.median(r[key] for r in runs[True])
            ratios = sorted(x[key] / y[key] for x, y in zip(runs[False], runs[True],
                                                            strict=True))
            line.append(f"{key} fresh {fresh:.4f} persistent {kept:.4f} "
                        f"(x{statistics.median(ratios):.2f}, rounds "
                        f"x{ratios[0]:.2f}-x{ratios[-1]:.2f})")
        print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
