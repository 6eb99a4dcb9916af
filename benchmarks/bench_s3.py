"""Streaming from S3 (moto on 127.0.0.1) against raw parallel GETs of the same objects.

    python -m benchmarks.bench_s3 [--quick] [--reps N] [--formats parquet zarr]
                                  [--workers N] [--latency-ms MS] [--samples N] [--store PATH]
                                  [--pin-server] [--json FILE]

One run starts a moto server in a process of its own on 127.0.0.1 (so that serving S3
does not share a GIL with the reader), ingests the suite's ``large`` pool (96 samples of
4 MiB float32 fields, 384 MiB; ``--quick``: 24) into a local store per shard format
(64 MiB shards, no compression), uploads the same objects to the server, and then
measures side by side, repetition by repetition:

- ``get4``/``get8``: raw boto3 GETs of the snapshot's shard objects, whole objects, from
  4 and 8 threads (the ceiling: no hashing, no disk, no decoding);
- ``get4_disk``: the same GETs from 4 threads, each body written to a new local file (no
  hash): the ceiling of any disk cache's fill, since writing fresh page-cache pages costs
  too (on this VM, more than the GET itself once the data outgrows a few hundred MiB);
- ``fill4``: the loader's fetch path alone (download, hash, write into its cache);
- ``cold``: one ``SimDataLoader`` epoch (batches of 8, shuffled) from S3 through an empty
  disk cache;
- ``warm``: the same epoch again through the now full cache (no request for shard bytes);
- ``local``: the same epoch from the local store holding the same objects.

Next to each throughput it reports the CPU seconds of the moto server process and of
the reader over the same clock (the benchmark's own threads, or the epoch's process and
its workers, imports excluded) and how many cores the two kept busy: on a machine where
the server shares the reader's cores, raw GETs alone can keep them all busy.

Before each measurement the page cache's dirty pages are written out (``os.sync``), so
none pays for the write-back of files an earlier one wrote. On a VM whose host takes
back the guest's free memory, a disk cache's fill still runs at the host's pace of
backing fresh pages in some minutes (see benchmarks/README.md, "What is measured"):
compare ``fill4`` and ``cold`` with ``get4_disk`` of the same repetition.

Every epoch runs in a fresh process (so its time to first batch includes making the S3
client and reading the catalog, as a job's first batch does; library imports are done
before the clock) and touches every 4 KiB page of every batch, as a
training step's copy would. Figures are medians over ``--reps`` repetitions (3 by
default): MiB/s of sample bytes delivered over the whole epoch (first batch included),
time to first batch, and the ratios the targets are about (cold / raw GET, warm / local),
each taken within a repetition and then the median over repetitions.

``--latency-ms`` also measures through ``FaultProxy`` adding that latency to every request
(a remote region): raw GETs and a cold epoch through the proxy (which buffers each
response whole).

moto serves a ranged GET by reading the whole object and slicing it, about 5x slower per
byte than a whole-object GET; designs that use ranged GETs look worse on moto than on S3.
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

MiB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "simstore-bench-s3"
SHARD_BYTES = 64 * MiB


# -- servers ---------------------------------------------------------------------------
SERVER_PIDS: dict[str, int] = {}
"""The process serving each endpoint of :func:`_serve`, for its CPU time."""


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of a running process; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(endpoint: str, measure: Any, *args: Any) -> dict[str, Any]:
    """``measure(*args)``'s result with the CPU seconds it cost: the server's (``server_cpu_s``),
    the reader's (``client_cpu_s``: the ``cpu_s`` every measurement here reports over its
    own clock, an epoch's child with its workers, imports excluded) and both over the wall
    time (``cores``).

    On this benchmark's machines the server and the reader share the cores, so a reader
    that takes more CPU per byte leaves the server less: these say how close a
    measurement ran to the machine's cores.
    """
    # no measurement pays for the write-back of the files an earlier one wrote: on a disk
    # slower than the page cache, the kernel holds up writers while a backlog drains
    os.sync()
    pid = SERVER_PIDS.get(endpoint)
    server0 = process_cpu_s(pid) if pid else None
    result: dict[str, Any] = measure(*args)
    server1 = process_cpu_s(pid) if pid else None
    client = result.pop("cpu_s")
    result["client_cpu_s"] = client
    if server0 is not None and server1 is not None:
        result["server_cpu_s"] = server1 - server0
        result["cores"] = (result["server_cpu_s"] + client) / result["s"]
    return result


@contextmanager
def _serve(args: list[str]) -> Iterator[str]:
    """A helper process (``moto`` or ``proxy``) of this module; yields its endpoint."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_s3", "--serve", *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ENDPOINT "):
            raise RuntimeError(f"S3 helper {args[0]} did not start: {line!r}")
        SERVER_PIDS[line.split()[1]] = proc.pid
        yield line.split()[1]
    finally:
        from simstore.testing.s3 import end_helper

        end_helper(proc)


