"""Dask engine benchmark: throughput with 1 and 2 dask workers against the local engine.

    python benchmarks/bench_dask.py [--quick] [--out results.json] [--workdir DIR]

1. Throughput: the same .npz folder (smooth float32 fields, as in bench_ingest.py) into
   uncompressed Parquet shards of 32 MiB on a LocalStore with fsync off, by the local
   engine (1 process, and a pool of 2) and by the dask engine on LocalClusters of 1 and 2
   worker processes (one thread each) bound to 127.0.0.1. The clusters are started and
   warmed before the timed runs (their start-up is reported apart), as an ingest against
   a running cluster (``--address``) would see them. The four engines take turns, run
   after run, so a change in the machine's load falls on all of them; each figure is the
   median of its runs. Every run writes a fresh store with the journal off, and every run
   must give the same content hash. Besides wall-clock MiB/s, each row gives the share of
   worker time spent inside tasks and the MiB per second of task time (one worker's speed
   while it works), which a busy machine disturbs less.
2. Driver memory per sample: dask ingests of 20,000 and 100,000 tiny samples (HDF5 runs cut
   into one-step windows); the growth of the driver's peak resident memory between the
   two, per sample. This is what scale.md's driver arithmetic multiplies.
3. Driver memory per source file (``--only files``): local ingests (one worker) of 10,000
   and 50,000 one-sample .npz files, in fresh driver processes; the growth of the peak
   between the two, per file: what a file's result costs the driver until it stages.

The machine is shared: throughput figures are medians of repeated, interleaved runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import make_npz  # noqa: E402  (sources shared with the ingest benchmark)

MiB = 1 << 20


def _ingest(src: Path, store_dir: Path, **options: Any) -> tuple[float, Any, str]:
    from simstore.catalog import Catalog
    from simstore.ingest import ingest
    from simstore.storage import LocalStore

    shutil.rmtree(store_dir, ignore_errors=True)
    cat = Catalog.init(LocalStore(str(store_dir), fsync=False))
    os.sync()  # no run pays for its predecessor's write-back
    t0 = time.perf_counter()
    result = ingest([src], dataset="bench", store=cat, resume=False, snapshot=True, **options)
    seconds = time.perf_counter() - t0
    content = cat.snapshot(result.snapshot_id).content_hash
    shutil.rmtree(store_dir, ignore_errors=True)
    return seconds, result, content


def _cluster(workers: int) -> Any:
    """The LocalCluster an ingest without an address starts (loopback, no dashboard)."""
    import distributed

    from simstore.ingest._dask import _local_cluster

    return _local_cluster(distributed, workers)


def throughput(work: Path, quick: bool, reps: int) -> dict[str, Any]:
    files, t, n = (8, 16, 256) if quick else (24, 16, 512)
    src = work / "npz"
    size = make_npz(src, files, t, n)
    warm = work / "warm-npz"
    make_npz(warm, 1, 2, 64)
    opts = {"format": "parquet", "compression": "none", "shard_size": 32 * MiB}
    contents: set[str] = set()
    starts = {}
    with contextlib.ExitStack() as stack:
        addresses = {}
        for workers in (1, 2):
            t0 = time.perf_counter()
            cluster = stack.enter_context(_cluster(workers))
            starts[workers] = time.perf_counter() - t0
            addresses[workers] = cluster.scheduler_address
            # untimed: a running cluster's workers have imported the libraries already
            _ingest(warm, work / "warm", engine="dask", address=cluster.scheduler_address)
        configs: list[tuple[str, int, dict[str, Any]]] = [
            ("local", 1, {}),
            ("local (process pool)", 2, {"workers": 2}),
            ("dask LocalCluster", 1, {"engine": "dask", "address": addresses[1]}),
            ("dask LocalCluster", 2, {"engine": "dask", "address": addresses[2]}),
        ]
        runs: list[list[tuple[float, Any]]] = [[] for _ in configs]
        # round robin, so a change in the machine's load falls on every engine alike
        for _ in range(reps):
            for i, (_, _, extra) in enumerate(configs):
                secs, result, content = _ingest(src, work / "store", **opts, **extra)
                runs[i].append((secs, result))
                contents.add(content)
    rows: list[dict[str, Any]] = []
    for (label, n_workers, _), measured in zip(configs, runs, strict=True):
        secs, result = sorted(measured, key=lambda r: r[0])[len(measured) // 2]  # median run
        task_s = sum(t.seconds for t in result.tasks)
        rows.append(
            {
                "engine": label,
                "workers": n_workers,
                "workers_used": result.workers,
                "tasks": len(result.tasks),
                "mib": size / MiB,
                "seconds": secs,
                "mib_s": size / MiB / secs,
                "runs_mib_s": [size / MiB / s for s, _ in measured],
                # time inside tasks / (wall time x workers): what the engine's overhead
                # and idle workers leave of the machine
                "task_share": task_s / (secs * n_workers),
                # MiB per second of task time: one worker's speed while it runs a task,
                # whatever the engine; steadier than wall-clock figures on a shared machine
                "task_mib_s": size / MiB / task_s,
            }
        )
    base = rows[0]["mib_s"]
    for r in rows:
        r["vs_local_1"] = r["mib_s"] / base
    return {
        "source": f"{files} .npz runs, {size / MiB:.0f} MiB",
        "rows": rows,
        "cluster_start_s": starts,
        "same_content": len(contents) == 1,
    }


_DRIVER = r"""
import json, sys
sys.path.insert(0, {bench!r})
from bench_dask import _ingest
from pathlib import Path
opts = {opts}
_ingest(Path({warm!r}), Path({store!r}), **opts)  # loads every module the run needs


