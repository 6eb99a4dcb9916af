"""Ingest benchmarks: throughput against a plain copy, peak RSS, codec ratio and read cost.

    python -m benchmarks.bench_ingest [--quick] [--out results.json] [--workdir DIR]
        [--baseline TREE] [--reps N] [--cases LABELS] [--sources NAMES] [--scale K]
        [--only throughput|rss|codecs|phases]

1. Throughput: .npz folders, HDF5 runs (time-windowed), many small .npz files, NetCDF-4
   runs (time-windowed) and VTU meshes (``--sources`` picks some) into Parquet, Zarr and
   Lance, with 1 and 2 worker processes, against ``shutil.copyfile`` of
   the same source files (same disk, page cache warm, the target emptied before the
   clock). Every ingest runs in a fresh process that imports and opens its store before
   the clock, so each repetition times the ingest alone; ``os.sync()`` before every timed
   run flushes earlier writes. The store is a LocalStore with fsync off, like the copy;
   one extra row shows the default (fsync on) against a copy that fsyncs. ``cpu_s`` is
   the CPU time of the ingest and its worker processes. With ``--baseline TREE`` (a
   checkout of an earlier revision) every case also runs with that tree, right after the
   same case with this one: the ``before_`` columns.
2. Peak RSS of a child process ingesting sources several times larger than the memory
   budget (shard size + dense threshold + block size), against a child that only imports.
3. Codecs on smooth float32 fields: compression ratio, write and full-read MiB/s.
4. Phases (``--only phases``): the CPU seconds of each step of a 1-worker ingest (source
   hash, adapter read, sample hash and statistics, shard writer, shard hash, journal), in
   a warm process, for the cases of the throughput target.

The machine is shared: every figure is the median of repeated rounds, each round timing
the copy and every case back to back, and ratios (ingest / copy of the same round set) are
steadier than absolute MiB/s.
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
from typing import Any

import numpy as np

MiB = 1 << 20
_TREE = str(Path(__file__).resolve().parents[1])  # the source tree this benchmark belongs to


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


def make_netcdf(root: Path, files: int, t: int, n: int) -> int:
    """NetCDF-4 runs like the HDF5 ones: two [time, y, x] float32 variables, a time axis."""
    import netCDF4

    root.mkdir(parents=True, exist_ok=True)
    base = smooth_fields(n, t, 3)
    for i in range(files):
        with netCDF4.Dataset(root / f"run{i:03d}.nc", "w") as ds:
            ds.createDimension("time", t)
            ds.createDimension("y", n)
            ds.createDimension("x", n)
            ds.Re = 100.0 + i
            ds.createVariable("time", "f8", ("time",))[:] = np.arange(t, dtype=np.float64)
            for name, values in (("density", base + np.float32(i)), ("pressure", base * 2)):
                var = ds.createVariable(name, "f4", ("time", "y", "x"), chunksizes=(1, n, n))
                var[:] = values
    return sum(p.stat().st_size for p in root.iterdir())


def make_vtu(root: Path, files: int, points: int) -> int:
    """VTU meshes written by meshio: a triangulated surface of ``points`` points with a
    float32 point field and a cell field (meshio's default: zlib-compressed binary)."""
    import meshio

    root.mkdir(parents=True, exist_ok=True)
    side = int(np.sqrt(points))
    gy, gx = np.mgrid[0:side, 0:side]
    pts = np.stack([gx.ravel(), gy.ravel(), np.zeros(side * side)], axis=1).astype(np.float64)
    quad = (gy[:-1, :-1] * side + gx[:-1, :-1]).ravel()
    lower = np.stack([quad, quad + 1, quad + side], 1)
    upper = np.stack([quad + 1, quad + side + 1, quad + side], 1)
    tris = np.concatenate([lower, upper]).astype(np.int64)
    for i in range(files):
        z = smooth_fields(side, 1, 10 + i)[0].ravel()
        mesh = meshio.Mesh(
            pts + np.stack([0 * z, 0 * z, z / 100], axis=1),
            [("triangle", tris)],
            point_data={"pressure": z},
            cell_data={"id": [np.arange(len(tris), dtype=np.int32) + i]},
        )
        mesh.write(root / f"part{i:03d}.vtu")
    return sum(p.stat().st_size for p in root.iterdir())


def make_small(root: Path, files: int) -> int:
    """``files`` small .npz samples like the suite's small profile: [2, 32, 32] float32 + Re."""
    root.mkdir(parents=True, exist_ok=True)
    base = smooth_fields(32, 2, 2)
    for i in range(files):
        np.savez(root / f"s{i:06d}.npz", fields=base + np.float32(i), Re=np.float64(100.0 + i))
    return sum(p.stat().st_size for p in root.iterdir())


def copy_tree(src: Path, dst: Path, fsync: bool) -> float:
    """Seconds to copy every file of ``src`` into a fresh ``dst`` (emptied before the clock).

    Every timed writer here (this copy, each ingest in its child process) removes its own
    previous output just before its clock starts, so each writes into page-cache memory
    freed a moment before. That matters on a virtual machine that reports free memory to
    its host (virtio-balloon free page reporting, as on the build VM): memory free for
    more than about two seconds goes back to the host, and writing into it again costs a
    fault on the host per page. An ingest child that found its store removed by the parent
    before its imports (1-2 s) wrote into such memory after a copy that had not, and spent
    2-3.5 s of system time on 768 MiB instead of 0.5-0.8 s.
    """
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    os.sync()
    t0 = time.perf_counter()
    for p in sorted(src.iterdir()):
        shutil.copyfile(p, dst / p.name)
        if fsync:
            fd = os.open(dst / p.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return time.perf_counter() - t0


def timed(fn, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls, each after ``os.sync()``."""
    times = []
    for _ in range(reps):
        os.sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


TREE_IMPORTS = r"""
if tree:
    import importlib.abc, importlib.util
    sys.path.insert(0, tree)
    # the repository keeps simstore.formats, .cli and .loaders in top-level folders
    parts = {f"simstore.{n}": os.path.join(tree, n) for n in ("formats", "cli", "loaders")}

    class _Tree(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            where = parts.get(name)
            if where is None or not os.path.isdir(where):
                return None
            return importlib.util.spec_from_file_location(
                name, os.path.join(where, "__init__.py"), submodule_search_locations=[where]
            )

    sys.meta_path.insert(0, _Tree())
"""
"""Child-process code that makes ``import simstore`` load the source tree named by the
variable ``tree`` (nothing when it is empty); ``os`` and ``sys`` must be imported. It holds
in that process and in the workers it forks; for workers it spawns, see ``link_tree``."""


def link_tree(tree: str) -> None:
    """Link ``tree``'s top-level ``formats``, ``cli`` and ``loaders`` into its ``simstore``.

    A spawned or fork-server worker of a timed process does not inherit ``TREE_IMPORTS``'
    finder: given ``sys.path`` alone, it would import ``simstore.loaders`` from wherever
    the installed package points (this tree, not the one timed). With the links, the
    timed tree's own folders are found first.
    """
    for name in ("formats", "cli", "loaders"):
        link = os.path.join(tree, "simstore", name)
        if os.path.isdir(os.path.join(tree, name)) and not os.path.lexists(link):
            os.symlink(os.path.join("..", name), link)


def _revision(tree: str) -> str:
    """The commit a source tree is a checkout of (what a result names, not the path)."""
    out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    head = out.stdout.strip()
    return f"a checkout of {head}" if out.returncode == 0 and head else "an earlier tree"


def compile_tree(tree: str) -> None:
    """Compile ``tree``'s modules into its bytecode cache, so a timed child's first run
    loads them as later runs do (see :func:`run_child`)."""
    folders = [os.path.join(tree, d) for d in ("simstore", "formats", "loaders")]
    subprocess.run([sys.executable, "-m", "compileall", "-q",
                    *[f for f in folders if os.path.isdir(f)]], check=True)


def run_child(code: str, payload: Any, *, what: str = "child process",
              cwd: str | None = None, env: dict[str, str] | None = None) -> Any:
    """Run ``python -c code JSON(payload)`` and return its last line of output, parsed as JSON.

    The benchmarks' timed processes all end by printing one JSON line; a process that
    fails raises an error naming ``what``, with the end of its stderr.

    The child keeps Python's bytecode cache whatever ``env`` or this process's environment
    says (``PYTHONDONTWRITEBYTECODE`` is dropped), as the loader suite's runner does: an
    installed package has its modules compiled, and a tree run from its folder with the
    cache off would compile those it imports on first use (an adapter, h5py's wrappers,
    a shard format: about 35 ms) inside every timed ingest.
    """
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(payload)], cwd=cwd, env=env,
                         capture_output=True, text=True, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode or not lines:
        raise RuntimeError(f"{what} failed (exit {out.returncode}): {out.stderr.strip()[-3000:]}")
    return json.loads(lines[-1])

# One timed ingest in a fresh process: imports, store and sync happen before the clock, so
# every repetition (the first too) times the ingest alone, and the tree it imports is the
# one named (the working tree, or a --baseline checkout of an earlier revision). The
# previous run's store is removed here, after the imports and just before the clock, as
# copy_tree removes its previous copy just before its clock: see copy_tree.
_RUN = r"""
import json, os, resource, shutil, sys, time
args = json.loads(sys.argv[1])
tree = args["tree"]
""" + TREE_IMPORTS + r"""import simstore
from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import LocalStore
assert (not tree) or simstore.__file__.startswith(tree), simstore.__file__
shutil.rmtree(args["store"], ignore_errors=True)
cat = Catalog.init(LocalStore(args["store"], fsync=args["fsync"]))
os.sync()
cpu0 = sum(os.times()[:4])
t0 = time.perf_counter()
ingest([args["src"]], dataset="bench", store=cat, **args["options"])
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "cpu_s": sum(os.times()[:4]) - cpu0}))
"""


def run_ingest(
    src: Path, store_dir: Path, *, tree: str = _TREE, fsync: bool = False, **options
) -> dict:
    """Time one ingest of ``src`` into a fresh store, in a child process importing ``tree``.

    ``tree`` is a source tree of simstore (this script's by default); "" imports whatever
    simstore is installed.

    Returns ``{"seconds", "cpu_s"}``: wall seconds of the ``ingest`` call, and CPU seconds
    of the child and its worker processes over the same call. The store is left in
    ``store_dir`` for the next run to remove just before its clock (see :func:`copy_tree`);
    the caller removes the last one.
    """
    args = {
        "tree": tree,
        "src": str(src),
        "store": str(store_dir),
        "fsync": fsync,
        "options": {"resume": False, **options},
    }
    result: dict = run_child(_RUN, args, what=f"ingest of {src}")
    return result


SOURCES = ("npz", "hdf5", "hdf5 runs", "small npz", "netcdf", "vtu")
"""The throughput benchmark's sources (``--sources`` picks some)."""


def _sources(
    work: Path, quick: bool, names: tuple[str, ...] = (), scale: int = 1
) -> dict[str, tuple[Path, int, dict]]:
    """The sources named (all by default), written under ``work``: (folder, bytes, options).

    ``scale`` multiplies the number of .npz and HDF5 files (each file's size stays).
    """
    wanted = [n for n in SOURCES if not names or n in names]
    out: dict[str, tuple[Path, int, dict]] = {}
    for name in wanted:
        if name == "npz":
            files = (8 if quick else 24) * scale
            out[name] = (work / "npz", make_npz(work / "npz", files, 16, 512), {})
        elif name in ("hdf5", "hdf5 runs"):
            if "hdf5" not in out:  # the two share their files
                make_h5(work / "h5", (2 if quick else 6) * scale, 64, 512)
            size = sum(p.stat().st_size for p in (work / "h5").iterdir())
            # "hdf5 runs": the same files, a run per sample: two (64, 512, 512) fields
            # chunked by time step in the file, near-cubic in the shard, so the Zarr writer
            # reads them in slabs
            opts = {"time_window": 4, "stride": 4} if name == "hdf5" else {}
            out[name] = (work / "h5", size, opts)
        elif name == "small npz":
            out[name] = (work / "small", make_small(work / "small", 1024 if quick else 4096), {})
        elif name == "netcdf":  # NetCDF-4 runs like the HDF5 ones, cut in windows
            size = make_netcdf(work / "nc", 2 if quick else 6, 64, 512)
            out[name] = (work / "nc", size, {"time_window": 4, "stride": 4})
        elif name == "vtu":  # meshes from meshio's VTU writer
            out[name] = (work / "vtu", make_vtu(work / "vtu", 4 if quick else 16, 512 * 512), {})
    return out


def _cases(source: str, quick: bool) -> list[tuple[str, dict, tuple[int, ...]]]:
    """(label, ingest options, worker counts) of every ingest case of a source."""
    both = (1, 2)
    if source == "small npz":
        return [
            ("parquet none", {"format": "parquet", "compression": "none"}, both),
            ("zarr none", {"format": "zarr", "compression": "none"}, (1,)),
            (
                "parquet none + journal",
                {"format": "parquet", "compression": "none", "resume": True},
                (1,),
            ),
        ]
    if source == "hdf5 runs":
        return [("zarr none", {"format": "zarr", "compression": "none"}, both)]
    if source in ("netcdf", "vtu"):
        return [
            ("parquet none", {"format": "parquet", "compression": "none"}, both),
            ("zarr none", {"format": "zarr", "compression": "none"}, both),
        ]
    cases = [
        ("parquet none", {"format": "parquet", "compression": "none"}, both),
        ("zarr none", {"format": "zarr", "compression": "none"}, both),
        ("lance none", {"format": "lance", "compression": "none"}, (1,) if quick else both),
        (
            "parquet shuffle-zstd:1",
            {"format": "parquet", "compression": "shuffle-zstd:1"},
            (1,) if quick else both,
        ),
        (
            "zarr shuffle-zstd:1",
            {"format": "zarr", "compression": "shuffle-zstd:1"},
            (1,) if quick else both,
        ),
    ]
    return cases


def throughput(
    work: Path,
    quick: bool,
    reps: int,
    baseline: str = "",
    only: tuple[str, ...] = (),
    sources: tuple[str, ...] = (),
    scale: int = 1,
) -> list[dict]:
    """Each ingest case against copying the same files, round by round.

    A round times, back to back: the copy, the copy with fsync, then (after one untimed
    ingest) every case (and, with ``baseline``, the same case with the baseline tree right
    after it, or right before it in every other round). Medians over the rounds; each
    ratio divides the copy's median seconds by the case's.
    """
    rows = []
    for name, (src, size, opts) in _sources(work, quick, sources, scale).items():
        runs: dict[tuple[str, int, str], list[dict]] = {}
        copies: dict[str, list[float]] = {"copy": [], "copy+fsync": []}
        trees = [("after", _TREE)] + ([("before", baseline)] if baseline else [])
        for rnd in range(reps):
            copies["copy"].append(copy_tree(src, work / "copy", False))
            copies["copy+fsync"].append(copy_tree(src, work / "copy", True))
            # untimed: the first ingest after the copies ran up to 1.6x slower than the
            # same one later in the round on the build VM, whichever tree it imported.
            # Uncompressed, so it leaves as much page cache for the first timed case to
            # free and write into as every case leaves the next (see copy_tree): with
            # the default codec it left about half, and the first case (Parquet, one
            # worker) wrote the rest into memory long free, 1.3-1.7x slower than Zarr
            # doing the same work right after it.
            run_ingest(src, work / "store", workers=1, shard_size=32 * MiB,
                       compression="none", **opts)
            for label, options, workers_list in _cases(name, quick):
                if only and label not in only:
                    continue
                for workers in workers_list:
                    # the trees take turns going first, so neither always follows the other
                    for which, tree in trees if rnd % 2 == 0 else trees[::-1]:
                        runs.setdefault((label, workers, which), []).append(
                            run_ingest(
                                src,
                                work / "store",
                                tree=tree,
                                workers=workers,
                                shard_size=32 * MiB,
                                **{**opts, **options},
                            )
                        )
            # the default store (fsync on) against the copy that fsyncs too
            for workers in (1, 2):
                fsync_run = run_ingest(
                    src,
                    work / "store",
                    fsync=True,
                    workers=workers,
                    format="parquet",
                    compression="none",
                    shard_size=32 * MiB,
                    **opts,
                )
                key = ("parquet none, store fsync on", workers, "after")
                runs.setdefault(key, []).append(fsync_run)
        # each run left its output for the next of its kind to remove (see copy_tree)
        shutil.rmtree(work / "store", ignore_errors=True)
        shutil.rmtree(work / "copy", ignore_errors=True)
        copy_s = statistics.median(copies["copy"])
        fsync_s = statistics.median(copies["copy+fsync"])
        rows.append({**_row(name, "copy", 1, size, copy_s, copy_s),
                     "rounds_s": [round(s, 4) for s in copies["copy"]]})
        rows.append({**_row(name, "copy+fsync", 1, size, fsync_s, copy_s),
                     "rounds_s": [round(s, 4) for s in copies["copy+fsync"]]})
        for (label, workers, which), got in runs.items():
            if which != "after":
                continue
            against = fsync_s if "fsync on" in label else copy_s
            row = _row(name, label, workers, size, _median(got, "seconds"), against)
            row["cpu_s"] = _median(got, "cpu_s")
            row["rounds_s"] = [round(r["seconds"], 4) for r in got]
            before = runs.get((label, workers, "before"))
            if before:
                secs = _median(before, "seconds")
                row["before_mib_s"] = size / MiB / secs
                row["before_ratio"] = against / secs
                row["before_cpu_s"] = _median(before, "cpu_s")
            rows.append(row)
    return rows


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _row(source: str, what: str, workers: int, size: int, secs: float, against: float) -> dict:
    return {
        "source": source,
        "what": what,
        "workers": workers,
        "mib": size / MiB,
        "mib_s": size / MiB / secs,
        "ratio": against / secs,
    }


# CPU seconds per phase of one ingest: an in-process run with the worker's steps wrapped
# in timers (the third of three runs, so imports and first-touch costs are out of it).
_PHASES = r"""
import collections, json, os, shutil, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["tree"])
from simstore.catalog import Catalog
from simstore.ingest import ingest
from simstore.storage import LocalStore
import simstore.ingest._worker as W
import simstore.stats as ST
T = collections.Counter()
clock = time.thread_time  # this thread's CPU: the reading and writing threads overlap

def timed(fn, label):
    def run(*a, **k):
        t0 = clock()
        try:
            return fn(*a, **k)
        finally:
            T[label] += clock() - t0
    return run

W.hash_source = timed(W.hash_source, "source hash")
W.hash_file = timed(W.hash_file, "shard hash")
W.hash_sample_blocks = timed(W.hash_sample_blocks, "sample hash + statistics")
W.write_journal = timed(W.write_journal, "journal")
ST.StatsAccumulator.add_array = timed(ST.StatsAccumulator.add_array, "(statistics)")
from benchmarks.ingest_timeline import timed_reads  # phases run this tree, never a baseline

def read_done(t0, c0):
    T["adapter read"] += clock() - c0

W.resolve_adapter = timed_reads(W.resolve_adapter, read_done)
builder = W.TaskRunner._builder

def builder_timed(self, kind):
    b = builder(self, kind)
    if not getattr(b.writer, "_timed", False):
        b.writer.add = timed(b.writer.add, "shard writer: add")
        b.writer.close = timed(b.writer.close, "shard writer: close")
        b.writer._timed = True
    return b

W.TaskRunner._builder = builder_timed
for _ in range(3):
    T.clear()
    shutil.rmtree(args["store"], ignore_errors=True)
    cat = Catalog.init(LocalStore(args["store"], fsync=False))
    t0 = time.process_time()
    ingest([args["src"]], dataset="bench", store=cat, **args["options"])
    total = time.process_time() - t0
shutil.rmtree(args["store"], ignore_errors=True)
T["everything else"] = total - sum(v for k, v in T.items() if not k.startswith("("))
print(json.dumps({"cpu_s": total, "phases": dict(T)}))
"""


def phases(work: Path, quick: bool) -> list[dict]:
    """Where an ingest's CPU goes, phase by phase, for the cases of the target (1 worker)."""
    rows = []
    srcs = _sources(work, quick, ("npz", "hdf5", "small npz"))
    for name, fmt in [
        ("npz", "parquet"),
        ("npz", "zarr"),
        ("hdf5", "parquet"),
        ("hdf5", "zarr"),
        ("small npz", "parquet"),
    ]:
        src, size, opts = srcs[name]
        args = {
            "tree": _TREE,
            "src": str(src),
            "store": str(work / "store"),
            "options": {
                "resume": False,
                "format": fmt,
                "compression": "none",
                "shard_size": 32 * MiB,
                **opts,
            },
        }
        got = run_child(_PHASES, args, what="phases of an ingest")
        for phase, secs in sorted(got["phases"].items(), key=lambda kv: -kv[1]):
            rows.append(
                {
                    "source": name,
                    "into": f"{fmt} none",
                    "mib": size / MiB,
                    "phase": phase,
                    "cpu_s": secs,
                    "share": secs / got["cpu_s"],
                }
            )
        rows.append(
            {
                "source": name,
                "into": f"{fmt} none",
                "mib": size / MiB,
                "phase": "total",
                "cpu_s": got["cpu_s"],
                "share": 1.0,
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
    return int(run_child(_CHILD, args, what="peak RSS ingest"))


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
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--only", choices=["throughput", "rss", "codecs", "phases"], default=None)
    ap.add_argument(
        "--baseline",
        default="",
        metavar="TREE",
        help="also time every ingest case with the simstore source tree TREE (a checkout of "
        "an earlier revision: git worktree add TREE REV), right after the same case with this "
        "one: before and after side by side, in the same rounds",
    )
    ap.add_argument("--reps", type=int, default=None, help="rounds (default 3, 1 with --quick)")
    ap.add_argument(
        "--scale",
        type=int,
        default=1,
        help="throughput: this many times the .npz and HDF5 files (768 MiB each at 1), so "
        "an ingest's start, end and last task weigh less against its steady rate",
    )
    ap.add_argument(
        "--sources",
        default="",
        help=f"comma-separated throughput sources (of {', '.join(SOURCES)}); default all",
    )
    ap.add_argument(
        "--cases",
        default="",
        help="comma-separated case labels to run (e.g. 'parquet none,zarr none'); default all",
    )
    args = ap.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    baseline = os.path.abspath(args.baseline) if args.baseline else ""
    work = Path(args.workdir or tempfile.mkdtemp(prefix="simstore-bench-"))
    for tree in (_TREE, baseline):
        if tree:
            compile_tree(tree)
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    try:
        if args.only in (None, "throughput"):
            only = tuple(c.strip() for c in args.cases.split(",") if c.strip())
            names = tuple(n.strip() for n in args.sources.split(",") if n.strip())
            unknown = sorted(set(names) - set(SOURCES))
            if unknown:
                ap.error(f"unknown sources {unknown}: expected some of {', '.join(SOURCES)}")
            results["throughput"] = throughput(work, args.quick, reps, baseline, only, names,
                                               args.scale)
            results["scale"] = args.scale
            if baseline:
                results["baseline"] = _revision(baseline)
            cols = ["source", "what", "workers", "mib", "mib_s", "ratio", "cpu_s"]
            if baseline:
                cols += ["before_mib_s", "before_ratio", "before_cpu_s"]
            print("## Throughput\n")
            print(table(results["throughput"], cols))
        if args.only in (None, "phases"):
            results["phases"] = phases(work, args.quick)
            print("\n## Where the CPU goes (1 worker, warm process)\n")
            print(table(results["phases"], ["source", "into", "mib", "phase", "cpu_s", "share"]))
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