def serve(argv: list[str]) -> None:
    """Run moto (``moto``) or a latency proxy (``proxy UPSTREAM SECONDS``) until stdin closes."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if len(argv) > 1 and argv[-2] == "--cpu":  # this server on one core (--pin-server)
        os.sched_setaffinity(0, {int(argv[-1])})
        argv = argv[:-2]
    if argv[0] == "moto":
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        print(f"ENDPOINT http://{host}:{port}", flush=True)
        sys.stdin.read()
        server.stop()
    else:
        from simstore.testing.s3 import FaultProxy

        proxy = FaultProxy(argv[1], latency_s=float(argv[2]))
        print(f"ENDPOINT {proxy.endpoint_url}", flush=True)
        sys.stdin.read()
        proxy.close()


def _client(endpoint: str, pool: int) -> Any:
    import boto3
    from botocore.config import Config

    from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=FAKE_ACCESS_KEY,
        aws_secret_access_key=FAKE_SECRET_KEY,
        config=Config(max_pool_connections=pool),
    )


def _options(endpoint: str) -> dict[str, Any]:
    from simstore.testing.s3 import FAKE_ACCESS_KEY, FAKE_SECRET_KEY

    return {
        "endpoint_url": endpoint,
        "key": FAKE_ACCESS_KEY,
        "secret": FAKE_SECRET_KEY,
        "region_name": "us-east-1",
    }


# -- data ------------------------------------------------------------------------------
def build(work: str, fmt: str, samples: int) -> str:
    """A local store of the ``large`` pool in ``fmt`` (64 MiB shards); returns its path."""
    from benchmarks.suite.data import ensure_pool
    from simstore.catalog import Catalog
    from simstore.ingest import ingest
    from simstore.storage import LocalStore

    pool = ensure_pool(os.path.join(REPO, ".bench"), "large", samples)
    out = os.path.join(work, f"{fmt}-{samples}")
    if os.path.exists(os.path.join(out, "done")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    cat = Catalog.init(LocalStore(out, fsync=False))
    ingest(
        [pool],
        dataset="large",
        store=cat,
        format=fmt,
        compression="none",
        shard_size=SHARD_BYTES,
        snapshot=True,
        resume=False,
        progress=None,
    )
    with open(os.path.join(out, "done"), "w") as f:
        f.write("ok\n")
    return out


def shard_keys(store: str) -> list[tuple[str, int]]:
    """(object key, size) of every shard of the snapshot ``large``."""
    from simstore.catalog import Catalog
    from simstore.hashing import object_key

    cat = Catalog.open(store)
    snap = cat.snapshot(cat.resolve("large"))
    ids = sorted({s for t in cat.iter_parts(snap) for s in t.column("shard").to_pylist()})
    return [(object_key(i), os.path.getsize(os.path.join(store, object_key(i)))) for i in ids]


def upload(endpoint: str, local: str, prefix: str) -> None:
    """Copy every file of the local store to ``BUCKET/prefix`` (the same object keys)."""
    s3 = _client(endpoint, 8)
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    paths = [os.path.join(d, n) for d, _, files in os.walk(local) for n in files if n != "done"]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda p: s3.upload_file(p, BUCKET, f"{prefix}/{os.path.relpath(p, local)}"), paths
            )
        )


# -- measurements ----------------------------------------------------------------------
def raw_get(endpoint: str, keys: list[str], threads: int) -> dict[str, float]:
    """Whole-object GETs of ``keys`` from ``threads`` threads (a fresh client)."""
    s3 = _client(endpoint, threads)

    def get(key: str) -> int:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        return len(body.read())

    cpu0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    secs = time.perf_counter() - t0
    s3.close()
    cpu = sum(os.times()[:2]) - cpu0
    return {"bytes": total, "s": secs, "mib_s": total / secs / MiB, "cpu_s": cpu}


def raw_get_to_disk(endpoint: str, keys: list[str], threads: int, where: str) -> dict[str, float]:
    """:func:`raw_get` writing each body to a new file under ``where`` (no hash): the bound
    on any disk cache's fill, as writing fresh pages of the page cache costs too."""
    s3 = _client(endpoint, threads)
    os.makedirs(where, exist_ok=True)

    def get(key: str) -> int:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        n = 0
        with open(os.path.join(where, key.replace("/", "_")), "wb") as f:
            while chunk := body.read(8 * MiB):
                n += f.write(chunk)
        return n

    cpu0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    secs = time.perf_counter() - t0
    s3.close()
    shutil.rmtree(where, ignore_errors=True)
    cpu = sum(os.times()[:2]) - cpu0
    return {"bytes": total, "s": secs, "mib_s": total / secs / MiB, "cpu_s": cpu}


