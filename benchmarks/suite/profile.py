"""Where the time goes: a py-spy profile of one read run, and the shards' read amplification.

    python -m benchmarks.suite.profile [--system simstore-parquet] [--profile small]
                                       [--workers 0] [--tier local] [--top 15]

Reads the data a ``python -m benchmarks`` run left under ``.bench/systems`` (run that
first), once under py-spy (``--subprocesses``, idle threads left out: samples are CPU
time), and prints the functions with the most samples, by leaf frame and by the first
frame in simstore's code. For simstore-parquet it then counts, in a plain process, how
many row groups the reader decodes against how many the shards hold: a shuffled read that
re-decodes row groups shows up here. py-spy comes with the peers' virtualenv
(benchmarks/peers-requirements.txt) or from PATH.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.suite.data import PROFILES
from benchmarks.suite.matrix import BY_NAME

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _py_spy(root: str) -> str | None:
    local = os.path.join(root, "peers-venv", "bin", "py-spy")
    return local if os.path.exists(local) else shutil.which("py-spy")


def _data(root: str, system: str, profile: str) -> str:
    base = os.path.join(root, "systems", system)
    names = sorted(n for n in os.listdir(base) if n.startswith(profile + "-")
                   and not n.endswith(".json")) if os.path.isdir(base) else []
    if not names:
        raise SystemExit(f"no {system} data for {profile} under {base}: run python -m benchmarks")
    return os.path.join(base, max(names, key=lambda n: int(n.split("-")[1])))


def hot_frames(raw_path: str, top: int) -> dict[str, list[tuple[str, float]]]:
    """Shares of samples by leaf frame and by the innermost frame in the repository."""
    leaf: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    total = 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            frames = stack.split(";")
            leaf[frames[-1]] += n
            mine = [fr for fr in frames if REPO in fr or "simstore" in fr or "loaders/" in fr
                    or "formats/" in fr]
            ours[mine[-1] if mine else "(outside the repository)"] += n
    return {
        "by_leaf": [(k, v / total) for k, v in leaf.most_common(top)],
        "by_repository_frame": [(k, v / total) for k, v in ours.most_common(top)],
        "samples": [("total", float(total))],
    }


_AMPLIFICATION = """
import collections, json, sys, time
import pyarrow.parquet as pq
calls = collections.Counter()
decoded = [0]
orig = pq.ParquetFile.read_row_group
def counted(self, i, *a, **k):
    t = orig(self, i, *a, **k)
    calls[(self.metadata.serialized_size, self.metadata.num_rows, i)] += 1
    decoded[0] += t.nbytes
    return t
pq.ParquetFile.read_row_group = counted
from simstore.loaders import SimDataLoader, SimDataset
out = {}
for shuffle in (True, False):
    calls.clear(); decoded[0] = 0
    ds = SimDataset(sys.argv[1], sys.argv[2], shuffle=shuffle, seed=0)
    batch = None if sys.argv[3] == "none" else int(sys.argv[3])
    t = time.perf_counter()
    n = sum(1 for _ in SimDataLoader(ds, batch_size=batch, num_workers=0))
    out["shuffle" if shuffle else "in_order"] = {
        "seconds": time.perf_counter() - t, "row_group_reads": sum(calls.values()),
        "distinct_row_groups": len(calls), "decoded_bytes": decoded[0]}
print(json.dumps(out))
"""


def amplification(data: str, profile: str) -> dict[str, Any]:
    """Row-group decodes of simstore's Parquet reader, shuffled and in order."""
    batch = PROFILES[profile].batch_size
    proc = subprocess.run([sys.executable, "-c", _AMPLIFICATION, data, profile,
                           "none" if batch is None else str(batch)],
                          capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="simstore-parquet", choices=sorted(BY_NAME))
    ap.add_argument("--profile", default="small", choices=sorted(PROFILES))
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--root", default=os.path.join(REPO, ".bench"))
    ap.add_argument("--json", help="write the findings here")
    args = ap.parse_args(argv)
    system = BY_NAME[args.system]
    data = _data(args.root, system.name, args.profile)
    python = sys.executable if system.venv == "main" else os.path.join(
        args.root, "peers-venv", "bin", "python")
    batch = PROFILES[args.profile].batch_size
    cmd = [python, "-m", "benchmarks.suite.runner", "read", system.family, data, args.profile,
           str(args.workers), "none" if batch is None else str(batch),
           json.dumps({"tier": "local"})]
    out: dict[str, Any] = {"system": system.name, "profile": args.profile,
                           "workers": args.workers, "data": data}
    spy = _py_spy(args.root)
    if spy is None:
        out["py_spy"] = "py-spy not found: build the peers' virtualenv or pip install py-spy"
    else:
        raw = os.path.join(tempfile.mkdtemp(), "profile.txt")
        t = time.perf_counter()
        proc = subprocess.run([spy, "record", "--format", "raw", "--rate", "100", "--threads",
                               "--subprocesses", "--output", raw, "--", *cmd], cwd=REPO,
                              capture_output=True, text=True)
        out["wall_s"] = time.perf_counter() - t
        result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        out["run"] = json.loads(result[-1][7:]) if result else proc.stderr[-500:]
        out["py_spy"] = hot_frames(raw, args.top) if os.path.exists(raw) else proc.stderr[-500:]
    if system.name in ("simstore-parquet", "simstore-parquet-zstd"):
        out["parquet_row_groups"] = amplification(data, args.profile)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(summary(out))
    return 0


def summary(out: dict[str, Any]) -> str:
    """The findings as text: the hottest frames, then the row-group counts."""
    lines = [f"{out['system']} {out['profile']}, {out['workers']} workers ({out['data']})"]
    if isinstance(out.get("run"), dict):
        r = out["run"]
        lines.append(f"run under py-spy: ttfb {r['ttfb_s']:.2f} s, epoch {r['epoch_s']:.2f} s, "
                     f"{r['samples']} samples")
    spy = out.get("py_spy")
    if isinstance(spy, dict):
        for key, title in (("by_repository_frame", "innermost repository frame"),
                           ("by_leaf", "leaf frame")):
            lines.append(f"CPU samples by {title}:")
            lines += [f"  {100 * share:5.1f}%  {frame}" for frame, share in spy[key]]
    elif spy:
        lines.append(str(spy))
    groups = out.get("parquet_row_groups")
    if groups and "error" not in groups:
        for mode, g in groups.items():
            lines.append(f"parquet row groups, {mode}: {g['row_group_reads']} decodes of "
                         f"{g['distinct_row_groups']} row groups, {g['decoded_bytes'] / 2**20:,.0f}"
                         f" MiB decoded, {g['seconds']:.2f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
