"""How long stopping a loader's workers mid-epoch takes: SimDataLoader against torch's own.

    python -m benchmarks.stop_workers --store PATH --dataset NAME [--batch 4]
        [--workers 2] [--context spawn] [--rounds 5] [--after 10]

What a job pays when it leaves an epoch early: a ``break``, an error, or the save and exit
of a preemption, inside the scheduler's grace period (Slurm's default: 30 s). Each round
starts a ``SimDataLoader`` over the dataset and a plain ``torch.utils.data.DataLoader``
over an iterable of zero tensors of the same batch shape, with the same workers, takes
``--after`` batches from each, drops the iterator and times until its workers are
stopped (the iterator's shutdown). Medians over rounds, and of the per-round ratios
(SimDataLoader / torch: below 1 means simstore's stop is the quicker).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset


class _Zeros(IterableDataset):  # type: ignore[type-arg]
    """Batches of zeros shaped like the dataset's first sample's tensors."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes

    def __iter__(self) -> Any:
        while True:
            yield {k: torch.zeros(s) for k, s in self.shapes.items()}


def _stop_s(loader: Any, after: int) -> float:
    it = iter(loader)
    for _ in range(after):
        next(it)
    began = time.perf_counter()
    del it
    gc.collect()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> None:
    from simstore.loaders import SimDataLoader, SimDataset

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--context", choices=["fork", "spawn", "forkserver"], default="spawn")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--after", type=int, default=10, help="batches taken before the stop")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers: stopping workers needs at least one")
    first = next(iter(SimDataset(args.store, args.dataset, shuffle=False)))
    shapes = {k: tuple(v.shape) for k, v in first.items() if isinstance(v, torch.Tensor)}
    ours, theirs, ratios = [], [], []
    for _ in range(args.rounds):
        sim = SimDataLoader(SimDataset(args.store, args.dataset, seed=3),
                            batch_size=args.batch, num_workers=args.workers,
                            multiprocessing_context=args.context)
        plain = DataLoader(_Zeros(shapes), batch_size=args.batch, num_workers=args.workers,
                           multiprocessing_context=args.context)
        a, b = _stop_s(sim, args.after), _stop_s(plain, args.after)
        ours.append(a)
        theirs.append(b)
        ratios.append(a / b)
    print(f"{args.dataset}, {args.workers} {args.context} workers: stop "
          f"{statistics.median(theirs):.3f} s (torch) -> {statistics.median(ours):.3f} s "
          f"(simstore), x{statistics.median(ratios):.2f} "
          f"(rounds x{min(ratios):.2f}-x{max(ratios):.2f})")


if __name__ == "__main__":
    main()
