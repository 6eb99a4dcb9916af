"""Ingest benchmarks: throughput against a plain copy, peak RSS, codec ratio and read cost.

    python benchmarks/bench_ingest.py [--quick] [--out results.json] [--workdir DIR]

1. Throughput: .npz folders and HDF5 runs (time-windowed) into Parquet, Zarr and Lance,
   with 1 and 2 worker processes, against ``shutil.copyfile`` of the same source bytes
   (same disk, page cache warm). Before each timed run ``os.sync()`` flushes earlier
   writes, so no run pays for its predecessor's write-back. The store is a LocalStore
   with fsync off, like the copy; one extra row shows the default (fsync on).
2. Peak RSS of a child process ingesting sources several times larger than the memory
   budget (shard size + dense threshold + block size), against a child that only imports.
3. Codecs on smooth float32 fields: compression ratio, write and full-read MiB/s.

The machine is shared: every figure is the median of repeated runs, and ratios (ingest /
copy measured back to back) are steadier than absolute MiB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

MiB = 1 << 20


def smooth_fields(n: int, t: int, seed: int) -> np.ndarray:
    """[t, n, n] float32: a drifting, low-pass-filtered random field (temperature-like)."""
    rng = np.random.default_rng(seed)
    kx = np.fft.fftfreq(n)[:, None]
    ky = np.fft.rfftfreq(n)[None, :]
    filt = np.exp(-(kx**2 + ky**2) / (2 * 0.02**2))
    phase = rng.standard_normal((n, n // 2 + 1)) + 1j * rng.standard_normal((n, n // 2 + 1))
    out = np.empty((t, n, n), dtype=np.float32)
    for i in range(t):
        phase = phase * np.exp(1j * 0.1)
        f = np.fft.irfft2(phase * filt, s=(n, n))
        out[i] = (f / (f.std() + 1e-12) * 3 + 300).astype(np.float32)
    return out


def make_npz(root: Path, files: int, t: int, n: int) -> int:
    root.mkdir(parents=True, exist_ok=True)
    base = smooth_fields(n, t, 0)
    for i in range(files):
        np.savez(
            root / f"run{i:04d}.npz",
            temperature=base + np.float32(i),
            velocity=np.stack([base, -base], axis=-1)[: t // 2],
        )
    return sum(p.stat().st_size for p in root.iterdir())


def make_h5(root: Path, files: int, t: int, n: int) -> int:
    import h5py

    root.mkdir(parents=True, exist_ok=True)
    base = smooth_fields(n, t, 1)
    for i in range(files):
        with h5py.File(root / f"run{i:03d}.h5", "w") as f:
            f.attrs["Re"] = 100.0 + i
            f["time"] = np.arange(t, dtype=np.float64)
            f.create_dataset("density", data=base + np.float32(i), chunks=(1, n, n))
            f.create_dataset("pressure", data=base * 2, chunks=(1, n, n))
    return sum(p.stat().st_size for p in root.iterdir())


def copy_tree(src: Path, dst: Path, fsync: bool) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for p in sorted(src.iterdir()):
        shutil.copyfile(p, dst / p.name)
        if fsync:
            fd = os.open(dst / p.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        os.sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_ingest(src: Path, store_dir: Path, fsync: bool = False, **options) -> dict:
    from simstore.catalog import Catalog
    from simstore.ingest import ingest
    from simstore.storage import LocalStore

    shutil.rmtree(store_dir, ignore_errors=True)
    cat = Catalog.init(LocalStore(str(store_dir), fsync=fsync))
    result = ingest([src], dataset="bench", store=cat, resume=False, **options)
    return result.to_json()


def throughput(work: Path, quick: bool, reps: int) -> list[dict]:
    sources = {
        "npz": (work / "npz", make_npz(work / "npz", 8 if quick else 24, 16, 512), {}),
        "hdf5": (
            work / "h5",
            make_h5(work / "h5", 2 if quick else 6, 64, 512),
            {"time_window": 4, "stride": 4},
        ),
    }
    cases = [
        ("parquet", "none"),
        ("zarr", "none"),
        ("lance", "none"),
        ("parquet", "shuffle-zstd:1"),
        ("zarr", "shuffle-zstd:1"),
    ]
    rows = []
    for name, (src, size, opts) in sources.items():
        copy_s = timed(partial(copy_tree, src, work / "copy", False), reps)
        copy_fsync_s = timed(partial(copy_tree, src, work / "copy", True), reps)
        rows.append(
            {
                "source": name,
                "what": "copy",
                "workers": 1,
                "mib": size / MiB,
                "mib_s": size / MiB / copy_s,
                "ratio": 1.0,
            }
        )
        rows.append(
            {
                "source": name,
                "what": "copy+fsync",
                "workers": 1,
                "mib": size / MiB,
                "mib_s": size / MiB / copy_fsync_s,
                "ratio": copy_s / copy_fsync_s,
            }
        )
        for fmt, comp in cases:
            for workers in (1, 2):
                if quick and workers == 2 and comp != "none":
                    continue
                run = partial(
                    run_ingest,
                    src,
                    work / "store",
                    format=fmt,
                    compression=comp,
                    workers=workers,
                    shard_size=32 * MiB,
                    **opts,
                )
                secs = timed(run, reps)
                rows.append(
                    {
                        "source": name,
                        "what": f"{fmt} {comp}",
                        "workers": workers,
                        "mib": size / MiB,
                        "mib_s": size / MiB / secs,
                        "ratio": copy_s / secs,
                    }
                )
        run = partial(
            run_ingest,
            src,
            work / "store",
            fsync=True,
            format="parquet",
            compression="none",
            shard_size=32 * MiB,
            **opts,
        )
        secs = timed(run, reps)
        rows.append(
            {
                "source": name,
                "what": "parquet none, store fsync on",
                "workers": 1,
                "mib": size / MiB,
                "mib_s": size / MiB / secs,
                "ratio": copy_fsync_s / secs,
            }
        )
    return rows


_CHILD = r"""
import json, sys
from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import LocalStore
args = json.loads(sys.argv[1])
if args.get("src"):
    cat = Catalog.init(LocalStore(args["store"], fsync=False))
    ingest([args["src"]], dataset="rss", store=cat, resume=False, **args["options"])