def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024


before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak resident memory (VmHWM) to the current level
secs, result, _ = _ingest(Path({src!r}), Path({store!r}), **opts)
print(json.dumps({{"samples": result.samples, "seconds": secs, "before": before,
                  "peak": status("VmHWM:")}}))
"""


def _driver_run(opts: dict[str, Any], warm: Path, src: Path, store: Path) -> dict[str, Any]:
    """One measured ingest of ``src`` in a fresh driver process (after a warm-up of ``warm``)."""
    code = _DRIVER.format(bench=str(Path(__file__).resolve().parent), opts=repr(opts),
                          warm=str(warm), src=str(src), store=str(store))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the driver process failed: {done.stderr.strip()[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _tiny_runs(folder: Path, samples: int) -> None:
    """Four HDF5 runs of ``samples`` one-step windows in all: many samples, few bytes."""
    import h5py

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(4):
        with h5py.File(folder / f"run{i}.h5", "w") as f:
            f["time"] = np.arange(samples // 4, dtype=np.float64)
            f["u"] = np.random.default_rng(i).standard_normal((samples // 4, 4)).astype("f4")


def driver_memory(work: Path, quick: bool) -> dict[str, Any]:
    """Peak driver memory of dask ingests of two sizes: the slope is the cost per sample.

    Each ingest runs in a fresh driver process (so no run reuses memory an earlier one
    freed), against one 2-worker LocalCluster.
    """
    sizes = (5_000, 20_000) if quick else (20_000, 100_000)
    out: dict[str, Any] = {"runs": []}
    _tiny_runs(work / "warm-src", 256)
    with _cluster(2) as cluster:
        for n in sizes:
            _tiny_runs(work / "tiny", n)
            opts = {"time_window": 1, "shard_size": 1 << 20, "engine": "dask",
                    "address": cluster.scheduler_address}
            run = _driver_run(opts, work / "warm-src", work / "tiny", work / "mem")
            out["runs"].append(
                {
                    "samples": run["samples"],
                    "seconds": run["seconds"],
                    "samples_per_s": run["samples"] / run["seconds"],
                    "driver_rss_before_mib": run["before"] / MiB,
                    "driver_peak_above_mib": (run["peak"] - run["before"]) / MiB,
                }
            )
    a, b = out["runs"]
    grown = (b["driver_peak_above_mib"] - a["driver_peak_above_mib"]) * MiB
    out["driver_bytes_per_sample"] = grown / (b["samples"] - a["samples"])
    return out


def _small_files(folder: Path, files: int) -> None:
    """``files`` .npz files of one small sample each (three fields, as a parameter sweep)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        np.savez(
            folder / f"run{i:06d}.npz",
            velocity=rng.random((16, 3), dtype=np.float32),
            pressure=rng.random(16, dtype=np.float32),
            re=np.float64(i),
        )


def driver_memory_files(work: Path, quick: bool) -> dict[str, Any]:
    """Peak driver memory of local one-worker ingests of two counts of one-sample files.

    The slope between the two is what the driver keeps per source file (its result's
    rows, schema, statistics and versions) until it stages the run.
    """
    sizes = (2_000, 10_000) if quick else (10_000, 50_000)
    out: dict[str, Any] = {"runs": []}
    _small_files(work / "warm-files", 64)
    for n in sizes:
        _small_files(work / "files", n)
        opts = {"shard_size": 32 << 20, "workers": 1}
        run = _driver_run(opts, work / "warm-files", work / "files", work / "mem")
        out["runs"].append(
            {
                "files": n,
                "samples": run["samples"],
                "seconds": run["seconds"],
                "ms_per_file": 1000 * run["seconds"] / n,
                "driver_rss_before_mib": run["before"] / MiB,
                "driver_peak_above_mib": (run["peak"] - run["before"]) / MiB,
            }
        )
    shutil.rmtree(work / "files", ignore_errors=True)
    a, b = out["runs"]
    grown = (b["driver_peak_above_mib"] - a["driver_peak_above_mib"]) * MiB
    out["driver_bytes_per_file"] = grown / (b["files"] - a["files"])
    return out


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--only", choices=["throughput", "memory", "files"], default=None)
    args = ap.parse_args()
    reps = 1 if args.quick else 5
    work = Path(args.workdir or tempfile.mkdtemp(prefix="simstore-bench-dask-"))
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "load_before": os.getloadavg(),
    }
    try:
        if args.only in (None, "throughput"):
            results["throughput"] = tp = throughput(work, args.quick, reps)
            print(f"## Throughput ({tp['source']}; same content: {tp['same_content']})\n")
            cols = ["engine", "workers", "workers_used", "tasks", "mib_s", "vs_local_1"]
            print(table(tp["rows"], cols + ["task_share", "task_mib_s"]))
            print(f"\nLocalCluster start (s): {tp['cluster_start_s']}")
        if args.only in (None, "memory"):
            results["driver_memory"] = mem = driver_memory(work, args.quick)
            print("\n## Driver memory (dask engine)\n")
            print(json.dumps(mem, indent=2))
        if args.only in (None, "files"):
            results["driver_memory_files"] = mem = driver_memory_files(work, args.quick)
            print("\n## Driver memory per source file (local engine)\n")
            print(json.dumps(mem, indent=2))
    finally:
        results["load_after"] = os.getloadavg()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
