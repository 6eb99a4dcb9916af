"""The streaming loader: throughput, time to first batch, memory, locality, shuffle quality.

    python -m benchmarks.bench_loader [--quick] [--json FILE] [--workdir DIR] [--only NAME ...]

Sections (``--only`` picks some):

- ``throughput``: 4 MiB float32 samples in a local store, warm page cache. Raw sequential
  read of the shard files against the format's reader alone and against ``SimDataset``
  (per-sample tensors) and ``SimDataLoader`` (batches of 8), per shard format.
- ``ttfb``: time from constructing ``SimDataset`` to its first sample, for manifests of
  1 thousand to 1 million samples (the first batch must not wait on the whole manifest).
- ``rss``: peak resident memory of a process streaming the 4 MiB dataset with workers,
  against 1.5 GiB plus the prefetch budgets.
- ``locality``: a "remote" store (a local directory read through ranged GETs) and a cold
  cache per rank: bytes fetched by 4 ranks x 2 workers over one epoch, against the
  dataset's shard bytes.
- ``shuffle``: the stream order against MosaicML Streaming's py1e, implemented here from
  its published description: how often neighbouring samples share a source file or a
  shard, and how many shards a stretch of 1,000 samples touches.
- ``stall``: data stall of a loop with a fixed 5 ms step.
- ``formats``: Parquet against Zarr shards by array size (64 KiB to 4 MiB float32 per
  sample, 96 MiB each, 0 and 2 workers, medians of 3 alternating fresh processes): what
  ingest's ``zarr_threshold`` default rests on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from simstore.loaders import PrefetchConfig, SimDataLoader, SimDataset
from simstore.loaders._order import group_order, source_layout

from simstore.catalog import Catalog
from simstore.hashing import hash_file, object_key
from simstore.ingest import ShardOptions
from simstore.manifest import MANIFEST_SCHEMA, ManifestRow, rows_from_list
from simstore.sample import Sample, infer_schema
from simstore.storage import LocalStore

MiB = 1 << 20
GiB = 1 << 30


# -- building datasets ----------------------------------------------------------------
def build(store: str, dataset: str, samples: Iterable[Sample], *, fmt: str, per_shard: int,
          compression: str = "none", workdir: str, row_group_bytes: int = 4 * MiB) -> str:
    """Write samples into shards of a real format, commit them; returns the snapshot id."""
    from simstore.formats import get_format

    cat = Catalog.init(store)
    writer = get_format(fmt, ShardOptions(compression=compression,
                                          row_group_bytes=row_group_bytes))
    rows: list[ManifestRow] = []
    shards: list[str] = []
    batch: list[Sample] = []
    schema_src: list[Sample] = []

    def flush() -> None:
        path = os.path.join(workdir, f"shard-{len(shards)}.{fmt}")
        result = writer.write(batch, path)
        oid, _ = hash_file(path)
        cat.store.put_file(object_key(oid), path)
        os.unlink(path)
        shards.append(oid)
        for w in result.samples:
            rows.append(ManifestRow(key=w.key, sample_hash=w.sample_hash, shard=oid,
                                    position=w.position, size_bytes=w.size_bytes))
        batch.clear()

    for s in samples:
        if not schema_src:
            schema_src.append(s)
        batch.append(s)
        if len(batch) == per_shard:
            flush()
    if batch:
        flush()
    cat.stage(dataset, changes=rows_from_list(rows), shards=shards,
              schema=infer_schema(schema_src))
    return str(cat.commit(dataset, message="benchmark").snapshot_id)


def float_samples(n: int, floats: int, *, runs: int = 16) -> Iterator[Sample]:
    rng = np.random.default_rng(0)
    per_run = max(1, -(-n // runs))
    for i in range(n):
        r, t = divmod(i, per_run)
        yield Sample(key=f"run{r:04d}/t{t:05d}",
                     fields={"data": rng.standard_normal(floats).astype(np.float32)})


def shard_paths(store: str, dataset: str) -> list[str]:
    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve(dataset))
    ids = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})
    return [os.path.join(store, "objects", s[:2], s) for s in ids]


class RemoteLikeStore(LocalStore):
    """A local directory read as if remote: no local paths, every read a (counted) GET."""

    def __init__(self, root: str, *, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only, fsync=False)
        self.url = f"remote://{self.root}"

    def local_path(self, key: str) -> str | None:
        return None


# -- throughput -------------------------------------------------------------------------
def raw_read(paths: list[str]) -> float:
    buf = bytearray(4 * MiB)
    n = 0
    t = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return n / (time.perf_counter() - t)


def reader_only(paths: list[str]) -> float:
    from simstore.formats import open_shard

    n = 0
    t = time.perf_counter()
    for p in paths:
        r: Any = open_shard(p)
        for d in r.read(list(range(r.num_samples)), ["data"]):
            n += d["data"].nbytes
        r.close()
    return n / (time.perf_counter() - t)


def loader_rate(store: str, **kw: Any) -> tuple[float, float]:
    ds = SimDataset(store, "big", **kw)
    n = 0
    t = time.perf_counter()
    for s in ds:
        n += s["data"].nbytes
    return n / (time.perf_counter() - t), float(ds.stats()["time_to_first_batch_s"] or 0)


def batched_rate(store: str, workers: int) -> float:
    loader = SimDataLoader(SimDataset(store, "big", verify=False), batch_size=8,
                           num_workers=workers, multiprocessing_context="spawn" if workers
                           else None)
    n = 0
    t = time.perf_counter()
    for b in loader:
        n += b["data"].nbytes
    return n / (time.perf_counter() - t)


def bench_throughput(work: str, quick: bool) -> dict[str, Any]:
    n = 32 if quick else 256
    out: dict[str, Any] = {"samples": n, "sample_bytes": 4 * MiB, "formats": {}}
    for fmt in ("lance", "zarr", "parquet"):
        store = os.path.join(work, f"tp-{fmt}")
        if not os.path.exists(store):
            build(store, "big", float_samples(n, MiB), fmt=fmt, per_shard=16, workdir=work)
        paths = shard_paths(store, "big")
        raw_read(paths)  # warm the page cache
        raw = max(raw_read(paths) for _ in range(3))
        reader = max(reader_only(paths) for _ in range(2))
        verified = max(loader_rate(store, verify=True)[0] for _ in range(2))
        unverified, ttfb = max(loader_rate(store, verify=False) for _ in range(2))
        threads = PrefetchConfig(decode_threads=4, chunks=8)
        wide = max(loader_rate(store, verify=False, prefetch=threads)[0] for _ in range(2))
        batched = batched_rate(store, 0)
        row = {
            "raw_gib_s": raw / GiB,
            "reader_gib_s": reader / GiB,
            "loader_gib_s": unverified / GiB,
            "loader_verified_gib_s": verified / GiB,
            "loader_4_decode_threads_gib_s": wide / GiB,
            "loader_batch8_gib_s": batched / GiB,
            "loader_vs_raw": max(unverified, wide) / raw,
            "loader_vs_reader": max(unverified, wide) / reader,
            "ttfb_s": ttfb,
        }
        out["formats"][fmt] = row
        print(f"  {fmt:8s} raw {row['raw_gib_s']:.2f} GiB/s | reader {row['reader_gib_s']:.2f} "
              f"| loader {row['loader_gib_s']:.2f} (verified {row['loader_verified_gib_s']:.2f}, "
              f"4 threads {row['loader_4_decode_threads_gib_s']:.2f}, batch8 "
              f"{row['loader_batch8_gib_s']:.2f}) = {100 * row['loader_vs_raw']:.0f}% of raw, "
              f"{100 * row['loader_vs_reader']:.0f}% of reader; ttfb {ttfb:.2f} s", flush=True)
    return out


# -- time to first batch -----------------------------------------------------------------
def bench_ttfb(work: str, quick: bool) -> dict[str, Any]:
    store = os.path.join(work, "ttfb")
    small = [Sample(key=f"s{i:04d}", fields={"x": np.full(256, i, dtype=np.float32)})
             for i in range(1000)]
    sid = build(store, "base", small, fmt="parquet", per_shard=1000, workdir=work)
    cat = Catalog.open(store)
    base = next(iter(cat.iter_parts(cat.snapshot(sid))))
    shard = base.column("shard")[0].as_py()
    hashes = base.column("sample_hash")
    out: dict[str, Any] = {}
    sizes = [1_000, 100_000] if quick else [1_000, 100_000, 1_000_000]
    for n in sizes:
        name = f"m{n}"
        idx = np.arange(n)
        keys = pa.array([f"run{i // 1000:05d}/t{i % 1000:04d}" for i in idx.tolist()])
        table = pa.table({
            "key": keys,
            "sample_hash": hashes.take(pa.array(idx % 1000)),
            "shard": pa.array([shard] * n),
            "position": pa.array(idx % 1000, pa.int64()),
            "size_bytes": pa.array(np.full(n, 1024), pa.int64()),
        }, schema=MANIFEST_SCHEMA)
        cat.stage(name, changes=table, shards=[shard], schema=infer_schema(small[:1]))
        snap_id = cat.commit(name, message="ttfb").snapshot_id
        parts = len(cat.snapshot(snap_id).parts)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            ds = SimDataset(store, name)
            next(iter(ds))
            times.append(time.perf_counter() - t)
        manifest = ds.stats()["manifest_parts"]
        out[str(n)] = {"ttfb_s": min(times), "manifest_parts": parts,
                       "parts_read_for_first_sample": manifest}
        print(f"  {n:>9,} samples, {parts:4d} manifest parts: first sample after "
              f"{min(times):.3f} s, {manifest} parts read", flush=True)
    cold = subprocess.run(
        [sys.executable, "-c",
         "import time; t=time.perf_counter(); from simstore.loaders import SimDataset; "
         f"ds=SimDataset({store!r}, 'm{sizes[-1]}'); next(iter(ds)); "
         "print(time.perf_counter()-t)"],
        capture_output=True, text=True, check=True)
    out["fresh_process_s"] = float(cold.stdout.strip())
    print(f"  fresh process (imports included): {out['fresh_process_s']:.2f} s", flush=True)
    return out


# -- memory ------------------------------------------------------------------------------
_RSS_SCRIPT = """
import resource, sys
from simstore.loaders import SimDataLoader, SimDataset
ds = SimDataset(sys.argv[1], "big", verify=True)
loader = SimDataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn")
n = 0
for _ in range(int(sys.argv[2])):
    for b in loader:
        n += b["data"].nbytes
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(own, kids, n)
"""


def bench_rss(work: str, quick: bool) -> dict[str, Any]:
    store = os.path.join(work, "tp-lance")
    if not os.path.exists(store):
        build(store, "big", float_samples(32 if quick else 256, MiB), fmt="lance",
              per_shard=16, workdir=work)
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, store, "2"],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the streaming process failed:\n{out.stderr[-3000:]}")
    own, kids, n = (int(x) for x in out.stdout.split())
    budget = PrefetchConfig().budget_bytes
    result = {
        "main_peak_rss_mib": own / 1024,
        "worker_peak_rss_mib": kids / 1024,
        "bytes_streamed": n,
        "prefetch_budget_mib_per_worker": budget / MiB,
        "limit_per_process_mib": (1.5 * GiB + budget) / MiB,
    }
    print(f"  main process peak RSS {own / 1024:.0f} MiB, largest worker {kids / 1024:.0f} MiB "
          f"(limit 1.5 GiB + {budget / MiB:.0f} MiB prefetch budget = "
          f"{result['limit_per_process_mib']:.0f} MiB), {n / GiB:.1f} GiB streamed", flush=True)
    return result


# -- locality ----------------------------------------------------------------------------
def bench_locality(work: str, quick: bool) -> dict[str, Any]:
    store = os.path.join(work, "loc")
    shards = 121 if quick else 481  # not a multiple of the world size: blocks end mid-window
    if not os.path.exists(store):
        build(store, "loc", float_samples(shards * 8, 16 * 1024), fmt="parquet", per_shard=8,
              workdir=work, row_group_bytes=64 * 1024)
    total = sum(os.path.getsize(p) for p in shard_paths(store, "loc"))
    out: dict[str, Any] = {"shards": shards, "shard_bytes": total}
    world = 4
    for label, window, cached, workers in (
        ("cache, window 8", 8, True, 2),
        ("cache, window 2", 2, True, 2),
        ("ranged reads, window 8", 8, False, 2),
        ("ranged reads, window 8, no workers", 8, False, 0),
    ):
        fetched = 0
        for rank in range(world):
            cache = tempfile.mkdtemp(dir=work) if cached else None
            # ranged reads fetch 64 KiB blocks here: 1 MiB blocks (the default) against these
            # 512 KiB shards would stand for whole-shard reads, not for shards of 100s of MiB
            ds = SimDataset(RemoteLikeStore(store), "loc", rank=rank, world_size=world,
                            window_shards=window, cache_dir=cache,
                            cache_limit="4GiB" if cached else None,
                            prefetch=PrefetchConfig(range_block_bytes=64 * 1024))
            loader = SimDataLoader(ds, batch_size=16, num_workers=workers,
                                   multiprocessing_context="fork" if workers else None)
            for _ in loader:
                pass
            stats = ds.stats()
            fetched += stats["tiers"]["remote"]["bytes"] - stats["manifest_bytes"]
            if cache:
                shutil.rmtree(cache)
        out[label] = {"bytes": fetched, "ratio": fetched / total}
        print(f"  {label}: {world} ranks x {workers} workers fetched {fetched / MiB:.1f} MiB "
              f"= {fetched / total:.3f}x the {total / MiB:.1f} MiB of shards", flush=True)
    return out


# -- shuffle quality ---------------------------------------------------------------------
def py1e_order(shard_sizes: np.ndarray, block: int, seed: int) -> np.ndarray:
    """MosaicML Streaming's py1e shuffle, from its description (not its code).

    Shards are permuted; each sample's position is then drawn uniformly from a window of
    ``block`` positions centred on the middle of its shard's span in the permuted layout,
    and samples are sorted by the drawn positions.
    """
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(shard_sizes)[:-1]])
    order = rng.permutation(len(shard_sizes))
    keys_list, ids_list = [], []
    pos = 0
    for s in order:
        n = int(shard_sizes[s])
        centre = pos + n / 2
        keys_list.append(rng.uniform(centre - block / 2, centre + block / 2, n))
        ids_list.append(starts[s] + np.arange(n))
        pos += n
    keys = np.concatenate(keys_list)
    ids = np.concatenate(ids_list)
    return np.asarray(ids[np.argsort(keys, kind="stable")])


def simstore_order(shard_of: np.ndarray, part_rows: int, window: int, group_parts: int,
                   seed: int, sample_bytes: int = 0, buffer_blocks: int = 16) -> np.ndarray:
    n = len(shard_of)
    rows = np.full(-(-n // part_rows), part_rows)
    rows[-1] = n - part_rows * (len(rows) - 1)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    lay = source_layout(rows, snapshot_id="ab" * 16, seed=seed, epoch=0, shuffle=True,
                        group_parts=group_parts)
    out = []
    for g in range(lay.num_groups):
        ids = np.concatenate([starts[p] + np.arange(rows[p]) for p in lay.parts_of(g)])
        shard = shard_of[ids]
        position = ids - np.searchsorted(shard_of, shard)  # shards are runs of ids
        order = group_order(shard, window_shards=window, seed=seed, epoch=0,
                            snapshot_id="ab" * 16, group=g, positions=position,
                            sizes=np.full(len(ids), sample_bytes),
                            block_bytes=4 << 20, buffer_blocks=buffer_blocks)
        out.append(ids[order])
    return np.concatenate(out)


def order_quality(order: np.ndarray, shard_of: np.ndarray, file_of: np.ndarray,
                  world: int) -> dict[str, float]:
    same_file = same_shard = pairs = 0
    touched = []
    per_rank = len(order) // world
    for r in range(world):
        stream = order[r * per_rank : (r + 1) * per_rank]
        f, s = file_of[stream], shard_of[stream]
        same_file += int((f[1:] == f[:-1]).sum())
        same_shard += int((s[1:] == s[:-1]).sum())
        pairs += len(stream) - 1
        touched += [len(np.unique(s[i : i + 1000])) for i in range(0, len(s) - 999, 1000)]
    return {"same_file_neighbours": same_file / pairs, "same_shard_neighbours": same_shard / pairs,
            "shards_per_1000_samples": float(np.mean(touched))}


def bench_shuffle(work: str, quick: bool) -> dict[str, Any]:
    n, per_file, per_shard, world = (50_000 if quick else 200_000), 400, 250, 8
    ids = np.arange(n)
    file_of, shard_of = ids // per_file, ids // per_shard  # shards written in key order
    out: dict[str, Any] = {"samples": n, "samples_per_file": per_file,
                           "samples_per_shard": per_shard, "world_size": world}
    for window in (4, 8, 16):
        ours = order_quality(simstore_order(shard_of, 8192, window, 4, seed=0), shard_of,
                             file_of, world)
        theirs = order_quality(py1e_order(np.full(n // per_shard, per_shard), window * per_shard,
                                          seed=0), shard_of, file_of, world)
        out[f"window_{window}"] = {"simstore": ours, "py1e": theirs}
        print(f"  window {window:2d} shards (py1e block {window * per_shard}): same source file "
              f"{100 * ours['same_file_neighbours']:.1f}% vs py1e "
              f"{100 * theirs['same_file_neighbours']:.1f}%; same shard "
              f"{100 * ours['same_shard_neighbours']:.1f}% vs "
              f"{100 * theirs['same_shard_neighbours']:.1f}%; shards per 1000 samples "
              f"{ours['shards_per_1000_samples']:.1f} vs {theirs['shards_per_1000_samples']:.1f}",
              flush=True)
    out["scale"] = bench_shuffle_scale(quick)
    return out


def bench_shuffle_scale(quick: bool) -> dict[str, Any]:
    """8 KiB samples in 256 MiB shards: how many 4 MiB row groups a stretch interleaves.

    A columnar reader decodes whole row groups; an order whose stretch of 1,000 samples
    touches about 1,000 row groups needs the whole window decoded at once (2 GiB for 8
    shards of 256 MiB) or decodes each row group again and again.
    """
    per_shard, per_file, sample = 32_768, 400, 8192
    n = (8 if quick else 16) * per_shard
    ids = np.arange(n)
    file_of, shard_of = ids // per_file, ids // per_shard
    group = (4 << 20) // sample
    block_of = ids // group  # 4 MiB row groups of a shard written in key order
    rows = {
        "simstore (blocks of 4 MiB, buffers of 16)": simstore_order(
            shard_of, 1 << 20, 8, 4, seed=0, sample_bytes=sample),
        "simstore without blocks (uniform window)": simstore_order(
            shard_of, 1 << 20, 8, 4, seed=0, sample_bytes=sample, buffer_blocks=1 << 30),
        "py1e (block = 8 shards)": py1e_order(np.full(n // per_shard, per_shard),
                                              8 * per_shard, seed=0),
    }
    out: dict[str, Any] = {"samples": n, "samples_per_shard": per_shard, "sample_bytes": sample,
                           "window_shards": 8}
    for name, order in rows.items():
        q = order_quality(order, shard_of, file_of, 1)
        b = block_of[order]
        q["row_groups_per_1000_samples"] = float(np.mean(
            [len(np.unique(b[i : i + 1000])) for i in range(0, n - 999, 1000)]))
        out[name] = q
        print(f"  scale, {name}: same source file {100 * q['same_file_neighbours']:.1f}%, same "
              f"shard {100 * q['same_shard_neighbours']:.1f}%, 4 MiB row groups per 1000 "
              f"samples {q['row_groups_per_1000_samples']:.1f}", flush=True)
    return out


# -- data stall --------------------------------------------------------------------------
def bench_stall(work: str, quick: bool) -> dict[str, Any]:
    store = os.path.join(work, "loc")
    if not os.path.exists(store):
        bench_locality(work, quick)
    out = {}
    for workers in (0, 2):
        ds = SimDataset(store, "loc")
        loader = SimDataLoader(ds, batch_size=16, num_workers=workers,
                               multiprocessing_context="fork" if workers else None)
        for _ in loader:
            time.sleep(0.005)  # the training step
        stats = ds.stats()
        out[f"workers_{workers}"] = {"data_stall": stats["data_stall"],
                                     "samples_per_s": stats["samples_per_s"]}
        print(f"  {workers} workers, 5 ms step: data stall {100 * (stats['data_stall'] or 0):.1f}%"
              f", {stats['samples_per_s']:.0f} samples/s", flush=True)
    return out


# -- Parquet or Zarr, by array size ------------------------------------------------------
_FORMAT_READ = """
import json, sys, time
from simstore.loaders import SimDataLoader, SimDataset
path, batch, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
loader = SimDataLoader(SimDataset(path, "d", seed=0), batch_size=batch, num_workers=workers,
                       multiprocessing_context="fork" if workers else None)
