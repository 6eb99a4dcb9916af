"""The other benchmarks of the project, run as they are and folded into the results.

- manifest scale (:mod:`benchmarks.bench_manifest`): snapshot, show/log and diff of 10
  million samples (100,000 with ``--quick``);
- ingest (``benchmarks/bench_ingest.py --quick``): throughput per adapter (.npz, HDF5
  time windows) and format against a file copy, with 1 and 2 workers, peak RSS, codecs.
  Its own full run takes over 10 minutes here, so the suite runs its quick sizes (one
  repetition) in full runs only; the suite's write-vs-copy table covers the .npz adapter
  per format at the suite's sizes.

Each runs in a subprocess of the project's interpreter; a failure becomes a note.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.suite.driver import Config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(cmd: list[str], out_json: str, log_path: str, timeout_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s (log: {log_path})"}
    if proc.returncode or not os.path.exists(out_json):
        return {"error": f"exit {proc.returncode} (log: {log_path})"}
    with open(out_json) as f:
        result: dict[str, Any] = json.load(f)
    # as anyone would type it in the repository: no interpreter or checkout path
    result["command"] = " ".join(
        "python" if c == sys.executable else os.path.relpath(c, REPO) if os.path.isabs(c) else c
        for c in cmd
    )
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def run(cfg: Config) -> dict[str, Any]:
    """{"manifest": ..., "ingest": ...} (each the other benchmark's own JSON)."""
    out: dict[str, Any] = {}
    samples = 100_000 if cfg.quick else 10_000_000
    path = os.path.join(cfg.root, f"manifest-{samples}.json")
    cfg.log(f"extras: manifest scale, {samples:,} samples")
    out["manifest"] = _run([sys.executable, "-m", "benchmarks.bench_manifest", "--samples",
                            str(samples), "--json", path], path,
                           os.path.join(cfg.root, "manifest.log"), 900)
    if not cfg.quick:
        path = os.path.join(cfg.root, "ingest.json")
        cfg.log("extras: ingest throughput, RSS and codecs (benchmarks/bench_ingest.py --quick)")
        work = os.path.join(cfg.root, "ingest")
        shutil.rmtree(work, ignore_errors=True)
        out["ingest"] = _run([sys.executable, "benchmarks/bench_ingest.py", "--quick", "--out",
                              path, "--workdir", work], path,
                             os.path.join(cfg.root, "ingest.log"), 600)
        shutil.rmtree(work, ignore_errors=True)
    return out