def fill(endpoint: str, url: str, keys: list[str], threads: int, cache: str) -> dict[str, float]:
    """The loader's fetch path alone: fill an empty disk cache with ``keys`` from ``threads``
    threads (download, hash, write), as the prefetch stage's I/O pool does."""
    from simstore.loaders._cache import CacheConfig
    from simstore.loaders._fetch import RateLimiter, ShardAccess
    from simstore.loaders._stats import Counters

    from simstore.storage import open_store

    store = open_store(url, storage_options=_options(endpoint), read_only=True)
    ids = [k.rsplit("/", 1)[1] for k in keys]
    store.exists("simstore.json")  # the client exists before the clock, as raw_get's does
    access = ShardAccess(
        store,
        counters=Counters(),
        limiter=RateLimiter(None),
        cache=CacheConfig(directory=cache, limit_bytes=8 << 30),
        verify=True,
    )
    cpu0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        handles = list(pool.map(access.prepare, ids))
    secs = time.perf_counter() - t0
    cpu = sum(os.times()[:2]) - cpu0
    total = 0
    for h in handles:
        assert h is not None and isinstance(h.source, str)
        total += os.path.getsize(h.source)
        h.release()
    access.close()
    store.close()
    shutil.rmtree(cache, ignore_errors=True)
    return {"bytes": total, "s": secs, "mib_s": total / secs / MiB, "cpu_s": cpu}


def epoch(
    store: str, options: dict[str, Any] | None, cache: str | None, workers: int, ref: str
) -> dict[str, Any]:
    """One epoch of ``ref`` in a fresh process; see :func:`child`."""
    spec = {"store": store, "options": options, "cache": cache, "workers": workers, "ref": ref}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_s3", "--child", json.dumps(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"epoch failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Read one shuffled epoch with ``SimDataLoader`` (batch 8); time and count it."""
    import importlib

    import torch
    from simstore.loaders import SimDataLoader, SimDataset

    # the library's imports (the shard formats, botocore) happen before the clock, as torch's
    for module in ("simstore.formats", "simstore.storage._s3"):
        importlib.import_module(module)

    cpu0 = sum(os.times()[:4])
    t0 = time.perf_counter()
    ds = SimDataset(
        spec["store"],
        spec["ref"],
        shuffle=True,
        seed=0,
        cache_dir=spec["cache"],
        cache_limit="8GiB" if spec["cache"] else None,
        storage_options=spec["options"],
    )
    loader = SimDataLoader(
        ds,
        batch_size=8,
        num_workers=spec["workers"],
        multiprocessing_context="fork" if spec["workers"] else None,
    )
    nbytes, t_first, first_bytes = 0, None, 0
    for batch in loader:
        for name, value in batch.items():
            if isinstance(value, torch.Tensor) and not name.startswith("__") and value.numel():
                step = max(1, 4096 // value.element_size())
                float(value.reshape(-1)[::step].sum())  # one element per page
                nbytes += value.element_size() * value.numel()
        if t_first is None:
            t_first, first_bytes = time.perf_counter() - t0, nbytes
    secs = time.perf_counter() - t0
    stats = loader.stats()
    assert t_first is not None
    rest = (nbytes - first_bytes) / max(1e-9, secs - t_first) / MiB
    return {
        "bytes": nbytes,
        "s": secs,
        "ttfb_s": t_first,
        "mib_s": nbytes / secs / MiB,
        "after_first_mib_s": rest,
        "cpu_s": sum(os.times()[:4]) - cpu0,  # DataLoader workers are joined by now
        "tiers": stats.get("tiers"),
        "cache_hits": stats.get("cache_hits"),
        "cache_misses": stats.get("cache_misses"),
    }


def _ratios(one: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The ratios of one repetition (its measurements ran side by side)."""
    best_get = max(one["get4"]["mib_s"], one["get8"]["mib_s"])
    out = {
        "cold_over_raw_get": one["cold"]["mib_s"] / best_get,
        "fill_over_raw_get": one["fill4"]["mib_s"] / best_get,
        "cold_over_get_to_disk": one["cold"]["mib_s"] / one["get4_disk"]["mib_s"],
        "fill_over_get_to_disk": one["fill4"]["mib_s"] / one["get4_disk"]["mib_s"],
        "cold_over_warm": one["cold"]["mib_s"] / one["warm"]["mib_s"],
        "warm_over_local": one["warm"]["mib_s"] / one["local"]["mib_s"],
        "warm_over_local_after_first": (
            one["warm"]["after_first_mib_s"] / one["local"]["after_first_mib_s"]
        ),
    }
    if "slow_cold" in one:
        out["slow_cold_over_slow_get8"] = one["slow_cold"]["mib_s"] / one["slow_get8"]["mib_s"]
    return out


