"""Where a one-process ingest's wall time goes, thread by thread.

    python -m benchmarks.ingest_timeline SRC [--format zarr] [--shard-size 32MiB]
        [--time-window 4 --stride 4] [--runs 3] [--store DIR]

Each run ingests SRC (``workers=1``, compression none, fsync off) into a fresh local
store in this process, with the worker's steps wrapped in timers that record each span's
start, end and thread CPU: the source hashes taken at a file's turn, the adapter's reads,
the sample hashes and statistics, the reading thread's waits for the writer thread (which
now take the next file's hash ahead), and the writer thread's adds. It prints, per run,
the wall time, each step's total wall and CPU seconds and count, the time before the
first file and after the last, and the process's CPU. Make the benchmark's HDF5 sources
with ``python -c "from pathlib import Path; from benchmarks.bench_ingest import make_h5;
make_h5(Path('DIR'), 6, 64, 512)"``. The first run of a process also pays imports and
first-touch costs: read the later ones.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any


def timed_reads(
    resolve: Callable[..., Any], record: Callable[[float, float], None]
) -> Callable[..., Any]:
    """``resolve_adapter`` whose adapters time each sample's read.

    ``record(wall_start, thread_cpu_start)`` runs on the reading thread as each read (the
    adapter's ``next``) ends; ``bench_ingest``'s phases table times its reads with it too.
    """

    def resolve_timed(*a: Any, **k: Any) -> Any:
        adapter = resolve(*a, **k)
        if adapter is None:
            return None
        read = adapter.iter_samples

        class Timed:
            name, version = adapter.name, adapter.version
            stores_source = getattr(adapter, "stores_source", False)

            def iter_samples(self, *a: Any, **k: Any) -> Any:
                it = read(*a, **k)
                while True:
                    t0, c0 = time.perf_counter(), time.thread_time()
                    try:
                        sample = next(it)
                    except StopIteration:
                        return
                    finally:
                        record(t0, c0)
                    yield sample

        return Timed()

    return resolve_timed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("--format", default="zarr", choices=["parquet", "zarr", "lance"])
    p.add_argument("--shard-size", default="32MiB")
    p.add_argument("--time-window", type=int, default=4)
    p.add_argument("--stride", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--store", default=None, help="scratch store folder (default: a temp dir)")
    args = p.parse_args(argv)

    import simstore.ingest._worker as worker
    from simstore._sizes import parse_size
    from simstore.catalog import Catalog
    from simstore.ingest import ingest
    from simstore.storage import LocalStore

    spans: list[tuple[str, float, float, float]] = []
    now = time.perf_counter

    def timed(fn: Any, label: str) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t0, c0 = now(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                spans.append((label, t0, now(), time.thread_time() - c0))

        return run

    worker.hash_source = timed(worker.hash_source, "source hash at its turn")
    worker.hash_sample_blocks = timed(worker.hash_sample_blocks, "sample hash + statistics")
    worker.TaskRunner._settle = timed(worker.TaskRunner._settle,
                                      "waits for the writer (hashing ahead)")
    worker._add = timed(worker._add, "writer thread: adds")
    worker.resolve_adapter = timed_reads(
        worker.resolve_adapter,
        lambda t0, c0: spans.append(("adapter reads", t0, now(), time.thread_time() - c0)),
    )
    store = args.store or tempfile.mkdtemp(prefix="simstore-timeline-")
    opts = {"time_window": args.time_window, "stride": args.stride} if args.time_window else {}
    try:
        for run in range(args.runs):
            spans.clear()
            shutil.rmtree(store, ignore_errors=True)
            cat = Catalog.init(LocalStore(store, fsync=False))
            os.sync()
            t0, c0 = now(), time.process_time()
            ingest([args.src], dataset="timeline", store=cat, resume=False, workers=1,
                   format=args.format, compression="none",
                   shard_size=parse_size(args.shard_size), progress=None, **opts)
            t1 = now()
            totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
            for label, a, b, cpu in spans:
                totals[label][0] += 1
                totals[label][1] += b - a
                totals[label][2] += cpu
            first = min((a for _, a, _, _ in spans), default=t0)
            last = max((b for _, _, b, _ in spans), default=t1)
            print(f"run {run + 1}: {t1 - t0:.3f} s wall, {time.process_time() - c0:.3f} CPU-s "
                  f"(threads: {threading.active_count()}); before the first span "
                  f"{first - t0:.3f} s, after the last {t1 - last:.3f} s")
            for label, (n, wall, cpu) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
                print(f"  {label:40s} {wall:7.3f} s wall {cpu:7.3f} CPU-s  x{int(n)}")
    finally:
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
