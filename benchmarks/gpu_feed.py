"""Feed a CUDA device from SimDataLoader: pinned batches, non-blocking copies, a fake step.

    python -m benchmarks.gpu_feed [--store PATH --ref NAME --field NAME] [--samples 128]
                                  [--batch 8] [--workers 2] [--step-ms 20] [--epochs 1]
                                  [--persistent-workers] [--json FILE]

Without ``--store`` it writes a dataset of 4 MiB float32 samples to a temporary store
(Zarr shards). Each training step copies the batch to the device with
``non_blocking=True`` from pinned memory, runs matrix products sized to take about
``--step-ms`` on the device, and synchronises once per step through ``loss.item()``, as a
real loop that logs its loss does. It reports samples/s, host-to-device GiB/s (the copies'
own time, from CUDA events) and the data stall: the share of the loop's time spent waiting
for the next batch, as the loader's metrics count it (from each ``iter()``, which starts
the workers, to the epoch's last batch), and measured here around the loop (``..._loop``,
the same definition) and without each epoch's first batch (its wait includes starting the
workers). The field fed (``--field``, ``data`` in the generated store) is any numeric
tensor field. Without a CUDA device the copy is skipped and the step runs on the CPU
(``pin_memory`` needs a device), so the script still measures the loader and the stall.
With a device the workers are spawned (CUDA and fork do not mix), which costs each
epoch an interpreter start per worker unless ``--persistent-workers`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch
from simstore.loaders import SimDataLoader, SimDataset

MiB = 1 << 20
GiB = 1 << 30


def make_store(work: str, samples: int) -> tuple[str, str]:
    from benchmarks.bench_loader import build, float_samples

    store = os.path.join(work, "store")
    # Zarr, not Lance: Lance is not fork-safe once a process has used it (as this one has,
    # writing the shards), and the CPU run starts its workers with fork
    build(store, "feed", float_samples(samples, MiB), fmt="zarr", per_shard=16, workdir=work)
    return store, "feed"


def calibrate(device: torch.device, step_ms: float) -> tuple[torch.Tensor, int]:
    """A weight matrix and a repeat count whose products take about ``step_ms``."""
    w = torch.randn(1024, 1024, device=device)
    x = torch.randn(256, 1024, device=device)

    def run(n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        y = x
        for _ in range(n):
            y = torch.tanh(y @ w)
        float(y.sum().item())
        return (time.perf_counter() - t) * 1000

    run(2)
    per = max(run(10) / 10, 1e-3)
    return w, max(1, round(step_ms / per))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store")
    parser.add_argument("--ref")
    parser.add_argument("--field", default="data", help="the tensor field fed to the step")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--persistent-workers", action="store_true",
                        help="keep the workers from one epoch to the next")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="gpu-feed-")
    try:
        if args.store:
            store, ref = args.store, args.ref or "feed"
        else:
            store, ref = make_store(work, args.samples)
        cuda = torch.cuda.is_available()
        device = torch.device("cuda") if cuda else torch.device("cpu")
        w, repeats = calibrate(device, args.step_ms)
        ds = SimDataset(store, ref)
        # CUDA and fork do not mix; without a device, fork starts workers faster
        context = ("spawn" if cuda else "fork") if args.workers else None
        loader = SimDataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                               pin_memory=cuda, multiprocessing_context=context,
                               persistent_workers=bool(args.persistent_workers and args.workers))
        copied = 0
        copy_s = 0.0
        steps = 0
        first_waits: list[float] = []  # per epoch: iter() (the workers' start) to its first batch
        waits: list[float] = []  # the other batches'
        step_s = 0.0
        start = time.perf_counter()
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            batches = iter(loader)
            first = True
            while True:
                batch = next(batches, None)
                if batch is None:
                    break  # the epoch's end: no batch waited for
                (first_waits if first else waits).append(time.perf_counter() - t0)
                first = False
                t_step = time.perf_counter()
                if args.field not in batch or not isinstance(batch[args.field], torch.Tensor):
                    raise SystemExit(f"error: {ref} has no tensor field {args.field!r} in its "
                                     f"batches (fields: {sorted(batch)}); give --field")
                host = batch[args.field]
                if cuda:
                    begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                    begin.record()
                    x = host.to(device, non_blocking=True)
                    end.record()
                else:
                    x = host
                flat = x.reshape(-1).float()
                if flat.numel() < 1024:
                    flat = torch.nn.functional.pad(flat, (0, 1024 - flat.numel()))
                y = flat[: flat.numel() // 1024 * 1024].reshape(-1, 1024)[:256]
                for _ in range(repeats):
                    y = torch.tanh(y @ w)
                float(y.sum().item())  # the step ends: its loss is logged
                if cuda:
                    copy_s += begin.elapsed_time(end) / 1000
                copied += host.nbytes
                steps += 1
                t0 = time.perf_counter()
                step_s += t0 - t_step
        wall = time.perf_counter() - start
        stats = ds.stats()
        waited = sum(first_waits) + sum(waits)
        loop = waited / (waited + step_s) if steps else None
        steady = sum(waits) / (sum(waits) + step_s) if steps else None
        result: dict[str, Any] = {
            "device": torch.cuda.get_device_name(device) if cuda else "cpu (device part skipped)",
            "steps": steps,
            "step_ms_target": args.step_ms,
            "samples_per_s": stats["samples"] / wall if wall else 0.0,
            "mib_per_s": copied / MiB / wall if wall else 0.0,
            "h2d_gib_per_s": copied / GiB / copy_s if cuda and copy_s else None,
            "data_stall": stats["data_stall"],
            "data_stall_loop": loop,
            "data_stall_after_first_batch": steady,
            "first_batch_waits_s": [round(w, 4) for w in first_waits],
            "time_to_first_batch_s": stats["time_to_first_batch_s"],
            "workers": args.workers,
            "persistent_workers": bool(args.persistent_workers and args.workers),
            "batch": args.batch,
        }
        for key, value in result.items():
            print(f"{key}: {value}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