def _median(runs: list[dict[str, Any]], name: str) -> float:
    return float(statistics.median(r[name] for r in runs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_s3", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="24 samples (96 MiB), 1 repetition")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    ap.add_argument("--formats", nargs="+", default=["parquet", "zarr"])
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    ap.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="also measure through a proxy adding this latency per request",
    )
    ap.add_argument(
        "--store",
        default=None,
        help="an existing local store whose dataset 'large' is read instead of the pool's "
        "(one format: name it with --formats), for datasets of many shuffle windows",
    )
    ap.add_argument(
        "--samples",
        type=int,
        default=None,
        help="samples of the pool (default 96, 24 with --quick): 384 makes 24 shards, three "
        "shuffle windows, where fills of the next window overlap decoding this one",
    )
    ap.add_argument(
        "--pin-server",
        action="store_true",
        help="run moto on the first core and the reader on the others (Linux), so the "
        "two do not take CPU from each other",
    )
    ap.add_argument("--workdir", default=os.path.join(REPO, ".bench", "s3"))
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    samples = args.samples or (24 if args.quick else 96)
    if samples < 1:
        ap.error("--samples must be at least 1")
    reps = args.reps or (1 if args.quick else 3)
    if args.store and len(args.formats) != 1:
        ap.error("--store reads one store: give its format alone in --formats")
    os.makedirs(args.workdir, exist_ok=True)
    results: dict[str, Any] = {
        "samples": samples,
        "reps": reps,
        "workers": args.workers,
        "formats": {},
    }
    with ExitStack() as stack:
        pinned = args.pin_server and len(os.sched_getaffinity(0)) > 1
        if pinned:  # the server on the first core, this process and its children on the rest
            cores = sorted(os.sched_getaffinity(0))
            endpoint = stack.enter_context(_serve(["moto", "--cpu", str(cores[0])]))
            os.sched_setaffinity(0, set(cores[1:]))
        else:
            endpoint = stack.enter_context(_serve(["moto"]))
        slow = (
            stack.enter_context(_serve(["proxy", endpoint, str(args.latency_ms / 1e3)]))
            if args.latency_ms
            else None
        )
        caches = stack.enter_context(tempfile.TemporaryDirectory(dir=args.workdir))
        for fmt in args.formats:
            local = args.store or build(args.workdir, fmt, samples)
            upload(endpoint, local, fmt)
            keys = [f"{fmt}/{k}" for k, _ in shard_keys(local)]
            url = f"s3://{BUCKET}/{fmt}"
            # the snapshot pinned by its id, as a reproducible job does (a warm node then
            # asks nothing of S3; a branch would cost a round trip and the S3 client)
            from simstore.catalog import Catalog

            ref = f"large@{Catalog.open(local).resolve('large')}"
            runs: dict[str, list[dict[str, Any]]] = {}
            for rep in range(reps):
                cache = os.path.join(caches, f"{fmt}-{rep}")
                one = {
                    "get4": with_cpu(endpoint, raw_get, endpoint, keys, 4),
                    "get8": with_cpu(endpoint, raw_get, endpoint, keys, 8),
                    "get4_disk": with_cpu(endpoint, raw_get_to_disk, endpoint, keys, 4,
                                          cache + "-get"),
                    "fill4": with_cpu(endpoint, fill, endpoint, url, keys, 4, cache + "-fill"),
                }
                options = _options(endpoint)
                for name in ("cold", "warm"):
                    one[name] = with_cpu(endpoint, epoch, url, options, cache, args.workers, ref)
                one["local"] = with_cpu(endpoint, epoch, local, None, None, args.workers, ref)
                if slow is not None:
                    one["slow_get8"] = raw_get(slow, keys, 8)
                    os.sync()
                    one["slow_cold"] = epoch(url, _options(slow), cache + "-slow", args.workers,
                                             ref)
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(cache + "-slow", ignore_errors=True)
                for name, r in one.items():
                    runs.setdefault(name, []).append(r)
                print(
                    f"{fmt} rep {rep}: "
                    + ", ".join(f"{n} {r['mib_s']:.0f} MiB/s" for n, r in one.items()),
                    flush=True,
                )
            med = {
                n: {"mib_s": _median(rs, "mib_s"), "s": _median(rs, "s")} for n, rs in runs.items()
            }
            for n in ("cold", "warm", "local", "slow_cold"):
                if n in runs:
                    med[n]["ttfb_s"] = _median(runs[n], "ttfb_s")
                    med[n]["after_first_mib_s"] = _median(runs[n], "after_first_mib_s")
            per_rep = [_ratios({n: rs[i] for n, rs in runs.items()}) for i in range(reps)]
            ratios = {n: float(statistics.median(r[n] for r in per_rep)) for n in per_rep[0]}
            results["formats"][fmt] = {"median": med, "ratios": ratios, "runs": runs}
            print(
                f"{fmt}: raw GET {med['get4']['mib_s']:.0f} (4 threads) / "
                f"{med['get8']['mib_s']:.0f} (8) MiB/s, written to disk "
                f"{med['get4_disk']['mib_s']:.0f}; cache fill alone "
                f"{med['fill4']['mib_s']:.0f} = {ratios['fill_over_raw_get']:.0%} "
                f"({ratios['fill_over_get_to_disk']:.0%} of GET to disk); cold "
                f"epoch {med['cold']['mib_s']:.0f} (ttfb {med['cold']['ttfb_s']:.2f} s) = "
                f"{ratios['cold_over_raw_get']:.0%} of raw GET "
                f"({ratios['cold_over_get_to_disk']:.0%} of GET to disk), "
                f"{ratios['cold_over_warm']:.2f}x warm; warm {med['warm']['mib_s']:.0f} "
                f"(ttfb {med['warm']['ttfb_s']:.2f} s), local {med['local']['mib_s']:.0f} "
                f"(ttfb {med['local']['ttfb_s']:.2f} s): warm/local "
                f"{ratios['warm_over_local']:.2f}x (after the first batch "
                f"{ratios['warm_over_local_after_first']:.2f}x)",
                flush=True,
            )
            cpu = [
                f"{n} {_median(runs[n], 'cores'):.2f} (server "
                f"{_median(runs[n], 'server_cpu_s'):.2f} s, reader "
                f"{_median(runs[n], 'client_cpu_s'):.2f} s)"
                for n in ("get4", "fill4", "cold", "warm")
                if all("cores" in r for r in runs[n])
            ]
            if cpu:
                print(f"{fmt}: cores busy, of {os.cpu_count()}: " + ", ".join(cpu), flush=True)
            if slow is not None:
                print(
                    f"{fmt} +{args.latency_ms:g} ms: raw GET {med['slow_get8']['mib_s']:.0f}, "
                    f"cold {med['slow_cold']['mib_s']:.0f} MiB/s = "
                    f"{ratios['slow_cold_over_slow_get8']:.0%}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit(main())