else:
    import simstore.formats, h5py, pyarrow.parquet, zarr  # noqa: F401  imports only
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) * 1024)
"""


def child_rss(args: dict) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)], check=True, capture_output=True, text=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def peak_rss(work: Path, quick: bool) -> list[dict]:
    import h5py

    shard, dense, block = 32 * MiB, 16 * MiB, 4 * MiB
    budget = shard + dense + block
    big = work / "rss"
    shutil.rmtree(big, ignore_errors=True)
    big.mkdir(parents=True)
    n_rows = 256 if quick else 1024  # x 1 MiB rows
    arr = np.lib.format.open_memmap(
        big / "big.npy", mode="w+", dtype=np.float32, shape=(n_rows, 512, 512)
    )
    for i in range(0, n_rows, 64):
        arr[i : i + 64] = smooth_fields(512, 1, i)[0]
    del arr
    with h5py.File(big / "run.h5", "w") as f:
        d = f.create_dataset(
            "density", shape=(n_rows, 512, 512), dtype=np.float32, chunks=(1, 512, 512)
        )
        f["time"] = np.arange(n_rows, dtype=np.float64)
        for i in range(0, n_rows, 64):
            d[i : i + 64] = smooth_fields(512, 1, i)[0]
    base = child_rss({})
    options = {
        "shard_size": shard,
        "dense_threshold": dense,
        "block_bytes": block,
        "compression": "none",
    }
    rows = []
    for name, src, extra in [
        ("one .npy field, dense -> zarr", big / "big.npy", {}),
        ("HDF5 run, windows of 8 -> parquet", big / "run.h5", {"time_window": 8}),
    ]:
        rss = child_rss(
            {"src": str(src), "store": str(work / "rss-store"), "options": {**options, **extra}}
        )
        shutil.rmtree(work / "rss-store", ignore_errors=True)
        rows.append(
            {
                "case": name,
                "source_mib": src.stat().st_size / MiB,
                "budget_mib": budget / MiB,
                "peak_rss_mib": rss / MiB,
                "imports_only_rss_mib": base / MiB,
                "above_imports_mib": (rss - base) / MiB,
            }
        )
    return rows


def codecs(work: Path, quick: bool, reps: int) -> list[dict]:
    from simstore.formats import get_format

    from simstore.ingest import ShardOptions
    from simstore.sample import Sample

    field = smooth_fields(512, 8 if quick else 32, 7)
    samples = [Sample(f"s{i:03d}", {"temperature": field[i]}) for i in range(len(field))]
    logical = field.nbytes
    rows = []
    for fmt in ("parquet", "zarr", "lance"):
        for comp in ("none", "zstd:1", "zstd:3", "shuffle-zstd:1", "shuffle-zstd:3"):
            f = get_format(fmt, ShardOptions(compression=comp))
            path = str(work / f"codec.{fmt}")
            write_s = timed(partial(f.write, samples, path), reps)
            size = os.path.getsize(path)
            read_s = timed(partial(read_all, path, len(samples)), reps)
            rows.append(
                {
                    "format": fmt,
                    "compression": comp,
                    "ratio": logical / size,
                    "write_mib_s": logical / MiB / write_s,
                    "read_mib_s": logical / MiB / read_s,
                }
            )
    return rows


def read_all(path: str, n: int) -> None:
    from simstore.formats import open_shard

    reader = open_shard(path)
    for _ in reader.read(range(n)):
        pass
    reader.close()


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--only", choices=["throughput", "rss", "codecs"], default=None)
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    work = Path(args.workdir or tempfile.mkdtemp(prefix="simstore-bench-"))
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    try:
        if args.only in (None, "throughput"):
            results["throughput"] = throughput(work, args.quick, reps)
            print("## Throughput\n")
            print(
                table(results["throughput"], ["source", "what", "workers", "mib", "mib_s", "ratio"])
            )
        if args.only in (None, "rss"):
            results["peak_rss"] = peak_rss(work, args.quick)
            print("\n## Peak RSS\n")
            print(
                table(
                    results["peak_rss"],
                    [
                        "case",
                        "source_mib",
                        "budget_mib",
                        "peak_rss_mib",
                        "imports_only_rss_mib",
                        "above_imports_mib",
                    ],
                )
            )
        if args.only in (None, "codecs"):
            results["codecs"] = codecs(work, args.quick, reps)
            print("\n## Codecs (smooth float32 fields)\n")
            print(
                table(
                    results["codecs"],
                    ["format", "compression", "ratio", "write_mib_s", "read_mib_s"],
                )
            )
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
