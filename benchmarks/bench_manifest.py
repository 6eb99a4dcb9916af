"""Manifest scale: snapshot, show/log and diff of 10 million samples.

    python -m benchmarks.bench_manifest [--samples 10000000] [--changes 1000] [--json FILE]

Builds a manifest of N samples (keys shaped like ``run00042/t0007``), commits it, then
commits 1,000 changed samples twice: once contiguous (one re-ingested run, the common
case) and once spread at random over the key space (the worst case for any part layout),
and measures commit time, peak RSS, show/log latency in a fresh process, and the time and
manifest bytes read by diff.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from simstore.catalog import Catalog
from simstore.manifest import MANIFEST_SCHEMA


def _rows(keys: list[str] | pa.Array, rng: np.random.Generator, shard_count: int) -> pa.Table:
    n = len(keys)
    hashes = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    shards = np.array([f"{i:032x}" for i in range(shard_count)])
    return pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "sample_hash": pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(16), n, [None, pa.py_buffer(hashes.tobytes())]
            ),
            "shard": pa.array(shards[rng.integers(0, shard_count, n)]),
            "position": pa.array(rng.integers(0, 4096, n), pa.int64()),
            "size_bytes": pa.array(np.full(n, 4 << 20), pa.int64()),
        },
        schema=MANIFEST_SCHEMA,
    )


def _keys(n: int) -> pa.Array:
    per_run = 1000
    runs = np.arange(n) // per_run
    steps = np.arange(n) % per_run
    run_s = pa.array(np.char.add("run", np.char.zfill(runs.astype(str), 6)))
    step_s = pa.array(np.char.add("/t", np.char.zfill(steps.astype(str), 4)))
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(run_s, step_s, "")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cli(store: str, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "simstore.cli", "--store", store, *args],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    root = tempfile.mkdtemp(prefix="simstore-manifest-")
    cat = Catalog.init(root)
    out: dict[str, object] = {"samples": args.samples, "changes": args.changes}

    t0 = time.perf_counter()
    keys = _keys(args.samples)
    table = _rows(keys, rng, shard_count=max(1, args.samples // 64))
    out["generate_s"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    entry = cat.stage("big", changes=table)
    out["stage_s"] = round(time.perf_counter() - t0, 2)
    del table
    # `simstore snapshot` in its own process: its wall time and its peak RSS
    # VmHWM is the high-water mark of the process's own address space (reset by exec),
    # unlike ru_maxrss of a child, which counts the parent's pages at fork time.
    hwm = (
        "import atexit, sys\n"
        "def _hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            print('VmHWM_KB', line.split()[1], file=sys.stderr)\n"
        "atexit.register(_hwm)\n"
        "from simstore.cli import main\n"
        "main()\n"
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", hwm, "--store", root, "snapshot", "big", "-m", "10M", "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    out["snapshot_s"] = round(time.perf_counter() - t0, 2)
    hwm_kb = [ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("VmHWM_KB")]
    out["snapshot_peak_rss_mib"] = round(int(hwm_kb[0]) / 1024, 1) if hwm_kb else None
    first_id = json.loads(proc.stdout)["snapshot"]
    assert entry.id in json.loads(proc.stdout)["staged"]
    snap = cat.snapshot(first_id)
    out["manifest_parts"] = len(snap.parts)
    out["manifest_bytes"] = snap.manifest_bytes

    # show/log from a fresh process (what a user types)
    out["show_s"] = round(min(_cli(root, "show", "big") for _ in range(3)), 3)
    out["log_s"] = round(min(_cli(root, "log", "big") for _ in range(3)), 3)

    for kind in ("contiguous", "random"):
        if kind == "contiguous":
            start = args.samples // 2
            idx = np.arange(start, start + args.changes)
        else:
            idx = np.sort(rng.choice(args.samples, size=args.changes, replace=False))
        changed = _rows(keys.take(pa.array(idx)), rng, shard_count=4)
        t0 = time.perf_counter()
        e = cat.stage("big", changes=changed)
        res = cat.commit("big", message=f"{kind} change", staging_ids=[e.id])
        commit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        d = cat.diff_snapshots(first_id, res.snapshot_id)
        diff_s = time.perf_counter() - t0
        assert len(d.diff.modified) == args.changes
        out[kind] = {
            "commit_s": round(commit_s, 3),
            "new_part_bytes": res.new_part_bytes,
            "diff_s": round(diff_s, 3),
            "diff_parts_read": d.parts_read,
            "diff_parts_total": d.parts_total,
            "diff_bytes_read": d.bytes_read,
            "diff_bytes_read_share": round(d.bytes_read / max(1, d.manifest_bytes), 5),
        }
        # reset main to the first snapshot for the next case
        _, version = cat.branches("big").get_versioned("main")
        cat.branches("big").move("main", version, first_id)
    out["bench_process_peak_rss_mib"] = round(_peak_rss_mib(), 1)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    import shutil

    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
