"""Where a DataLoader worker's first batch spends its time, in one process per run.

    python -m benchmarks.ttfb_trace --store PATH --dataset NAME [--batch 8] [--workers 1]
        [--runs 5]

Each run builds a fresh ``SimDataset`` and ``SimDataLoader`` (fork workers) and prints, in
seconds from building them: when worker 0's init ran, when its batch stream yielded its
first batch, when the thread of torch's queue pickled that batch, when the main process
had it, and when its tensors had been touched once per 4 KiB page. "in the worker" is init
to first yield; "handover" is the worker's yield to the main process holding the batch,
split into "to pickling" (the sending thread waiting for the interpreter and a core) and
the rest (the pipe, unpickling, the arena views). Medians over the runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)

    import multiprocessing

    import simstore.loaders._streams as loader_mod
    from simstore.loaders import SimDataLoader, SimDataset

    from benchmarks.suite.runner import touch_pages

    marks = multiprocessing.get_context("fork").Array("d", 3)  # init, first yield, pickled
    plain = loader_mod._BatchStream._items
    reduce = loader_mod._Tagged.__reduce__

    def pickled(self):  # type: ignore[no-untyped-def]
        if self.tag.worker == 0 and not marks[2]:
            marks[2] = time.time()
        return reduce(self)

    loader_mod._Tagged.__reduce__ = pickled  # type: ignore[method-assign]

    def traced(self):  # type: ignore[no-untyped-def]
        first = loader_mod.worker_context()[0] == 0
        for batch in plain(self):
            if first:
                marks[1] = time.time()
                first = False
            yield batch

    loader_mod._BatchStream._items = traced  # type: ignore[method-assign]

    def init(worker: int) -> None:
        if worker == 0:
            marks[0] = time.time()

    rows = []
    for seed in range(args.runs):
        marks[2] = 0.0
        t0 = time.time()
        ds = SimDataset(os.path.abspath(args.store), args.dataset, shuffle=True, seed=seed)
        loader = SimDataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                               multiprocessing_context="fork", worker_init_fn=init)
        it = iter(loader)
        batch = next(it)
        t_main = time.time()
        touch_pages(batch)
        t_touched = time.time()
        rows.append((marks[0] - t0, marks[1] - t0, marks[2] - t0, t_main - t0,
                     t_touched - t0, marks[2] - marks[1]))
        del it, loader, ds, batch
    med = [statistics.median(r[i] for r in rows) for i in range(6)]
    print(f"{args.dataset}, {args.workers} worker(s), median of {args.runs} runs: worker init "
          f"{med[0]:.3f} s, first yield {med[1]:.3f} s, pickled {med[2]:.3f} s, in the main "
          f"process {med[3]:.3f} s, touched {med[4]:.3f} s; in the worker "
          f"{med[1] - med[0]:.3f} s, handover {med[3] - med[1]:.3f} s (to pickling "
          f"{med[5] * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