it = iter(loader)
next(it)
t, n = time.perf_counter(), 0
for b in it:
    n += len(b["__key__"])
    float(b["fields"].reshape(-1)[::1024].sum())
print(json.dumps({"samples_per_s": n / (time.perf_counter() - t)}))
"""


def bench_formats(work: str, quick: bool) -> dict[str, Any]:
    import simstore

    sizes = {"64KiB": (4, 64, 64), "256KiB": (4, 128, 128), "1MiB": (4, 256, 256),
             "4MiB": (4, 64, 64, 64)}
    total = (24 if quick else 96) << 20
    reps = 1 if quick else 3
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name, shape in sizes.items():
        per = int(np.prod(shape)) * 4
        n = max(8, total // per)
        batch = max(4, min(64, (2 << 20) // per * 4))
        pool = os.path.join(work, f"formats-pool-{name}")
        if not os.path.exists(pool):
            os.makedirs(pool)
            for i in range(n):
                np.savez(os.path.join(pool, f"s{i:05d}.npz"),
                         fields=rng.standard_normal(shape).astype(np.float32), Re=np.float64(i))
        rates: dict[str, dict[int, list[float]]] = {"parquet": {0: [], 2: []},
                                                     "zarr": {0: [], 2: []}}
        for fmt in rates:
            store = os.path.join(work, f"formats-{fmt}-{name}")
            if not os.path.exists(store):
                Catalog.init(LocalStore(store, fsync=False))
                simstore.ingest([pool], dataset="d", store=store, format=fmt,
                                compression="none", shard_size=64 << 20, zarr_threshold=1 << 40,
                                snapshot=True, resume=False, progress=None)
        for _ in range(reps):
            for workers in (0, 2):
                for fmt in rates:
                    store = os.path.join(work, f"formats-{fmt}-{name}")
                    proc = subprocess.run(
                        [sys.executable, "-c", _FORMAT_READ, store, str(batch), str(workers)],
                        capture_output=True, text=True, check=True)
                    rates[fmt][workers].append(
                        json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"])
        row: dict[str, Any] = {"samples": n, "batch": batch}
        for workers in (0, 2):
            p = float(np.median(rates["parquet"][workers]))
            z = float(np.median(rates["zarr"][workers]))
            row[f"workers_{workers}"] = {"parquet_samples_per_s": p, "zarr_samples_per_s": z,
                                         "zarr_over_parquet": z / p}
            print(f"  {name} per sample, {workers} workers: Parquet {p:,.0f}, Zarr {z:,.0f} "
                  f"samples/s (Zarr/Parquet {z / p:.2f})", flush=True)
        out[name] = row
    return out


SECTIONS = {
    "formats": bench_formats,
    "throughput": bench_throughput,
    "ttfb": bench_ttfb,
    "rss": bench_rss,
    "locality": bench_locality,
    "shuffle": bench_shuffle,
    "stall": bench_stall,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--workdir", help="keep datasets here (default: a temporary folder)")
    parser.add_argument("--only", nargs="*", choices=sorted(SECTIONS), help="sections to run")
    args = parser.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="bench-loader-")
    os.makedirs(work, exist_ok=True)
    results: dict[str, Any] = {"quick": args.quick, "cpus": os.cpu_count()}
    try:
        for name in args.only or list(SECTIONS):
            print(f"{name}:", flush=True)
            results[name] = SECTIONS[name](work, args.quick)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
